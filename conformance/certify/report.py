"""The certification report: per-case results, totals per suite and per rule, and the text
`kvcert certify` prints (each unexpected result with its rules and, for hit cases, the
`kvcert explain` diagram)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from kvcert.conformance.contract.codec import JSON, from_ranges, layout_from_json, partial_from_json
from kvcert.conformance.tools.explain import explain, render
from kvcert.spec import CacheView, hybrid_hit

PASSING = {"passed", "xfailed", "skipped"}
SAME_CAUSE = 4  # this many unexpected results with one detail are reported as one line


@dataclass
class Result:
    """What happened to one case."""

    id: str
    suite: str
    status: str  # passed | failed | errored | skipped | xfailed | xpassed
    rules: list[str]
    detail: str = ""
    origin: str | None = None
    focus: list[str] = field(default_factory=list)  # the rules the case was written for


@dataclass
class Report:
    """A whole run."""

    engine: JSON
    results: list[Result] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(r.status for r in self.results)

    @property
    def ok(self) -> bool:
        """Nothing unexpected, and at least one case ran: a run that tested nothing (every
        case skipped or unsupported) certifies nothing."""
        counts = self.counts()
        ran = counts["passed"] + counts["xfailed"]
        return ran > 0 and all(r.status in PASSING for r in self.results)

    def summary_line(self) -> str:
        counts = self.counts()
        failed = sum(counts[s] for s in ("failed", "errored", "xpassed"))
        passed = counts["passed"] + counts["xfailed"]
        return f"{passed} passed, {failed} failed, {counts['skipped']} skipped"

    def to_json(self) -> JSON:
        by_rule: dict[str, Counter[str]] = {}
        for result in self.results:
            for rule in result.rules:
                by_rule.setdefault(rule, Counter())[result.status] += 1
        return {
            "engine": self.engine,
            "summary": self.summary_line(),
            "counts": dict(self.counts()),
            "by_rule": {k: dict(v) for k, v in sorted(by_rule.items())},
            "results": [asdict(r) for r in self.results],
        }


def hit_diagram(case: JSON) -> str:
    """The `kvcert explain` text of a hit case, for failure reports (under `unit U`, which
    explain does not break down, the spec's answer and the case's comment)."""
    data = case["input"]
    layout = layout_from_json(data["layout"])
    cached = tuple(from_ranges(r) for r in data["cached"])
    partial = partial_from_json(data.get("partial"), len(cached))
    view = CacheView(layout, data["num_tokens"], cached, partial)
    if layout.hit_unit is not None:
        spec = hybrid_hit(view)
        return (
            f"{case['id']}: unit {layout.hit_unit}, {view.num_tokens} tokens; the spec's hit is "
            f"{spec.length}, blocks {[list(b) for b in spec.blocks]} (HIT-UNIT-1..4). "
            f"{case.get('comment', '')}"
        ).rstrip()
    return render(explain(view), case["id"], case.get("comment", ""))


def suspect_rules(report: Report, top: int = 5) -> list[tuple[str, int, int]]:
    """Rules ranked by the share of their citing cases that failed: a broken rule fails most
    of its cases, while rules every case cites fail only a small share."""
    cited: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for result in report.results:
        if result.status == "skipped":
            continue
        for rule in result.rules:
            cited[rule] += 1
            failed[rule] += result.status not in PASSING
    ranked = sorted(
        (r for r in failed if failed[r]), key=lambda r: (-failed[r] / cited[r], -failed[r], r)
    )
    return [(r, failed[r], cited[r]) for r in ranked[:top]]


def render_report(report: Report, cases: Mapping[str, JSON] | None = None) -> str:
    """The readable report: totals per suite and per rule, then each unexpected result (with
    the `kvcert explain` diagram of a failed hit case when `cases` maps its id to the case)."""
    lines = [f"engine: {report.engine.get('name')} {report.engine.get('version', '')}".rstrip()]
    for suite in sorted({r.suite for r in report.results}):
        counts = Counter(r.status for r in report.results if r.suite == suite)
        lines.append(
            f"  suite {suite}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        )
    bad = [r for r in report.results if r.status not in PASSING]
    focused = Counter(rule for r in bad for rule in r.focus)
    if focused:
        lines.append(
            "  rules the failing scenarios were written for: "
            + ", ".join(f"{rule} ({n})" for rule, n in focused.most_common())
        )
    suspects = suspect_rules(report)
    if suspects:
        lines.append(
            "  rules most implicated (failed / citing cases): "
            + ", ".join(f"{rule} {failed}/{cited}" for rule, failed, cited in suspects)
        )
    shared = Counter((r.status, r.detail) for r in bad)
    told: set[tuple[str, str]] = set()
    for result in bad:
        cause = (result.status, result.detail)
        if shared[cause] >= SAME_CAUSE:  # one cause (a dead engine, say): said once
            if cause not in told:
                told.add(cause)
                lines.append(
                    f"{result.status.upper()} {shared[cause]} cases, from {result.id} on: "
                    f"{result.detail}"
                )
            continue
        origin = f" [{result.origin}]" if result.origin else ""
        lines.append(f"{result.status.upper()} {result.id}{origin}: {result.detail}")
        focus = f"focus {', '.join(result.focus)}; " if result.focus else ""
        lines.append(f"  {focus}rules exercised: {', '.join(result.rules) or '-'}")
        if cases is not None and result.suite == "hit" and result.status == "failed":
            case = cases.get(result.id)
            if case is not None and "hit" in case["expect"]:
                lines.extend("    " + line for line in hit_diagram(case).splitlines())
    counts = report.counts()
    if counts["passed"] + counts["xfailed"] == 0 and report.results:
        lines.append(
            "NOTHING RAN: no case passed or failed as expected, so this run certifies "
            "nothing (every case was skipped, unsupported or errored)"
        )
    lines.append(report.summary_line())
    return "\n".join(lines) + "\n"
