"""§3 per-group acceptance: worked examples, downward closure, and where it fails."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.spec import (
    NULL,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    MambaMode,
    MambaState,
    SlidingWindow,
    group_accepts,
    group_blocks,
    needed_blocks,
)
from tests.strategies import BLOCK_SIZES, attention_groups, groups


def accepted(group, cached, limit):
    return [n for n in range(limit + 1) if group_accepts(group, frozenset(cached), n)]


def test_full_attention_needs_every_earlier_block():
    """HIT-FULL-1: cached {0,1,2} of B=16 serves 0..48 in whole blocks and nothing past a gap."""
    full = FullAttention(16)
    assert accepted(full, {0, 1, 2}, 70) == [0, 16, 32, 48]
    assert accepted(full, {0, 1, 3}, 70) == [0, 16, 32]
    assert accepted(full, {1, 2, 3}, 70) == [0]


def test_sliding_window_needs_window_minus_one_tokens():
    """HIT-SW-1: W=32, B=16 at L=64 needs tokens 33..63, i.e. blocks 2 and 3 = cdiv(31, 16)."""
    sw = SlidingWindow(16, window=32)
    assert list(needed_blocks(sw, 64)) == [2, 3]
    assert list(needed_blocks(sw, 16)) == [0]  # below W-1 the run reaches back to block 0
    assert accepted(sw, {2, 3}, 70) == [0, 64]
    assert group_blocks(sw, frozenset({0, 2, 3}), 64) == (NULL, NULL, 2, 3)


@pytest.mark.parametrize(
    ("block_size", "window"), [(16, 32), (16, 33), (16, 17), (4, 128), (64, 128), (8, 1)]
)
def test_sliding_window_block_count_matches_vllm_cdiv(block_size, window):
    """HIT-SW-1 at an aligned L >= W-1 needs cdiv(W-1, B) blocks, vLLM's reference count."""
    length = block_size * (1 + (window + block_size) // block_size)
    expected = -(-(window - 1) // block_size)
    assert len(needed_blocks(SlidingWindow(block_size, window), length)) == expected


@pytest.mark.parametrize(
    ("pattern", "blocks"),
    [
        ([1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1], 12),
        ([1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0], 8),
        ([1], 1),
        ([1, 0], 1),
    ],
)
def test_sliding_window_matches_vllm_peer_examples(pattern, blocks):
    """HIT-SW-1 against vLLM's test_sliding_window_possible_cached_prefix (B=2, W=4).

    The lookup runs with max_length = all blocks; expected lengths are the peer test's block
    counts. With W=4 a hit at L needs tokens [L-3, L): the two blocks before L.
    """
    sw = SlidingWindow(2, window=4)
    cached = {j for j, bit in enumerate(pattern) if bit}
    assert accepted(sw, cached, 2 * len(pattern))[-1] == 2 * blocks


def test_chunked_local_needs_only_the_current_chunk():
    """HIT-CHUNK-1: C=32, B=16: chunk boundaries need nothing; mid-chunk needs its first block."""
    chunked = ChunkedLocal(16, chunk=32)
    assert list(needed_blocks(chunked, 48)) == [2]
    assert list(needed_blocks(chunked, 64)) == []
    assert accepted(chunked, set(), 70) == [0, 32, 64]
    assert accepted(chunked, {2}, 70) == [0, 32, 48, 64]


def test_chunk_not_multiple_of_block_needs_the_straddling_block():
    """HIT-CHUNK-1: C=6, B=4: token 8's chunk starts at 6, inside block 1, so block 1 is needed."""
    assert list(needed_blocks(ChunkedLocal(4, chunk=6), 8)) == [1]


def test_state_needs_the_checkpoint_at_the_boundary_only():
    """HIT-MAMBA-1: only the checkpoint at L counts; earlier checkpoints are irrelevant."""
    state = MambaState(16)
    assert accepted(state, {2}, 70) == [0, 48]
    assert accepted(state, {0, 1}, 70) == [0, 16, 32]
    assert group_blocks(state, frozenset({0, 2}), 48) == (NULL, NULL, 2)


def test_state_mode_none_serves_only_the_empty_hit():
    """HIT-MAMBA-2: mode none keeps no checkpoints; align and all accept identically."""
    assert accepted(MambaState(16, MambaMode.NONE), set(), 70) == [0]
    align = accepted(MambaState(16, MambaMode.ALIGN), {1, 3}, 70)
    assert align == accepted(MambaState(16, MambaMode.ALL), {1, 3}, 70) == [0, 32, 64]


def test_cross_attention_constrains_nothing_and_returns_no_blocks():
    """HIT-CROSS-1: accepts every length, even unaligned ones, with an empty block list."""
    cross = CrossAttention(16)
    assert accepted(cross, set(), 20) == list(range(21))
    assert group_blocks(cross, frozenset(), 17) == ()


def test_unaligned_lengths_are_refused():
    """HIT-GROUP-1: a length that is not a multiple of the block size is never accepted."""
    assert not group_accepts(FullAttention(16), frozenset({0, 1}), 24)
    assert not group_accepts(MambaState(8), frozenset({0, 1, 2}), 12)


@given(
    group=st.builds(FullAttention, block_size=BLOCK_SIZES),
    cached=st.sets(st.integers(0, 12)),
    length=st.integers(0, 100),
)
def test_full_attention_is_downward_closed(group, cached, length):
    """THM-FULL-DOWN: full attention accepting L accepts every aligned L' < L."""
    cached = frozenset(cached)
    if group_accepts(group, cached, length):
        for shorter in range(0, length, group.block_size):
            assert group_accepts(group, cached, shorter)


@pytest.mark.parametrize(
    ("group", "cached", "accepted_length", "refused_shorter"),
    [
        (SlidingWindow(16, window=32), {2, 3}, 64, 32),
        (ChunkedLocal(16, chunk=32), {2}, 48, 16),
        (MambaState(16), {2}, 48, 32),
    ],
    ids=["sliding_window", "chunked_local", "mamba"],
)
def test_windowed_and_state_kinds_are_not_downward_closed(
    group, cached, accepted_length, refused_shorter
):
    """Concrete counterexamples: each accepts a length but refuses a shorter aligned one."""
    assert group_accepts(group, frozenset(cached), accepted_length)
    assert not group_accepts(group, frozenset(cached), refused_shorter)


@given(
    group=groups(),
    cached=st.sets(st.integers(0, 12)),
    more=st.sets(st.integers(0, 12)),
    length=st.integers(0, 100),
)
def test_acceptance_is_monotone_in_the_cache(group, cached, more, length):
    """THM-GROUP-MONO: caching more blocks never makes a group refuse a length it accepted."""
    if group_accepts(group, frozenset(cached), length):
        assert group_accepts(group, frozenset(cached | more), length)


@given(group=groups(), length=st.integers(0, 100))
def test_needed_blocks_are_a_run_ending_at_the_hit(group, length):
    """Every kind needs a contiguous run of blocks ending at block L/B (or nothing)."""
    if isinstance(group, CrossAttention) or length % group.block_size:
        return
    needed = needed_blocks(group, length)
    assert needed.step == 1
    assert not needed or needed.stop == length // group.block_size


@given(group=attention_groups(), cached=st.sets(st.integers(0, 12)), length=st.integers(0, 100))
def test_block_list_is_the_needed_blocks_padded_with_null(group, cached, length):
    """HIT-GROUP-2: one entry per block before L; exactly the needed ones are non-null."""
    cached = frozenset(cached)
    if not group_accepts(group, cached, length):
        return
    blocks = group_blocks(group, cached, length)
    assert len(blocks) == length // group.block_size
    assert [j for j, b in enumerate(blocks) if b is not NULL] == list(needed_blocks(group, length))


@given(
    st.frozensets(st.integers(0, 40), max_size=30),
    st.integers(0, 45),
    st.integers(0, 45),
)
def test_all_cached_is_the_literal_check(cached, start, stop):
    """HIT-GROUP-1 asks "is every needed block cached" through the runs of consecutive cached
    blocks; it answers exactly as the literal scan, for plain and run-carrying sets."""
    from kvcert.spec.acceptance import CachedBlocks, all_cached

    needed = range(start, stop)
    literal = all(j in cached for j in needed)
    assert all_cached(cached, needed) == literal
    assert all_cached(CachedBlocks(cached), needed) == literal
    assert CachedBlocks(cached) == cached
