"""The compiled decode lane equals the general path it replaces, state for state.

Two managers take the same calls: one with the lane (reference/_decodelane.c), one whose
lane is off, so that the general paths of `extend` and `admit` take every step the quiet
fast path does not, every prompt's next chunk and every admission's first chunk. Every
answer must be equal, and after every call every request's fields (tables, first held
positions, counters, quiet bounds, tokens) and the pool's whole state (counts and the lru
ring, free and registered counts, eviction counters, every block's key). The workloads are
decode-heavy over small pools: boundaries, window and chunk releases, evictions, Waiting,
lookahead grown and shrunk, budgets short of the tokens, max_model_len, malformed tokens;
admissions with hits (capped at times), lookahead, blocks kept free and vLLM's whole-prompt
gate.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference import decode_lane
from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    Eviction,
    GroupConfig,
    Kind,
    MambaMode,
    Visibility,
)
from kvcert.reference.errors import ConfigError, KVCacheError
from kvcert.reference.manager import KVCacheManager
from kvcert.reference.requests import Scheduled
from tests.tiers import tiered

compiled = pytest.importorskip("kvcert.reference._decodelane")

SIZES = st.sampled_from([1, 2, 3, 4, 8])
ATTENTION = st.one_of(
    st.builds(GroupConfig, st.just(Kind.FULL), SIZES),
    st.builds(
        lambda size, window: GroupConfig(Kind.SLIDING_WINDOW, size, window=window),
        SIZES,
        st.integers(1, 24),
    ),
    st.builds(
        lambda size, chunk: GroupConfig(Kind.CHUNKED_LOCAL, size, chunk=chunk),
        SIZES,
        st.integers(1, 24),
    ),
)
SERVED = {
    "prefill": 0,
    "admitted": 0,
    "admit_declined": 0,
    "lane": 0,
    "quiet": 0,
    "declined": 0,
    "registered": 0,
    "published": 0,
    "state": 0,
    "state_changes": 0,
    "ended": 0,
    "end_declined": 0,
}


class Counted:
    """The lane, counting the steps it took and the ones it left to the general path, and
    the registrations it made."""

    def __init__(self, lane: Any, quiet: Any, stateful: bool) -> None:
        self.lane = lane
        self.quiet = quiet  # the new blocks of a step that allocates nothing
        self.stateful = stateful  # a state group: the lane registers nothing

    def extend(self, *args: Any) -> Any:
        answer = self.lane.extend(*args)
        if answer is None:
            SERVED["declined"] += 1
        elif not args[3]:  # a prompt's next chunk
            SERVED["prefill"] += 1
        elif answer.new_blocks is self.quiet:
            SERVED["quiet"] += 1
            SERVED["state"] += self.stateful
        else:
            SERVED["lane"] += 1
            SERVED["state_changes"] += self.stateful
        return answer

    def end_chunks(self, *args: Any) -> Any:
        return self.lane.end_chunks(*args)

    def end_step(self, core: Any, step: Any) -> Any:
        # every other step, the same-pass publications are taken first (counted) and left
        # to the core as if published outside the lane, which the compiled end_step adds
        # alike; the other steps it takes them from the lane itself
        counting = SERVED["ended"] % 2 == 0
        published = self.take_published() if counting else 0
        core._published_in_step += published
        answer = self.lane.end_step(core, step)
        if answer is None:  # the definition then answers, the publications counted in
            SERVED["end_declined"] += 1
            return None
        SERVED["ended"] += 1
        if counting and not self.stateful:  # the lane's registrations (a state layout's
            SERVED["registered"] += answer - published  # are Python's)
        return answer

    def admit(self, *args: Any) -> Any:
        answer = self.lane.admit(*args)
        SERVED["admitted" if answer is not None else "admit_declined"] += 1
        return answer

    def publish(self, request: Any) -> int | None:
        published = self.lane.publish(request)
        SERVED["published"] += published or 0
        return published

    def take_published(self) -> int:
        published = self.lane.take_published()
        SERVED["published"] += published
        return published

    def register(self, *args: Any) -> Any:
        registered = self.lane.register(*args)
        SERVED["registered"] += registered or 0
        return registered


def with_lane(config: CacheConfig) -> KVCacheManager:
    """A manager whose lane is the compiled one, also where this process runs pure Python
    (KVCERT_PURE_PYTHON=1: then over the pure-Python key index)."""
    manager = KVCacheManager(config)
    assert decode_lane.serves(config, manager.pool)
    lane = decode_lane.build(
        compiled.DecodeLane,
        config,
        manager.pool,
        manager._commits,
        (manager._no_blocks, manager._quiet_steps),
    )
    stateful = any(g.kind is Kind.MAMBA for g in config.groups)
    manager._lane = Counted(lane, manager._no_blocks, stateful)
    manager._lane_registers = decode_lane.registers(config, manager._commits)
    return manager


def without_lane(config: CacheConfig) -> KVCacheManager:
    manager = KVCacheManager(config)
    manager._lane = None
    return manager


REQUEST_FIELDS = (
    "computed",
    "scheduled",
    "lookahead",
    "decoding",
    "held_from",
    "tables",
    "registered",
    "commit_at",
    "quiet_end",
    "quiet_state",
    "quiet_slots",
    "quiet_slots_floor",
    "published",
)


def state(manager: KVCacheManager) -> Any:
    pool = manager.pool
    requests = {
        rid: (
            [getattr(r, f) for f in REQUEST_FIELDS],
            r.tokens.tolist(),
            [(c.digests, c._fed, bytes(c._stream)) for c in r.unique_chains],
        )
        for rid, r in manager._requests.items()
    }
    blocks = range(pool.num_blocks)
    keys = [(pool.keys.key_of(b), pool.keys.group_of(b)) for b in blocks]
    counters = (pool.num_free, pool.num_registered, pool.evictions, pool.dead_evictions)
    ring = (pool.ref_count.tolist(), pool.queue.links.tolist())
    return requests, dict(manager._in_flight), keys, counters, ring


def both(pair: tuple[KVCacheManager, KVCacheManager], call: str, *args: Any, **kw: Any) -> Any:
    answers = []
    for manager in pair:
        try:
            answers.append(getattr(manager, call)(*args, **kw))
        except KVCacheError as error:
            answers.append((type(error), str(error)))
    assert answers[0] == answers[1], (call, args, kw, answers)
    assert state(pair[0]) == state(pair[1]), (call, args, kw)
    return answers[0]


WORKLOAD = {
    "groups": st.lists(ATTENTION, min_size=1, max_size=3),
    "blocks": st.integers(6, 60),
    "limit": st.one_of(st.none(), st.integers(25, 120)),  # past every alignment (lcm 24)
    "drafts": st.booleans(),
    "reach": st.integers(1, 3),  # draft_reach: commits wait for reach - 1 more tokens
    "visibility": st.sampled_from(Visibility),  # same-pass: a launch publishes (ALLOC-VIS-2)
    "script": st.lists(
        st.tuples(st.integers(0, 11), st.integers(1, 3), st.integers(0, 3), st.integers(1, 30)),
        min_size=10,
        max_size=80,
    ),
}
STATE = st.one_of(  # blocks of 6 to 12 (lcm 24 with SIZES): most decode steps are quiet
    st.builds(
        GroupConfig,
        st.just(Kind.MAMBA),
        st.sampled_from([6, 8, 12]),
        mode=st.sampled_from(MambaMode),
    ),
    st.builds(  # a decode chunk holds positions for its drafts' states (ALLOC-SPEC-1)
        GroupConfig,
        st.just(Kind.MAMBA),
        st.sampled_from([6, 8, 12]),
        mode=st.just(MambaMode.ALIGN),
        speculative_blocks=st.integers(1, 2),
    ),
)


@settings(max_examples=tiered(150, 3000), deadline=None)
@given(**WORKLOAD)
def decode_workload(groups, blocks, limit, drafts, reach, visibility, script):
    play(groups, blocks, limit, drafts, reach, visibility, script)


@settings(max_examples=tiered(150, 1500), deadline=None)
@given(state=STATE, **WORKLOAD)
def state_decode_workload(state, groups, blocks, limit, drafts, reach, visibility, script):
    """With a state (Mamba) group: the lane takes the decode steps, registers nothing."""
    play([*groups, state], blocks, limit, drafts, reach, visibility, script)


def play(groups, blocks, limit, drafts, reach, visibility, script):
    if drafts:  # a draft group: its keys and commits wait for the drafts (extend does not)
        groups = [*groups, GroupConfig(Kind.FULL, 4, draft=True)]
    config = CacheConfig(
        tuple(groups),
        blocks,
        speculative=DraftKeying.EXACT if drafts else None,
        draft_reach=reach if drafts else 1,
        max_model_len=limit,
        eviction=Eviction.LRU,
        visibility=visibility,
    )
    pair = (with_lane(config), without_lane(config))
    states = [g.block_size for g in groups if g.kind is Kind.MAMBA]
    running: list[str] = []
    serial, token = 0, 100
    for roll, count, lookahead, size in script:
        if roll == 0 or not running:  # a new request; prompts share a prefix
            rid = f"r{serial}"
            serial += 1
            # vLLM's whole-prompt gate (at times asking for more than the prompt), blocks kept
            # free, lookahead, a first chunk verifying drafts
            options = {
                "lookahead": lookahead,
                "keep_free": lookahead * (count - 1),
                "fit_tokens": size + count - 1 if count > 1 else None,
                "fit_keep_free": lookahead if count == 3 else 0,
                "verifies_drafts": count == 2,
                "max_hit": max(size - lookahead, 0) if lookahead > 1 else None,  # capped
            }
            tokens = [*range(size), serial]
            if hasattr(both(pair, "admit", rid, tokens, size % 9 + 1, **options), "hit"):
                running.append(rid)
            continue
        rid = running[size % len(running)]
        if roll == 1:
            both(pair, "finish" if size % 2 else "preempt", rid)
            running.remove(rid)
        elif roll == 2:  # lookahead slots held while the chunk is in flight
            computed, known = pair[0].progress(rid)
            # at times with the end of a chunk scheduled behind it: a state group then holds
            # its running state there, and later steps ending before it keep it
            chunk_end = computed + count + size if size % 3 == 0 else 0
            checkpoint = 0
            if states and chunk_end and size % 2:
                # and at times that chunk's inner checkpoint (CKPT-INNER-1): the first state
                # boundary it may save, past the one its state is read from; open until a
                # step passes it (an invalid one is refused alike)
                start = max(computed, pair[0]._requests[rid].pipelined)
                checkpoint = ((start - 1) // states[0] + 2) * states[0] if start else states[0]
                chunk_end = checkpoint + 1 + size % 4
            both(pair, "reserve", rid, computed + lookahead + count, chunk_end, checkpoint)
        else:  # a step: the sampled tokens, or the prompt's next chunk
            # numbered (roll 10, 11): a step that may end while a later one runs
            step = both(pair, "start_step") if roll >= 10 else 0
            for each in list(running):
                if each in pair[0]._in_flight:  # its chunk from a numbered step runs on
                    continue
                computed, known = pair[0].progress(each)
                if computed < known:
                    both(pair, "extend", each, size)
                    continue
                appended: list[Any] = list(range(token, token + count))
                token += count
                if roll == 3:  # a malformed token: both refuse it alike
                    appended[-1] = [-1, "7", 2**63, True][size % 4]
                budget = count - 1 if roll == 4 else count  # short budgets schedule fewer
                both(pair, "extend", each, max(budget, 1), appended, lookahead if roll > 8 else 0)
            if step and size % 7 == 0:  # a step not started yet: refused alike
                both(pair, "end_step", step + 1)
            if step and size % 2 == 0:  # the steps before it end; its chunks run on
                both(pair, "end_step", step - 1)
            else:
                both(pair, "end_step", step or None)


def test_the_lane_leaves_every_answer_and_state_as_the_general_path():
    """...and it takes table-changing steps, quiet steps, admissions' first chunks, prompts'
    next chunks, registrations and same-pass publications by the hundred, or this proves
    nothing."""
    SERVED.update(dict.fromkeys(SERVED, 0))
    decode_workload()
    # floors far below what any draw gives (unseeded, 11 runs: 310+, 157+ and 485+), so that
    # the test cannot pass vacuously and no draw fails it
    assert SERVED["lane"] >= 25, SERVED
    assert SERVED["quiet"] >= 25, SERVED
    if decode_lane.native("_chain") is not None:  # the lane registers with compiled SHA-256
        assert SERVED["registered"] >= 25, SERVED
    assert SERVED["published"] >= 25, SERVED  # same-pass launches (ALLOC-VIS-2)
    # admissions' first chunks (3 runs: 361+), and admissions left to the general path,
    # each one Waiting (269+)
    assert SERVED["admitted"] >= 25, SERVED
    assert SERVED["admit_declined"] >= 25, SERVED
    assert SERVED["prefill"] >= 25, SERVED  # prompts' next chunks (284+)
    # steps ended compiled (numbered ones among them, some ending only earlier steps), and
    # steps not started yet, which the compiled end_step leaves to the definition to refuse
    assert SERVED["ended"] >= 25, SERVED
    assert SERVED["end_declined"] >= 5, SERVED


def test_with_a_state_group_the_lane_takes_decode_steps_and_leaves_registration():
    """A layout with a state group (its running state, or every boundary's; drafts'
    positions): the lane answers the quiet steps and the steps that move the running state
    to a new block and release the one it leaves (by the dozen each, or this proves
    nothing), each answer and state equal to the general path's; registration stays the
    general path's."""
    SERVED.update(dict.fromkeys(SERVED, 0))
    state_decode_workload()
    assert SERVED["state"] >= 25, SERVED
    assert SERVED["state_changes"] >= 25, SERVED
    assert SERVED["registered"] == 0, SERVED  # a state layout's registrations are Python's
    assert SERVED["admitted"] >= 25, SERVED  # its admissions' first chunks (3 runs: 390+)
    assert SERVED["prefill"] >= 25, SERVED  # and prompts' next chunks (225+)


