"""The compiled reference counting equals its pure-Python definition."""

from __future__ import annotations

from array import array
from typing import Any

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
    (compiled.count_free, refcounts.py_count_free),
]


def outcome(step, counts, blocks):
    try:
        return ("ok", step(counts, blocks), counts.tolist())
    except (IndexError, TypeError) as error:
        return ("error", type(error), counts.tolist())


@settings(max_examples=tiered(300, 5000))
@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=8),  # 0 or less: free
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


def ring(order: list[int], held: dict[int, int], size: int) -> tuple[array, array]:
    """Counts and links as the lru queue keeps them: `order` free in that order (block 0 the
    sentinel), every other block held `held[b]` times."""
    counts, links = array("i", [0]) * size, array("i", [0]) * size
    for block in range(1, size):
        counts[block] = held.get(block, 1)
    previous = 0
    for block in order:
        links[previous], counts[block] = block, -previous
        previous = block
    links[previous], counts[0] = 0, -previous
    return counts, links


def walk(counts: array, links: array) -> list[int]:
    """The queue front to back, each step checked against the predecessor kept in counts."""
    order, previous, block = [], 0, links[0]
    while block:
        assert counts[block] == -previous
        order.append(block)
        previous, block = block, links[block]
    assert counts[0] == -previous
    return order


def rings(extra: Any) -> st.SearchStrategy[tuple[Any, ...]]:
    """(size, the free queue's order, blocks in or just outside 1..size - 1, and `extra`
    drawn for that size)."""
    return st.integers(1, 9).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.permutations(range(1, size)).flatmap(
                lambda p: st.integers(0, len(p)).map(lambda k: p[:k])
            ),
            st.lists(st.integers(-1, size), max_size=12),
            extra(size),
        )
    )


@settings(max_examples=tiered(300, 5000))
@given(rings(lambda size: st.sampled_from([list, tuple, iter])))
def test_holding_unlinks_the_revived_blocks_from_the_queue(case):
    """With the lru queue's links, the compiled hold equals the definition (answer, error,
    counts and links after), and both leave the queue as it was minus the revived blocks, in
    order, each revived block held once more per listing."""
    size, order, blocks, wrap = case
    held = {b: 1 + b % 3 for b in range(1, size) if b not in order}
    results = []
    for step in (compiled.hold, refcounts.py_hold):
        counts, links = ring(list(order), held, size)
        try:
            answer = ("ok", step(counts, wrap(blocks), links))
        except (IndexError, ValueError, TypeError) as error:
            answer = ("error", type(error))
        results.append((answer, counts.tolist(), links.tolist()))
    assert results[0] == results[1]
    (answer, counts_after, links_after) = results[0]
    if answer[0] == "ok":
        counts, links = array("i", counts_after), array("i", links_after)
        assert answer[1] == [b for i, b in enumerate(blocks) if b in order and b not in blocks[:i]]
        assert walk(counts, links) == [b for b in order if b not in blocks]
        for block in set(blocks):
            assert counts[block] == (0 if block in order else held[block]) + blocks.count(block)
    else:
        assert any(not 1 <= b < size for b in blocks)
        assert results[0][1:] == (
            ring(list(order), held, size)[0].tolist(),
            ring(list(order), held, size)[1].tolist(),
        )


def test_links_must_match_the_counts():
    counts, _ = ring([1, 2], {}, 4)
    with pytest.raises(ValueError, match="one per block"):
        compiled.hold(counts, [1], array("i", [0, 0]))
    with pytest.raises(ValueError, match="one per block"):
        refcounts.py_hold(counts, [1], array("i", [0, 0]))
    with pytest.raises(TypeError, match="links"):
        compiled.hold(counts, [1], [0, 0, 0, 0])


def test_corrupt_links_are_refused_not_followed():
    """Entries no queue kept (a free block whose neighbour lies outside the pool) raise
    instead of writing outside the arrays."""
    counts, links = ring([1, 2], {}, 4)
    links[1] = 99
    for step in (compiled.hold, refcounts.py_hold):
        with pytest.raises(ValueError, match="not kept by one queue"):
            step(array("i", counts), [1], array("i", links))


def test_the_counts_must_be_an_int_array():
    with pytest.raises(TypeError, match="array"):
        compiled.hold(array("q", [0, 0]), [1])
    with pytest.raises(TypeError):
        compiled.hold([0, 0], [1])


def test_the_compiled_steps_are_chosen():
    if native.PURE_PYTHON:
        assert refcounts.hold is refcounts.py_hold
        assert refcounts.link is refcounts.py_link
        assert refcounts.count_free is refcounts.py_count_free
    else:
        names = ("hold", "drop", "set_one", "count_free", "link", "unlink_head")
        for name in names:
            assert getattr(refcounts, name) is getattr(compiled, name), name


@settings(max_examples=tiered(300, 5000))
@given(rings(lambda size: st.integers(-1, size)))
def test_the_queue_runs_equal_their_definitions(case):
    """`link` (released blocks join the tail) and `unlink_head` (an allocation takes the
    head): the compiled ones equal the definitions (answer, error, counts and links after),
    and both leave the queue as the lru order says."""
    size, order, blocks, count = case
    held = [b for b in range(1, size) if b not in order]
    joining = list(dict.fromkeys(b for b in blocks if b in held or not 1 <= b < size))

    def run(step, argument):
        counts, links = ring(list(order), {}, size)
        for block in joining:  # released: their count reached 0
            if 1 <= block < size:
                counts[block] = 0
        try:
            answer = ("ok", step(counts, links, argument))
        except (IndexError, ValueError) as error:
            answer = ("error", type(error))
        return answer, counts.tolist(), links.tolist()

    linked = [run(step, joining) for step in (compiled.link, refcounts.py_link)]
    unlinked = [run(step, count) for step in (compiled.unlink_head, refcounts.py_unlink_head)]
    assert linked[0] == linked[1]
    assert unlinked[0] == unlinked[1]
    answer, counts, links = linked[0]
    if answer[0] == "ok":
        assert walk(array("i", counts), array("i", links)) == [*order, *joining]
    else:
        assert any(not 1 <= b < size for b in joining)
    answer, counts, links = unlinked[0]
    if answer[0] == "ok":
        assert answer[1] == list(order[: max(count, 0)])
        assert walk(array("i", counts), array("i", links)) == list(order[max(count, 0) :])
    else:
        assert count > len(order)
