"""What an engine's scheduler asks beyond admit/extend: capped hits, admission margins,
progress and deferred releases (used by kvcert.reference.vllm)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.errors import MaxLengthError, RequestStateError, UnknownRequestError
from kvcert.reference.manager import KVCacheManager, Scheduled, Waiting
from tests.tiers import tiered

FULL = GroupConfig(Kind.FULL, 16)
SW = GroupConfig(Kind.SLIDING_WINDOW, 16, window=32)
STATE = GroupConfig(Kind.MAMBA, 16, mode=MambaMode.ALIGN)
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


def test_reserve_gives_the_next_chunk_its_blocks_while_one_is_in_flight() -> None:
    m = KVCacheManager(CacheConfig((FULL, SW), 64))
    first = m.admit("r", PROMPT, 32)
    assert isinstance(first, Scheduled)
    grown = m.reserve("r", 64)  # the next step's chunk, scheduled before this one ends
    assert isinstance(grown, Scheduled)
    assert grown.new_blocks == ((5, 6), (7, 8))
    assert m.progress("r") == (32, 97)  # nothing more is computed
    assert m.reserve("r", 48) == Scheduled(0, 0, ((), ()))  # slots never shrink here
    assert m.end_step() == 4  # only the chunk in flight: blocks 0-1 of each group
    assert m.lookup(PROMPT)[0] == 32
    later = m.extend("r", 32, lookahead=0)
    assert later == Scheduled(0, 32, ((), ()))  # its blocks were reserved
    assert m.lookup(PROMPT)[0] == 32  # not registered before its step ends
    m.end_step()
    assert m.lookup(PROMPT)[0] == 64
    with pytest.raises(RequestStateError):
        m.reserve("r", -1)
    with pytest.raises(UnknownRequestError):
        m.reserve("nobody", 8)


def test_reserve_that_does_not_fit_changes_nothing() -> None:
    m = KVCacheManager(CacheConfig((FULL,), 4))
    m.admit("r", PROMPT, 16)
    tables = m.block_tables("r")
    assert m.reserve("r", 97) == Waiting(6, 2)
    assert m.block_tables("r") == tables
    assert isinstance(m.reserve("r", 48), Scheduled)


def test_reserve_holds_a_state_group_where_the_next_chunk_leaves_its_running_state() -> None:
    """A state group holds no slots, but the chunk scheduled behind the one in flight moves
    the running state: `chunk_end` gives it that position's block now, and the position the
    chunk in flight reads its state from stays held until that chunk has run."""
    m = KVCacheManager(CacheConfig((FULL, STATE), 64))
    m.admit("r", PROMPT, 32)  # state: position 1 (the state at 32)
    assert m.reserve("r", 64).new_blocks == ((4, 5), ())  # slots only: no state position
    assert m.reserve("r", 64, chunk_end=64).new_blocks == ((), (6,))
    assert m.block_tables("r")[1] == (0, 3, 0, 6)  # the chunk in flight still writes 1
    m.end_step()
    assert m.extend("r", 32) == Scheduled(0, 32, ((), ()))
    assert m.block_tables("r")[1] == (0, 3, 0, 6)  # reads the state at 32 from position 1
    m.end_step()
    m.extend("r", 16)
    assert m.block_tables("r")[1] == (0, 0, 0, 6, 8)  # the state at 64 read from 3
    with pytest.raises(RequestStateError):
        m.reserve("r", 80, chunk_end=-1)


def test_reserve_refuses_a_chunk_end_past_its_slots_or_max_model_len() -> None:
    """A chunk computes only tokens it holds slots for and none past max_model_len: a chunk
    end beyond either is refused with the table unchanged (before, a state group held the
    running state's position there, a table of chunk_end / block_size entries)."""
    m = KVCacheManager(CacheConfig((FULL, STATE), 64, max_model_len=128))
    m.admit("r", PROMPT[:40], 40)
    m.end_step()
    tables = m.block_tables("r")
    with pytest.raises(MaxLengthError, match="max_model_len=128"):
        m.reserve("r", 129, chunk_end=129)
    with pytest.raises(RequestStateError, match="reserve tokens >= chunk_end"):
        m.reserve("r", 41, chunk_end=64)
    assert m.block_tables("r") == tables
    # blocks 1-3 hold the prompt's positions 0-2, block 4 the state at 40 (position 2): the
    # 128 slots take positions 3-7 and the running state at 128 position 7
    assert m.reserve("r", 128, chunk_end=128).new_blocks == ((5, 6, 7, 8, 9), (10,))


def _chunk_ends(chunks: list[int]) -> list[int]:
    """Where PROMPT's prefill chunks of these sizes end (the last one capped by the prompt)."""
    ends, done = [], 0
    for chunk in chunks:
        if done >= len(PROMPT):
            break
        done = min(done + chunk, len(PROMPT))
        ends.append(done)
    return ends


@settings(max_examples=tiered(40, 400), deadline=None)
@given(
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    window=st.sampled_from([16, 32, 48]),
    state=st.booleans(),
)
def test_a_pipelined_prefill_registers_what_a_synchronous_one_does(
    chunks: list[int], window: int, state: bool
) -> None:
    """Each chunk's blocks reserved one step early (the next step is scheduled before the
    current one ends), the chunk extended after that step ended: the same blocks become
    hittable at the same steps as the synchronous schedule, never earlier, and once a chunk
    runs each table holds blocks at the same positions."""
    groups = (FULL, GroupConfig(Kind.SLIDING_WINDOW, 16, window=window))
    groups += (STATE,) if state else ()
    sync, piped = (KVCacheManager(CacheConfig(groups, 64)) for _ in range(2))
    ends = _chunk_ends(chunks)
    sync.admit("r", PROMPT, ends[0])
    piped.admit("r", PROMPT, ends[0])
    for i, end in enumerate(ends):
        if i + 1 < len(ends):  # the next step is scheduled while this one runs
            assert isinstance(piped.reserve("r", ends[i + 1], ends[i + 1]), Scheduled)
        sync.end_step()
        piped.end_step()
        assert piped.lookup(PROMPT)[0] == sync.lookup(PROMPT)[0] <= end
        if i + 1 < len(ends):
            nxt = ends[i + 1]
            sync.extend("r", nxt - end)
            assert piped.extend("r", nxt - end).new_blocks == ((),) * len(groups)
            assert [[b != 0 for b in t] for t in piped.block_tables("r")] == [
                [b != 0 for b in t] for t in sync.block_tables("r")
            ]
    assert piped.stats().registered_blocks == sync.stats().registered_blocks


def test_numbered_steps_end_one_at_a_time() -> None:
    """Step 2 is scheduled before step 1's output arrives: ending step 1 registers what
    step 1 wrote and nothing of step 2 (ALLOC-VIS-1 per step)."""
    m = KVCacheManager(CacheConfig((FULL,), 64))
    one = m.start_step()
    m.admit("a", PROMPT, 1 << 20)
    two = m.start_step()
    m.admit("b", [7, *PROMPT[1:]], 1 << 20)
    assert (one, two, m.step) == (1, 2, 2)
    assert m.end_step(one) == 6  # a's six whole blocks
    assert m.in_flight("b")
    assert not m.in_flight("a")
    assert m.lookup([7, *PROMPT[1:]])[0] == 0
    assert m.end_step(two) == 6
    assert m.lookup([7, *PROMPT[1:]])[0] == 96
    for bad in (-1, 3, "1", True):
        with pytest.raises(RequestStateError):
            m.end_step(bad)  # type: ignore[arg-type]


def test_a_chunk_extended_late_belongs_to_the_step_it_runs_in() -> None:
    m = KVCacheManager(CacheConfig((FULL,), 64))
    one = m.start_step()
    m.admit("r", PROMPT, 32)
    two = m.start_step()
    m.reserve("r", 64)  # step 2's chunk: blocks now
    m.start_step()  # step 3 is being scheduled when step 1's output arrives
    m.end_step(one)
    m.extend("r", 32, step=two)  # the chunk step 2 computes
    assert m.end_step(two) == 2  # blocks 2 and 3, at the end of step 2, not of step 3
    assert m.lookup(PROMPT)[0] == 64
    with pytest.raises(RequestStateError):
        m.extend("r", 1, step=9)


def test_accepted_drafts_count_once_their_step_has_ended() -> None:
    """A decode step computes one known token and four draft slots; three drafts are
    accepted when its output arrives: they count as computed at once, and the block they
    complete becomes hittable without another step."""
    small = GroupConfig(Kind.FULL, 4)
    m = KVCacheManager(CacheConfig((small,), 16))
    prompt = list(range(10))
    m.admit("r", prompt, 10)
    m.end_step()
    m.extend("r", 1, [10], lookahead=4)  # position 10, drafts 11..14 in slots
    with pytest.raises(RequestStateError):
        m.accept("r", [11])  # the step has not ended
    assert m.end_step() == 0  # 11 tokens computed: block 2 (8..11) not complete
    assert m.accept("r", [11, 12, 13]) == 1  # 14 computed: block 2 complete
    assert m.progress("r") == (14, 14)
    assert m.lookup([*range(14), 99])[0] == 12
    with pytest.raises(RequestStateError):
        m.accept("r", [14, 15, 16])  # no slot for position 16
    with pytest.raises(RequestStateError):
        m.accept("r", [-1])


class _SlowPaths(KVCacheManager):
    """The same allocator with its shortcuts off: every reserve and extend walks
    _changes (the twin the shortcuts must equal)."""

    def _holds_slots(self, request, end, pipelined):  # type: ignore[no-untyped-def]
        return False

    def _plan_quiet(self, request):  # type: ignore[no-untyped-def]
        request.quiet_end = 0


@settings(max_examples=tiered(40, 400), deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=40),
    window=st.sampled_from([8, 16, 24]),
    size=st.sampled_from([4, 8]),
    spare=st.integers(0, 3),
)
def test_the_pipelined_decode_shortcuts_equal_the_slow_paths(
    steps: list[tuple[int, bool]], window: int, size: int, spare: int
) -> None:
    """Decoding as an asynchronous engine does (the next token's slots reserved while the
    current one runs, `extend(step=)` once it ended), with extra reserved slots drawn at
    random and the state group keeping `spare` blocks for drafts' states (ALLOC-SPEC-1):
    the reserve shortcut and the decode fast path leave every table, hit and
    registration as the slow paths do."""
    groups = (
        GroupConfig(Kind.FULL, size),
        GroupConfig(Kind.SLIDING_WINDOW, size, window=window),
        GroupConfig(Kind.MAMBA, size, mode=MambaMode.ALIGN, speculative_blocks=spare),
    )
    fast, slow = KVCacheManager(CacheConfig(groups, 64)), _SlowPaths(CacheConfig(groups, 64))
    prompt = PROMPT[:13]
    for m in (fast, slow):
        m.start_step()
        m.admit("r", prompt, len(prompt))
    token = 500
    for extra, drafting in steps:
        for m in (fast, slow):
            computed = m.progress("r")[0]
            step = m.start_step()
            grown = m.reserve("r", computed + 1 + (extra if drafting else 0), computed + 1)
            assert isinstance(grown, Scheduled)
            m.end_step(step - 1)
            m.extend("r", 1, [token], step=step)
        token += 1
        assert fast.block_tables("r") == slow.block_tables("r")
        assert fast.stats() == slow.stats()
    for m in (fast, slow):
        m.end_step()
    assert (
        fast.lookup([*prompt, *range(500, token), 1])[0]
        == slow.lookup([*prompt, *range(500, token), 1])[0]
    )


