"""Bad input: one typed error family, messages that say what to fix."""

from __future__ import annotations

import pytest

from kvcert.spec import (
    AlignmentImpossible,
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    InvalidLayout,
    InvalidRequest,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
    UncacheableLayout,
    hybrid_hit,
)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: FullAttention(0), "block_size must be >= 1"),
        (lambda: FullAttention(-16), "block_size must be >= 1"),
        (lambda: FullAttention(16.0), "block_size must be an integer"),
        (lambda: FullAttention(True), "block_size must be an integer"),
        (lambda: FullAttention(16, draft="yes"), "draft must be true or false"),
        (lambda: SlidingWindow(16, 0), "window must be >= 1"),
        (lambda: ChunkedLocal(16, 0), "chunk must be >= 1"),
        (lambda: MambaState(16, "sometimes"), "mode must be one of none, align, all"),
        (lambda: CrossAttention(0), "block_size must be >= 1"),
        (lambda: Layout(()), "non-empty tuple of groups"),
        (lambda: Layout([FullAttention(16)]), "non-empty tuple of groups"),
        (lambda: Layout(("full",)), "expected one of FullAttention"),
        (lambda: Layout((FullAttention(16),), speculative="eagle"), "exact, drop"),
        (lambda: Layout((FullAttention(16, draft=True),)), "set speculative to 'exact' or 'drop'"),
        (lambda: Layout((FullAttention(16),), Speculative.DROP), "mark the group"),
        (lambda: Layout((FullAttention(16),), max_model_len=0), "max_model_len must be >= 1"),
        (
            lambda: Layout((FullAttention(4, draft=True),), Speculative.EXACT, draft_reach=0),
            "draft_reach must be >= 1",
        ),
        (lambda: Layout((FullAttention(4),), draft_reach=2), "the layout has none"),
        (
            lambda: Layout((FullAttention(2, draft=True),), Speculative.DROP, draft_reach=3),
            "fewer than the draft_reach=3 tokens",
        ),
    ],
)
def test_invalid_layouts(build, fragment):
    with pytest.raises(InvalidLayout, match=fragment):
        build()


def test_alignment_impossible_names_the_numbers():
    """lcm(48, 64) = 192 > 100 - 1: no request could ever hit."""
    with pytest.raises(AlignmentImpossible, match=r"192 tokens .* max_model_len=100"):
        Layout((FullAttention(48), SlidingWindow(64, 128)), max_model_len=100)
    Layout((FullAttention(48), SlidingWindow(64, 128)), max_model_len=193)  # fine


LAYOUT = Layout((FullAttention(16), SlidingWindow(16, 32)), max_model_len=1000)


@pytest.mark.parametrize(
    ("num_tokens", "cached", "fragment"),
    [
        (0, (frozenset(), frozenset()), "num_tokens must be >= 1"),
        (-5, (frozenset(), frozenset()), "num_tokens must be >= 1"),
        ("10", (frozenset(), frozenset()), "num_tokens must be an integer"),
        (1001, (frozenset(), frozenset()), "exceeds max_model_len=1000"),
        (40, (frozenset(),), "one entry per group"),
        (40, (frozenset({2}), frozenset()), r"block 2 is not a keyed block .* 0\.\.1"),
        (40, (frozenset({-1}), frozenset()), "block -1 is not a keyed block"),
        (40, ({0}, frozenset()), "must be a frozenset"),
        (10, (frozenset({0}), frozenset()), r"valid indices: none"),
    ],
)
def test_invalid_views(num_tokens, cached, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        CacheView(LAYOUT, num_tokens, cached)


def test_cross_and_mode_none_groups_cannot_hold_cached_blocks():
    with pytest.raises(InvalidRequest, match="never cached"):
        CacheView(Layout((FullAttention(4), CrossAttention(4))), 9, (frozenset(), frozenset({0})))
    with pytest.raises(InvalidRequest, match="mode 'none' keeps no state"):
        CacheView(Layout((MambaState(4, MambaMode.NONE),)), 9, (frozenset({0}),))


def test_exact_draft_blocks_need_the_token_after_them():
    """HASH-DRAFT-1: with 32 tokens and B=16, draft block 1 has no next token, so no key."""
    layout = Layout((FullAttention(16, draft=True),), Speculative.EXACT)
    with pytest.raises(InvalidRequest, match=r"valid indices: 0\.\.0"):
        CacheView(layout, 32, (frozenset({0, 1}),))


def test_lookup_on_a_cross_attention_only_model_is_refused():
    view = CacheView(Layout((CrossAttention(16),)), 40, (frozenset(),))
    with pytest.raises(UncacheableLayout, match="no prefix to reuse"):
        hybrid_hit(view)


def test_every_error_is_a_spec_error_and_a_value_error():
    for error in (InvalidLayout, InvalidRequest, AlignmentImpossible, UncacheableLayout):
        assert issubclass(error, SpecError)
        assert issubclass(error, ValueError)


def test_enum_inputs_take_the_member_or_its_exact_value_string():
    """The spec's enum-typed fields accept what JSON and command lines carry, and refuse
    anything else by INPUT-1 instead of comparing it by identity and taking another branch."""
    from kvcert.spec import ExtraKind, alloc, page_layout
    from kvcert.spec.checkpoints import Placement, next_chunk
    from kvcert.spec.hashing import Extra
    from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype

    assert MambaState(16, "align").mode is MambaMode.ALIGN  # type: ignore[arg-type]
    drafted = Layout((FullAttention(16, draft=True),), speculative="drop")  # type: ignore[arg-type]
    assert drafted.speculative is Speculative.DROP
    assert drafted == Layout((FullAttention(16, draft=True),), speculative=Speculative.DROP)
    assert Extra("lora", "x").kind is ExtraKind.LORA  # type: ignore[arg-type]
    pool = alloc.PoolConfig(Layout((FullAttention(16),)), 8, "hybrid")  # type: ignore[arg-type]
    assert pool.eviction is alloc.Eviction.HYBRID
    assert next_chunk("align", 0, 100, 50, 16) == next_chunk(Placement.ALIGN, 0, 100, 50, 16)  # type: ignore[arg-type]
    layer = AttentionLayer("full", 2, 4, 4)  # type: ignore[arg-type]
    assert layer.kind is AttentionKind.FULL
    by_value = page_layout.attention_offset(layer, "int8_per_token_head", 2, token=0, head=1,
                                            part="v", index=0)  # type: ignore[arg-type]  # fmt: skip
    assert by_value == page_layout.attention_offset(
        layer, KVDtype.INT8_PER_TOKEN_HEAD, 2, token=0, head=1, part=page_layout.Part.V, index=0
    )
    for build, error, fragment in (
        (lambda: MambaState(16, "ALIGN"), InvalidLayout, "mode must be one of none, align"),
        (lambda: Extra("salt", "x"), InvalidRequest, "extra kind must be one of cache_salt"),
        (lambda: alloc.PoolConfig(Layout((FullAttention(16),)), 8, "fifo"), SpecError,
         "eviction must be one of lru"),
        (lambda: next_chunk("every", 0, 100, 50, 16), InvalidRequest, "placement must be one of"),
        (lambda: page_layout.attention_offset(layer, KVDtype.FP16, 2, token=0, head=0, part="q",
                                              index=0), InvalidRequest, "part must be one of k, v"),
    ):  # fmt: skip
        with pytest.raises(error, match=fragment):
            build()
