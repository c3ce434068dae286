"""engines/vllm/campaign/RESULTS.md's table, from the committed `kvcert fuzz` reports.

    python -m kvcert.conformance.vllm.campaign.results            # print the table
    python -m kvcert.conformance.vllm.campaign.results --write    # rewrite it inside RESULTS.md
    python -m kvcert.conformance.vllm.campaign.results --headline 0.33.0   # docs/campaign.md's
    python -m kvcert.conformance.vllm.campaign.results --import REPORT.json  # commit a run's report

Each release directory holds the JSON reports of two runs (`kvcert fuzz --runs N --json
REPORT.json`, and the same with `--fix`), made in that release's venv and imported as
fuzz.json and fuzz-fix.json without the shrunk workloads (the seed regenerates each; `--save`
writes them as regression files). The table is their summary, so every figure in RESULTS.md
(and docs/campaign.md's, which a test checks against it) is what a committed report says.
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


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in path.name.split("."))


def reports() -> list[tuple[str, dict[str, Any]]]:
    """(release, report) for every committed report, releases in order, unfixed first."""
    out = []
    for release in sorted((d for d in RELEASES.iterdir() if d.name[0].isdigit()),
                          key=_version_key):  # fmt: skip
        for name in ("fuzz.json", "fuzz-fix.json"):
            path = release / name
            if path.is_file():
                out.append((release.name, json.loads(path.read_text(encoding="utf-8"))))
    return out


def _findings(report: dict[str, Any]) -> str:
    found = report["violations"]
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
        command = f"kvcert fuzz --runs {report['runs']}" + (" --fix" if report["fix"] else "")
        budget = report.get("shrink_budget", 400)  # the default; older reports do not say
        command += f" --shrink-budget {budget}" if budget != 400 else ""
        drafts = f"{report.get('accepted', 0):,} of {report.get('drafts', 0):,}"
        unplayed = sum(len(s) for s in report.get("unreachable", {}).values())
        lines.append(
            f"| {release} | `{command}` | {report['runs']:,} | {report['seconds']} | "
            f"{report['preemptions']:,} | {drafts} | {unplayed} | {_findings(report)} | "
            f"{_first(report)} |"
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


def import_report(path: Path) -> Path:
    """Copy a run's report into its release's directory, shrunk workloads left out."""
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    release: str = report["engine"].split()[-1]
    if report.get("mutant") or not (RELEASES / release).is_dir():
        raise SystemExit(f"{path}: not a plain or --fix run on a pinned vLLM release")
    for finding in report["violations"]:
        finding["shrunk"].pop("workload", None)
    target = RELEASES / release / ("fuzz-fix.json" if report["fix"] else "fuzz.json")
    seeds = json.dumps(report.pop("seeds"))  # one line, not one per seed
    text = json.dumps({"seeds": "SEEDS", **report}, indent=1).replace('"SEEDS"', seeds, 1)
    target.write_text(text + "\n", encoding="utf-8")
    return target


def write(path: Path = HERE / "RESULTS.md") -> None:
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table()}{END}{tail}", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        write()
    elif argv and argv[0] == "--headline":
        print(headline(argv[1]))
    elif argv and argv[0] == "--import":
        for path in argv[1:]:
            print(f"imported as {import_report(Path(path))}")
    else:
        print(table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