@pytest.mark.parametrize(
    ("change", "served"),
    [
        ({}, True),
        ({"eviction": Eviction.HYBRID}, False),
        ({"eviction": Eviction.LRU_UNKEYED_FIRST}, False),
        ({"record_events": True}, False),
        ({"count_dead_evictions": True}, False),
        ({"hit_unit": 4}, False),
        ({"groups": (GroupConfig(Kind.FULL, 8), GroupConfig(Kind.MAMBA, 8))}, True),
        ({"groups": (GroupConfig(Kind.FULL, 8), GroupConfig(Kind.CROSS, 8))}, False),
    ],
)
def test_the_lane_serves_attention_layouts_under_plain_lru_only(change, served):
    base: dict[str, Any] = {
        "groups": (GroupConfig(Kind.FULL, 8), GroupConfig(Kind.SLIDING_WINDOW, 8, window=32)),
        "num_blocks": 64,
    }
    config = CacheConfig(**(base | change))
    manager = KVCacheManager(config)
    assert decode_lane.serves(config, manager.pool) is served
    assert (manager._lane is not None) is (served and decode_lane.native("_decodelane") is not None)
    if not served:  # built by hand it is refused, not wrong
        with pytest.raises(ConfigError, match="plain lru pool"):
            decode_lane.build(
                compiled.DecodeLane,
                config,
                manager.pool,
                manager._commits,
                (manager._no_blocks, manager._quiet_steps),
            )


