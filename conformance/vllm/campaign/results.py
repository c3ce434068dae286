"""engines/vllm/campaign/RESULTS.md's tables, from the committed `kvcert fuzz` reports.

    python -m kvcert.conformance.vllm.campaign.results            # print the tables
    python -m kvcert.conformance.vllm.campaign.results --write    # rewrite them in RESULTS.md
    python -m kvcert.conformance.vllm.campaign.results --headline 0.33.0   # docs/campaign.md's
    python -m kvcert.conformance.vllm.campaign.results --import REPORT.json  # commit a run's report

Each release directory holds the JSON reports of two runs (`kvcert fuzz --runs N --json
REPORT.json`, and the same with `--fix`), made in that release's venv and imported as
fuzz.json and fuzz-fix.json without the shrunk workloads (the seed regenerates each; `--save`
writes them as regression files). The completeness table reads a third run per release,
`--fix --families` (fuzz-families.json; on 0.33.0 with every workload option, so that its
workloads are those of kvcert's drop-in run, fuzz-kvcert.json, its last row). The tables are
their summary, so every figure in RESULTS.md (and docs/campaign.md's, which a test checks
against it) is what a committed report says.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kvcert.conformance.campaign.command import finding_class, finding_role
from kvcert.conformance.vllm import checkout

HERE = checkout() / "engines" / "vllm" / "campaign"  # RESULTS.md beside the regressions
RELEASES = HERE.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
OWED_BEGIN, OWED_END = "<!-- completeness:begin -->", "<!-- completeness:end -->"
# the options a report records, in the order `kvcert fuzz` is given them
OPTIONS = ("kvcert", "fix", "families", "state_checkpoints", "state_drafts", "mtp")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in path.name.split("."))


def _releases() -> list[Path]:
    """The pinned release directories, in release order."""
    return sorted((d for d in RELEASES.iterdir() if d.name[0].isdigit()), key=_version_key)


def _committed(names: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(release, report) for each committed report of these names, by release."""
    return [
        (release.name, json.loads((release / name).read_text(encoding="utf-8")))
        for release in _releases()
        for name in names
        if (release / name).is_file()
    ]


def reports() -> list[tuple[str, dict[str, Any]]]:
    """(release, report) for every committed report, releases in order, unfixed first."""
    return _committed(("fuzz.json", "fuzz-fix.json"))


def completeness_reports() -> list[tuple[str, dict[str, Any]]]:
    """(release, report) for every committed `--fix --families` run, releases in order, then
    kvcert's drop-in run on the same workloads."""
    families = _committed(("fuzz-families.json",))
    return families + _committed(("fuzz-kvcert.json",))


def command(report: dict[str, Any]) -> str:
    """The `kvcert fuzz` command line a report is the run of."""
    line = f"kvcert fuzz --runs {report['runs']}"
    line += "".join(f" --{name.replace('_', '-')}" for name in OPTIONS if report.get(name))
    budget = report.get("shrink_budget", 400)  # the default; older reports do not say
    return line + (f" --shrink-budget {budget}" if budget != 400 else "")


def _findings(report: dict[str, Any], kinds: tuple[str, ...] | None = None) -> str:
    found = [v for v in report["violations"] if kinds is None or finding_role(v) in kinds]
    if not found:
        return "0"
    counts = Counter(finding_class(v) for v in found)
    parts = []
    for name, count in sorted(counts.items()):
        seeds = [v["seed"] for v in found if finding_class(v) == name]
        shown = ", ".join(map(str, seeds[:6])) + (", ..." if len(seeds) > 6 else "")
        parts.append(f"{count} {name} ({shown})")
    return "; ".join(parts)


def _first(report: dict[str, Any]) -> str:
    if not report["violations"]:
        return "-"
    first = min(report["violations"], key=lambda v: v["found_after_runs"])
    return f"{first['found_after_runs']} workloads, {first['found_after_seconds']} s"


