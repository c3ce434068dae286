"""Hypothesis strategies for layouts and cache views, small enough that hits are common."""

from __future__ import annotations

from hypothesis import strategies as st

from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec.layout import is_cacheable
from kvcert.spec.view import keyable_blocks

BLOCK_SIZES = st.sampled_from([1, 2, 3, 4, 6, 8])


def attention_groups(draft: bool = False) -> st.SearchStrategy[Group]:
    """A full, sliding-window or chunked-local group; `draft` marks it as holding draft layers."""
    return st.one_of(
        st.builds(FullAttention, block_size=BLOCK_SIZES, draft=st.just(draft)),
        st.builds(
            SlidingWindow, block_size=BLOCK_SIZES, window=st.integers(1, 24), draft=st.just(draft)
        ),
        st.builds(
            ChunkedLocal, block_size=BLOCK_SIZES, chunk=st.integers(1, 24), draft=st.just(draft)
        ),
    )


def groups() -> st.SearchStrategy[Group]:
    """One group of any kind, never a draft group."""
    return st.one_of(
        attention_groups(),
        st.builds(MambaState, block_size=BLOCK_SIZES, mode=st.sampled_from(list(MambaMode))),
        st.builds(CrossAttention, block_size=BLOCK_SIZES),
    )


@st.composite
def layouts(draw: st.DrawFn, max_groups: int = 4, speculative: bool = True) -> Layout:
    """A valid layout: at least one cacheable group; draft groups iff a speculative profile."""
    profile = (
        draw(st.sampled_from([None, Speculative.EXACT, Speculative.DROP])) if speculative else None
    )
    body = draw(st.lists(groups(), min_size=1, max_size=max_groups))
    if profile is not None:
        body.append(draw(attention_groups(draft=True)))
    if not any(is_cacheable(g) for g in body):
        body.append(draw(st.builds(FullAttention, block_size=BLOCK_SIZES)))
    order = draw(st.permutations(range(len(body))))
    return Layout(tuple(body[i] for i in order), speculative=profile)


def _serves(group: Group) -> bool:
    return is_cacheable(group) and not (
        isinstance(group, MambaState) and group.mode is MambaMode.NONE
    )


@st.composite
def cached_blocks(draw: st.DrawFn, count: int) -> frozenset[int]:
    """A cached subset of `count` blocks, biased towards nearly complete caches."""
    if count == 0:
        return frozenset()
    missing = draw(
        st.one_of(
            st.sets(st.integers(0, count - 1), max_size=2),
            st.sets(st.integers(0, count - 1)),
        )
    )
    return frozenset(range(count)) - missing


@st.composite
def views(
    draw: st.DrawFn, layout: st.SearchStrategy[Layout] | None = None, max_tokens: int = 60
) -> CacheView:
    """A cache view over a drawn layout."""
    chosen = draw(layout if layout is not None else layouts())
    num_tokens = draw(st.integers(1, max_tokens))
    cached = tuple(
        draw(cached_blocks(keyable_blocks(chosen, i, num_tokens))) if _serves(g) else frozenset()
        for i, g in enumerate(chosen.groups)
    )
    return CacheView(chosen, num_tokens, cached)
