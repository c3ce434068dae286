"""What vLLM's own tests read and set on the drop-in, on vLLM 0.33.0's objects: the
coordinator's retention interval (honoured in vLLM's meaning before the first request,
refused after or where it cannot act), the read-only views of kvcert's state under vLLM's
names (tables, hit alignment, the blocks cached for one of vLLM's block hashes), the step
signal a manager driven alone gets (`new_step_starts`), and `--prefix-match-unit` (refused
where it asks for hits inside blocks). Run by
`kvcert.conformance.vllm.checks.integration`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.request import Request, RequestStatus

from kvcert.conformance.vllm.checks.fixtures import (
    BLOCK,
    FULL,
    STATE,
    TOKENS,
    config,
    make_scheduler,
    refused,
    request,
    state_config,
)
from kvcert.reference.config import Eviction, Retention
from kvcert.reference.vllm import IntegrationError, KVCacheManager, Scheduler, Settings
from kvcert.reference.vllm.layout import CutError, retention_notice


def match_unit_scheduler(unit: int) -> Any:
    """kvcert's Scheduler for a full-attention + Mamba (align) model with state blocks of 32
    served with --prefix-match-unit `unit` (sub-block hits when finer than 32)."""
    vllm_config = state_config()
    vllm_config.cache_config.prefix_match_unit = unit
    state = dataclasses.replace(STATE, block_size=2 * BLOCK)
    return make_scheduler(Scheduler, vllm_config, FULL, state, hash_block_size=unit)


def retention_checks() -> list[tuple[str, bool, str]]:
    """vLLM's tests set the coordinator's `retention_interval` after building the manager: the
    drop-in honours it in vLLM's meaning (None dense, 0 and N sparse) before the first request,
    reads it back, and refuses it with a typed error afterwards or where it cannot act."""

    def manager(*specs: Any) -> Any:
        return KVCacheManager(config(*specs), 256, BLOCK, BLOCK)

    checks: list[tuple[str, bool, str]] = []
    built = manager(FULL, STATE)
    checks.append(("dense by default", built.coordinator.retention_interval is None, ""))
    for interval, retention in (
        (0, Retention.SPARSE),
        (32, Retention.SPARSE),
        (None, Retention.DENSE),
    ):
        built.coordinator.retention_interval = interval
        got = (built.coordinator.retention_interval, built.core.config.retention)
        checks.append((f"set to {interval}", got == (interval, retention), f"got {got}"))
    full, state = built.core.config.groups
    notices = [
        retention_notice(interval, groups, default) is not None
        for interval, groups, default in (
            (0, (full, state), Retention.DENSE),
            (0, (full,), Retention.DENSE),
            (None, (full, state), Retention.DENSE),
            (0, (full, state), Retention.SPARSE),
        )
    ]
    checks.append(
        (
            "vLLM's 0 served as dense is said (only where a bounded group makes it matter)",
            notices == [True, False, False, False],
            f"{notices}",
        )
    )
    state = dataclasses.replace(STATE, block_size=2 * BLOCK)
    unit = KVCacheManager(config(FULL, state), 256, 2 * BLOCK, BLOCK, prefix_match_unit=BLOCK)
    unit.coordinator.retention_interval = 64
    served = (
        unit.core.config.hit_unit,
        unit.core.config.retention,
        unit.coordinator.retention_interval,
    )
    checks.append(
        (
            "--prefix-match-unit under a positive interval: served (spec 0.11.0)",
            served == (BLOCK, Retention.SPARSE, 64),
            f"got {served}",
        )
    )
    zero = dataclasses.replace(config(FULL), prefix_cache_retention_interval=0)
    plain = KVCacheManager(zero, 256, BLOCK, BLOCK)
    read_back = [plain.coordinator.retention_interval, plain.core.config.retention]
    plain.coordinator.retention_interval = None
    read_back.append(plain.coordinator.retention_interval)
    checks.append(
        (
            "full attention alone: the interval reads back as given (both profiles keep all)",
            read_back == [0, Retention.DENSE, None],
            f"got {read_back}",
        )
    )
    built.get_computed_blocks(request("r"))
    try:
        built.coordinator.retention_interval = 0
        late = "accepted"
    except IntegrationError as why:
        late = str(why)
    checks.append(("refused once a request was looked up", late != "accepted", late))
    bad: tuple[tuple[tuple[Any, ...], object], ...] = (
        ((FULL, STATE), "16"),
        ((FULL, STATE), -16),
        ((FULL, STATE), 24),
        ((FULL,), 16),
    )
    for specs, value in bad:
        coordinator = manager(*specs).coordinator
        refusal = refused(functools.partial(setattr, coordinator, "retention_interval", value))
        checks.append(
            (f"refused {value!r} on {len(specs)} group(s)", refusal is not None, "accepted")
        )
    return checks


def view_checks() -> list[tuple[str, bool, str]]:
    """The read-only views vLLM's tests read, computed from kvcert's state: a group's tables
    (`req_to_blocks`), its hit alignment, and the blocks kvcert serves for one of vLLM's
    block hashes (`block_pool.get_cached_block`, with the hash view on): like vLLM's map, the
    blocks a chunk in flight will register count from its scheduling, while hits on them wait
    for the step's end (ALLOC-VIS-1)."""
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    settings = Settings(vllm_hash_view=True)
    manager = KVCacheManager(config(FULL, STATE), 256, BLOCK, BLOCK, settings=settings)
    a = Request("a", TOKENS, SamplingParams(max_tokens=1), None, block_hasher=hasher)
    manager.allocate_slots(a, a.num_tokens)
    tables = manager.get_block_ids("a")
    views = [
        [b.block_id for b in g.req_to_blocks["a"]] for g in manager.coordinator.single_type_managers
    ]
    pool = manager.block_pool
    early = pool.get_cached_block(a.block_hashes[1], [0])
    early_length = manager.blocks[tables[0][1]].block_hash_num_tokens
    b = Request("b", TOKENS, SamplingParams(max_tokens=1), None, block_hasher=hasher)
    early_hit = manager.get_computed_blocks(b)[1]
    manager.end_step()
    attention = pool.get_cached_block(a.block_hashes[1], [0])
    state = pool.get_cached_block(a.block_hashes[3], [0, 1])
    mid_state = pool.get_cached_block(a.block_hashes[1], [0, 1])
    unknown = pool.get_cached_block(b"\x00" * 32, [0])
    alignment = manager.coordinator.single_type_managers[0].cache_hit_alignment_tokens
    counts = [dict(g.num_cached_block) for g in manager.coordinator.single_type_managers]
    manager.free(a)
    freed = manager.coordinator.single_type_managers[0].req_to_blocks
    counted = [dict(g.num_cached_block) for g in manager.coordinator.single_type_managers]
    try:
        KVCacheManager(config(), 256, BLOCK, BLOCK).block_pool.get_cached_block(b"", [0])
        without = "answered"
    except IntegrationError as why:
        without = str(why)
    names = [
        type(KVCacheManager(config(*specs), 256, BLOCK, BLOCK, enable_caching=on).coordinator)
        for specs, on in (((FULL,), True), ((FULL, STATE), True), ((FULL,), False))
    ]
    short = manager.create_kv_cache_blocks(([manager.blocks[tables[0][0]]], []))
    try:
        cut = f"cut to {manager.truncate_computed_blocks(short, 2 * BLOCK)}"
    except CutError as why:  # also what vLLM's assert raises, for callers catching that
        cut = str(why) if isinstance(why, AssertionError | IntegrationError) else "untyped"
    wide_state = dataclasses.replace(STATE, block_size=2 * BLOCK)
    wide = KVCacheManager(config(FULL, wide_state), 256, 2 * BLOCK, BLOCK)
    unit = match_unit_scheduler(BLOCK // 2).kv_cache_manager.coordinator
    aligned = [
        (c.scheduler_block_size, c._cache_hit_alignment_tokens) for c in (wide.coordinator, unit)
    ]
    return [
        ("req_to_blocks is the table", views == [list(t) for t in tables], f"{views} {tables}"),
        (
            "keyed with its chunk, as in vLLM's map",
            [b.block_id for b in early or ()] == [tables[0][1]],
            f"{early} vs {tables[0][1]}",
        ),
        ("no hit before the step ends (ALLOC-VIS-1)", early_hit == 0, f"{early_hit}"),
        (
            "its block's fields show that key already",
            early_length == 2 * BLOCK,
            f"{early_length}",
        ),
        (
            "the table's block once it ends",
            [b.block_id for b in attention or ()] == [tables[0][1]],
            f"{attention} vs {tables[0][1]}",
        ),
        (
            "every group's block at the prompt's end",
            [b.block_id for b in state or ()] == [tables[0][3], tables[1][3]],
            f"{state} vs {tables}",
        ),
        ("no state block inside the prompt", mid_state is None, f"{mid_state}"),
        ("an unknown hash names nothing cached", unknown is None, f"{unknown}"),
        ("hits align to whole blocks", alignment == BLOCK, f"{alignment}"),
        ("a freed request holds nothing", "a" not in freed and freed["a"] == [], f"{freed}"),
        (
            "num_cached_block: every full block considered once the step ends",
            counts == [{"a": 4}, {"a": 4}],
            f"{counts}",
        ),
        ("num_cached_block: nothing for a freed request", counted == [{}, {}], f"{counted}"),
        ("refused with the hash view off", without != "answered", without),
        (
            "the coordinator's class is the one vLLM builds",
            [n.__name__ for n in names]
            == [
                "UnitaryKVCacheCoordinator",
                "HybridKVCacheCoordinator",
                "KVCacheCoordinatorNoPrefixCache",
            ],
            f"{names}",
        ),
        ("a cut past an attention group's blocks is refused", "holds 1 blocks" in cut, cut),
        (
            "scheduler_block_size is the lcm; hits align to the hash block inside a longer "
            "state block, as vLLM resolves it, and to U under --prefix-match-unit U",
            aligned == [(2 * BLOCK, BLOCK), (2 * BLOCK, BLOCK // 2)],
            f"{aligned}",
        ),
    ]


def step_signal_checks() -> list[tuple[str, bool, str]]:
    """`new_step_starts()` ends every step so far on a manager nobody numbers steps for
    (driven alone, as vLLM's synchronous scheduler drives its own: each step starts once the
    last one's output has been read), so a state checkpoint serves the next step's lookups,
    and so does scheduling a request whose chunk is in flight again (such a scheduler
    schedules a request once per step), and so does releasing a request whose chunk is in
    flight (such a scheduler frees a request after its step's output, or aborts it between
    steps); under numbered steps (kvcert's schedulers) none ends a step, the step's output does."""
    other = TOKENS[:48] + [7] * 16

    def hit_after(numbered: bool) -> tuple[int, int]:
        manager = KVCacheManager(config(FULL, STATE), 256, BLOCK, BLOCK, settings=Settings())
        step = manager.start_step() if numbered else None
        a = request("a")
        manager.allocate_slots(a, 48)
        a.num_computed_tokens = 48
        manager.new_step_starts()
        now = manager.get_computed_blocks(request("b", tokens=other))[1]
        manager.end_step(step)
        return now, manager.get_computed_blocks(request("c", tokens=other))[1]

    def hit_after_extend() -> int:
        manager = KVCacheManager(config(FULL, STATE), 256, BLOCK, BLOCK, settings=Settings())
        a = request("a")
        manager.allocate_slots(a, 48)
        a.num_computed_tokens = 48
        manager.allocate_slots(a, 16)  # scheduled again: its first step has ended
        return int(manager.get_computed_blocks(request("b", tokens=other))[1])

    def hit_after_free(numbered: bool, preempted: bool = False) -> int:
        manager = KVCacheManager(config(FULL, STATE), 256, BLOCK, BLOCK, settings=Settings())
        step = manager.start_step() if numbered else None
        a = request("a")
        manager.allocate_slots(a, 48)
        a.num_computed_tokens = 48
        if preempted:  # vLLM preempts a request still RUNNING, maybe in the step it schedules
            a.status = RequestStatus.RUNNING
        manager.free(a)  # released with its chunk in flight: finished once its output came
        now = int(manager.get_computed_blocks(request("b", tokens=other))[1])
        manager.end_step(step)
        return now

    alone, numbered = hit_after(numbered=False), hit_after(numbered=True)
    extended = hit_after_extend()
    freed, freed_numbered = hit_after_free(numbered=False), hit_after_free(numbered=True)
    preempted = hit_after_free(numbered=False, preempted=True)
    return [
        ("alone: the next step hits the checkpoint", alone == (48, 48), f"{alone}"),
        ("numbered: only the step's end serves it", numbered == (0, 48), f"{numbered}"),
        ("alone: scheduling a request again ends its step", extended == 48, f"{extended}"),
        (
            "alone: releasing a request with a chunk in flight ends its step",
            freed == 48,
            f"{freed}",
        ),
        ("numbered: a release ends no step", freed_numbered == 0, f"{freed_numbered}"),
        ("alone: a preemption (still RUNNING) ends no step", preempted == 0, f"{preempted}"),
    ]


def block_field_checks() -> list[tuple[str, bool, str]]:
    """The fields vLLM's tests read on block objects and the pool's free queue, cached keys
    and pending KV events, computed from kvcert's pool: a held block's reference count,
    vLLM's hash (with group) and length of the tokens its key certifies, nothing on an
    unkeyed block, the free queue's count, order and sentinels, the events not taken yet;
    the hash fields refused without the hash view."""
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    settings = Settings(vllm_hash_view=True, eviction=Eviction.LRU)
    manager = KVCacheManager(config(FULL), 64, BLOCK, BLOCK, settings=settings)
    a = Request("a", TOKENS[:40], SamplingParams(max_tokens=1), None, block_hasher=hasher)
    manager.allocate_slots(a, a.num_tokens)
    manager.end_step()
    table = manager.get_block_ids("a")[0]
    second, partial = manager.blocks[table[1]], manager.blocks[table[2]]
    wanted = make_block_hash_with_group_id(a.block_hashes[1], 0)
    queue = manager.block_pool.free_block_queue
    before = [b.block_id for b in queue.get_all_free_blocks()]
    keys = len(manager.block_pool.cached_block_hash_to_block)
    held = second.ref_cnt
    manager.free(a)
    after = [b.block_id for b in queue.get_all_free_blocks()]
    head = queue.fake_free_list_head.next_free_block
    bare = KVCacheManager(
        config(FULL), 64, BLOCK, BLOCK, enable_kv_cache_events=True, settings=Settings()
    )
    bare.allocate_slots(request("b", block_hasher=hasher), len(TOKENS))
    bare.end_step()
    keyed = bare.blocks[bare.get_block_ids("b")[0][0]]
    refusal = refused(lambda: keyed.block_hash, IntegrationError)
    queued = bare.block_pool.kv_event_queue
    taken = bare.take_events()
    emptied = bare.block_pool.kv_event_queue
    return [
        ("a held block counts its holder", held == 1, f"{held}"),
        ("block_hash is vLLM's hash of its tokens", second.block_hash == wanted, "differs"),
        ("block_hash_num_tokens", second.block_hash_num_tokens == 2 * BLOCK, "differs"),
        ("an unkeyed block has no hash", partial.block_hash is None, f"{partial.block_hash}"),
        ("two keys cached", keys == 2, f"{keys}"),
        (
            "the free queue's count and order",
            queue.num_free_blocks == len(after) and after == before + table[::-1],
            f"{before} then {after}",
        ),
        ("the head sentinel names the first", head.block_id == after[0], f"{head}"),
        ("freed blocks hold no reference", second.ref_cnt == 0, f"{second.ref_cnt}"),
        ("block_hash refused without the hash view", refusal is not None, "answered"),
        (
            "kv_event_queue holds what take_events hands out, then nothing",
            len(queued) == 1 and list(queued) == taken and emptied == (),
            f"{queued} {taken} {emptied}",
        ),
    ]
