"""§4 the hybrid hit: properties of the definition and the vLLM probe cases it settles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.spec import (
    NULL,
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Layout,
    MambaState,
    SlidingWindow,
    Speculative,
    common_lengths,
    group_accepts,
    hit_alignment,
    hybrid_hit,
    max_hit_length,
)
from kvcert.spec.hybrid import drop_draft_hit, plain_hit
from kvcert.spec.layout import is_cacheable
from tests.strategies import layouts, views

# --- properties of the definition -------------------------------------------------------------


@given(views())
def test_hit_is_servable_by_every_group(view):
    """HIT-HYB-1/HIT-SPEC-*: whatever the profile, every group accepts the reported hit."""
    hit = hybrid_hit(view)
    for index, group in enumerate(view.layout.groups):
        assert group_accepts(group, view.cached[index], hit.length)


@given(views())
def test_hit_respects_the_last_token_and_alignment(view):
    """HIT-LEN-1 and the lcm corollary: hit <= n - 1 and a multiple of every block size."""
    hit = hybrid_hit(view)
    assert 0 <= hit.length <= max_hit_length(view.num_tokens) == view.num_tokens - 1
    assert hit.length % hit_alignment(view.layout) == 0


@pytest.mark.parametrize(
    ("groups", "num_tokens", "cached", "expected"),
    [
        # HIT-HYB-1's diagram: full accepts 0..64, SW needs blocks 2, 3 before 64.
        ((FullAttention(16), SlidingWindow(16, 32)), 71, ({0, 1, 2, 3}, {2, 3}), 64),
        # the SW group's window before 48 needs block 1 too, which it lacks: 48 and 32 fail,
        # 16 needs only block 0 of the window (tokens 0-15), lacking too: 0.
        ((FullAttention(16), SlidingWindow(16, 32)), 71, ({0, 1, 2}, {2, 3}), 0),
        # a state group accepts only where a checkpoint sits: 32, not 48.
        ((FullAttention(16), MambaState(16)), 71, ({0, 1, 2, 3}, {1}), 32),
        # mixed block sizes: every hit is a multiple of lcm(16, 32) = 32.
        ((FullAttention(16), FullAttention(32)), 71, ({0, 1, 2, 3}, {0, 1}), 64),
        ((FullAttention(16), FullAttention(32)), 71, ({0, 1, 2}, {0, 1}), 32),
        # HIT-LEN-1: a 64-token prompt keeps its last token to compute, so at most 48.
        ((FullAttention(16),), 64, ({0, 1, 2, 3},), 48),
        # chunked C=32: L=64 needs block 2's predecessor in its chunk, nothing before 64.
        ((FullAttention(16), ChunkedLocal(16, 32)), 71, ({0, 1, 2, 3}, set()), 64),
        ((FullAttention(16), ChunkedLocal(16, 32)), 71, ({0, 1, 2}, {1}), 32),
    ],
)
def test_plain_hit_worked_numbers(groups, num_tokens, cached, expected):
    """HIT-HYB-1, HIT-LEN-1 and the per-kind rules on hand-computed cases (B = 16)."""
    view = CacheView(Layout(groups), num_tokens, tuple(frozenset(c) for c in cached))
    assert hybrid_hit(view).plain_length == expected


@given(views())
def test_block_lists_have_one_entry_per_block_before_the_hit(view):
    """HIT-GROUP-2 through the hybrid: list lengths follow the hit, entries are cached blocks."""
    hit = hybrid_hit(view)
    for index, group in enumerate(view.layout.groups):
        blocks = hit.blocks[index]
        expected = 0 if isinstance(group, CrossAttention) else hit.length // group.block_size
        assert len(blocks) == expected
        assert all(b is NULL or b in view.cached[index] for b in blocks)


@given(views(), st.data())
def test_more_cached_blocks_never_shorten_the_hit(view, data):
    """THM-HYB-MONO: adding cached blocks to any group never lowers the hit (any profile)."""
    grown = []
    for index, group in enumerate(view.layout.groups):
        extra = frozenset()
        if is_cacheable(group) and not (isinstance(group, MambaState) and group.mode == "none"):
            count = _keyable(view, index)
            extra = frozenset(data.draw(st.sets(st.integers(0, count - 1)))) if count else extra
        grown.append(view.cached[index] | extra)
    bigger = CacheView(view.layout, view.num_tokens, tuple(grown))
    assert hybrid_hit(bigger).length >= hybrid_hit(view).length
    assert hybrid_hit(bigger).plain_length >= hybrid_hit(view).plain_length


def _keyable(view, index):
    from kvcert.spec.view import keyable_blocks

    return keyable_blocks(view.layout, index, view.num_tokens)


@given(views(), st.randoms(use_true_random=False))
def test_group_order_does_not_matter(view, rnd):
    """THM-HYB-ORDER: permuting the groups permutes the block lists and keeps the hit."""
    order = list(range(len(view.layout.groups)))
    rnd.shuffle(order)
    layout = view.layout
    permuted = CacheView(
        Layout(tuple(layout.groups[i] for i in order), layout.speculative, layout.max_model_len),
        view.num_tokens,
        tuple(view.cached[i] for i in order),
    )
    hit, other = hybrid_hit(view), hybrid_hit(permuted)
    assert other.length == hit.length
    assert other.blocks == tuple(hit.blocks[i] for i in order)


@given(views())
def test_a_group_that_serves_everything_changes_nothing(view):
    """THM-HYB-COUNT: adding a group that accepts every length leaves the hit unchanged.

    The drop is defined on the common set, so the number of groups cannot matter; vLLM's
    per-group drop lost one more block for every group (#40624).
    """
    layout = view.layout
    wider = Layout((*layout.groups, FullAttention(1)), layout.speculative)
    everything = frozenset(range(view.num_tokens))
    bigger = CacheView(wider, view.num_tokens, (*view.cached, everything))
    assert hybrid_hit(bigger).length == hybrid_hit(view).length


@given(views(layouts().filter(lambda lay: lay.speculative is Speculative.DROP)))
def test_drop_profile_steps_down_exactly_once(view):
    """HIT-SPEC-2: exactly one common length lies in (hit, plain] when plain > 0; none at 0."""
    hit = hybrid_hit(view)
    common = common_lengths(view)
    skipped = [n for n in common if hit.length < n <= hit.plain_length]
    assert len(skipped) == (1 if hit.plain_length > 0 else 0)


@given(views(layouts().filter(lambda lay: lay.speculative is Speculative.DROP)))
def test_drop_profile_never_spirals(view):
    """HIT-SPEC-2: with two or more positive common lengths the dropped hit stays positive."""
    positive = [n for n in common_lengths(view) if n > 0]
    if len(positive) >= 2:
        assert hybrid_hit(view).length == positive[-2] > 0


@given(views(layouts().filter(lambda lay: lay.speculative is Speculative.EXACT)))
def test_exact_profile_drops_nothing(view):
    """HIT-SPEC-1: under exact keying the hit is the plain hybrid hit."""
    hit = hybrid_hit(view)
    assert hit.length == hit.plain_length


def test_drop_examples_from_the_rule():
    """HIT-SPEC-2's diagram, literally."""
    assert drop_draft_hit((0, 16, 32, 48, 64)) == 48
    assert drop_draft_hit((0, 64)) == 0
    assert drop_draft_hit((0,)) == 0
    assert plain_hit((0, 64)) == 64


# --- a broken twin: the drop inside the loop (vLLM <= 0.15, #32802) ------------------------


def per_group_drop_in_loop(view: CacheView) -> int:
    """The bug shape: each group drops one own step on every pass of a fixed-point loop."""
    groups = view.layout.groups
    hit = max_hit_length(view.num_tokens)
    while True:
        current = hit
        for index, group in enumerate(groups):
            own = [n for n in range(current + 1) if group_accepts(group, view.cached[index], n)]
            current = own[-2] if len(own) > 1 else 0  # its own "drop the last block"
        if current >= hit:
            return current
        hit = current


def test_drop_once_property_catches_the_per_group_loop():
    """The drop-at-most-once property fails for vLLM's old shape on the GPT-OSS case (C1)."""
    layout = Layout((FullAttention(16, draft=True), SlidingWindow(16, window=32)), Speculative.DROP)
    view = CacheView(layout, 71, (frozenset(range(4)), frozenset(range(4))))
    assert per_group_drop_in_loop(view) == 0  # the spiral
    assert hybrid_hit(view).length == 48  # the spec: one step below 64


# --- vLLM probe cases (research notes §6), B = 16 -------------------------------------------

FULL, SW = FullAttention(16), SlidingWindow(16, window=32)


def resend(layout: Layout, per_group_blocks: list[set[int]], num_tokens: int = 69) -> int:
    """Request b = 4 shared blocks + 5 own tokens after request a cached the shared blocks."""
    return hybrid_hit(
        CacheView(layout, num_tokens, tuple(frozenset(b) for b in per_group_blocks))
    ).length


@pytest.mark.parametrize(
    ("evicted_full", "evicted_sw", "expected"),
    [({0}, set(), 0), (set(), {0}, 64), ({3}, {0}, 48), ({2}, {0}, 0), (set(), {2}, 32)],
)
def test_c8_eviction_matrix(evicted_full, evicted_sw, expected):
    """C8 (vLLM test_prefill_hybrid_model): [full, sw W=2B] after evicting single blocks.

    Evicting full block 2 and SW block 0 gives 0: full serves at most 32, and the window
    before 32 needs SW blocks 0 and 1.
    """
    all_blocks = set(range(4))
    layout = Layout((FULL, SW))
    assert resend(layout, [all_blocks - evicted_full, all_blocks - evicted_sw]) == expected


@pytest.mark.parametrize(
    ("groups", "vllm_0_20"),
    [
        ((FullAttention(16, draft=True), SW), 48),  # C1, #32802
        ((FullAttention(16, draft=True), SW, MambaState(16)), 48),  # C2
        ((FULL, SW, FullAttention(16, draft=True, name="draft")), 48),  # C3, #40624
        ((FullAttention(16, draft=True), SW, SlidingWindow(16, window=64)), 48),  # C3b
    ],
    ids=["C1", "C2", "C3", "C3b"],
)
def test_eagle_cases_drop_one_block_whatever_the_group_count(groups, vllm_0_20):
    """C1-C3b: the spec agrees with vLLM 0.20+ (48), not with <= 0.19's 0 or double drop."""
    layout = Layout(groups, Speculative.DROP)
    assert resend(layout, [set(range(4))] * len(groups)) == vllm_0_20


@pytest.mark.parametrize(
    ("groups", "blocks", "expected"),
    [
        ((FullAttention(32, draft=True), SlidingWindow(16, window=64)), [4, 8], 96),  # C4
        ((FullAttention(16, draft=True), SlidingWindow(32, window=64)), [8, 4], 96),  # C4b
    ],
    ids=["C4", "C4b"],
)
def test_eagle_with_different_block_sizes(groups, blocks, expected):
    """C4/C4b (Gemma4 shape): lcm 32, a 133-token re-send; 128 in common, the drop gives 96.

    vLLM <= 0.19.0 crashed here, 0.19.1 dropped twice (64); 0.20+ gives 96 as the spec does.
    """
    layout = Layout(groups, Speculative.DROP)
    assert resend(layout, [set(range(n)) for n in blocks], num_tokens=133) == expected


def test_c9_state_is_not_downward_closed():
    """C9: [full, mamba]: evicting checkpoint 3 leaves 48; [sw, sw 4B, mamba] evicting 2: 64."""
    assert resend(Layout((FULL, MambaState(16))), [set(range(4)), {0, 1, 2}]) == 48
    layout = Layout((SW, SlidingWindow(16, window=64), MambaState(16)))
    assert resend(layout, [set(range(4)), set(range(4)), {0, 1, 3}]) == 64


@given(layouts(max_groups=3))
def test_alignment_is_the_lcm_of_cacheable_block_sizes(layout):
    """The hit alignment ignores cross-attention groups, which constrain no length."""
    import math

    sizes = [g.block_size for g in layout.groups if is_cacheable(g)]
    assert hit_alignment(layout) == math.lcm(*sizes)
