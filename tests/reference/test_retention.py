"""The reference's retention (RET-SPARSE-2) against the spec's, position by position: the
per-position walk (`keeps`) and the tabulated form the registrar uses (`Kept`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcert.reference.config import GroupConfig, Kind, MambaMode
from kvcert.reference.retention import Kept, Retained, keeps, periodic_mask
from kvcert.spec import ChunkedLocal, Group, MambaState, SlidingWindow
from kvcert.spec import retention as spec

SIZES = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def groups(draw: st.DrawFn) -> tuple[GroupConfig, Group]:
    size, reach = draw(SIZES), draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["window", "chunk", "state"]))
    if kind == "window":
        return GroupConfig(Kind.SLIDING_WINDOW, size, window=reach), SlidingWindow(size, reach)
    if kind == "chunk":
        return GroupConfig(Kind.CHUNKED_LOCAL, size, chunk=reach), ChunkedLocal(size, reach)
    return GroupConfig(Kind.MAMBA, size, mode=MambaMode.ALIGN), MambaState(size, MambaMode.ALIGN)


@given(
    pair=groups(),
    named=st.frozensets(st.integers(1, 60), max_size=4),
    every=st.sampled_from([0, 2, 4, 6, 8, 12, 16]),
    below=st.sampled_from([0, 2, 4]),
)
def test_kept_positions_are_the_specs(
    pair: tuple[GroupConfig, Group], named: frozenset[int], every: int, below: int
) -> None:
    group, twin = pair
    below = below if every > below else 0
    lengths = Retained(named, every, below)
    kept = Kept(group, lengths, periodic_mask(group, every, below))
    wanted = spec.Retained(named, every, below)
    for position in range(40):
        expected = spec.keeps(twin, wanted, position)
        assert keeps(group, lengths, position) == expected, position
        assert (position in kept) == expected, position


def test_a_window_block_no_aligned_hit_reads_is_left_out() -> None:
    """vLLM's geometry (full B=32 beside SW B=8 W=8): of each 32 tokens only the last block."""
    window = GroupConfig(Kind.SLIDING_WINDOW, 8, window=8)
    dense = Retained(frozenset(), 32)
    kept = Kept(window, dense, periodic_mask(window, 32, 0))
    assert [j for j in range(12) if j in kept] == [3, 7, 11]
