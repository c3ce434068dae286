"""kvcert.reference's radix tree against the spec's (§13), step by step, through the machine
kvcert ships: every run under the radix profile, page ids compared as lifetimes
(RADIX-ID-1), the spec's invariants (RADIX-INV-1) after every step."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.checks.stateful import machine_for
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.reference.radix import RadixCacheManager
from tests.differential.test_mutants import DIVERGENCE, SEARCH, STALE_MUTANT
from tests.tiers import tiered

RADIX_PROFILES = frozenset({"eviction.radix", "visibility.step-end", "retention.dense"})


class RadixAgainstSpec(machine_for(ReferenceEngine, profiles=RADIX_PROFILES)):  # type: ignore[misc]
    """The shipped machine on kvcert.reference.radix."""


def test_the_reference_tree_matches_the_spec():
    """Differential, stateful: >= 6k operations per run (>= 150k in the long tier)."""
    RadixAgainstSpec.steps = 0
    run_state_machine_as_test(
        RadixAgainstSpec, settings=settings(max_examples=tiered(250, 5000), stateful_step_count=80)
    )
    assert RadixAgainstSpec.steps >= tiered(6_000, 150_000), RadixAgainstSpec.steps


# Detection only, with tests/differential/test_mutants.py's budget: a caught twin stops at
# its first divergence, so the budget costs time only when one escapes.


def must_fail() -> None:
    with pytest.raises(DIVERGENCE) as caught:
        run_state_machine_as_test(RadixAgainstSpec, settings=SEARCH)
    assert not STALE_MUTANT.search(str(caught.value)), f"the twin crashed: {caught.value}"


def test_a_tree_publishing_decoded_pages_at_step_end_is_caught(monkeypatch):
    """Twin of RADIX-PUB-2: a decode step's pages join the tree when its step ends."""
    original = RadixCacheManager.end_step

    def eager(self: RadixCacheManager) -> int:
        for request in self._requests.values():
            request.decoding = False
        return original(self)

    monkeypatch.setattr(RadixCacheManager, "end_step", eager)
    must_fail()


def test_a_tree_freeing_the_prefix_it_lent_is_caught(monkeypatch):
    """Twin of RADIX-FREE-1: a release frees the locked path's pages too (a double free)."""
    original = RadixCacheManager._release

    def freeing(self: RadixCacheManager, rid: str, held: list[int]) -> int:
        request = self._requests[rid]
        self._free += request.table[: request.protected]
        return original(self, rid, held)

    monkeypatch.setattr(RadixCacheManager, "_release", freeing)
    must_fail()


def test_a_tree_evicting_only_the_chunk_is_caught(monkeypatch):
    """Twin of RADIX-EVICT-1: the eviction's target leaves out SGLang's extra page."""
    original = RadixCacheManager._evict
    monkeypatch.setattr(
        RadixCacheManager, "_evict", lambda self, target: original(self, target - self.page)
    )
    must_fail()


def test_a_tree_evicting_the_newest_leaf_is_caught(monkeypatch):
    """Twin of RADIX-LRU-1: stamps count down, so the most recently used leaf goes first."""

    def backwards(self: RadixCacheManager) -> tuple[int, int]:
        self._clock += 1
        return (-self._clock, 0)

    monkeypatch.setattr(RadixCacheManager, "_tick", backwards)
    must_fail()


def test_a_tree_keeping_duplicate_pages_is_caught(monkeypatch):
    """Twin of RADIX-DEDUP-1: an insert frees none of the request's pages the tree holds
    already (they leak)."""
    original = RadixCacheManager._insert
    monkeypatch.setattr(
        RadixCacheManager,
        "_insert",
        lambda self, keys, pages, protected: original(self, keys, pages, len(keys)),
    )
    must_fail()
