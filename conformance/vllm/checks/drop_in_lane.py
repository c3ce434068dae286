"""The drop-in's compiled calls answer as its Python methods do, through vLLM 0.33.0's own
Scheduler.

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.drop_in_lane [--runs N]

kvcert.reference.vllm.lane serves a decode chunk's or a prompt chunk's `allocate_slots`,
`start_pending` and `end_step` compiled (reference/_decodelane_dropin.c) over the core's
decode lane; the drop-in's Python methods are their definitions. Each seed's random
workload (`kvcert fuzz --kvcert`'s, drafts, multi-module MTP and state hybrids included) is
played through kvcert's Scheduler twice:
with the compiled calls (and the core's compiled decode lane under them), and with every
call answered by the Python methods, the core's too (and the drop-in's `_wrap` and the
digest memo by their definitions: reference/_decodelane_wrap.c's `wrap_blocks` and
reference/_chain_memo.c are held to them here too). Every call vLLM makes to the manager
must get the same answer (block ids per group, hits, None), the two runs the same outcome,
and the allocator the same state after each step: every request's counters, tables, bounds
and registered marks, every block's key and count, the pool's counters. Nine directed
scenarios (`directed`) do the same for what those workloads rarely reach. The compiled calls
slice vLLM's token lists directly (`lane.token_list`) on odd seeds and in the scenarios, and
through the lists' own `__getitem__` on even seeds, so both are held to the Python methods.
So that this cannot pass vacuously, on the attention seeds the compiled side must itself
have answered at least a quarter of the `allocate_slots` calls, started a quarter of the
queued chunks (asynchronous seeds), handed out a quarter of the extensions' new blocks and
ended a quarter of the steps, and on the state hybrids' seeds answered some calls,
extensions, hand-outs and step ends.

Exit 0 when every seed agrees, 1 at the first difference (printed with its seed), 2 when the
compiled calls are not built (KVCERT_PURE_PYTHON=1, or no compiler at install).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvcert.conformance.campaign.workload import STATE_MODELS, Arrival, Workload, generate
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.campaign import loop
from kvcert.conformance.vllm.campaign.build import build as campaign_build
from kvcert.reference import hashing
from kvcert.reference.errors import KVCacheError
from kvcert.reference.native import native
from kvcert.reference.vllm import lane, tables
from kvcert.reference.vllm.manager import KVCacheManager

# the manager's public calls whose answers are compared (every other one is a view vLLM
# reads or a no-op, compared through the state after each step); take_new_block_ids: the
# attention blocks handed out that a worker zeroing new blocks (a state hybrid's) zeroes
CALLS = (
    "allocate_slots",
    "get_computed_blocks",
    "free",
    "end_step",
    "start_pending",
    "take_new_block_ids",
)
FIELDS = (
    "computed",
    "scheduled",
    "lookahead",
    "pipelined",
    "decoding",
    "held_from",
    "tables",
    "registered",
    "commit_at",
    "published",
    "quiet_end",
    "quiet_state",
    "quiet_slots",
    "quiet_slots_floor",
)


def plain(answer: Any) -> Any:
    """An answer as comparable data: vLLM's KVCacheBlocks as block ids per group."""
    if hasattr(answer, "blocks"):
        return tuple(tuple(block.block_id for block in group) for group in answer.blocks)
    if isinstance(answer, tuple):
        return tuple(plain(item) for item in answer)
    return answer


def core_state(manager: KVCacheManager) -> Any:
    """The allocator's whole state, and the facade's per-request records (copied: the
    request's lists change in place as it runs)."""
    core, pool = manager.core, manager.core.pool
    requests = {
        rid: ([getattr(request, name) for name in FIELDS], request.tokens.tolist())
        for rid, request in core._requests.items()
    }
    tracked = {
        rid: (t.seen, t.keep, list(t.pending), t.inner) for rid, t in manager._tracked.items()
    }
    keys = [pool.key_of(block) for block in range(pool.num_blocks)]
    counters = (pool.num_free, pool.num_registered, pool.evictions, pool.dead_evictions)
    state = requests, tracked, dict(core._in_flight), keys, counters, list(pool.ref_count)
    return copy.deepcopy(state)


