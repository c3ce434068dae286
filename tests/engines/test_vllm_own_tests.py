"""vLLM's own tests with kvcert's manager: the published comparison is complete and CI's
check is strict."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.conformance.campaign.workload import STATE_MODELS, generate
from kvcert.conformance.vllm.own_tests.report import explained_reason
from tests.docs import doc, words

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "engines/vllm/0.33.0"


def test_every_difference_is_explained_and_the_counts_match_the_expected_outcomes() -> None:
    text = (RELEASE / "VLLM_TESTS.md").read_text(encoding="utf-8")
    expected = json.loads((RELEASE / "vllm-tests-expected.json").read_text(encoding="utf-8"))
    assert "UNEXPLAINED" not in text
    summary = re.search(r"\*\*([\d,]+) of ([\d,]+) pass with vLLM's manager.*?; ([\d,]+) pass "
                        r"with kvcert's\.\*\* ([\d,]+) pass with vLLM's and not", text)  # fmt: skip
    assert summary is not None
    passed_vllm, total, passed_kvcert, lost = (int(g.replace(",", "")) for g in summary.groups())
    outcomes = expected["kvcert"]
    assert passed_kvcert == sum(s == "passed" for s in outcomes.values())
    assert total == len(outcomes)
    listed = re.findall(r"^- `(.+)`$", text.split("## Passing with vLLM's manager, not")[1], re.M)
    assert len(listed) == lost == len(set(listed))
    assert passed_vllm - lost <= passed_kvcert
    for test in listed:  # each difference is a test kvcert's run did not pass
        assert outcomes[f"tests/v1/core/{test}"] != "passed", test
    reasons = re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)
    assert sum(int(n) for n, _ in reasons) == lost


def test_the_docs_quote_the_published_counts() -> None:
    text = (RELEASE / "VLLM_TESTS.md").read_text(encoding="utf-8")
    quoted = doc("vllm-drop-in").split("<!-- vllm-tests:")[1].split("**Seed 001")[0]
    numbers = re.search(r"([\d,]+) of ([\d,]+) pass with vLLM's manager, ([\d,]+) with "
                        r"kvcert's\. Each of the ([\d,]+)", quoted)  # fmt: skip
    assert numbers is not None
    summary = re.search(r"\*\*([\d,]+) of ([\d,]+) pass with vLLM's manager.*?; ([\d,]+) pass "
                        r"with kvcert's\.\*\* ([\d,]+) pass", text)  # fmt: skip
    assert summary is not None
    assert numbers.groups() == summary.groups()
    counts = {why: int(n) for n, why in re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)}
    vis = sum(n for why, n in counts.items() if why.startswith("ALLOC-VIS"))
    internals = sum(
        n for why, n in counts.items() if why.startswith("reads vLLM's manager internals")
    )
    drafts = sum(n for why, n in counts.items() if why.startswith("kvcert limitation"))
    quoted = " ".join(quoted.split())  # line breaks are not part of a claim
    assert f"under its reason: {internals} tests reading vLLM's manager internals" in quoted
    assert f"{vis} tests that expect hits through state checkpoints no step has" in quoted
    assert (f"and {drafts} where a request finishing" in quoted) == (drafts > 0)
    row = re.search(r"^\| `test_async_scheduler\.py` \| (\d+) \| \d+ \| (\d+) \|$", text, re.M)
    assert row is not None
    assert f"`test_async_scheduler.py`: {row[2]} of {row[1]} pass" in quoted
    assert ("No test passes only with kvcert's" in quoted) == ("## Passing only with" not in text)


def junit(path: Path, outcomes: dict[str, str]) -> None:
    cases = []
    for name, status in outcomes.items():
        module, test = name.split("::")
        inner = {"failed": '<failure message="AssertionError: boom"/>', "skipped": "<skipped/>"}
        cases.append(f'<testcase classname="{module}" name="{test}">{inner.get(status, "")}'
                     "</testcase>")  # fmt: skip
    path.write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")


@pytest.mark.parametrize(
    ("now", "code"),
    [
        ({"a": "passed", "b": "failed"}, 0),
        ({"a": "failed", "b": "failed"}, 1),  # a new failure
        ({"a": "passed", "b": "passed"}, 1),  # an unexpected pass
        ({"a": "passed", "b": "skipped"}, 0),  # not passing, as expected
        ({"a": "passed"}, 0),  # b absent: not passing either
    ],
)
def test_the_check_fails_on_any_change_of_outcome(tmp_path: Path, now: dict[str, str],
                                                  code: int) -> None:  # fmt: skip
    root = tmp_path / "root"
    (root / "engines/vllm/own_tests").mkdir(parents=True)
    (root / "engines/vllm/9.9.9").mkdir(parents=True)
    (root / ".engines/vllm-9.9.9-tests").mkdir(parents=True)
    ids = {"a": "tests.v1.core.test_x::test_a", "b": "tests.v1.core.test_x::test_b"}
    expected = {"tests/v1/core/test_x.py::test_a": "passed",
                "tests/v1/core/test_x.py::test_b": "failed"}  # fmt: skip
    (root / "engines/vllm/9.9.9/vllm-tests-expected.json").write_text(
        json.dumps({"kvcert": expected})
    )
    junit(root / ".engines/vllm-9.9.9-tests/kvcert.xml", {ids[k]: s for k, s in now.items()})
    run = subprocess.run(
        [sys.executable, "-m", "kvcert.conformance.vllm.own_tests.report", "9.9.9", "--check",
         "--root", str(root)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == code, run.stdout + run.stderr


def test_a_refusal_the_failure_shows_comes_before_the_explained_reason() -> None:
    explained = {"test_x": "reads an internal"}
    refusal = "UnsupportedConfigError: the kvcert manager does not support KV connectors"
    assert explained_reason("test_x.py::test_x", refusal, explained) == "refused: KV connectors"
    assert explained_reason("test_x.py::test_x", "assert 1 == 2", explained) == "reads an internal"
    assert explained_reason("test_y.py::test_y", "assert 1 == 2", explained).startswith(
        "UNEXPLAINED"
    )


def test_the_docs_quote_the_campaign_through_kvcerts_scheduler() -> None:
    report = json.loads((RELEASE / "fuzz-kvcert.json").read_text(encoding="utf-8"))
    assert report["kvcert"] is True
    assert report["violations"] == []
    assert report["unreachable"] == {}  # every workload is served, state hybrids included
    readme = words("vllm-drop-in")
    quoted = readme.split("<!-- fuzz-kvcert:")[1].split("CI runs 400 seeds")[0]
    workloads = [
        generate(seed, state_checkpoints=True, state_drafts=True, mtp=True, families=True)
        for seed in range(report["runs"])
    ]
    asynchronous = [w for w in workloads if w.async_scheduling]
    drafting = sum(1 for w in asynchronous if w.spec_tokens)
    state = [w for w in workloads if w.model in STATE_MODELS]
    saving = sum(1 for w in workloads if w.state_checkpoints)
    state_drafting = sum(1 for w in state if w.spec_tokens)
    mtp = sum(1 for w in workloads if w.drafter == "mtp")
    sparse = sum(1 for w in workloads if w.retention_units is not None)
    turns = sum(1 for w in workloads for a in w.arrivals if a.follows is not None)
    assert (
        f"{turns:,} multi-turn follow-ups sent with the answers the engine gave; {sparse} "
        f"seeds under kvcert's sparse retention), {report['preemptions']:,} preemptions, "
        f"owed {report['owed_tokens']:,} hit tokens at admissions and served "
        f"{report['served_tokens']:,}, **0 lost hits**"
    ) in quoted
    assert (
        f"all {report['runs']:,} workloads played ({len(asynchronous)} with asynchronous "
        f"scheduling, {drafting} of them with speculative decoding; {mtp} with a multi-module "
        f"MTP drafter; {len(state)} state hybrids "
        f"in Mamba align mode, {saving} of them on a backend that saves checkpoints inside a "
        f"prefill, {state_drafting} decoding with MTP/EAGLE drafts; "
    ) in quoted
    assert (
        f"{report['accepted']:,} of {report['drafts']:,} drafts accepted, **0 findings**, "
        f"{report['state_copies']:,} passes verifying drafts that crossed a state block "
        "boundary (ALLOC-SPEC-2)"
    ) in quoted


def test_each_refused_feature_says_what_the_spec_would_need() -> None:
    """Every reason beginning `refused` gets its paragraph from refusals.json; one without is
    reported UNEXPLAINED (which --write refuses to publish)."""
    from kvcert.conformance.vllm.own_tests.report import _needs

    text = (RELEASE / "VLLM_TESTS.md").read_text(encoding="utf-8")
    reasons = [why for _, why in re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)]
    refusals = json.loads(
        (ROOT / "engines/vllm/own_tests/refusals.json").read_text(encoding="utf-8")
    )
    paragraphs = _needs(reasons, refusals)
    assert paragraphs
    assert not any(p.startswith("UNEXPLAINED") for p in paragraphs)
    needed = text.split("## What the spec would need for each refused feature")[1]
    assert all(p in needed.split("## The tests, by reason")[0] for p in paragraphs)
    orphan = _needs(["refused: a FancySpec group"], refusals)
    assert orphan == ["UNEXPLAINED refusal: refused: a FancySpec group"]
