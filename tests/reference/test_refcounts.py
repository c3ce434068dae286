"""The compiled reference counting equals its pure-Python definition."""

from __future__ import annotations

from array import array
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference import native, refcounts
from tests.tiers import tiered

compiled = pytest.importorskip("kvcert.reference._refcounts")
RELEASES: Counter[str] = Counter()  # test_a_request_release_equals_drop_then_link's outcomes
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
        names = ("hold", "drop", "set_one", "count_free", "link", "unlink_head", "release_tables")
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


def release_cases(size: int) -> st.SearchStrategy[tuple[list[list[int]], list[int]]]:
    """Up to three tables of blocks in 0..size - 1 (0 the null block) and a low position
    each, some past the table's end; four in seven draws spoiled by a block outside the
    pool (at either end), a low below 0 or one low too many."""
    table = st.lists(st.sampled_from([*range(1, size), 0]), min_size=1, max_size=6)
    cases = st.lists(st.tuples(table, st.integers(0, 3)), max_size=3).map(
        lambda pairs: ([t for t, _ in pairs], [low for _, low in pairs])
    )
    return st.tuples(cases, st.sampled_from([None, None, None, -1, size, "low", "lows"])).map(
        lambda drawn: spoiled(*drawn[0], drawn[1])
    )


def spoiled(
    tables: list[list[int]], lows: list[int], how: int | str | None
) -> tuple[list[list[int]], list[int]]:
    """The case with `how` applied: an extra low, the last low -1, or block `how` appended
    to the last table (None, or nothing to spoil: as drawn)."""
    if how == "lows":
        return tables, [*lows, 0]
    if how == "low" and lows:
        return tables, [*lows[:-1], -1]
    if isinstance(how, int) and tables:
        return [*tables[:-1], [*tables[-1], how]], lows
    return tables, lows


@settings(max_examples=tiered(300, 5000))
@given(rings(release_cases))
def test_a_request_release_equals_drop_then_link(case):
    """`release_tables`: the compiled one equals the definition (answer, error, counts and
    links after); and the definition equals ALLOC-FREE-1's listing dropped then linked (each
    table from its last position down to its low, null entries skipped, in layout order),
    nothing changed when it refuses."""
    size, queue, _, (tables, lows) = case
    pairs = zip(tables, lows, strict=False)
    listed = [b for t, low in pairs for b in reversed(t[max(low, 0) :]) if b]
    order = [b for b in queue if b not in listed]  # the request holds what it releases
    # a listed block held as often as listed (freed by it) or, ids divisible by 3, once more
    held = {b: max(listed.count(b), 1) + (b % 3 == 0) for b in range(1, size) if b not in order}

    def run(step):
        counts, links = ring(list(order), held, size)
        try:
            answer = ("ok", step(counts, links, tables, lows))
        except (IndexError, ValueError, TypeError) as error:
            answer = ("error", type(error))
        return answer, counts.tolist(), links.tolist()

    results = [run(step) for step in (compiled.release_tables, refcounts.py_release_tables)]
    assert results[0] == results[1]
    answer, counts, links = results[0]
    RELEASES[answer[0] if answer[0] == "error" or not answer[1] else "freed"] += 1
    counts_before, links_before = ring(list(order), held, size)
    if answer[0] == "error":
        assert (counts, links) == (counts_before.tolist(), links_before.tolist())
        assert (
            len(lows) != len(tables)
            or any(low < 0 for low in lows)
            or any(not 0 <= b < size for b in listed)
        )
        return
    freed = refcounts.py_drop(counts_before, listed)
    refcounts.py_link(counts_before, links_before, freed)
    assert answer[1] == len(freed)
    assert (counts, links) == (counts_before.tolist(), links_before.tolist())
    assert walk(array("i", counts), array("i", links)) == [*order, *freed]
    last_listed = [b for i, b in enumerate(listed) if b not in listed[i + 1 :]]
    assert freed == [b for b in last_listed if b % 3]  # each where its count reached 0


def test_the_release_cases_reach_each_outcome():
    """Not vacuous: the release cases above were refused in some, freed blocks in some and
    none in others."""
    if not RELEASES:
        test_a_request_release_equals_drop_then_link()
    draws = RELEASES.total()  # dev profile, twelve runs of 300: each outcome 49 or more
    assert min(RELEASES["error"], RELEASES["freed"], RELEASES["ok"]) >= draws / 10, RELEASES


def test_a_request_release_refuses_a_broken_queue():
    """A tail no queue kept is refused before any count drops."""
    counts, links = ring([1], {2: 1}, 3)
    counts[0] = -7
    for step in (compiled.release_tables, refcounts.py_release_tables):
        before = counts.tolist()
        with pytest.raises(ValueError, match="not kept by one queue"):
            step(counts, links, [[2]], [0])
        assert counts.tolist() == before
