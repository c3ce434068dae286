"""Per-kind position arithmetic: first_release is first_read's inverse for a one-token step."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcert.reference.config import GroupConfig, Kind, MambaMode
from kvcert.reference.groups import first_needed, first_read, first_release, needs_last_block

SIZES = st.integers(1, 8)
GROUPS = st.one_of(
    st.builds(GroupConfig, st.just(Kind.FULL), SIZES),
    st.builds(GroupConfig, st.just(Kind.SLIDING_WINDOW), SIZES, window=st.integers(1, 40)),
    st.builds(GroupConfig, st.just(Kind.CHUNKED_LOCAL), SIZES, chunk=st.integers(1, 40)),
    st.builds(GroupConfig, st.just(Kind.MAMBA), SIZES, mode=st.sampled_from(list(MambaMode))),
)


@given(GROUPS, st.integers(0, 12))
def test_first_release_is_the_least_step_that_stops_reading_a_position(group, low):
    steps = range(0, 400)
    released = [c for c in steps if first_read(group, c, c + 1) > low]
    expected = released[0] if released else None
    assert first_release(group, low) == expected
    # and first_read never comes back below it (the kept range only moves forward)
    assert all(first_read(group, c, c + 1) > low for c in steps if c >= (expected or 400))


@given(GROUPS)
def test_needs_last_block_says_exactly_when_every_run_holds_its_last_block(group):
    """The hit search leaps over a stretch of missing blocks only for these groups."""
    size = group.block_size
    lengths = range(size, 400)
    holds = all(first_needed(group, n) <= n // size - 1 for n in lengths)
    assert needs_last_block(group) == holds
