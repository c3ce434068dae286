"""The reference's hybrid search returns the spec's hit on every drawn cache view."""

from __future__ import annotations

from hypothesis import given

from kvcert.conformance.contract.codec import layout_to_json, to_ranges
from kvcert.conformance.engines.reference_engine import ReferenceEngine, config_from_json
from kvcert.reference.coordinator import find_hit
from kvcert.spec import NULL, hybrid_hit
from tests.strategies import unit_views, views


def config_of(layout, num_blocks):
    """A spec layout as the reference's configuration (through the vector JSON)."""
    return config_from_json(layout_to_json(layout), num_blocks)


@given(views())
def test_find_hit_equals_the_spec(view):
    """Implements HIT-HYB-1/HIT-SPEC-1/HIT-SPEC-2: equal length and equal block lists."""
    config = config_of(view.layout, 2)
    ids = {(g, j): 1 + 1000 * g + j for g, blocks in enumerate(view.cached) for j in blocks}
    keys = [range(view.num_tokens) for _ in view.cached]  # block j keyed by its index
    served = [{j: ids[(g, j)] for j in blocks} for g, blocks in enumerate(view.cached)]
    length, tables = find_hit(config, view.num_tokens, keys, served)
    expected = hybrid_hit(view)
    assert length == expected.length
    assert tables == [
        [0 if j is NULL else ids[(g, j)] for j in blocks]
        for g, blocks in enumerate(expected.blocks)
    ]


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
