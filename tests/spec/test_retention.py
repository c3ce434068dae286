"""§6b retention: what sparse retention keeps, what it owes, and what it refuses."""

from __future__ import annotations

import pytest

from kvcert.spec import (
    ChunkedLocal,
    FullAttention,
    Group,
    InvalidOp,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec.alloc import (
    Admit,
    Admitted,
    EndStep,
    Extend,
    Finish,
    PoolConfig,
    StepEnded,
    initial_state,
    step,
)
from kvcert.spec.retention import (
    Retained,
    Retention,
    dense_lengths,
    is_bounded,
    junction,
    keeps,
    retained_lengths,
)
from kvcert.spec.view import CacheView

FULL, SW = FullAttention(4), SlidingWindow(4, 8)
PROMPT = tuple(range(100, 113))  # 13 tokens: re-send hit 12, extension hit 12


def run(layout: Layout, retention: str, ops: list, interval: int = 0) -> list[object]:
    state = initial_state(PoolConfig(layout, 96, retention=retention, retention_interval=interval))
    seen = []
    for op in ops:
        state, observation = step(state, op)
        seen.append(observation)
    return seen


def hits(observations: list[object]) -> list[int]:
    return [o.hit for o in observations if isinstance(o, Admitted)]


def registered(observations: list[object]) -> int:
    return sum(o.registered for o in observations if isinstance(o, StepEnded))


def served(rid: str, tokens: tuple[int, ...]) -> list[object]:
    return [Admit(rid, tokens, 64), EndStep(), Finish(rid)]


LAYOUTS = [
    Layout((FULL, SW)),
    Layout((FULL, MambaState(4, MambaMode.ALL))),
    Layout((FULL, ChunkedLocal(4, 8))),
    Layout((FULL, SW, SlidingWindow(4, 8, draft=True)), Speculative.DROP),
    Layout((FULL, SW, SlidingWindow(4, 8, draft=True)), Speculative.EXACT, None, 2),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("length", [11, 12, 13])
@pytest.mark.parametrize("follower", ["re-send", "extension", "junction"])
def test_sparse_owes_what_dense_serves_to_each_promised_follower(
    layout: Layout, length: int, follower: str
) -> None:
    """RET-SPARSE-1's promise: the re-send, an extension and a request at the junction get the
    same hit as under dense retention, while the writer registers no more blocks."""
    prompt = PROMPT[:length]
    if follower == "re-send":
        after = [Admit("f", prompt, 64)]
    elif follower == "extension":
        after = [Admit("f", (*prompt, 7, 8, 9), 64)]
    else:  # a sibling diverging after 5 tokens, then a third request sharing those 5
        after = [*served("s", (*prompt[:5], *range(900, 910))), Admit("t", (*prompt[:5], 1, 2), 64)]
    ops = [*served("w", prompt), *after]
    dense, sparse = run(layout, "dense", ops), run(layout, "sparse", ops)
    assert hits(sparse)[-1] == hits(dense)[-1]
    assert registered(sparse[:2]) <= registered(dense[:2])  # the writer's step


def test_a_sibling_before_every_retained_length_loses_its_hit() -> None:
    """What sparse retention gives up: a sibling diverging inside the prompt, before any
    retained length, finds the window blocks it needs uncached."""
    ops = [*served("w", PROMPT), Admit("s", (*PROMPT[:5], *range(900, 910)), 64)]
    assert hits(run(Layout((FULL, SW)), "dense", ops)) == [0, 4]
    assert hits(run(Layout((FULL, SW)), "sparse", ops)) == [0, 0]


def test_an_interval_keeps_every_multiple_decoded_tokens_included() -> None:
    layout = Layout((FULL, SW))
    decode = [Extend("w", 1, (t,)) for t in range(7)]
    ops = [Admit("w", PROMPT, 64), EndStep()]
    for extend in decode:
        ops += [extend, EndStep()]
    resumed = (*PROMPT, *range(7))[:16]
    ops += [Finish("w"), Admit("f", (*resumed, 55), 64)]
    assert hits(run(layout, "sparse", ops, interval=8))[-1] == 16
    assert hits(run(layout, "sparse", ops))[-1] == 12  # the prompt's end only


def test_full_attention_keeps_every_block_under_either_profile() -> None:
    assert not is_bounded(FULL)
    assert all(is_bounded(g) for g in (SW, ChunkedLocal(4, 8), MambaState(4)))


def test_retained_lengths_follow_the_docstring_examples() -> None:
    layout = Layout((FullAttention(16), SlidingWindow(16, 32)))
    assert retained_lengths(layout, 100, 48, 0).named == {96, 48}
    assert retained_lengths(layout, 96, 0, 0).named == {80, 96}
    every = retained_lengths(layout, 96, 0, 64)
    assert every.within(1, 200) == [64, 80, 96, 128, 192]
    assert 64_000 in every
    assert 112 not in every
    assert 0 not in every
    drop = Layout((FullAttention(16), SlidingWindow(16, 32, draft=True)), Speculative.DROP)
    assert retained_lengths(drop, 96, 0, 0).named == {64, 80, 96}
    assert retained_lengths(drop, 96, 0, 64).within(97, 200) == [112, 128, 176, 192]
    exact = Layout(
        (FullAttention(16), SlidingWindow(16, 32, draft=True)), Speculative.EXACT, None, 2
    )
    assert retained_lengths(exact, 97, 0, 0).named == {80}
    assert not retained_lengths(layout, 1, 0, 0).within(0, 1000)


def test_dense_lengths_follow_the_docstring_examples() -> None:
    """RET-DENSE-1: every multiple of the hit alignment, and only the blocks those hits read."""
    assert dense_lengths(Layout((FullAttention(32), SlidingWindow(8, 8)))).within(1, 70) == [32, 64]
    window = SlidingWindow(8, 8)
    dense = dense_lengths(Layout((FullAttention(32), window)))
    assert [j for j in range(8) if keeps(window, dense, j)] == [3, 7]
    state = MambaState(16)
    dense = dense_lengths(Layout((SlidingWindow(32, 64), state)))
    assert [j for j in range(4) if keeps(state, dense, j)] == [1, 3]
    wide = SlidingWindow(16, 32)
    dense = dense_lengths(Layout((FullAttention(16), wide)))
    assert all(keeps(wide, dense, j) for j in range(8))


def test_keeps_follows_the_docstring_examples() -> None:
    window = SlidingWindow(16, 32)

    def kept(group: Group, lengths: Retained) -> list[int]:
        return [j for j in range(12) if keeps(group, lengths, j)]

    assert kept(window, Retained(frozenset({96}))) == [4, 5]
    assert kept(window, Retained(frozenset({48, 96}))) == [1, 2, 4, 5]
    assert kept(MambaState(16), Retained(frozenset({48, 96}))) == [2, 5]
    assert kept(ChunkedLocal(16, 64), Retained(frozenset({96}))) == [4, 5]
    assert kept(window, Retained(every=64)) == [2, 3, 6, 7, 10, 11]


def test_an_interval_keeps_blocks_for_lengths_a_later_chunk_reaches() -> None:
    """RET-SPARSE-1/-2: a window block committed by a chunk that ends short of the next
    multiple of N is kept for it: the hit at that multiple does not depend on the chunking.
    (Bounding the multiples by the tokens computed when the block commits lost it: 0.)"""
    layout = Layout((FullAttention(4), SlidingWindow(4, 8)))
    prompt = tuple(range(100, 130))
    for chunks in ([14, 16], [16, 14], [30]):
        ops = [Admit("w", prompt, chunks[0]), EndStep()]
        ops += [op for budget in chunks[1:] for op in (Extend("w", budget), EndStep())]
        ops += [Finish("w"), Admit("f", (*prompt[:17], 1, 2, 3), 64)]
        assert hits(run(layout, "sparse", ops, interval=16))[-1] == 16, chunks


def test_the_promise_needs_the_state_saved_at_the_retained_length() -> None:
    """§6b's proviso: an align-mode state group has a state only where a chunk ended. A
    9-token prompt split 4 + 5 leaves none at its re-send length 8: dense keeps the state at
    4 and the re-send hits 4, sparse keeps only length 8 and hits 0. Split 8 + 1, both hit 8."""
    layout = Layout((FULL, MambaState(4, MambaMode.ALIGN)))
    prompt = (7,) * 9
    for chunks, dense_hit, sparse_hit in (((4, 5), 4, 0), ((8, 1), 8, 8)):
        ops = [Admit("w", prompt, chunks[0]), EndStep(), Extend("w", chunks[1]), EndStep()]
        ops += [Finish("w"), Admit("f", prompt, 64)]
        assert hits(run(layout, "dense", ops))[-1] == dense_hit
        assert hits(run(layout, "sparse", ops))[-1] == sparse_hit


def test_dense_leaves_unread_window_blocks_uncached_and_loses_no_aligned_hit() -> None:
    """RET-DENSE-1 with vLLM's geometry (full B=32, SW B=8 W=8): the writer registers window
    blocks 3 and 7 of 8, and every follower still hits the longest multiple of 32 it shares."""
    layout = Layout((FullAttention(32), SlidingWindow(8, 8)))
    prompt = tuple(range(100, 164))
    writer = [Admit("w", prompt, 64), EndStep(), Finish("w")]
    assert registered(run(layout, "dense", writer)) == 2 + 2
    for shared in range(1, 64):
        follower = Admit("f", (*prompt[:shared], 1, 2), 64)
        assert hits(run(layout, "dense", [*writer, follower])) == [0, shared // 32 * 32]


def test_the_junction_needs_a_group_holding_the_prefix() -> None:
    layout = Layout((FullAttention(16), SlidingWindow(16, 32)))
    view = CacheView(layout, 120, (frozenset(range(6)), frozenset()))
    assert junction(view, 0) == 96
    assert junction(view, 96) == 0  # not past the hit: nothing to keep beyond it
    chunked = Layout((FullAttention(16), ChunkedLocal(16, 64)))
    vacuous = CacheView(chunked, 120, (frozenset(), frozenset()))
    assert junction(vacuous, 0) == 0  # chunked accepts 64 needing nothing: no shared prefix


@pytest.mark.parametrize(
    ("retention", "interval", "reason"),
    [
        ("sparse", -4, "an integer >= 0"),
        ("dense", 8, "sparse retention only"),
        ("sparse", 6, "not a multiple of the hit alignment"),
        ("sparse", True, "an integer >= 0"),
        ("sparce", 0, "retention"),
    ],
)
def test_bad_retention_settings_are_refused(retention: str, interval: object, reason: str) -> None:
    with pytest.raises(InvalidOp, match=reason):
        PoolConfig(Layout((FULL, SW)), 8, retention=retention, retention_interval=interval)


def test_the_profile_is_taken_by_value() -> None:
    assert PoolConfig(Layout((FULL,)), 8, retention="sparse").retention is Retention.SPARSE
