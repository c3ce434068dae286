"""What an engine's scheduler asks beyond admit/extend: capped hits, admission margins,
progress and deferred releases (used by kvcert.reference.vllm)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind
from kvcert.reference.errors import RequestStateError, UnknownRequestError
from kvcert.reference.manager import KVCacheManager, Scheduled, Waiting
from tests.tiers import tiered

FULL = GroupConfig(Kind.FULL, 16)
SW = GroupConfig(Kind.SLIDING_WINDOW, 16, window=32)
PROMPT = list(range(100, 197))  # 97 tokens: 6 whole blocks


def cached(*groups: GroupConfig, blocks: int = 64, **kwargs: object) -> KVCacheManager:
    """A manager whose cache holds PROMPT's whole blocks, nothing running."""
    m = KVCacheManager(CacheConfig(tuple(groups or (FULL, SW)), blocks, **kwargs))  # type: ignore[arg-type]
    m.admit("warm", PROMPT, 1 << 20)
    m.end_step()
    m.finish("warm")
    return m


def accepted(m: KVCacheManager, length: int) -> bool:
    """Whether every group accepts a hit of `length` tokens of PROMPT: the hit of the prompt
    cut one token after it (HIT-LEN-1) reaches it."""
    return m.lookup(PROMPT[: length + 1])[0] == length if length else True


@settings(max_examples=tiered(30, 300), deadline=None)
@given(cap=st.integers(0, len(PROMPT)), window=st.sampled_from([16, 32, 48]))
def test_a_capped_hit_is_the_longest_accepted_length_below_the_cap(cap: int, window: int) -> None:
    m = cached(FULL, GroupConfig(Kind.SLIDING_WINDOW, 16, window=window))
    full, _ = m.lookup(PROMPT)
    hit, tables = m.lookup(PROMPT, max_hit=cap)
    best = max(n for n in range(0, min(cap, full) + 1, 16) if accepted(m, n))
    assert hit == (full if cap >= full else best)
    admitted = m.admit("r", PROMPT, 8, max_hit=cap)
    assert isinstance(admitted, Scheduled)
    assert admitted.hit == hit
    assert admitted.tables is not None
    assert [t[: len(h)] for t, h in zip(admitted.tables, tables, strict=True)] == list(tables)


def test_a_cap_under_drop_keying_is_not_dropped_again() -> None:
    draft = GroupConfig(Kind.FULL, 16, draft=True)
    m = cached(FULL, draft, speculative=DraftKeying.DROP)
    assert m.lookup(PROMPT)[0] == 80  # six blocks cached, the last one dropped
    assert m.lookup(PROMPT, max_hit=80)[0] == 80
    assert m.lookup(PROMPT, max_hit=79)[0] == 64  # a longer accepted length exists: no drop
    assert m.lookup(PROMPT, max_hit=0)[0] == 0


def test_admission_margins() -> None:
    m = cached(FULL, blocks=12)  # 11 usable, 6 of them cached and free
    need = 1  # a 16-token chunk after a 96-token hit: one new block
    assert isinstance(m.admit("a", PROMPT, 16, keep_free=11 - 6 - need), Scheduled)
    m.finish("a")
    assert isinstance(m.admit("a", PROMPT, 16, keep_free=11 - 6), Waiting)
    # 157 tokens take 10 blocks: the 6 it revives and 4 new ones, 1 to spare of 11
    longer = PROMPT + [1] * 60
    assert isinstance(m.admit("b", longer, 16, fit_tokens=157, fit_keep_free=1), Scheduled)
    m.finish("b")
    refused = m.admit("b", longer, 16, fit_tokens=157, fit_keep_free=2)
    assert isinstance(refused, Waiting)
    assert not m.is_running("b")
    for bad in ({"max_hit": -1}, {"keep_free": -2}, {"fit_keep_free": "3"}):
        with pytest.raises(RequestStateError):
            m.admit("c", PROMPT, 16, **bad)  # type: ignore[arg-type]
        assert not m.is_running("c")


def test_the_whole_prompt_gate_lets_windows_recycle() -> None:
    # 1,600 tokens: 100 blocks of full attention; the 32-token window's last 512-token chunk
    # keeps 34 blocks (2 of window before it, 32 written). 134 fit in 140 usable, 200 do not.
    m = KVCacheManager(CacheConfig((FULL, SW), 141))
    long = list(range(1600))
    assert isinstance(m.admit("r", long, 512, fit_tokens=1600, fit_keep_free=6), Scheduled)
    m.finish("r")
    assert isinstance(m.admit("r", long, 512, fit_tokens=1600, fit_keep_free=7), Waiting)
    with pytest.raises(RequestStateError):
        m.admit("r", long, 512, fit_tokens=-1)


def test_progress_in_flight_and_blocks_to_reach() -> None:
    m = KVCacheManager(CacheConfig((FULL,), 64))
    m.admit("r", PROMPT, 40)
    assert m.progress("r") == (40, 97)
    assert m.in_flight("r")
    assert m.blocks_to_reach("r", 40) == 0  # the chunk's blocks are held
    assert m.blocks_to_reach("r", 97) == 7 - 3
    assert m.blocks_to_reach("r", 129) == 9 - 3  # slots past the known tokens: lookahead
    m.end_step()
    assert not m.in_flight("r")
    with pytest.raises(UnknownRequestError):
        m.progress("nobody")
    with pytest.raises(RequestStateError):
        m.blocks_to_reach("r", -1)


def test_a_renamed_request_keeps_its_blocks_and_frees_its_id() -> None:
    m = cached(FULL)
    m.admit("r", PROMPT, 8)
    tables = m.block_tables("r")
    m.rename("r", "parked")
    assert not m.is_running("r")
    assert m.block_tables("parked") == tables
    assert isinstance(m.admit("r", PROMPT, 8), Scheduled)  # the id is free again
    with pytest.raises(RequestStateError):
        m.rename("r", "parked")
    with pytest.raises(UnknownRequestError):
        m.rename("gone", "elsewhere")
    free = m.stats().free_blocks
    m.finish("parked")
    assert m.stats().free_blocks > free
