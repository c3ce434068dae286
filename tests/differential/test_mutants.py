"""The differential machine has teeth: each seeded bug in the reference must be caught."""

from __future__ import annotations

import re

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.checks.stateful import machine_for
from kvcert.conformance.contract.protocol import PROFILES
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.reference import block_pool, coordinator, eviction
from kvcert.reference.errors import KVCacheError

# The seeded bugs below are in hits, keys and free order, whatever the retention profile:
# searched under dense retention, the search budget is not spread over sparse runs (the
# retention mutants are the shipped machine's: kvcert.conformance.engines.mutants).
DENSE = frozenset(p for p in PROFILES if not p.startswith("retention.sparse"))


class ReferenceAgainstSpec(machine_for(ReferenceEngine, profiles=DENSE)):  # type: ignore[misc]
    """The shipped machine on kvcert.reference, dense retention."""


# Detection only: no shrinking (issue 7 measures find-and-shrink times separately). A
# caught mutant stops the search at its first divergence, so the budget costs time only
# when a mutant escapes. It has margin because the search's outcome depends on what the
# process imported before, cause not found (measured: after `import kvcert.conformance.cli` the
# missing-prerequisites mutant escaped 400 examples and was caught within 2,000; alone,
# within a few dozen), and pytest-xdist decides what a worker imported first.
SEARCH = settings(
    max_examples=2000,
    stateful_step_count=80,
    derandomize=True,
    deadline=None,
    print_blob=False,
    phases=[Phase.generate],
)
# What a divergence raises: a failed comparison or invariant, an error only the reference
# raised, or pytest's "DID NOT RAISE" when only the spec refused.
DIVERGENCE = (AssertionError, KVCacheError, pytest.fail.Exception)


# A mutant that no longer fits the code it patches crashes instead of misbehaving; that is
# not the seeded bug being caught.
STALE_MUTANT = re.compile(r"raised (TypeError|AttributeError|NameError)\b")


def must_fail() -> None:
    with pytest.raises(DIVERGENCE) as caught:
        run_state_machine_as_test(ReferenceAgainstSpec, settings=SEARCH)
    assert not STALE_MUTANT.search(str(caught.value)), f"the mutant crashed: {caught.value}"


def test_reused_block_keeps_its_old_key(monkeypatch):
    """Bug: a block popped for new content stays registered (stale hits)."""
    monkeypatch.setattr(block_pool.BlockPool, "_forget", lambda self, block, evicted=True: None)
    must_fail()


def test_release_in_forward_order(monkeypatch):
    """Bug: blocks join the free queue first position first (another eviction order)."""
    original = block_pool.BlockPool.release
    monkeypatch.setattr(
        block_pool.BlockPool,
        "release",
        lambda self, blocks, cold=False: original(self, reversed(list(blocks)), cold),
    )
    must_fail()


def test_drop_applied_twice(monkeypatch):
    """Bug: the speculative drop steps down twice (vLLM 0.16-0.19's double drop)."""
    original = coordinator._first_accepted

    def one_more(top, alignment, refusal, count):
        found = original(top, alignment, refusal, count)
        if count < 2 or len(found) < 2 or found[1] == 0:
            return found
        return found[1:] + original(found[1] - alignment, alignment, refusal, 1)

    monkeypatch.setattr(coordinator, "_first_accepted", one_more)
    must_fail()


def test_hybrid_counts_only_empty_blocks_as_dead(monkeypatch):
    """Bug: shadowed copies and orphans are not dead (EVICT-DEAD-1 reduced to "no key")."""
    monkeypatch.setattr(block_pool.BlockPool, "is_dead", lambda self, b: self.key_of(b) is None)
    must_fail()


def test_hybrid_ignores_missing_prerequisites(monkeypatch):
    """Bug: EVICT-DEAD-1 without its prerequisite keys (only empty and shadowed blocks die)."""
    original = block_pool.BlockPool.register
    monkeypatch.setattr(
        block_pool.BlockPool,
        "register",
        lambda self, block, group, key, prerequisites=(): original(self, block, group, key, ()),
    )
    must_fail()


def test_hybrid_blocks_freed_mid_request_are_not_cold(monkeypatch):
    """Bug: blocks a running request releases (ALLOC-SKIP-1) are not marked cold."""
    original = block_pool.BlockPool.release
    monkeypatch.setattr(
        block_pool.BlockPool,
        "release",
        lambda self, blocks, cold=False: original(self, blocks, False),
    )
    must_fail()


def test_unkeyed_first_run_reversed(monkeypatch):
    """Bug: lru-unkeyed-first puts a group's unregistered blocks at the head in reverse order
    (ALLOC-FREE-2 keeps ALLOC-FREE-1's order within the run)."""
    original = eviction.FreeQueue._prepend
    monkeypatch.setattr(
        eviction.FreeQueue,
        "_prepend",
        lambda self, blocks: original(self, blocks[::-1]),
    )
    must_fail()