@pytest.mark.parametrize(
    ("kind", "spare", "every", "message"),
    [
        (7, 0, 0, "kinds are 0"),
        (0, 1, 0, "both 0 unless the group is a state group"),  # drafts' positions on attention
        (0, 0, 1, "both 0 unless the group is a state group"),
        (3, 1, 1, "spares 0 where every_state is 1"),  # mode all keeps no drafts' positions
        (3, 0, 2, "every_state 0 or 1"),
    ],
)
def test_a_malformed_lane_is_refused_with_a_clear_error(kind, spare, every, message):
    config = CacheConfig((GroupConfig(Kind.FULL, 8),), 16)
    manager = KVCacheManager(config)
    with pytest.raises(ValueError, match=message):
        compiled.DecodeLane(
            kinds=(kind,),
            sizes=(8,),
            spans=(0,),
            spares=(spare,),
            every_state=(every,),
            limit=None,
            key_lookahead=(0,),
            commit_delay=(0,),
            unit=8,
            scheduled=Scheduled,
            quiet_steps={},
            pool=manager.pool,
            counts=manager.pool.ref_count,
            links=manager.pool.queue.links,
            keys=manager.pool.keys,
            evictions=manager.pool.evictions,
            dead_evictions=manager.pool.dead_evictions,
            no_blocks=((),),
            token_limit=2**63,
            same_pass=False,
            registers=False,
            commits=manager._commits,
        )