@settings(max_examples=tiered(40, 400), deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 3), st.sampled_from([7, 16, 20, 32, 48])),
        min_size=1,
        max_size=6,
    ),
    probe=st.integers(0, 2),
    cut=st.integers(8, 96),
    state=st.booleans(),
)
def test_the_hit_after_the_steps_in_flight_is_the_hit_once_they_end(
    plan: list[tuple[int, int, int]], probe: int, cut: int, state: bool
) -> None:
    """Requests sharing prefixes are admitted or extended within one step; before the step
    ends, lookup_after_steps (and the branch point after the steps) answers what lookup
    (and the branch point) answer once it has ended, and lookup alone what it did before."""
    groups = (FULL, GroupConfig(Kind.SLIDING_WINDOW, 16, window=32)) + ((STATE,) if state else ())
    m = KVCacheManager(CacheConfig(groups, 128))
    prompts = [PROMPT, PROMPT[:40] + list(range(900, 957)), list(range(300, 397))]
    m.start_step()
    for rid_index, _, chunk in plan[:1]:
        m.admit(f"r{rid_index}", prompts[rid_index], chunk)
    m.end_step()
    m.start_step()
    for rid_index, extra, chunk in plan[1:]:
        rid = f"r{rid_index}"
        if not m.is_running(rid):
            m.admit(rid, prompts[rid_index], chunk * extra)
        elif m.progress(rid)[0] < len(prompts[rid_index]) and not m.in_flight(rid):
            m.extend(rid, chunk)
    query = [*prompts[probe][:cut], 5, 6, 7]
    before = m.lookup(query)[0]
    later = m.lookup_after_steps(query)
    branch_later = m.branch_point(query, after_steps=True)
    assert m.lookup(query)[0] == before  # nothing registered early
    m.end_step()
    assert later == m.lookup(query)[0]
    assert branch_later == m.branch_point(query)


