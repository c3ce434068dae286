"""vLLM's own tests, run against vLLM's manager and against kvcert's: counts and reasons.

    python -m kvcert.conformance.vllm.own_tests.report VERSION --write  # VLLM_TESTS.md, expected
    python -m kvcert.conformance.vllm.own_tests.report VERSION --check  # CI: kvcert's run

Reads the two JUnit reports scripts/vllm-own-tests.sh writes
(.engines/vllm-VERSION-tests/{vllm,kvcert}.xml) under the checkout (`--root`).
`--write` publishes engines/vllm/VERSION/VLLM_TESTS.md (per file: passed with vLLM, passed
with kvcert; every test passing with vLLM but not with kvcert under the reason its failure
shows, one line each) and the outcome of every test under kvcert
(engines/vllm/VERSION/vllm-tests-expected.json). `--check` fails (exit 1) when a test's
outcome under kvcert differs from that file: a new failure or an unexpected pass. Standard
library only, beside `checkout()`: it runs in any Python that can import kvcert.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from kvcert.conformance.vllm import checkout

# What a kvcert failure's message shows -> why the test cannot pass, in one line. Each reason
# says whether it is a refusal (the integration does not serve that configuration, by
# design or not yet), a private internal the test reads, or a rule of the spec that differs
# from vLLM on purpose. A failure no pattern matches is UNEXPLAINED (a kvcert bug until shown
# otherwise); --write refuses to publish one.
REASONS: list[tuple[str, str]] = [
    (
        r"holds (\w+Spec)",
        "refused: a {0} group (the integration serves full, sliding-window, chunked local "
        "attention and align-mode state groups)",
    ),
    (
        r"in mamba_cache_mode='(\w+)'",
        "refused: a state group in mamba_cache_mode {0} (the integration serves align)",
    ),
    (
        r"does not support shared-prefix state checkpoints",
        "refused: vLLM's sub-block shared-prefix state checkpoints "
        "(enable_mamba_shared_prefix_checkpoint; kvcert's block-aligned junction is served)",
    ),
    (r"does not support dcp_world_size", "refused: decode context parallelism"),
    (
        r"not prefix-cacheable in vLLM's terms",
        "refused: a bounded-replay (not prefix-cacheable) sliding-window group",
    ),
    (r"does not support KV connectors", "refused: KV connectors"),
    (r"serve encoder-decoder", "refused: encoder-decoder models (cross-attention tokens)"),
    (
        r"discarded tokens a step in flight computed",
        "refused: a request resumed below tokens a step in flight computed (a streaming-input "
        "session resumed under asynchronous scheduling; computed KV is never taken back)",
    ),
    (
        r"isinstance\(<kvcert\.reference\.vllm\.parts\.CoordinatorView[^,]*, (\w+)\)",
        "reads vLLM's manager internals (asserts the coordinator is vLLM's {0})",
    ),
    (
        r"'(?:Pool|Group|Coordinator)View' object has no attribute '(\w+)'",
        "reads vLLM's manager internals (`{0}`), which the kvcert manager does not have",
    ),
]


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Per test id (file::name): its outcome (passed | failed | skipped) and failure text."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("classname"):  # a module that failed to import: pytest names it
            case.set("classname", case.get("name") or "")
            case.set("name", "<collection>")
        module = (case.get("classname") or "").split(".")
        # classname is the dotted module path, plus a class for methods
        parts, cls = [], []
        for i, part in enumerate(module):
            parts.append(part)
            if part.startswith("test_"):
                cls = module[i + 1 :]
                break
        name = "/".join(parts) + ".py::" + "::".join([*cls, case.get("name") or ""])
        status, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                text = (child.get("message") or "") + "\n" + (child.text or "")
            elif child.tag == "skipped" and status == "passed":
                status = "skipped"
        if status == "failed" or name not in found:
            found[name] = (status, text)
    return found


def reason(text: str) -> str:
    for pattern, why in REASONS:
        match = re.search(pattern, text)
        if match:
            return why.format(*match.groups())
    first = next((line for line in text.splitlines() if line.strip()), "no message")
    return f"UNEXPLAINED: {first.strip()[:160]}"


def explained_reason(test: str, text: str, explained: dict[str, str]) -> str:
    """The reason explained.json gives the test (a regex over its id or its failure text),
    else what its failure message shows; a refusal the message shows comes first (the test
    configures a feature kvcert refuses, whatever it would read next)."""
    shown = reason(text)
    if shown.startswith("refused"):
        return shown
    for pattern, why in explained.items():
        if not pattern.startswith("_") and (re.search(pattern, test) or re.search(pattern, text)):
            return why
    return shown


def _needs(reasons: Iterable[str], refusals: dict[str, str]) -> list[str]:
    """Per refused reason present, its paragraph from refusals.json (what the spec would have
    to define to serve the feature), in the order of the file; a refused reason no entry
    matches gets an UNEXPLAINED line."""
    refused = sorted({why for why in reasons if why.startswith("refused")})
    entries = {key: text for key, text in refusals.items() if not key.startswith("_")}
    paragraphs = [
        text for key, text in entries.items() if any(re.search(key, why) for why in refused)
    ]
    missing = [why for why in refused if not any(re.search(key, why) for key in entries)]
    return [*paragraphs, *(f"UNEXPLAINED refusal: {why}" for why in missing)]


def render(
    version: str,
    vllm: dict[str, tuple[str, str]],
    ours: dict[str, tuple[str, str]],
    explained: dict[str, str],
    refusals: dict[str, str],
) -> str:
    files: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for test, (status, _) in vllm.items():
        counts = files[test.split("::")[0]]
        counts[0] += 1
        counts[1] += status == "passed"
        counts[2] += ours.get(test, ("missing", ""))[0] == "passed"

    def passed(results: dict[str, tuple[str, str]], test: str) -> bool:
        return results.get(test, ("missing", ""))[0] == "passed"

    lost = {
        test: explained_reason(test, ours.get(test, ("missing", "not run"))[1], explained)
        for test in vllm
        if passed(vllm, test) and not passed(ours, test)
    }
    gained = [test for test in ours if passed(ours, test) and not passed(vllm, test)]
    total = [sum(c[i] for c in files.values()) for i in range(3)]
    # the parity measure: tests of features kvcert refuses at start-up left out
    refused = sum(1 for why in lost.values() if why.startswith("refused"))
    judged = total[1] - refused
    share = total[2] * 10_000 // judged / 10_000 if judged else 0.0  # floored: never up to 95%
    lines = [
        f"# vLLM {version}'s own tests/v1/core: vLLM's manager vs kvcert's",
        "",
        "Generated by `python -m kvcert.conformance.vllm.own_tests.report "
        f"{version} --write` from two runs of `bash scripts/vllm-own-tests.sh {version} "
        "vllm|kvcert` (vLLM's sdist tests, unedited; the kvcert run swaps in "
        "`kvcert.reference.vllm` with the plugin `kvcert.conformance.vllm.own_tests.swap`). "
        "A test is counted as passed when it passed; skipped and failed are not.",
        "",
        f"**{total[1]:,} of {total[0]:,} pass with vLLM's manager on this CPU-only machine; "
        f"{total[2]:,} pass with kvcert's.** {len(lost):,} pass with vLLM's and not with "
        f"kvcert's, each listed below under its reason; {len(gained)} pass only with kvcert's.",
        "",
        f"**Parity: leaving out the {refused} tests of features kvcert refuses at start-up "
        f"(reasons beginning `refused`), kvcert passes {total[2]:,} of the {judged:,} that pass "
        f"with vLLM's manager ({share:.2%}).**",
        "",
        "| file | tests | passed with vLLM | passed with kvcert |",
        "|---|---|---|---|",
    ]
    for name in sorted(files):
        tests, with_vllm, with_kvcert = files[name]
        lines.append(
            f"| `{name.removeprefix('tests/v1/core/')}` | {tests} | {with_vllm} | {with_kvcert} |"
        )
    lines.append(f"| **all** | **{total[0]}** | **{total[1]}** | **{total[2]}** |")
    by_reason: dict[str, list[str]] = defaultdict(list)
    for test, why in lost.items():
        by_reason[why].append(test)
    lines += ["", "## Passing with vLLM's manager, not with kvcert's, by reason", ""]
    lines += ["| tests | reason |", "|---|---|"]
    for why, ids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        lines.append(f"| {len(ids)} | {why} |")
    lines += ["", "## What the spec would need for each refused feature", ""]
    for paragraph in _needs(by_reason, refusals):
        lines += [paragraph, ""]
    lines.pop()
    lines += ["", "## The tests, by reason"]
    for why, ids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        lines += ["", f"### {why}", ""]
        lines += [f"- `{t.removeprefix('tests/v1/core/')}`" for t in sorted(ids)]
    if gained:
        lines += ["", "## Passing only with kvcert's manager", ""]
        lines += [f"- `{t.removeprefix('tests/v1/core/')}`" for t in sorted(gained)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the kvcert checkout holding engines/ and .engines/ (default: the one kvcert "
        "is installed from, else the working directory)",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    root = args.root or checkout()
    runs = root / f".engines/vllm-{args.version}-tests"
    release = root / "engines/vllm" / args.version
    expected_path = release / "vllm-tests-expected.json"
    ours = outcomes(runs / "kvcert.xml")
    if args.check:
        expected = json.loads(expected_path.read_text(encoding="utf-8"))["kvcert"]
        changed = sorted(
            t
            for t in set(expected) | set(ours)
            if (ours.get(t, ("missing", ""))[0] == "passed") != (expected.get(t) == "passed")
        )
        for test in changed:
            now = ours.get(test, ("missing", ""))
            print(
                f"{test}: expected {expected.get(test, 'absent')}, got {now[0]}"
                + (f" ({reason(now[1])})" if now[0] == "failed" else "")
            )
        counts = Counter(s for s, _ in ours.values())
        print(
            f"vLLM {args.version} tests/v1/core with kvcert's manager: "
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} "
            f"skipped; {len(changed)} differ from {expected_path.name}"
        )
        return 1 if changed else 0
    vllm = outcomes(runs / "vllm.xml")
    explained_path = root / "engines/vllm/own_tests/explained.json"
    explained = json.loads(explained_path.read_text(encoding="utf-8"))
    refusals_path = root / "engines/vllm/own_tests/refusals.json"
    refusals = json.loads(refusals_path.read_text(encoding="utf-8"))
    text = render(args.version, vllm, ours, explained, refusals)
    unexplained = [
        line for line in text.splitlines() if line.startswith(("### UNEXPLAINED", "UNEXPLAINED"))
    ]
    (release / "VLLM_TESTS.md").write_text(text, encoding="utf-8")
    expected_path.write_text(
        json.dumps({"kvcert": {t: s for t, (s, _) in sorted(ours.items())}}, indent=0) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {release / 'VLLM_TESTS.md'} and {expected_path}")
    if unexplained:
        print(
            f"{len(unexplained)} reason(s) UNEXPLAINED: classify them (REASONS or "
            "explained.json; a refusal's paragraph in refusals.json) or fix kvcert",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