def test_a_table_naming_a_block_outside_the_pool_is_refused_not_followed():
    """The lane reads block ids from the request's tables and writes the pool's arrays at
    them: an id no pool holds (a corrupted table) raises instead of writing past them."""
    config = CacheConfig(
        (GroupConfig(Kind.FULL, 4), GroupConfig(Kind.SLIDING_WINDOW, 4, window=4)), 32
    )
    manager = with_lane(config)
    manager.admit("a", list(range(12)), 12)
    manager.end_step()
    manager._requests["a"].tables[1][0] = 10**6  # a position the next step releases
    with pytest.raises(ValueError, match="outside the pool"):
        manager.extend("a", 1, [5])


def drop_in_without_a_manager(state_columns: Any, token_list: Any) -> None:
    """DropIn built from its arguments alone: its argument checks run before it reads the
    manager, so a bad argument is refused by name, not by the missing manager."""
    compiled.DropIn(
        manager=None,
        general=None,
        pending=None,
        start_chunk=None,
        end_step=None,
        state_columns=state_columns,
        token_list=token_list,
    )


@pytest.mark.parametrize("columns", [[(0, 4)], ((0, 0),), ((-1, 4),), ((0,),), (("0", 4),)])
def test_the_drop_ins_state_columns_are_checked_when_it_is_built(columns: Any) -> None:
    """The vLLM drop-in's compiled calls (reference/vllm/lane.py) read the state groups'
    columns as (index, block size) pairs: anything else is refused, naming the format."""
    with pytest.raises(TypeError, match=r"state_columns: a tuple of \(group index"):
        drop_in_without_a_manager(columns, None)


