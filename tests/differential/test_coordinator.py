"""The reference's hybrid search returns the spec's hit on every drawn cache view."""

from __future__ import annotations

from array import array

from hypothesis import example, given

from kvcert.conformance.contract.codec import layout_to_json, to_ranges
from kvcert.conformance.engines.reference_engine import ReferenceEngine, config_from_json
from kvcert.reference.coordinator import BLOCK_IDS, find_hit
from kvcert.reference.unit_hits import find_unit_hit
from kvcert.spec import (
    NULL,
    FullAttention,
    Layout,
    MambaState,
    SlidingWindow,
    Speculative,
    hybrid_hit,
)
from kvcert.spec.view import CacheView, keyable_blocks
from tests.strategies import layouts, unit_views, views


def config_of(layout, num_blocks):
    """A spec layout as the reference's configuration (through the vector JSON)."""
    return config_from_json(layout_to_json(layout), num_blocks)


def searched_as_the_spec(view, keys):
    """find_hit over `view` with block j keyed j (`keys`: per group, the keys it holds),
    held to the spec's hit: equal length and equal block lists; returns what it read."""
    config = config_of(view.layout, 2)
    ids = {(g, j): 1 + 1000 * g + j for g, blocks in enumerate(view.cached) for j in blocks}
    served = [{j: ids[(g, j)] for j in blocks} for g, blocks in enumerate(view.cached)]
    length, tables = find_hit(config, view.num_tokens, keys, served)
    expected = hybrid_hit(view)
    assert length == expected.length
    assert tables == [
        [0 if j is NULL else ids[(g, j)] for j in blocks]
        for g, blocks in enumerate(expected.blocks)
    ]
    return config, served, length, tables


@given(views())
def test_find_hit_equals_the_spec(view):
    """Implements HIT-HYB-1/HIT-SPEC-1/HIT-SPEC-2: equal length and equal block lists."""
    keys = [range(view.num_tokens) for _ in view.cached]  # block j keyed by its index
    config, served, length, tables = searched_as_the_spec(view, keys)
    packed_length, packed = find_hit(config, view.num_tokens, keys, served, packed=True)
    assert packed_length == length  # the packed answer: the same blocks, int32 arrays
    assert all(isinstance(t, array) and t.typecode == BLOCK_IDS for t in packed)
    assert [t.tolist() for t in packed] == tables


# a 3-token drafter's window group keys one of its two blocks at 10 tokens: the full
# group's prefix (8 tokens) must not be accepted through a window run read short
DRAFT_REACH_3 = Layout(
    (FullAttention(block_size=4), SlidingWindow(block_size=4, window=8, draft=True)),
    speculative=Speculative.EXACT,
    draft_reach=3,
)


@given(views(layouts(reach=True)))
@example(CacheView(DRAFT_REACH_3, 10, (frozenset({0, 1}), frozenset({0}))))
def test_find_hit_equals_the_spec_with_only_the_keys_that_exist(view):
    """As above, with each group holding a key for its keyable blocks only, as the manager's
    chains do (HASH-DRAFT-1: a draft group under exact keying has none for its last
    blocks until the draft_reach tokens after them exist; drafters reading up to 3 tokens
    ahead): a run past a group's last key is refused, not read short."""
    groups = range(len(view.cached))
    searched_as_the_spec(
        view, [range(keyable_blocks(view.layout, g, view.num_tokens)) for g in groups]
    )


@given(unit_views())
def test_find_unit_hit_equals_the_spec(view):
    """Implements HIT-UNIT-1..4 with HIT-HYB-1/HIT-SPEC-1/HIT-SPEC-2: the reference's unit
    search (kvcert.reference.unit_hits), through the conformance engine's JSON, gives the
    spec's length and block lists on views with partial keys."""
    case = {
        "suite": "hit",
        "layout": layout_to_json(view.layout),
        "num_tokens": view.num_tokens,
        "cached": [to_ranges(c) for c in view.cached],
        "partial": [sorted(p) for p in view.partial],
    }
    expected = hybrid_hit(view)
    answer = ReferenceEngine().run(case)
    assert answer == {"hit": expected.length, "blocks": [list(b) for b in expected.blocks]}


@given(unit_views(flight=True))
def test_find_unit_hit_equals_the_spec_with_blocks_in_flight(view):
    """Implements HIT-UNIT-5 too: with attention blocks in flight (same-pass), the reference's
    unit search gives the spec's length, its table entries, and a copy source that is never a
    block in flight but under a key reaching the hit (the spec's ALLOC-UNIT-3 choice)."""
    layout, unit = view.layout, view.layout.hit_unit
    config = config_of(layout, 2)
    whole = {(g, j): 1 + 1000 * g + j for g, c in enumerate(view.cached) for j in c}
    part = {(g, p): 500 + 1000 * g + p for g, ps in enumerate(view.partial) for p in ps}
    keys = [range(view.num_tokens // unit) for _ in layout.groups]  # key i: (i + 1) * U tokens
    served = []
    for g, group in enumerate(layout.groups):
        per_key = {
            (j + 1) * group.block_size // unit - 1: b for (h, j), b in whole.items() if h == g
        }
        per_key |= {p // unit - 1: b for (h, p), b in part.items() if h == g}
        served.append(per_key)
    flying = {whole[g, j] for g, f in enumerate(view.in_flight) for j in f}
    length, tables = find_unit_hit(config, view.num_tokens, keys, served, flying)
    expected = hybrid_hit(view)
    assert length == expected.length

    def source(g, j):
        size = layout.groups[g].block_size
        if isinstance(layout.groups[g], MambaState):
            return part[g, length]
        if j in view.cached[g] and j not in view.in_flight[g]:
            return whole[g, j]
        return part[g, max(p for p in view.partial[g] if p // size == j)]

    assert tables == [
        [
            0 if j is NULL
            else source(g, j) if (j + 1) * layout.groups[g].block_size > length
            else whole[g, j]
            for j in blocks
        ]
        for g, blocks in enumerate(expected.blocks)
    ]  # fmt: skip
