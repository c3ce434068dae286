"""kvcert.reference.tails beyond the differential machine: what the manager refuses under
`unit U`, what it returns, and that the pure-Python key index serves the tails too."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.reference import block_pool
from kvcert.reference.config import CacheConfig, GroupConfig, Kind, MambaMode
from kvcert.reference.errors import ConfigError, RequestStateError
from kvcert.reference.keyindex import PyKeyIndex
from kvcert.reference.lookup import Layered
from kvcert.reference.manager import KVCacheManager
from kvcert.reference.tails import Tails
from tests.differential.test_allocator import ReferenceAgainstSpecUnderUnit
from tests.tiers import tiered

HYBRID = (GroupConfig(Kind.FULL, 64), GroupConfig(Kind.MAMBA, 64, mode=MambaMode.ALIGN))
PROMPT = list(range(1, 101))


def manager(**settings: object) -> KVCacheManager:
    return KVCacheManager(CacheConfig(HYBRID, 20, hit_unit=16, **settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"eviction": "hybrid"}, "lru-unkeyed-first"),
        ({"record_events": True}, "record_events"),
        ({"count_dead_evictions": True}, "count_dead_evictions"),
    ],
)
def test_the_unit_profile_refuses_what_it_does_not_serve(settings, fragment):
    with pytest.raises(ConfigError, match=fragment):
        manager(**settings)


def test_the_unit_profile_serves_sparse_retention():
    """RET-SPARSE-2/-3 under `unit U`: a prompt of 100 computed in one chunk that saves its
    tail 96 in passing; a re-send hits 96 under sparse retention as under dense."""
    for retention in ("dense", "sparse"):
        m = manager(retention=retention)
        m.admit("a", PROMPT, 100, checkpoint=96)
        m.end_step()
        m.finish("a")
        assert m.admit("b", PROMPT, 4).hit == 96, retention


DRAFTED = (GroupConfig(Kind.FULL, 64), GroupConfig(Kind.FULL, 64, draft=True))


def test_draft_groups_are_refused_under_the_unit_profile_only_with_the_drop():
    with pytest.raises(ConfigError, match="drop profile"):
        KVCacheManager(CacheConfig(DRAFTED, 20, speculative="drop", hit_unit=16))
    KVCacheManager(CacheConfig(DRAFTED, 20, speculative="exact", hit_unit=16))


@pytest.mark.parametrize(("reach", "prompt", "tail"), [(1, 100, 96), (2, 98, 96), (3, 98, 80)])
def test_a_draft_group_keys_its_tail_where_a_resend_can_hit(reach, prompt, tail):
    """ALLOC-UNIT-2 for a draft group (exact keying): the tail is the re-send hit, prompt -
    max(1, reach) floored to U (a draft key covers `reach` tokens past it), keyed in both
    groups once the reach - 1 tokens after it are computed; a re-send hits there."""
    config = CacheConfig(DRAFTED, 20, speculative="exact", draft_reach=reach, hit_unit=16)
    kv = KVCacheManager(config)
    tokens = list(range(1, prompt + 1))
    a = kv.admit("a", tokens, prompt)
    kv.end_step()
    assert [kv.cached_block(tokens, g, tail) for g in (0, 1)] == [a.tables[0][1], a.tables[1][1]]
    kv.finish("a")
    assert kv.lookup(tokens)[0] == tail


LONG = [*PROMPT, *range(200, 228)]  # 128 tokens: blocks 0 and 1 whole


def test_same_pass_serves_a_block_in_flight_as_a_table_entry_never_a_copy():
    """HIT-UNIT-5 (the spec's worked example): b re-sends a's prompt in a's step; a hit
    ending inside block 1 would copy a's block 1 before a's pass writes it."""
    kv = KVCacheManager(CacheConfig((GroupConfig(Kind.FULL, 64),), 20, hit_unit=16,
                                    visibility="same-pass"))  # fmt: skip
    a = kv.admit("a", LONG, 128)
    b = kv.admit("b", LONG, 128)
    assert (b.hit, b.copies) == (64, ())
    assert b.tables[0][0] == a.tables[0][0]
    kv.end_step()
    c = kv.admit("c", LONG, 128)
    assert c.hit == 112
    assert c.copies == ((0, a.tables[0][1], c.tables[0][1]),)


def test_a_chunk_withdrawn_or_ended_leaves_no_block_in_flight():
    kv = KVCacheManager(CacheConfig((GroupConfig(Kind.FULL, 64),), 20, hit_unit=16,
                                    visibility="same-pass"))  # fmt: skip
    kv.admit("a", LONG, 128)
    assert kv._tails is not None
    assert len(kv._tails.flying) == 2
    kv.preempt("a")  # nobody read its blocks: they lose their keys (ALLOC-VIS-3)
    assert kv._tails.flying == set()
    kv.admit("a", LONG, 128)
    kv.end_step()
    assert kv._tails.flying == set()


def test_a_copy_source_does_not_stop_a_withdrawal():
    """ALLOC-VIS-3 refuses only table readers: b reads a's block under its older tail key."""
    kv = KVCacheManager(CacheConfig((GroupConfig(Kind.FULL, 4),), 4, hit_unit=1,
                                    visibility="same-pass"))  # fmt: skip
    a = kv.admit("a", [1, 2, 3], 3)
    kv.end_step()
    b = kv.admit("b", [1, 2], 2)
    assert b.copies == ((0, a.tables[0][0], b.tables[0][0]),)
    kv.extend("a", 1, [0])
    assert kv.finish("a") == 0
    assert kv.lookup([1, 2, 3, 9])[0] == 2  # the tail key stayed


def test_a_dispatched_release_of_a_chunk_keeping_a_checkpoint_is_refused():
    """Its pass would overwrite the keyed state block before the copy took the key: refused,
    nothing released; released normally, the checkpoint stays keyed."""
    kv = manager()
    kv.admit("a", PROMPT, 96)
    kv.end_step()
    assert len(kv.extend("a", 4).copies) == 1
    with pytest.raises(RequestStateError, match="dispatched"):
        kv.finish("a", dispatched=True)
    kv.finish("a")
    assert kv.lookup(PROMPT)[0] == 96


def test_the_hit_after_the_steps_counts_the_tail_keys_they_register():
    """What a drop-in asks before holding a request back a step (vLLM's Mamba deferral): the
    writer's chunk in flight ends at the tail 96, so once its step ends a re-send hits 96
    (a block search over whole keys alone would say 64)."""
    kv = manager()
    kv.admit("a", PROMPT, 96)
    assert kv.lookup(PROMPT)[0] == 0
    assert kv.lookup_after_steps(PROMPT) == 96
    assert kv.lookup_after_steps(PROMPT, max_hit=90) == 0  # the chunk saves no state below 96
    kv.end_step()
    assert kv.lookup(PROMPT)[0] == kv.lookup_after_steps(PROMPT) == 96


def test_pipelining_calls_are_refused_under_the_unit_profile():
    kv = manager()
    kv.admit("a", PROMPT, 96)
    with pytest.raises(RequestStateError, match="reserve under `unit U`"):
        kv.reserve("a", 100)
    kv.end_step()
    with pytest.raises(RequestStateError, match="accept under `unit U`"):
        kv.accept("a", [1])


def test_max_hit_caps_a_unit_hit_on_the_unit_grid():
    kv = manager()
    kv.admit("a", PROMPT[:64] + [7] * 36, 100)
    kv.end_step()
    kv.finish("a")
    assert kv.lookup(PROMPT[:64] + [7] * 36)[0] == 0  # no state checkpoint at 96 or 64
    kv = KVCacheManager(CacheConfig((GroupConfig(Kind.FULL, 64),), 20, hit_unit=16))
    kv.admit("a", PROMPT, 100)
    kv.end_step()
    kv.finish("a")
    assert kv.lookup(PROMPT)[0] == 96
    assert kv.lookup(PROMPT, max_hit=90)[0] == 80


def test_the_combined_served_map_reads_block_keys_then_tail_keys():
    served = Layered({b"a": 3}, {b"b": 5})
    assert (served.get(b"a", 0), served.get(b"b", 0), served.get(b"c", 0)) == (3, 5, 0)
    assert served[b"b"] == 5
    assert b"a" in served
    assert b"c" not in served
    assert len(served) == 2
    assert dict(served.items()) == {b"a": 3, b"b": 5}
    with pytest.raises(KeyError):
        served[b"c"]


def test_tails_need_the_profile_and_a_pool_keeping_tail_keys():
    config = CacheConfig(HYBRID, 8)
    with pytest.raises(ValueError, match="hit_unit is None"):
        Tails(config, block_pool.BlockPool(8, num_groups=2), [0, 0])
    unit = CacheConfig(HYBRID, 8, hit_unit=16)
    with pytest.raises(ValueError, match="tail_keys=True"):
        Tails(unit, block_pool.BlockPool(8, num_groups=2), [0, 0])


def test_the_pure_python_key_index_serves_tails_too(monkeypatch):
    """The unit machine with the pool's block and tail keys on the fallback PyKeyIndex."""
    monkeypatch.setattr(block_pool, "KeyIndex", PyKeyIndex)
    ReferenceAgainstSpecUnderUnit.steps = 0
    run_state_machine_as_test(
        ReferenceAgainstSpecUnderUnit,
        settings=settings(max_examples=tiered(100, 2000), stateful_step_count=80),
    )
    assert ReferenceAgainstSpecUnderUnit.steps >= tiered(2_000, 60_000)


def test_cached_block_names_a_tail_key_and_after_steps_the_keys_a_chunk_in_flight_registers():
    """The inspection view: `cached_block` at a position inside a block is the block holding
    the tail key there (ALLOC-UNIT-2); `after_steps` counts the keys the chunks in flight
    register when their steps end, which a lookup serves only then (ALLOC-VIS-1)."""
    kv = manager()
    a = kv.admit("a", PROMPT, 96)
    assert [kv.cached_block(PROMPT, g, 96) for g in (0, 1)] == [None, None]
    after = [kv.cached_block(PROMPT, g, 96, after_steps=True) for g in (0, 1)]
    assert after == [a.tables[0][1], a.tables[1][1]]
    assert kv.cached_block(PROMPT, 0, 64, after_steps=True) == a.tables[0][0]
    assert kv.cached_block(PROMPT, 0, 88, after_steps=True) is None  # not a multiple of U
    assert kv.lookup(PROMPT)[0] == 0
    pending = kv.keys_after_steps()  # block 0 whole, the tail at 96 in both groups
    assert sorted(pending) == sorted([a.tables[0][0], a.tables[0][1], a.tables[1][1]])
    assert pending[a.tables[1][1]][0] == 1
    kv.end_step()
    assert kv.keys_after_steps() == {}
    assert [kv.cached_block(PROMPT, g, 96) for g in (0, 1)] == after
    assert kv.cached_block(PROMPT, 1, 80) is None  # no checkpoint there
    assert kv.lookup(PROMPT)[0] == 96


def test_keys_after_steps_move_a_kept_tail_key_to_its_copy():
    """ALLOC-UNIT-4 seen early: while the chunk that overwrites a state block keyed at 96 is
    in flight, `keys_after_steps` names the copy as the key's holder and the written block as
    losing it (what the key index shows once the step ends)."""
    kv = manager()
    a = kv.admit("a", PROMPT, 96)
    kv.end_step()
    kept = kv.extend("a", 4)
    ((group, source, target),) = kept.copies
    assert source == a.tables[1][1]
    moves = kv.keys_after_steps()
    assert moves[source] is None
    assert moves[target] == (group, kv.pool.tails.key_of(source))
    assert kv.cached_block(PROMPT, 1, 96) == source  # until the step ends
    assert kv.cached_block(PROMPT, 1, 96, after_steps=True) == target
    kv.end_step()
    assert kv.pool.tails.key_of(target) == moves[target][1]
    assert kv.pool.tails.key_of(source) is None


def test_the_chunk_ending_the_prompt_saves_its_tail_in_passing():
    """CKPT-INNER-2: the tail 96 saved into the position before the running one, keyed there
    (the view after the step in flight names it already), and a re-send hits it; the twin
    without the checkpoint leaves no state at 96."""
    core = manager()
    core.admit("a", PROMPT, 100, checkpoint=96)
    assert core.checkpoint_position("a", 1, 96) == 0
    saved = core.block_at("a", 1, 0)
    assert core.cached_block(PROMPT, 1, 96, after_steps=True) == saved
    assert core.cached_block(PROMPT, 1, 96) is None  # not before the step ends
    core.end_step()
    assert core.cached_block(PROMPT, 1, 96) == saved
    core.finish("a")
    resend = core.admit("b", PROMPT, 4)
    assert resend.hit == 96
    assert (1, saved, resend.tables[1][1]) in resend.copies
    twin = manager()
    twin.admit("a", PROMPT, 100)
    twin.end_step()
    twin.finish("a")
    assert twin.admit("b", PROMPT, 4).hit == 0


def test_a_chunk_inside_the_prompt_saves_a_state_a_diverging_prompt_hits():
    """CKPT-INNER-2 in a chunk that does not end the prompt (attention blocks of 16, so a
    hit at 112 is one attention serves): the twin naming no checkpoint serves 0."""
    groups = (GroupConfig(Kind.FULL, 16), GroupConfig(Kind.MAMBA, 64, mode=MambaMode.ALIGN))
    prompt = list(range(1, 201))
    diverging = [*prompt[:120], *range(900, 940)]
    for checkpoint, hit in ((112, 112), (0, 0)):
        core = KVCacheManager(CacheConfig(groups, 40, hit_unit=16))
        core.admit("a", prompt, 160, checkpoint=checkpoint)
        core.end_step()
        core.extend("a", 40)
        core.end_step()
        core.finish("a")
        assert core.admit("b", diverging, 4).hit == hit


def test_a_unit_checkpoint_the_chunk_cannot_save_is_refused():
    core = manager()
    core.admit("a", PROMPT, 64)
    core.end_step()
    with pytest.raises(RequestStateError, match="holds the state the chunk reads"):
        core.extend("a", 36, checkpoint=96)
    with pytest.raises(RequestStateError, match="a multiple of U=16 inside a block"):
        core.extend("a", 36, checkpoint=90)
