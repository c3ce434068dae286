"""The spec's twin for SGLang before 0.5.19: the tree evicts the whole ask, not the shortfall.

RADIX-EVICT-1 evicts leaves until the allocation's target (the chunk's tokens plus a page)
is free. Up to 0.5.15, `evict_from_tree_cache` asked the tree to evict the whole target
whenever any of it was missing; sglang#32016 (merged 2026-07-22, first in 0.5.19) made it
evict the shortfall only:

    B=4, 2 pages free, prefill of 8 tokens -> target 8 + 4 = 12 tokens = 3 pages
    shortfall (the spec, 0.5.19 on):   evict 1 page's worth:  one leaf of 1 page goes
    whole ask (0.5.9, 0.5.15):         evict 3 pages' worth:  leaves of 3 pages go

The twin is §13 with that one reading changed. The conformance report names a radix vector
that SGLang fails as this cause only where the twin's answer differs from the spec's, and
`checks.shortfall_eviction` shows each release agreeing with one of the two on every
radix vector.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.cases import spec_answer
from kvcert.spec import radix

Evict = Callable[[radix.State, int], radix.State]


def whole_ask(shortfall: Evict) -> Evict:
    """The eviction before sglang#32016, from the spec's: whenever fewer than `target`
    tokens' pages are free, whole leaves go, least recently used first, until `target`
    tokens' pages have been evicted."""

    def evict(state: radix.State, target: int) -> radix.State:
        size = state.config.layout.groups[0].block_size
        if radix.free_pages(state) * size >= target:
            return state
        start = radix.free_pages(state)
        while (radix.free_pages(state) - start) * size < target:
            fewer = shortfall(state, (radix.free_pages(state) + 1) * size)  # one more leaf
            if fewer == state:
                break  # nothing left to evict
            state = fewer
        return state

    return evict


@contextlib.contextmanager
def whole_ask_eviction() -> Iterator[None]:
    """While open, the spec's §13 answers as SGLang before 0.5.19 (not thread-safe: it
    swaps the module's function)."""
    shortfall = radix.evict
    setattr(radix, "evict", whole_ask(shortfall))  # noqa: B010 - mypy refuses assigning to a function
    try:
        yield
    finally:
        setattr(radix, "evict", shortfall)  # noqa: B010


def twin_answer(case_input: JSON) -> JSON:
    """The twin's answer to an alloc case, as a vector's expectation."""
    with whole_ask_eviction():
        return spec_answer(case_input)[0]


def follows_whole_ask(case: JSON) -> bool:
    """Whether the vector's expectation is one the twin answers otherwise: only then can the
    whole-ask eviction be why an engine fails it."""
    return bool(twin_answer(case["input"]) != case["expect"])