@pytest.mark.parametrize("token_list", [[], "ConstantList", 0])
def test_the_drop_ins_token_list_is_a_class_or_none(token_list: Any) -> None:
    """The compiled calls slice a request's all_token_ids through the list it keeps when it
    is an instance of `token_list` (vLLM's ConstantList, lane.token_list): anything but a
    class or None is refused, naming what it must be."""
    with pytest.raises(TypeError, match=r"token_list: vLLM's ConstantList class, or None"):
        drop_in_without_a_manager((), token_list)


def test_a_decode_step_with_an_inner_checkpoint_open_keeps_its_block_as_the_general_path():
    """A chunk reserved behind the one in flight saves its state at a boundary (CKPT-INNER-1),
    so that block stays held until a step passes it. Decode steps before that move the
    running state and release the blocks they leave; the lane takes them (an open
    checkpoint's position lies at or past the first one read and below the reserved chunk's
    running state, so a decode step neither releases nor wants it) and keeps every table,
    answer and pool state equal to the general path's."""
    config = CacheConfig(
        (GroupConfig(Kind.FULL, 4), GroupConfig(Kind.MAMBA, 4, mode=MambaMode.ALIGN)),
        32,
        eviction=Eviction.LRU,
    )
    pair = (with_lane(config), without_lane(config))
    both(pair, "admit", "a", list(range(6)), 6)
    both(pair, "end_step")
    both(pair, "reserve", "a", 13, 13, 12)  # a chunk ending at 13 saves the state at 12
    SERVED.update(state_changes=0)
    for token in range(100, 106):  # computed 6 -> 12: the checkpoint stays open throughout
        assert pair[0]._requests["a"].checkpoints == [12]
        both(pair, "extend", "a", 1, [token])
        both(pair, "end_step")
    assert SERVED["state_changes"] >= 1, SERVED  # a state block released as the state moved on
    checkpoint_block = pair[0]._requests["a"].tables[1][2]  # position 12 // 4 - 1
    assert checkpoint_block != 0


def test_a_prefill_chunk_behind_a_reserved_one_keeps_the_state_where_that_one_ends():
    """A chunk reserved behind the one in flight (`reserve`'s chunk_end, `pipelined`) puts the
    running state where it ends. A shorter prompt chunk started after it (an engine that
    shrank its budget) keeps the state there, as the general path's `changes` does (state
    end = the later of the two ends), and the lane takes that chunk too."""
    config = CacheConfig(
        (GroupConfig(Kind.FULL, 4), GroupConfig(Kind.MAMBA, 4, mode=MambaMode.ALIGN)),
        40,
        eviction=Eviction.LRU,
    )
    pair = (with_lane(config), without_lane(config))
    both(pair, "admit", "a", list(range(20)), 4)  # [0, 4) in flight
    both(pair, "reserve", "a", 12, 12)  # a chunk behind it ends at 12: its state at 8..12
    both(pair, "end_step")
    SERVED.update(prefill=0)
    both(pair, "extend", "a", 4)  # [4, 8): the state stays at position 12 // 4 - 1 = 2
    assert SERVED["prefill"] == 1, SERVED
    assert pair[0]._requests["a"].tables[1][2] != 0
