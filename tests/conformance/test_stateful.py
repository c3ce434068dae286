"""The shipped state machine: the reference passes it, a broken engine does not."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.engines import ReferenceEngine
from kvcert.conformance.stateful import machine_for
from tests.conformance.broken import BROKEN

RUN = settings(max_examples=60, stateful_step_count=25, deadline=None, derandomize=True)


def test_reference_passes_the_shipped_machine():
    run_state_machine_as_test(machine_for(ReferenceEngine), settings=RUN)


@pytest.mark.parametrize(
    "name", ["allocation before hits", "per-group speculative drop", "salt ignored"]
)
def test_broken_engines_fail_the_shipped_machine(name):
    engine_class, _ = BROKEN[name]
    search = settings(RUN, max_examples=300, phases=[Phase.generate], print_blob=False)
    with pytest.raises(AssertionError, match="diverges from the spec"):
        run_state_machine_as_test(machine_for(engine_class), settings=search)
