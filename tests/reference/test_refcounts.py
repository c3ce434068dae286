"""The compiled reference counting equals its pure-Python definition."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference import native, refcounts
from tests.tiers import tiered

compiled = pytest.importorskip("kvcert.reference._refcounts")
STEPS = [
    (compiled.hold, refcounts.py_hold),
    (compiled.drop, refcounts.py_drop),
    (compiled.set_one, refcounts.py_set_one),
]


def outcome(step, counts, blocks):
    try:
        return ("ok", step(counts, blocks), counts.tolist())
    except (IndexError, TypeError) as error:
        return ("error", type(error), counts.tolist())


@settings(max_examples=tiered(300, 5000))
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=8),
    st.lists(st.integers(-2, 9), max_size=12),
    st.sampled_from(STEPS),
    st.sampled_from([list, tuple, iter]),
)
def test_compiled_steps_equal_the_definitions(counts, blocks, steps, wrap):
    """Same answer, same error, same counts after (nothing changes when a block is out of
    range), for lists, tuples and one-shot iterators of blocks."""
    c_step, py_step = steps
    assert outcome(c_step, array("i", counts), wrap(blocks)) == outcome(
        py_step, array("i", counts), wrap(blocks)
    )


def test_the_counts_must_be_an_int_array():
    with pytest.raises(TypeError, match="array"):
        compiled.hold(array("q", [0, 0]), [1])
    with pytest.raises(TypeError):
        compiled.hold([0, 0], [1])


def test_the_compiled_steps_are_chosen():
    if native.PURE_PYTHON:
        assert refcounts.hold is refcounts.py_hold
    else:
        assert (refcounts.hold, refcounts.drop, refcounts.set_one) == (
            compiled.hold,
            compiled.drop,
            compiled.set_one,
        )
