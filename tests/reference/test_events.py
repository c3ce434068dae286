"""What the cache announces (kvcert.reference.events): every hittable block announced once,
every eviction withdrawn, and recording them changes nothing the allocator does."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference.config import BLOCK_POOL_EVICTIONS, CacheConfig, Eviction, GroupConfig, Kind
from kvcert.reference.events import Cleared, Removed, Stored
from kvcert.reference.manager import KVCacheManager, Scheduled
from tests.tiers import tiered

FULL = GroupConfig(Kind.FULL, 4)
SW = GroupConfig(Kind.SLIDING_WINDOW, 8, window=8)


def manager(blocks: int = 32, **kwargs: object) -> KVCacheManager:
    return KVCacheManager(CacheConfig((FULL, SW), blocks, record_events=True, **kwargs))  # type: ignore[arg-type]


def test_a_computed_prompt_announces_each_registered_block_with_its_parent_and_tokens() -> None:
    m = manager()
    prompt = list(range(50, 67))  # 17 tokens: 4 blocks of FULL, 2 of SW
    m.admit("r", prompt, 64)
    assert m.take_events() == []  # nothing is hittable before the step ends
    registered = m.end_step()
    events = m.take_events()
    assert len(events) == registered == 6
    assert all(isinstance(e, Stored) and e.rid == "r" for e in events)
    full = [e for e in events if isinstance(e, Stored) and e.group == 0]
    assert [e.tokens for e in full] == [tuple(prompt[i : i + 4]) for i in range(0, 16, 4)]
    assert [e.start for e in full] == [0, 4, 8, 12]
    assert full[0].parent is None
    assert [e.parent for e in full[1:]] == [e.key for e in full[:-1]]
    tables = m.block_tables("r")
    assert [e.block for e in full] == list(tables[0][:4])
    assert m.take_events() == []  # taken once


def test_evictions_and_resets_are_announced() -> None:
    m = manager(blocks=8)
    m.admit("a", list(range(100, 113)), 64)
    m.end_step()
    m.finish("a")
    stored = m.take_events()
    m.admit("b", list(range(200, 213)), 64)  # needs the free blocks, cached ones included
    removed = [e for e in m.take_events() if isinstance(e, Removed)]
    assert removed
    keys = {(e.group, e.key, e.block) for e in stored if isinstance(e, Stored)}
    assert {(e.group, e.key, e.block) for e in removed} <= keys
    m.end_step()
    m.finish("b")
    m.take_events()
    assert m.reset_prefix_cache()
    assert m.take_events() == [Cleared()]


def test_without_recording_nothing_is_announced() -> None:
    m = KVCacheManager(CacheConfig((FULL, SW), 32))
    m.admit("r", list(range(17)), 64)
    m.end_step()
    assert m.take_events() == []


@settings(max_examples=tiered(30, 300), deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=12),
    eviction=st.sampled_from(BLOCK_POOL_EVICTIONS),
    resets=st.sets(st.integers(0, 11)),
)
def test_the_announcements_replay_to_the_registered_keys(
    prompts: list[list[int]], eviction: Eviction, resets: set[int]
) -> None:
    """A consumer counting Stored +1, Removed -1 and Cleared as a reset holds, after every
    step, exactly the (group, key) pairs the pool's blocks are registered under; a twin that
    records nothing makes every hit and table the same."""
    recorded = manager(blocks=12, eviction=eviction)
    plain = KVCacheManager(CacheConfig((FULL, SW), 12, eviction=eviction))
    held: Counter[tuple[int, bytes]] = Counter()
    for i, prompt in enumerate(prompts):
        results = [m.admit("r", prompt, 64) for m in (recorded, plain)]
        assert results[0] == results[1]
        if isinstance(results[0], Scheduled):
            for m in (recorded, plain):
                m.end_step()
                m.finish("r")
        if i in resets:
            for m in (recorded, plain):
                assert m.reset_prefix_cache()
        for event in recorded.take_events():
            if isinstance(event, Stored):
                held[event.group, event.key] += 1
            elif isinstance(event, Removed):
                held[event.group, event.key] -= 1
            else:
                held.clear()
        pool = recorded.pool
        actual = Counter(k for b in range(1, pool.num_blocks) if (k := pool.key_of(b)))
        assert +held == actual