def _served_afresh(m: KVCacheManager) -> list[dict[bytes, int]]:
    """Per group, what the served maps once the steps in flight end hold, built from
    nothing: the pool's keys with those of every chunk in flight, in the order they were
    scheduled (the first to register a key keeps it)."""
    pending: list[dict[bytes, int]] = [{} for _ in m.config.groups]
    for rid in m._in_flight:
        request = m._requests[rid]
        if request.scheduled:
            m._commits.pending_keys(request, pending)
    return [
        {**extra, **dict(now.items())} for now, extra in zip(m.pool.served, pending, strict=True)
    ]


def _served_asked(m: KVCacheManager) -> list[dict[bytes, int]]:
    served = m._served_after_steps() or m.pool.served
    return [dict(group.items()) for group in served]


OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "extend", "reserve", "preempt", "finish", "end_step", "ask"]),
        st.integers(0, 2),  # request
        st.integers(0, 2),  # prompt (admit)
        st.sampled_from([7, 16, 20, 32, 48]),  # chunk
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=tiered(100, 1000), deadline=None)
@given(ops=OPS, state=st.booleans())
def test_the_maps_after_the_steps_kept_between_admissions_are_the_maps_built_afresh(
    ops: list[tuple[str, int, int, int]], state: bool
) -> None:
    """Each admission of a step asks for the served maps once the steps in flight end, and
    the manager keeps the keys of the chunks it was asked about, adding only new chunks':
    after any sequence of admissions, extensions, reserves, preemptions (a request admitted
    again under its id with another prompt included) and step ends, asked at any point,
    the kept maps are those built from nothing."""
    groups = (FULL, SW) + ((STATE,) if state else ())
    m = KVCacheManager(CacheConfig(groups, 256))
    prompts = [PROMPT, PROMPT[:40] + list(range(900, 957)), list(range(300, 397))]
    for op, r, p, chunk in ops:
        rid = f"r{r}"
        if op == "admit" and not m.is_running(rid):
            assert _served_asked(m) == _served_afresh(m)  # an engine asks before admitting
            m.admit(rid, prompts[p], chunk)
        elif op == "extend" and m.is_running(rid) and not m.in_flight(rid):
            computed, known = m.progress(rid)
            if computed < known:
                m.extend(rid, chunk)
        elif op == "reserve" and m.is_running(rid) and m.in_flight(rid):
            computed, scheduled, _ = m.progress_of(rid)
            end = min(computed + scheduled + chunk, len(m._requests[rid].tokens))
            m.reserve(rid, end, end)
        elif op in ("preempt", "finish") and m.is_running(rid):
            getattr(m, op)(rid)
        elif op == "end_step":
            m.end_step()
        elif op == "ask":  # as an admission asks: what is kept stays until the next ask
            assert _served_asked(m) == _served_afresh(m)
    assert _served_asked(m) == _served_afresh(m)


