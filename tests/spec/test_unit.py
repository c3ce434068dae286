"""The hit-granularity profile `unit U` (HIT-UNIT-1..4): worked examples, refusals, and its
relation to the block profile, exhaustively on small views."""

from __future__ import annotations

import itertools

import pytest

from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    InvalidLayout,
    InvalidOp,
    InvalidRequest,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    hit_alignment,
    hybrid_hit,
)
from kvcert.spec import alloc as spec
from kvcert.spec.acceptance import group_accepts, needed_blocks
from kvcert.spec.view import keyable_blocks

F = frozenset


def test_docstring_examples():
    full = FullAttention(4)
    assert group_accepts(full, F({0}), 6, unit=1, partial=F({7}))
    assert group_accepts(full, F({0}), 5, unit=1, partial=F({7}))
    assert not group_accepts(full, F({0}), 6, unit=1, partial=F({5}))
    state = MambaState(16)
    accepted = [n for n in range(0, 48, 4) if group_accepts(state, F({0}), n, unit=4,
                                                             partial=F({40}))]  # fmt: skip
    assert accepted == [0, 16, 40]


def test_state_in_mode_none_serves_only_zero():
    none = MambaState(4, MambaMode.NONE)
    assert group_accepts(none, F(), 0, unit=2)
    assert not group_accepts(none, F({0}), 4, unit=2)


def test_lengths_off_the_unit_grid_are_refused():
    assert not group_accepts(FullAttention(4), F({0}), 3, unit=2)
    assert group_accepts(CrossAttention(4), F(), 3, unit=2)  # HIT-CROSS-1: any length


def test_hybrid_hit_inside_a_block():
    layout = Layout((FullAttention(4), MambaState(8)), hit_unit=2)
    view = CacheView(layout, 20, (F({0, 1, 2}), F({0})), (F({14}), F({10, 14})))
    hit = hybrid_hit(view)
    assert hit.length == 14
    assert hit.blocks == ((0, 1, 2, 3), (None, 1))  # block 3 of full is the copy source


def test_block_profile_is_unchanged_and_coarser():
    layout = Layout((FullAttention(4), MambaState(8)))
    assert hit_alignment(layout) == 8
    assert hit_alignment(Layout(layout.groups, hit_unit=2)) == 2


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Layout((FullAttention(4),), hit_unit=3), InvalidLayout),
        (lambda: Layout((FullAttention(4),), hit_unit=0), InvalidLayout),
        (lambda: Layout((FullAttention(4),), hit_unit=True), InvalidLayout),
        (lambda: CacheView(Layout((FullAttention(4),)), 9, (F(),), (F({2}),)), InvalidRequest),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), (F({4}),)),
         InvalidRequest),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), (F({3}),)),
         InvalidRequest),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), (F({10}),)),
         InvalidRequest),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), ()), None),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), (F(), F())),
         InvalidRequest),
        (
            lambda: spec.PoolConfig(Layout((FullAttention(4),), hit_unit=2), 8, eviction="hybrid"),
            InvalidOp,
        ),
        (lambda: CacheView(Layout((FullAttention(4),), hit_unit=2), 9, (F(),), ({2},)),
         InvalidRequest),
        (lambda: CacheView(Layout((FullAttention(4), CrossAttention(4)), hit_unit=2), 9,
                           (F(), F()), (F(), F({2}))), InvalidRequest),
        (lambda: CacheView(Layout((MambaState(4, MambaMode.NONE),), hit_unit=2), 9, (F(),),
                           (F({2}),)), InvalidRequest),
    ],
)  # fmt: skip
def test_refusals(make, error):
    if error is None:
        make()
        return
    with pytest.raises(error) as raised:
        make()
    assert any(word in str(raised.value) for word in ("hit_unit", "partial", "keys"))


GROUPS = (
    FullAttention(2),
    FullAttention(4),
    SlidingWindow(2, 3),
    SlidingWindow(4, 2),
    ChunkedLocal(2, 3),
    MambaState(2),
    MambaState(4),
)


def _subsets(items: range) -> list[frozenset[int]]:
    return [F(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


def _views(unit: int, max_tokens: int = 9):
    for group in GROUPS:
        layout = Layout((group,), hit_unit=unit)
        size = group.block_size
        for tokens in range(1, max_tokens + 1):
            positions = range(unit, tokens + 1, unit)
            inside = [p for p in positions if p % size]
            for cached in _subsets(range(keyable_blocks(layout, 0, tokens))):
                for k in range(len(inside) + 1):
                    for partial in itertools.combinations(inside, k):
                        yield layout, CacheView(layout, tokens, (cached,), (F(partial),))


def _extents(group, cached, partial) -> dict[int, int]:
    """Per block, how far its cached content reaches (tokens)."""
    reach = {j: (j + 1) * group.block_size for j in cached}
    for p in partial:
        j = p // group.block_size
        reach[j] = max(reach.get(j, 0), p)
    return reach


@pytest.mark.sweep
def test_every_accepted_unit_hit_reads_only_cached_tokens():
    """Soundness at token level: every token the kind needs before an accepted L lies in a
    block whose cached content reaches past it (HIT-UNIT-2), and a state hit has a
    checkpoint at exactly L (HIT-UNIT-3)."""
    checked = 0
    for layout, view in _views(unit=1):
        group = layout.groups[0]
        cached, partial = view.cached[0], view.partial[0]
        reach = _extents(group, cached, partial)
        for length in range(view.num_tokens):
            if not group_accepts(group, cached, length, unit=1, partial=partial):
                continue
            checked += 1
            if isinstance(group, MambaState):
                ends = {(j + 1) * group.block_size for j in cached} | partial
                assert length == 0 or length in ends
                continue
            tokens = needed_blocks(type(group)(**{**vars(group), "block_size": 1}), length)
            for t in tokens:
                assert reach.get(t // group.block_size, -1) > t, (group, view, length, t)
    assert checked > 1_000


@pytest.mark.sweep
def test_full_attention_is_downward_closed_at_unit_granularity():
    for layout, view in _views(unit=1):
        group = layout.groups[0]
        if not isinstance(group, FullAttention):
            continue
        accepted = [
            n
            for n in range(view.num_tokens)
            if group_accepts(group, view.cached[0], n, unit=1, partial=view.partial[0])
        ]
        assert accepted == list(range(len(accepted))), (view, accepted)


@pytest.mark.sweep
def test_unit_profile_never_serves_less_than_the_block_profile():
    """The same whole blocks, with or without partial keys: the unit hit is at least the
    block hit (the block profile's lengths are among the unit profile's)."""
    for unit in (1, 2):
        for layout, view in _views(unit=unit, max_tokens=8):
            block_layout = Layout(layout.groups)
            block = hybrid_hit(CacheView(block_layout, view.num_tokens, view.cached))
            assert hybrid_hit(view).length >= block.length


def test_unit_equal_to_the_block_size_is_the_block_profile():
    for group in GROUPS:
        unit_layout = Layout((group,), hit_unit=group.block_size)
        block_layout = Layout((group,))
        for tokens in range(1, 10):
            for cached in _subsets(range(keyable_blocks(block_layout, 0, tokens))):
                unit_hit = hybrid_hit(CacheView(unit_layout, tokens, (cached,)))
                assert unit_hit == hybrid_hit(CacheView(block_layout, tokens, (cached,)))
