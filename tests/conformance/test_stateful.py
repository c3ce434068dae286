"""The shipped state machine: the reference passes it, a broken engine does not."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.checks.stateful import machine_for
from kvcert.conformance.engines.mutants import BROKEN
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from tests.tiers import tiered

RUN = settings(
    max_examples=tiered(60, 1000), stateful_step_count=25, deadline=None, derandomize=True
)


def test_reference_passes_the_shipped_machine():
    run_state_machine_as_test(machine_for(ReferenceEngine), settings=RUN)


@pytest.mark.parametrize(
    "name",
    [
        # found after 1,500 to 3,000 runs (20 s); `kvcert check` hunts it in the fast tier too
        pytest.param("allocation before hits", marks=pytest.mark.slow),
        "per-group speculative drop",
        "salt ignored",
        "inner checkpoint ignored",
    ],
)
def test_broken_engines_fail_the_shipped_machine(name):
    engine_class, _ = BROKEN[name]
    # Allocation before hits needs a re-sent prefix while the pool is nearly full: found
    # after 1,500 to over 3,000 examples in our runs (Hypothesis seeds its search with
    # constants from the modules imported so far, so the count depends on test order).
    search = settings(RUN, max_examples=6000, phases=[Phase.generate], print_blob=False)
    with pytest.raises(AssertionError, match="diverges from the spec"):
        run_state_machine_as_test(machine_for(engine_class), settings=search)


@pytest.mark.slow
def test_a_shrunk_failure_becomes_a_regression_vector(tmp_path, monkeypatch):
    """KVCERT_REGRESSION_DIR keeps the minimal failing trace; gen turns it into a vector that
    the broken engine fails and the reference passes."""
    import json

    from kvcert.conformance.certify.runner import run_case
    from kvcert.conformance.engines.reference_engine import ReferenceEngine
    from kvcert.conformance.vectors.generate import alloc as gen

    monkeypatch.setenv("KVCERT_REGRESSION_DIR", str(tmp_path))
    engine_class, _ = BROKEN["visible before written"]
    search = settings(RUN, max_examples=2000, stateful_step_count=15, print_blob=False)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(engine_class), settings=search)
    saved = json.loads((tmp_path / "latest-failure.json").read_text())
    saved["id"] = "alloc.regression.test"
    (tmp_path / "case.json").write_text(json.dumps(saved))
    (tmp_path / "latest-failure.json").unlink()
    monkeypatch.setattr(gen, "REGRESSIONS", tmp_path)
    (case,) = gen.regression_cases()
    assert run_case(ReferenceEngine(), case, 10).status == "passed"
    assert run_case(engine_class(), case, 10).status == "failed"  # not a crash
    assert len(saved["ops"]) <= 12  # shrunk


class NoPreemption(ReferenceEngine):
    """The reference, but its sessions answer every preemption `{"unsupported": why}`
    without applying it, as an engine that cannot express one does."""

    def open(self, case):
        session = super().open(case)

        class Refusing:
            def apply(self, op):
                if op.get("op") == "preempt":
                    return {"unsupported": "preemption is not driven"}
                return session.apply(op)

        return Refusing()


def test_an_operation_a_session_cannot_express_leaves_the_trace():
    """The machine drops an operation answered unsupported and rolls the spec back: the
    rest of the trace still agrees, and the operations left out are counted by reason."""
    machine = machine_for(NoPreemption)
    run_state_machine_as_test(machine, settings=RUN)
    assert machine.unsupported.get("preemption is not driven", 0) > 0
    assert machine.steps > 0


class PreemptsAnyway(NoPreemption):
    """A session that answers unsupported but applies the preemption anyway: the spec and
    the engine part ways, which the machine must find."""

    def open(self, case):
        session = ReferenceEngine.open(self, case)

        class Lying:
            def apply(self, op):
                answer = session.apply(op)
                return {"unsupported": "lied"} if op.get("op") == "preempt" else answer

        return Lying()


def test_an_unsupported_answer_that_changed_the_engine_is_caught():
    search = settings(RUN, max_examples=2000, phases=[Phase.generate], print_blob=False)
    with pytest.raises(AssertionError, match="diverges from the spec"):
        run_state_machine_as_test(machine_for(PreemptsAnyway), settings=search)