def test_a_request_extended_by_a_chunk_of_the_same_size_is_a_new_chunk_in_flight() -> None:
    """Asked while a request's first chunk is in flight, then after it ended and the request
    was extended by a chunk as long: same id, same size, other blocks registered."""
    m = KVCacheManager(CacheConfig((FULL, SW), 128))
    m.admit("a", PROMPT, 16)
    assert _served_asked(m) == _served_afresh(m)
    m.end_step()
    m.extend("a", 16)
    assert _served_asked(m) == _served_afresh(m)
    assert m.lookup_after_steps([*PROMPT[:32], 1]) == 32


def test_a_request_admitted_again_under_its_id_is_a_new_chunk_in_flight() -> None:
    """The last chunk asked about is preempted and its id admitted again with another
    prompt in the same step: same id, same chunk bounds, other keys; the maps after the
    steps hold the new prompt's keys, not the withdrawn one's."""
    m = KVCacheManager(CacheConfig((FULL, SW), 128))
    other = list(range(300, 397))
    m.admit("a", PROMPT, 48)
    m.admit("b", PROMPT[:40] + list(range(900, 957)), 48)
    assert m.lookup_after_steps([*PROMPT[:48], 1]) == 48
    m.preempt("b")
    m.admit("b", other, 48)
    assert _served_asked(m) == _served_afresh(m)
    assert m.lookup_after_steps([*other[:48], 1]) == 48
    assert m.lookup_after_steps([*PROMPT[:40], *range(900, 908), 1]) == 32