class Served:
    """How many calls the compiled side took, and how many it left to the Python methods."""

    def __init__(self) -> None:
        self.calls = self.general = self.started = self.started_in_python = 0
        self.ended = self.ended_in_python = 0  # end_step calls, those the Python one took
        # extensions answered with new blocks, those the Python allocate_slots answered, and
        # those the Python _handed_out answered
        self.extended = self.extended_in_python = self.handed_in_python = 0

    @property
    def compiled_calls(self) -> int:
        return self.calls - self.general

    @property
    def compiled_ends(self) -> int:
        return self.ended - self.ended_in_python

    @property
    def compiled_starts(self) -> int:
        return self.started - self.started_in_python

    @property
    def compiled_hand_outs(self) -> int:
        return self.extended - self.handed_in_python

    @property
    def compiled_extensions(self) -> int:
        return self.extended - self.extended_in_python

    def counting(self, method: Callable[..., Any], counter: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            return method(*args, **kwargs)

        return call


def waiting(manager: KVCacheManager) -> int:
    """The chunks queued behind chunks in flight (asynchronous scheduling)."""
    return sum(len(tracked.pending) for tracked in manager._tracked.values())


class Recorder:
    """Wraps a manager's calls: their answers, the state after each step's end, and how
    many queued chunks start_pending started."""

    def __init__(self, manager: KVCacheManager, served: Served) -> None:
        self.log: list[Any] = []
        self.served = served
        for name in CALLS:
            setattr(manager, name, self._recorded(manager, name, getattr(manager, name)))

    def _recorded(self, manager: KVCacheManager, name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            queued = waiting(manager)
            running = name == "allocate_slots" and manager.core.is_running(args[0].request_id)
            answer = method(*args, **kwargs)
            self.log.append((name, plain(answer)))
            if running and answer is not None and any(plain(answer)):
                self.served.extended += 1
            if name in ("end_step", "start_pending"):
                self.log.append(("state", core_state(manager)))
            if name == "start_pending":
                self.served.started += queued - waiting(manager)
            return answer

        return call


def instrumented(
    compiled: bool, recorders: list[Recorder], served: Served, token_list: type | None
) -> Any:
    """The campaign's `build`, whose scheduler runs the compiled calls (counted; slicing
    vLLM's token lists through `token_list`, lane.token_list, or None) or the Python
    methods only, and is recorded."""

    def build(*args: Any, **kwargs: Any) -> Any:
        scheduler, *rest = campaign_build(*args, **kwargs)
        manager = scheduler.kv_cache_manager
        for name in lane.COMPILED:
            vars(manager).pop(name, None)
        if not compiled:  # the core's decode lane too: Python's definitions throughout
            manager.core._lane, manager.core._lane_registers = None, False
        elif lane.serves(manager, KVCacheManager):
            drop_in = native("_decodelane").DropIn(  # type: ignore[union-attr]
                manager=manager,
                general=served.counting(KVCacheManager.allocate_slots, "general"),
                pending=KVCacheManager.start_pending,
                start_chunk=served.counting(KVCacheManager._start_chunk, "started_in_python"),
                end_step=served.counting(KVCacheManager.end_step, "ended_in_python"),
                state_columns=tuple((g, size) for g, size, _ in manager._state_columns),
                token_list=token_list,
            )
            manager.allocate_slots = served.counting(drop_in, "calls")
            manager.start_pending = drop_in.start_pending
            manager.end_step = served.counting(drop_in.end_step, "ended")
        recorders.append(Recorder(manager, served))
        return (scheduler, *rest)

    return build


@contextmanager
def wired(
    compiled: bool, recorders: list[Recorder], served: Served, token_list: type | None
) -> Iterator[None]:
    """Within: every scheduler the campaign's `play` builds is `instrumented`."""
    names = vars(loop)
    names["build"] = instrumented(compiled, recorders, served, token_list)  # this process only
    try:
        with definitions_only(not compiled):
            yield
    finally:
        names["build"] = campaign_build


@contextmanager
def definitions_only(on: bool) -> Iterator[None]:
    """Within, when `on`: the drop-in's `_wrap` and the digest memo run their definitions,
    not their compiled twins (this process only)."""
    wrap, memo = tables._wrap_blocks, hashing._memo_digest
    if on:
        tables._wrap_blocks, hashing._memo_digest = None, None
    try:
        yield
    finally:
        tables._wrap_blocks, hashing._memo_digest = wrap, memo


@contextmanager
def python_hand_outs_counted(served: Served) -> Iterator[None]:
    """Within: the Python `allocate_slots` counts the extensions it gives new blocks, and
    `_handed_out` the new blocks it hands out (the class's methods, which the compiled calls
    call only where they leave a chunk to them, and which a manager the compiled calls do not
    serve runs for every chunk)."""
    allocate, hand_out = KVCacheManager.allocate_slots, KVCacheManager._handed_out

    def allocated(self: KVCacheManager, request: Any, *args: Any, **kwargs: Any) -> Any:
        running = self.core.is_running(request.request_id)
        answer = allocate(self, request, *args, **kwargs)
        served.extended_in_python += running and answer is not None and any(plain(answer))
        return answer

    def counted(self: KVCacheManager, rid: str, result: Any) -> Any:
        answer = hand_out(self, rid, result)
        served.handed_in_python += answer is not None and any(plain(answer))
        return answer

    # this process only
    KVCacheManager.allocate_slots = allocated  # type: ignore[method-assign]
    KVCacheManager._handed_out = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        KVCacheManager.allocate_slots = allocate  # type: ignore[method-assign]
        KVCacheManager._handed_out = hand_out  # type: ignore[method-assign]


def played(
    workload: Workload, compiled: bool, served: Served, token_list: type | None = None
) -> tuple[Any, list[Any]]:
    recorders: list[Recorder] = []
    with wired(compiled, recorders, served, token_list), python_hand_outs_counted(served):
        outcome = loop.play(workload, kvcert=True)
    return vars(outcome), [entry for r in recorders for entry in r.log]


def directed(compiled: bool, served: Served, scenario: str) -> list[Any]:
    """A scenario the random workloads rarely or never reach, played call by call on the
    drop-in (kvcert's Scheduler's calls: start_step, allocate_slots, end_step,
    start_pending), and its log (answers and states; an error as its type and message):
    `shrink`: slots held past the chunk's needs (the worker's table keeps its last block,
    `_Tracked.keep`) as the lookahead falls from 40 to 0; `deep`: three steps in flight, so
    two chunks queue behind one (a deeper batch queue than vLLM's two), the lookahead
    changing; `rewind`: vLLM's count resumed below a chunk in flight, refused alike;
    `replaced`: the manager's `_handed_out` replaced on the instance (as a wrapper or a
    broken twin does), which then hands out every extension's new blocks, logged; `hole`
    (Qwen3.5, a state hybrid): the block at a state table's running column nulled behind the
    manager's back (the bug `_check_runner_columns` exists for), which must be refused with
    the same IntegrationError; `queued hole`: the same under asynchronous scheduling, where
    the chunk is queued behind the one in flight (there the hole fails reserve's check that
    the slots are held, so the Python method answers and raises); `checked` (Qwen3.5): the
    manager's `_check_runner_columns` replaced on the instance, which then checks every
    chunk, logged; `steps`: end_step asked by keyword every other step, and for a step
    never started and a bool (refused alike) and with no step (every one ends); `padded`:
    the prompt in two chunks, the second padded with 9 rows past the prompt (as vLLM pads a
    prefill reaching the last token with draft rows), which hold slots, nothing computed."""
    recorders: list[Recorder] = []
    with python_hand_outs_counted(served), definitions_only(not compiled):
        build = instrumented(compiled, recorders, served, lane.token_list())
        return _directed(build, recorders, scenario)


def _directed(build: Any, recorders: list[Recorder], scenario: str) -> list[Any]:
    v = runtime.vllm()
    prompt = tuple(range(1, 41))
    arrival = Arrival(0, "a", prompt, 0, 200)  # sizes the model's max_model_len
    hole = scenario.endswith("hole")
    model = "qwen3.5-0.8b" if hole or scenario == "checked" else "gpt-oss-20b"
    asynchronous = scenario not in ("shrink", "hole", "checked", "padded")
    load = Workload(0, model, "fcfs", asynchronous, 64, 256, 0, (arrival,))
    scheduler, _, hasher, _ = build(load, kvcert=True)
    manager, log = scheduler.kv_cache_manager, recorders[0].log
    if scenario == "replaced":
        hand_out = manager._handed_out

        def replaced(rid: str, result: Any) -> Any:
            answer = hand_out(rid, result)
            log.append(("replaced _handed_out", rid, plain(answer)))
            return answer

        manager._handed_out = replaced  # this manager only
    if scenario == "checked":
        check = manager._check_runner_columns

        def checked(request: Any, start: int, end: int, checkpoint: int) -> None:
            log.append(("replaced _check_runner_columns", start, end, checkpoint))
            check(request, start, end, checkpoint)

        manager._check_runner_columns = checked  # this manager only
    params = v.SamplingParams(max_tokens=200, ignore_eos=True)
    request = v.Request("a", list(prompt), params, None, block_hasher=hasher)
    requests = {"a": request}
    manager.get_computed_blocks(request)
    ahead = 40 if scenario == "shrink" else 0
    in_flight = [manager.start_step()]
    _admitted(manager, request, in_flight, ahead, padded=scenario == "padded")
    # steps in flight at most
    depths = {"shrink": 1, "deep": 3, "rewind": 2, "replaced": 1, "hole": 1, "queued hole": 2}
    depths |= {"steps": 2}
    depth = depths.get(scenario, 1)
    try:
        for n in range(60):
            if len(in_flight) >= depth:  # the oldest step's output: one sampled token
                request.append_output_token_ids(7 + n)
                _end_oldest(manager, in_flight, n if scenario == "steps" else None, log)
                manager.start_pending(requests)
            if scenario == "rewind" and n == 30:
                request.num_computed_tokens -= 1  # below the chunk in flight's end
            if hole and n == 10:  # the first state group's running column
                g, size, _ = manager._state_columns[0]
                column = -(-(request.num_computed_tokens + 1) // size) - 1
                manager.core._requests["a"].tables[g][column] = 0
            in_flight.append(manager.start_step())
            ahead = max(0, 40 - 2 * n) if scenario == "shrink" else (n * 7) % 5
            manager.allocate_slots(request, 1, num_lookahead_tokens=ahead)
            request.num_computed_tokens += 1
    except Exception as error:
        log.append((type(error).__name__, str(error)))
    return log


def _admitted(
    manager: Any, request: Any, in_flight: list[int], ahead: int, *, padded: bool
) -> None:
    """The 40-token prompt scheduled: in one chunk, or `padded`, in two, the second ending 9
    rows past it (block 3 of a 16-token block, which only those rows reach)."""
    first = 20 if padded else 40
    manager.allocate_slots(request, first, num_lookahead_tokens=ahead)
    request.num_computed_tokens = first
    if padded:
        manager.end_step(in_flight.pop(0))
        in_flight.append(manager.start_step())
        manager.allocate_slots(request, 29)
        request.num_computed_tokens = 40


def _end_oldest(manager: Any, in_flight: list[int], n: int | None, log: list[Any]) -> None:
    """The oldest step in flight ends. Under `steps` (n: the step's index), every other one
    is asked by keyword, and first end_step is asked for a step never started, for a bool
    (both refused alike, logged) and with no step (every step ends)."""
    if n in (20, 21, 22):
        odd: tuple[Any, ...] = {20: (in_flight[-1] + 9,), 21: (True,), 22: ()}[n]
        try:
            manager.end_step(*odd)
        except KVCacheError as error:
            log.append((type(error).__name__, str(error)))
    if n is not None and n % 2:
        manager.end_step(step=in_flight.pop(0))
    else:
        manager.end_step(in_flight.pop(0))


def first_difference(a: list[Any], b: list[Any]) -> str | None:
    for index, (left, right) in enumerate(zip(a, b, strict=False)):
        if left != right:
            return f"entry {index}: compiled {left!r:.400}\n  python   {right!r:.400}"
    if len(a) != len(b):
        return f"the compiled run made {len(a)} calls, the Python one {len(b)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150, help="seeds to play")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    args = parser.parse_args(argv)
    if native("_decodelane") is None:
        print("the compiled calls are not built here (KVCERT_PURE_PYTHON=1 or no compiler)")
        return 2
    served, state_served, seeds, states = Served(), Served(), 0, 0
    for seed in range(args.first, args.first + args.runs):
        workload = generate(seed, state_drafts=True, mtp=True, families=True)
        hybrid = workload.model in STATE_MODELS
        seeds, states = seeds + (not hybrid), states + hybrid
        counted = state_served if hybrid else served
        # odd seeds slice vLLM's token lists directly, even ones through their __getitem__
        token_list = lane.token_list() if seed % 2 else None
        compiled = played(workload, True, counted, token_list)
        python = played(workload, False, Served())
        difference = first_difference(compiled[1], python[1])
        if difference is None and compiled[0] != python[0]:
            difference = f"outcomes differ: {compiled[0]} != {python[0]}"
        if difference is not None:
            print(f"DIFFER seed {seed} ({workload.model}): {difference}")
            return 1
    scenarios = (
        *("shrink", "deep", "rewind", "replaced", "hole", "queued hole", "checked"),
        *("steps", "padded"),
    )
    for scenario in scenarios:
        compiled_log = directed(True, served, scenario)
        difference = first_difference(compiled_log, directed(False, Served(), scenario))
        if difference is not None:
            print(f"DIFFER scenario {scenario}: {difference}")
            return 1
        if scenario.endswith("hole") and compiled_log[-1][0] != "IntegrationError":
            print(
                f"MISSED scenario {scenario}: the compiled calls served {compiled_log[-1]!r:.300}"
            )
            return 1
    print(
        f"drop-in lane: {seeds} attention seeds agree; the compiled calls answered "
        f"{served.compiled_calls} of {served.calls} allocate_slots calls "
        f"({served.compiled_hand_outs} of the {served.extended} extensions with new blocks) "
        f"and started {served.compiled_starts} of {served.started} queued chunks; it ended "
        f"{served.compiled_ends} of {served.ended} steps"
    )
    print(
        f"drop-in lane: {states} state-hybrid seeds agree; the compiled calls answered "
        f"{state_served.compiled_calls} of {state_served.calls} allocate_slots calls and "
        f"started {state_served.compiled_starts} of {state_served.started} queued chunks, "
        f"ended {state_served.compiled_ends} of {state_served.ended} steps; of "
        f"the {state_served.extended} extensions with new blocks, "
        f"{state_served.compiled_extensions} allocated and {state_served.compiled_hand_outs} "
        "handed out compiled"
    )
    shares = (
        (served.compiled_calls, served.calls),
        (served.compiled_starts, served.started),
        (served.compiled_hand_outs, served.extended),
        (served.compiled_ends, served.ended),
    )
    vacuous_states = states > 0 and 0 in (
        state_served.compiled_calls,
        state_served.compiled_extensions,
        state_served.compiled_hand_outs,
        state_served.compiled_ends,
    )
    if any(part * 4 < whole for part, whole in shares) or vacuous_states:
        print("VACUOUS: the compiled side answered under a quarter of the calls, or none of a "
              "state hybrid's calls, extensions, hand-outs or step ends")  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