def table() -> str:
    """The markdown table: one row per committed report."""
    lines = [
        "| release | command | workloads | seconds | preemptions | drafts accepted | "
        "not played | findings by class (seeds) | first found after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for release, report in reports():
        drafts = f"{report.get('accepted', 0):,} of {report.get('drafts', 0):,}"
        lines.append(
            f"| {release} | `{command(report)}` | {report['runs']:,} | {report['seconds']} | "
            f"{report['preemptions']:,} | {drafts} | {_unplayed(report)} | "
            f"{_findings(report)} | {_first(report)} |"
        )
    return "\n".join(lines) + "\n"


def _lost_by_cause(report: dict[str, Any]) -> str:
    """The lost-hit findings by the cause kvcert.conformance.vllm.campaign.causes named
    (`--annotate`); "not yet traced" where it named none."""
    lost = [v for v in report["violations"] if finding_role(v) == "lost"]
    if not lost:
        return "0"
    by_cause: dict[str, list[int]] = {}
    for finding in lost:
        cause = finding.get("cause", "not classified")
        by_cause.setdefault(cause or "not yet traced", []).append(finding["seed"])
    parts = []
    for cause, seeds in sorted(by_cause.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(map(str, seeds[:4])) + (", ..." if len(seeds) > 4 else "")
        parts.append(f"{len(seeds)} {cause} ({shown})")
    return "; ".join(parts)


def _unplayed(report: dict[str, Any]) -> int:
    return sum(len(seeds) for seeds in report.get("unreachable", {}).values())


def completeness_table() -> str:
    """The markdown table of the completeness oracle: one row per `--fix --families` run,
    then kvcert's drop-in on the same workloads."""
    lines = [
        "| release | manager | command | workloads | not played | owed hit tokens | served | "
        "served past owed | admissions that lost a hit | lost hits (seeds) | "
        "other findings (seeds) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for release, report in completeness_reports():
        manager = "kvcert's drop-in" if report.get("kvcert") else "vLLM's, fixed"
        lines.append(
            f"| {release} | {manager} | `{command(report)}` | {report['runs']:,} | "
            f"{_unplayed(report)} | {report['owed_tokens']:,} | {report['served_tokens']:,} | "
            f"{report['beyond_tokens']:,} | {report['lost_hits']:,} | "
            f"{_lost_by_cause(report)} | "
            f"{_findings(report, ('target', 'draft', 'state', 'crash'))} |"
        )
    return "\n".join(lines) + "\n"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def _tally(report: dict[str, Any]) -> str:
    """`N unsound reads of target KV, S of Mamba state, M of draft KV (all under drop
    keying), K engine crashes` for one report."""
    found = report["violations"]
    roles = Counter(finding_role(v) for v in found)
    target, states, crashes = roles["target"], roles["state"], roles["crash"]
    drafts = [v for v in found if finding_role(v) == "draft"]
    text = f"{target} unsound reads of target KV"
    if states:
        text += f", {states} of Mamba state"
    if drafts:
        keyings = Counter(v.get("keying") for v in drafts)
        if len(keyings) == 1:
            under = f"all under {next(iter(keyings))} keying"
        else:
            under = ", ".join(f"{n} under {k} keying" for k, n in sorted(keyings.items()))
        text += f" and {len(drafts)} of draft KV ({under})"
    if crashes:
        text += f", {crashes} engine crashes"
    return text


def headline(release: str) -> str:
    """docs/campaign.md's sentence about one release's two runs."""
    pair = {r["fix"]: r for name, r in reports() if name == release}
    plain, fixed = pair[False], pair[True]
    target = sorted((v for v in plain["violations"] if finding_role(v) == "target"),
                    key=lambda v: v["found_after_runs"])  # fmt: skip
    first = ""
    if target:
        first = (f" (the first: seed {target[0]['seed']}, the "
                 f"{_ordinal(target[0]['found_after_runs'])} workload)")  # fmt: skip
    tally = _tally(plain).replace(
        " unsound reads of target KV", f" unsound reads of target KV{first}", 1
    )
    return f"On {release}, {plain['runs']:,} workloads give {tally}; with the fix, {_tally(fixed)}."


def _report_name(report: dict[str, Any]) -> str:
    """Where a run's report is committed: fuzz.json (plain), fuzz-fix.json (--fix),
    fuzz-families.json (--fix --families), fuzz-kvcert.json (--kvcert)."""
    if report.get("kvcert"):
        return "fuzz-kvcert.json"
    if report.get("families"):
        if not report["fix"]:
            raise SystemExit("the completeness table reads --fix --families runs only")
        return "fuzz-families.json"
    if any(report.get(name) for name in ("state_checkpoints", "state_drafts", "mtp")):
        raise SystemExit("the soundness table reads plain and --fix runs only")
    return "fuzz-fix.json" if report["fix"] else "fuzz.json"


def import_report(path: Path) -> Path:
    """Copy a run's report into its release's directory, shrunk workloads left out."""
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    release: str = report["engine"].split()[-1]
    if report.get("mutant") or not (RELEASES / release).is_dir():
        raise SystemExit(f"{path}: not a run of vLLM's or kvcert's manager on a pinned release")
    for finding in report["violations"]:
        finding["shrunk"].pop("workload", None)
    target = RELEASES / release / _report_name(report)
    seeds = json.dumps(report.pop("seeds"))  # one line, not one per seed
    text = json.dumps({"seeds": "SEEDS", **report}, indent=1).replace('"SEEDS"', seeds, 1)
    target.write_text(text + "\n", encoding="utf-8")
    return target


def _replaced(text: str, begin: str, end: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def write(path: Path = HERE / "RESULTS.md") -> None:
    text = _replaced(path.read_text(encoding="utf-8"), BEGIN, END, table())
    text = _replaced(text, OWED_BEGIN, OWED_END, completeness_table())
    path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        write()
    elif argv and argv[0] == "--headline":
        print(headline(argv[1]))
    elif argv and argv[0] == "--import":
        for path in argv[1:]:
            print(f"imported as {import_report(Path(path))}")
    else:
        print(table() + "\n" + completeness_table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
