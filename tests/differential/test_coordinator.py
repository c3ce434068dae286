"""The reference's hybrid search returns the spec's hit on every drawn cache view."""

from __future__ import annotations

from hypothesis import given

from kvcert.conformance.reference_engine import cache_config
from kvcert.reference.coordinator import find_hit
from kvcert.spec import NULL, hybrid_hit
from tests.strategies import views


@given(views())
def test_find_hit_equals_the_spec(view):
    """Implements HIT-HYB-1/HIT-SPEC-1/HIT-SPEC-2: equal length and equal block lists."""
    config = cache_config(view.layout, 2)
    ids = {(g, j): 1 + 1000 * g + j for g, blocks in enumerate(view.cached) for j in blocks}
    length, tables = find_hit(config, view.num_tokens, lambda g, j: ids.get((g, j)))
    expected = hybrid_hit(view)
    assert length == expected.length
    assert tables == [
        [0 if j is NULL else ids[(g, j)] for j in blocks]
        for g, blocks in enumerate(expected.blocks)
    ]
