"""The reference allocator against the spec state machine, step by step.

This is the machine kvcert ships to engine authors (kvcert.conformance.checks.stateful),
pointed at kvcert.reference through its session API: every operation goes to both, the
observations must agree up to a consistent renaming of block ids, misuse must be refused by
both, and the spec's invariants must hold after every step; every eviction profile, cache
resets, extra keys and speculative lookahead are drawn.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.checks.stateful import machine_for
from kvcert.conformance.contract.protocol import FEATURES
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.reference import block_pool
from kvcert.reference.keyindex import PyKeyIndex
from tests.tiers import tiered


class ReferenceAgainstSpec(machine_for(ReferenceEngine)):  # type: ignore[misc]
    """The shipped machine on kvcert.reference."""


UNIT_PROFILES = frozenset(
    {"eviction.lru", "eviction.lru-unkeyed-first", "visibility.step-end", "visibility.same-pass",
     "retention.dense", "retention.sparse", "retention.sparse-interval", "hit.unit"}
)  # fmt: skip


UNIT_FEATURES = frozenset(FEATURES) - {"speculative.drop"}  # ALLOC-UNIT-1: drafts keyed exactly


class ReferenceAgainstSpecUnderUnit(
    machine_for(  # type: ignore[misc]
        ReferenceEngine, features=UNIT_FEATURES, profiles=UNIT_PROFILES, every_run_unit=True
    )
):
    """The same machine with every run under `unit U` (ALLOC-UNIT-1..4, HIT-UNIT-5): tail
    keys (draft groups' too, keyed exactly), the copies of hits inside blocks and of kept
    state checkpoints, under step-end and same-pass visibility, dense and sparse retention."""


def test_reference_matches_the_spec_for_ten_thousand_steps():
    """Differential, stateful: >= 10k operations per run (>= 200k in the long tier)."""
    ReferenceAgainstSpec.steps = 0
    runs = tiered(400, 7000)  # about 33 steps a run: >= 10k (200k) with margin
    run_state_machine_as_test(
        ReferenceAgainstSpec, settings=settings(max_examples=runs, stateful_step_count=80)
    )
    assert ReferenceAgainstSpec.steps >= tiered(10_000, 200_000), ReferenceAgainstSpec.steps


def test_reference_matches_the_spec_under_unit():
    """Every run under `unit U` (the runs above draw it in a fraction of theirs)."""
    ReferenceAgainstSpecUnderUnit.steps = 0
    run_state_machine_as_test(
        ReferenceAgainstSpecUnderUnit,
        settings=settings(max_examples=tiered(300, 5000), stateful_step_count=80),
    )
    assert ReferenceAgainstSpecUnderUnit.steps >= tiered(6_000, 150_000)


def test_the_pure_python_key_index_matches_the_spec_too(monkeypatch):
    """The same machine with the pool on the fallback PyKeyIndex (what a machine without a C
    compiler runs); the default run above uses the compiled one."""
    monkeypatch.setattr(block_pool, "KeyIndex", PyKeyIndex)
    ReferenceAgainstSpec.steps = 0
    run_state_machine_as_test(
        ReferenceAgainstSpec,
        settings=settings(max_examples=tiered(150, 3000), stateful_step_count=80),
    )
    assert ReferenceAgainstSpec.steps >= tiered(3_000, 80_000), ReferenceAgainstSpec.steps
