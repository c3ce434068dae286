"""The campaign's committed results without vLLM: the reports, the table generated from them,
docs/campaign.md's figures, and the regression files CI replays."""

from __future__ import annotations

import json
from pathlib import Path

from kvcert.conformance.campaign.command import REPORT_FORMAT, finding_role
from kvcert.conformance.campaign.workload import Workload
from kvcert.conformance.vllm.campaign import results
from tests.docs import words

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "engines" / "vllm" / "campaign"


def test_every_pinned_release_has_both_campaign_reports():
    releases = sorted(p.parent for p in ROOT.glob("engines/vllm/*/requirements.txt"))
    assert releases
    for release in releases:
        plain = json.loads((release / "fuzz.json").read_text(encoding="utf-8"))
        fixed = json.loads((release / "fuzz-fix.json").read_text(encoding="utf-8"))
        for report, fix in ((plain, False), (fixed, True)):
            assert report["format"] == REPORT_FORMAT
            assert report["engine"] == f"vllm {release.name}"
            assert report["fix"] is fix
            assert report.get("mutant") is None
            assert report["runs"] == len(report["seeds"]) >= 2000
        assert plain["seeds"] == fixed["seeds"]


def test_the_results_table_is_generated_from_the_reports():
    text = (CAMPAIGN / "RESULTS.md").read_text(encoding="utf-8")
    inside = text.split(results.BEGIN, 1)[1].split(results.END, 1)[0]
    assert inside.strip() == results.table().strip()


def test_the_docs_quote_the_0_33_campaign_as_reported():
    assert results.headline("0.33.0") in words("campaign")


def test_regressions_say_what_they_show_and_parse():
    files = sorted(CAMPAIGN.glob("vllm-*.json"))
    assert files
    for path in files:
        body = json.loads(path.read_text(encoding="utf-8"))
        assert set(body["expect"]) == {"unfixed", "fixed"}, path.name
        Workload.from_json(body["workload"])
        # a finding recorded in the file is expected at least unfixed
        assert (body.get("violation") is not None) == body["expect"]["unfixed"], path.name


def _all_findings():
    for release, report in results.reports():
        for finding in report["violations"]:
            yield release, report, finding


def test_the_findings_are_the_classes_results_md_traces():
    """RESULTS.md explains every finding by one of five mechanisms; each has a signature in
    the reports, checked here so that a new mechanism cannot hide in a known class."""
    for release, report, finding in _all_findings():
        where = f"{release} seed {finding['seed']}"
        role = finding_role(finding)
        if role == "crash":  # eagle-block-sizes (vllm#39450, #39528)
            assert "aligned_length is not compatible with eagle now" in finding["violation"], where
        elif role == "draft":  # draft-other-writer: drop keying only
            assert finding["keying"] == "drop", where
        elif role == "state" and release in ("0.15.0", "0.16.0"):
            # mamba-same-step (vllm#29387, in 0.17.0): a checkpoint no pass has written yet
            assert "holds no state any forward pass wrote" in finding["shrunk"]["violation"], where
        elif role == "state":  # preempt-in-flight on a state group (vllm#57580): fixed
            assert not report["fix"], where
        elif report["fix"]:  # async-window-free (vllm#47728): the window reads a freed block
            assert finding["keying"] is not None, where
            assert "(sliding_window, block 0)" in finding["shrunk"]["violation"], where
    # exact keying (lookahead hashes) shows no finding in any run
    assert all(f.get("keying") != "exact" for _, _, f in _all_findings())


def test_the_fix_adds_no_target_finding():
    """A target finding of an unfixed run either disappears with the fix (preempt-in-flight)
    or stays (async-window-free, which the fix is not for)."""
    pairs = {}
    for release, report in results.reports():
        pairs.setdefault(release, {})[report["fix"]] = report
    for release, pair in pairs.items():

        def targets(report):
            return {f["seed"] for f in report["violations"] if finding_role(f) == "target"}

        assert targets(pair[True]) <= targets(pair[False]), release


def test_every_pinned_release_has_its_completeness_run_and_kvcerts_serves_the_same():
    """`--fix --families` on every release (0.33.0 with every workload option), and kvcert's
    drop-in on 0.33.0's very workloads: the same seeds and options, no finding, no lost hit."""
    reports = dict(results.completeness_reports()[:-1])
    releases = sorted(p.parent.name for p in ROOT.glob("engines/vllm/*/requirements.txt"))
    assert sorted(reports, key=lambda r: tuple(map(int, r.split(".")))) == sorted(
        releases, key=lambda r: tuple(map(int, r.split(".")))
    )
    for release, report in reports.items():
        assert report["engine"] == f"vllm {release}"
        assert (report["fix"], report["families"]) == (True, True)
        assert report["runs"] == len(report["seeds"]) >= 2000
        assert report["owed_tokens"] > 0
        assert report["served_tokens"] > 0
    kvcert = json.loads((ROOT / "engines/vllm/0.33.0/fuzz-kvcert.json").read_text())
    vllm = reports["0.33.0"]
    assert kvcert["seeds"] == vllm["seeds"]
    assert all(vllm.get(o) for o in ("state_checkpoints", "state_drafts", "mtp"))
    assert kvcert["violations"] == []
    assert kvcert["lost_hits"] == 0


def test_the_completeness_table_is_generated_from_the_reports():
    text = (CAMPAIGN / "RESULTS.md").read_text(encoding="utf-8")
    inside = text.split(results.OWED_BEGIN, 1)[1].split(results.OWED_END, 1)[0]
    assert inside.strip() == results.completeness_table().strip()


def test_every_lost_hit_has_its_cause_and_results_md_traces_each():
    """kvcert.conformance.vllm.campaign.causes named the cause of every lost hit of the
    committed completeness runs (or none: then its shrunk repro is committed and RESULTS.md
    names it), and RESULTS.md explains every cause found."""
    text = " ".join((CAMPAIGN / "RESULTS.md").read_text(encoding="utf-8").split())
    for release, report in results.completeness_reports():
        for finding in report["violations"]:
            if finding_role(finding) != "lost":
                continue
            assert "cause" in finding, (release, finding["seed"])
            cause = finding["cause"]
            if cause is None:
                repro = f"vllm-{release}-seed-{finding['seed']}-lost-hit.json"
                assert (CAMPAIGN / repro).is_file(), repro
                assert repro in text, repro
            else:
                for name in cause.split(" + "):
                    assert f"**{name.split(' (')[0]}**" in text, name
