"""`kvcert check`: verdict rows, the JSON report, honest failure, and its three parts."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, Phase, settings

pytest.importorskip("z3", reason="the proofs extra: pip install -c constraints.txt '.[proofs]'")
pytest.importorskip("crosshair", reason="the symbolic extra: '.[symbolic]'")

from kvcert.conformance.checks import check
from kvcert.conformance.checks.proofs import tier
from kvcert.conformance.cli import main
from kvcert.conformance.engines.mutants import BROKEN
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from tests.tiers import tiered


def test_z3_part_passes_and_writes_json(tmp_path, capsys, monkeypatch):
    """The command's plumbing on a proof and its twin (tests/proofs discharges every
    obligation, and scripts/test.sh runs the whole `kvcert check` once more)."""
    from kvcert.conformance.checks import proofs

    chosen = [o for o in tier("pr") if o.id in {"THM-HYB-SEARCH", "TWIN-HYB-TWO-GROUP"}]
    assert len(chosen) == 2
    monkeypatch.setattr(proofs, "tier", lambda name: chosen)
    target = tmp_path / "check.json"
    assert main(["check", "--only", "z3", "--json", str(target)]) == 0
    report = json.loads(target.read_text())
    assert report["tier"] == "pr"
    assert len(report["rows"]) == 2
    assert all(row["ok"] for row in report["rows"])
    out = capsys.readouterr().out
    assert "THM-HYB-SEARCH" in out
    assert "check: 2 as expected, 0 unexpected" in out


def test_list_and_bad_arguments(capsys):
    assert main(["check", "--list", "--tier", "long"]) == 0
    assert "THM-HYB-SEARCH-LONG" in capsys.readouterr().out
    assert main(["check", "--only", "z3,coq"]) == 2
    assert "--only takes" in capsys.readouterr().err


def test_an_unexpected_verdict_fails_the_run(monkeypatch, capsys):
    def lying(_tier, _jobs):
        yield check.Row("z3", "THM-FAKE", "proved", "unknown", 0.1, "z3 gave up")

    monkeypatch.setitem(check.RUNNERS, "z3", lying)
    assert main(["check", "--only", "z3"]) == 1
    out = capsys.readouterr().out
    assert "UNEXPECTED" in out
    assert "z3 gave up" in out
    assert "0 as expected, 1 unexpected" in out


def test_parts_run_side_by_side_and_report_in_the_order_asked(monkeypatch, capsys):
    """With two jobs both parts are in flight at once (each waits for the other at a barrier,
    which a part run alone would break after 60 s), and the table keeps the parts' order."""
    meeting = threading.Barrier(2, timeout=60)

    def part(name):
        def rows(_tier, _jobs):
            meeting.wait()
            yield check.Row(name, f"{name} row", "proved", "proved", 0.1)

        return rows

    for name in ("z3", "hypothesis"):
        monkeypatch.setitem(check.RUNNERS, name, part(name))
    assert main(["check", "--only", "hypothesis,z3", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.index("hypothesis row") < out.index("z3 row")
    assert "check: 2 as expected, 0 unexpected" in out


def test_one_job_runs_the_parts_in_turn(monkeypatch, capsys):
    order = []

    def part(name):
        def rows(_tier, jobs):
            order.append((name, jobs))
            yield check.Row(name, f"{name} row", "proved", "proved", 0.1)

        return rows

    for name in ("z3", "hypothesis"):
        monkeypatch.setitem(check.RUNNERS, name, part(name))
    assert main(["check", "--only", "z3,hypothesis", "--jobs", "1"]) == 0
    assert order == [("z3", 1), ("hypothesis", 1)]


def test_crosshair_golden_controls_and_diffbehavior():
    """A correct function passes, a buggy one fails, and diffbehavior finds the off-by-one."""
    budget = ["--max_iterations", "40"]
    for target, expected in check.GOLDEN:
        got, _, detail = check._crosshair(["check", *budget, target], 120)
        assert got == expected, detail
    spec_side, buggy, expected = check.DIFF_TARGETS[2]
    got, _, detail = check._crosshair(
        ["diffbehavior", "--max_uninteresting_iterations", "20", spec_side, buggy], 120
    )
    assert got == expected == check.FOUND, detail
    got, _, detail = check._crosshair(["check", *budget, "no.such.module.function"], 60)
    assert got == "error"


def test_a_spec_contract_holds_within_budget():
    got, _, detail = check._crosshair(
        ["check", "--max_iterations", "40", "kvcert.spec.plan.split_bucket"], 120
    )
    assert got == check.NO_COUNTEREXAMPLE, detail


# What crosshair-tool 0.0.112 printed, exit status 1, when it crashed on group_size's Fraction
# (on a loaded machine `kvcert check` once read it as a counterexample and failed the tier).
CROSSHAIR_CRASH = """Traceback (most recent call last):
  File "/x/crosshair/core.py", line 1619, in attempt_call
    original_args = gen_args(conditions.sig)
  File "/x/crosshair/libimpl/fractionlib.py", line 11, in _make_fraction
    force_true(d > 0)
  File "/x/crosshair/statespace.py", line 275, in force_true
    raise CrossHairInternal(
crosshair.util.CrossHairInternal: Attempted to call assert_true on a non-symbolic"""


@pytest.mark.parametrize(
    ("returncode", "output", "verdict"),
    [
        (1, CROSSHAIR_CRASH, check.CRASHED),
        (0, CROSSHAIR_CRASH, check.CRASHED),
        (1, "/a/b.py:97: error: false when calling f([8, 7], 64) (which returns 64)", check.FOUND),
        (1, "Given: (length=4096, window=1, block=1),\n  f : returns 1\n  g : returns 0",
         check.FOUND),
        (0, "", check.NO_COUNTEREXAMPLE),
        (1, "", "error"),
        (1, "some other complaint", "error"),
        (2, "error: no such target", "error"),
        (2, CROSSHAIR_CRASH, "error"),
    ],
)  # fmt: skip
def test_a_crosshair_crash_is_crashed_never_a_counterexample(returncode, output, verdict):
    assert check.crosshair_verdict(returncode, output) == verdict


def test_crosshair_budgets_are_paths_not_seconds():
    """No verdict may depend on machine load: every CrossHair task of every tier is bounded by
    a count (paths, uninteresting iterations), with the solver under a work limit."""
    for name in ("pr", "long"):
        for task in check.crosshair_tasks(check.TIERS[name]):
            label, _, args, _ = task
            assert "--per_condition_timeout" not in args, label
            assert "--max_iterations" in args or "--max_uninteresting_iterations" in args, label
    assert check.SOLVER_RLIMIT > 0


SEARCH = settings(
    max_examples=2000,
    stateful_step_count=15,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def test_machines_pass_on_the_spec_and_reference_and_find_a_bug_class():
    """The hypothesis part's plumbing. The bug class is one this search finds in a few runs
    ("sliding window without -1" took it 27 s); `kvcert check --tier pr`, which
    scripts/test.sh runs after this suite, hunts every seeded bug class."""
    machine = settings(SEARCH, max_examples=tiered(100, 2000))
    assert check._run_machine(None, machine).got == "no divergence"
    assert check._run_machine(ReferenceEngine, machine).got == "no divergence"
    engine_class, _ = BROKEN["salt ignored"]
    result = check._run_machine(engine_class, SEARCH)
    assert result.got == check.FOUND
    assert 0 < result.find_seconds <= result.total_seconds
    assert result.shrunk_ops >= 1


def test_a_crashing_engine_is_not_reported_as_the_seeded_bug():
    """A mutant whose patch no longer fits the code raises TypeError; that is a crash, not the
    counterexample its bug class expects."""
    from kvcert.conformance.engines.mutants import Mutant

    class Stale(Mutant):
        def rewrite(self, op):
            raise TypeError("rewrite() takes 2 positional arguments but 3 were given")

    assert check._run_machine(Stale, SEARCH).got == "crashed"


def test_missing_tools_are_named(monkeypatch):
    monkeypatch.setattr(check.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="kvcert check needs z3"):
        check.run(check_args(only="z3"))


def check_args(**overrides):
    import argparse

    values = {"tier": "pr", "only": "z3", "json": None, "list": False, "jobs": 1} | overrides
    return argparse.Namespace(**values)
