"""The vLLM drop-in's compiled `_wrap` (`_decodelane.wrap_blocks`): its contract, read here
without vLLM (the block class and views are stand-ins). Through vLLM's own Scheduler,
kvcert.conformance.vllm.checks.drop_in_lane holds it to the Python `_wrap` call for call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.reference.native import native

compiled = native("_decodelane")
pytestmark = pytest.mark.skipif(compiled is None, reason="the _decodelane extension is not built")

VIEWS = [object() for _ in range(12)]
EMPTY = object()


@dataclass
class Blocks:  # vLLM's KVCacheBlocks: one field, the tuple of per-group lists
    blocks: tuple[list[Any], ...]


def wrapped(tables: Any) -> Any:
    return compiled.wrap_blocks(VIEWS, tables, Blocks, EMPTY)  # type: ignore[union-attr]


@given(
    st.lists(st.lists(st.integers(0, len(VIEWS) - 1), max_size=6), max_size=4),
    st.sampled_from([tuple, list]),
    st.sampled_from([tuple, list]),
)
def test_it_wraps_ids_in_their_views(tables, outer, inner):
    """Lists or tuples of ids within the views: the empty answer when every table is empty,
    else one new list of views per table, in a tuple, given to the block class."""
    shaped = outer(inner(t) for t in tables)
    answer = wrapped(shaped)
    if not any(tables):
        assert answer is EMPTY
        return
    assert type(answer) is Blocks
    assert type(answer.blocks) is tuple
    assert all(type(group) is list for group in answer.blocks)
    assert [[VIEWS.index(v) for v in group] for group in answer.blocks] == tables


@pytest.mark.parametrize(
    "tables",
    [
        ((1, -1),),  # a negative id: the view list's own indexing would wrap it
        ((1, len(VIEWS)),),  # past the views
        ((1, 2.0),),  # not an int
        ((1, True),),  # a bool is no block id
        ((1, 2**70),),
        (range(3),),  # another sequence
        iter([(1,)]),  # not a list or tuple of tables
        [[], (1,), "ab"],
    ],
)
def test_anything_else_is_left_to_the_definition(tables):
    """None, with nothing raised: the Python `_wrap` then answers (or raises) as it would."""
    assert wrapped(tables) is None


def test_its_arguments_are_checked():
    with pytest.raises(TypeError, match="takes 4 arguments"):
        compiled.wrap_blocks(VIEWS, ((1,),), Blocks)  # type: ignore[union-attr, call-arg]
    assert compiled.wrap_blocks(tuple(VIEWS), ((1,),), Blocks, EMPTY) is None  # type: ignore[union-attr]