def _last_boundary(start: int, end: int) -> int:
    """The inner checkpoint an engine like vLLM's runner saves in a chunk: the last block
    boundary strictly inside it past the state it starts from (CKPT-INNER-1), or 0."""
    position = (end - 1) // 16 * 16
    low = 16 if start == 0 else ((start - 1) // 16 + 2) * 16
    return position if position >= low and start < position < end else 0


@settings(max_examples=tiered(40, 400), deadline=None)
@given(chunks=st.lists(st.integers(1, 60), min_size=1, max_size=6))
def test_a_pipelined_prefill_with_checkpoints_registers_what_a_synchronous_one_does(
    chunks: list[int],
) -> None:
    """Each chunk's inner checkpoint given with its blocks one step early (`reserve`) or at
    its extension: the same blocks become hittable at the same steps, the checkpoints'
    included, and more of the prompt than without them whenever a chunk had one."""
    groups = (FULL, STATE)
    sync, piped, plain = (KVCacheManager(CacheConfig(groups, 64)) for _ in range(3))
    ends = _chunk_ends(chunks)
    first = _last_boundary(0, ends[0])
    sync.admit("r", PROMPT, ends[0], checkpoint=first)
    piped.admit("r", PROMPT, ends[0], checkpoint=first)
    plain.admit("r", PROMPT, ends[0])
    saved = bool(first)
    for i, end in enumerate(ends):
        nxt = ends[i + 1] if i + 1 < len(ends) else 0
        point = _last_boundary(end, nxt) if nxt else 0
        if nxt:  # the next step is scheduled while this one runs
            assert isinstance(piped.reserve("r", nxt, nxt, checkpoint=point), Scheduled)
        for m in (sync, piped, plain):
            m.end_step()
        hit = sync.lookup(PROMPT)[0]
        assert piped.lookup(PROMPT)[0] == hit <= end
        assert hit >= plain.lookup(PROMPT)[0]
        if nxt:
            sync.extend("r", nxt - end, checkpoint=point)
            assert piped.extend("r", nxt - end, checkpoint=point).new_blocks == ((), ())
            plain.extend("r", nxt - end)
            saved = saved or bool(point)
    for m in (sync, piped, plain):
        m.end_step()
    assert piped.stats().registered_blocks == sync.stats().registered_blocks
    if saved:  # a checkpoint adds a state block no chunk end registers
        assert sync.stats().registered_blocks > plain.stats().registered_blocks


def test_a_misplaced_checkpoint_is_refused_and_changes_nothing() -> None:
    """A checkpoint must be a state block boundary strictly inside the chunk, past the block
    its state is copied from: anything else is a RequestStateError saying so, and the
    request keeps its tables and slots."""
    m = KVCacheManager(CacheConfig((FULL, STATE), 64))
    m.admit("r", PROMPT, 32, checkpoint=16)
    tables = m.block_tables("r")
    for checkpoint, said in ((40, "block boundary of state"), (32, "strictly inside"), (64, "str")):
        with pytest.raises(RequestStateError, match=said):
            m.reserve("r", 64, chunk_end=64, checkpoint=checkpoint)
        assert m.block_tables("r") == tables
    m.end_step()
    with pytest.raises(RequestStateError, match="block boundary"):
        m.extend("r", 32, checkpoint=40)
    assert m.block_tables("r") == tables
    plain = KVCacheManager(CacheConfig((FULL,), 64))
    with pytest.raises(RequestStateError, match="state group in mode align"):
        plain.admit("r", PROMPT, 40, checkpoint=16)
    assert not plain.is_running("r")


def test_a_first_chunk_that_verifies_drafts_holds_their_state_blocks():
    """ALLOC-SPEC-1 from the first chunk: a request admitted one token short of its prompt's
    end, whose engine pads that chunk with draft rows (vLLM does), holds the state blocks the
    drafts' states go to after the running state's; the same admission without drafts holds
    the running state's block only, and so does a chunk that stops before the last token."""
    spare = 2
    state = GroupConfig(Kind.MAMBA, 16, mode=MambaMode.ALIGN, speculative_blocks=spare)
    config = CacheConfig((FULL, state), 64)
    prompt = PROMPT[:33]  # a hit of 32 leaves the last token to compute
    tables = {}
    for verifies, cached in ((True, True), (False, True), (True, False)):
        m = KVCacheManager(config)
        if cached:
            m.admit("w", prompt, 32)
            m.end_step()
            m.finish("w")
        # with the hit: one token, the last; without: 32 tokens, stopping one short
        result = m.admit("r", prompt, 32, lookahead=spare, verifies_drafts=verifies)
        assert isinstance(result, Scheduled)
        assert result.hit == (32 if cached else 0)
        tables[verifies, cached] = m.block_tables("r")[1]
    running = 2  # the block of token 32 (of token 31 without the hit)
    held = tables[True, True]
    assert all(held[running : running + spare + 1]), held
    assert not any(tables[False, True][running + 1 :]), tables[False, True]
    assert not any(tables[True, False][running:]), tables[True, False]


@settings(max_examples=tiered(30, 300), deadline=None)
@given(
    steps=st.integers(0, 40),
    starts=st.lists(st.integers(0, 12), min_size=2, max_size=2),
)
def test_table_tails_are_the_tables_past_each_start(steps: int, starts: list[int]) -> None:
    """What an engine whose worker holds `starts[g]` entries appends: each table from there
    on, and the tables' lengths (a window's released positions hold the null block)."""
    m = KVCacheManager(CacheConfig((FULL, SW), 64))
    m.admit("r", PROMPT, 1 << 20)
    for token in range(steps):
        m.end_step()
        m.extend("r", 1, [token])
    tables = m.block_tables("r")
    tails, lengths = m.table_tails("r", starts)
    assert tails == tuple(t[s:] for t, s in zip(tables, starts, strict=True))
    assert lengths == tuple(map(len, tables))


def test_table_tails_refuse_starts_that_do_not_name_each_group() -> None:
    m = KVCacheManager(CacheConfig((FULL, SW), 64))
    m.admit("r", PROMPT, 1 << 20)
    with pytest.raises(RequestStateError, match="one position per group"):
        m.table_tails("r", [0])
    with pytest.raises(RequestStateError, match="one position per group"):
        m.table_tails("r", None)  # type: ignore[arg-type]
    with pytest.raises(RequestStateError, match="a table start"):
        m.table_tails("r", [0, -1])
    with pytest.raises(UnknownRequestError):
        m.table_tails("nobody", [0, 0])


@settings(max_examples=tiered(30, 300), deadline=None)
@given(
    steps=st.integers(0, 40),
    spans=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 12), st.integers(0, 14)), max_size=4
    ),
)
def test_first_unheld_is_the_first_span_holds_refuses(steps: int, spans: list) -> None:
    m = KVCacheManager(CacheConfig((FULL, SW), 64))
    m.admit("r", PROMPT, 1 << 20)
    for token in range(steps):
        m.end_step()
        m.extend("r", 1, [token])
    refused = [k for k, (g, start, stop) in enumerate(spans) if not m.holds("r", g, start, stop)]
    assert m.first_unheld("r", spans) == (refused[0] if refused else None)


def test_first_unheld_refuses_a_group_or_position_outside_the_layout() -> None:
    m = KVCacheManager(CacheConfig((FULL, SW), 64))
    m.admit("r", PROMPT, 1 << 20)
    with pytest.raises(RequestStateError, match="group"):
        m.first_unheld("r", [(2, 0, 1)])
    with pytest.raises(RequestStateError, match="start"):
        m.first_unheld("r", [(0, -1, 1)])
    with pytest.raises(RequestStateError, match="a span is"):
        m.first_unheld("r", [(0, 1)])
    with pytest.raises(RequestStateError, match="spans are a list"):
        m.first_unheld("r", 3)  # type: ignore[arg-type]
