"""vLLM 0.33.0's whole Scheduler step with its own KVCacheManager vs kvcert's drop-in.

    .engines/vllm-0.33.0/bin/python benchmarks/vs_vllm_scheduler.py [--quick] [--by-call]

What a deployment pays per step for swapping the manager (`--scheduler-cls
kvcert.reference.vllm.Scheduler` or `.AsyncScheduler`): the same workload through vLLM's real
Scheduler (`schedule()` then `update_from_output()` with a played model runner), once with
each manager, alternately, in the same process; each time is the fastest of its side's rounds
and the ratio is vLLM's time / kvcert's (above 1: kvcert's is faster). Every request must
finish and each side serve the same hits in every round, and kvcert at least vLLM's hit
tokens, or nothing is reported (exit 1). Both modes:
synchronous, and asynchronous as vLLM's engine drives its AsyncScheduler (step N+1 scheduled
before step N's output is read).

Workload: GPT-OSS-20B as vLLM's planner groups it (full attention + a 128-token sliding
window), 64 requests sharing a 1,024-token system prompt with a 512-token question each,
arriving 8 per step, 64 output tokens each, an 8,192-token step budget. `--model
qwen3.5-0.8b` plays the same shape on the Gated DeltaNet hybrid (Mamba align mode, 544-token
blocks): every length scaled by block / 16, so the prompts span the same number of blocks;
with `--state-checkpoints` its GDN layers save state inside a prefill chunk as 0.33's
FlashInfer kernel does (`num_prefill_checkpoint_blocks=1`), so vLLM's scheduler sends each
prompt in one chunk and each manager reserves the state block the runner saves. `--drafts N`
decodes with N EAGLE/MTP drafts per step, every one accepted (on a state model its GDN layers
then keep N blocks for the drafts' states, `num_speculative_blocks`).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvcert.conformance.campaign.workload import (
    STATE_MODELS,
    Arrival,
    Workload,
    state_block_size,
)
from kvcert.conformance.vllm.campaign.build import build
from kvcert.conformance.vllm.runtime import vllm


def workload(
    requests: int,
    output: int,
    asynchronous: bool = False,
    model: str = "gpt-oss-20b",
    *,
    checkpoints: bool = False,
    drafts: int = 0,
) -> Workload:
    unit = state_block_size(model) // 16 if model in STATE_MODELS else 1
    system = tuple(1 + i % 1024 for i in range(1024 * unit))

    def question(r: int) -> tuple[int, ...]:
        return tuple(2000 + (r * 512 * unit + i) % 7000 for i in range(512 * unit))

    arrivals = tuple(
        Arrival(r // 8, f"r{r}", system + question(r), 0, output) for r in range(requests)
    )
    return Workload(
        seed=0,
        model=model,
        policy="fcfs",
        async_scheduling=asynchronous,
        usable_blocks=4096,
        budget=8192 * unit,
        long_prefill=0,
        arrivals=arrivals,
        state_checkpoints=checkpoints,
        spec_tokens=drafts,
    )


def serve(scheduler: Any, hasher: Any, load: Workload, phase: int = 0) -> tuple[float, int, int]:
    """(seconds, hit tokens, steps) for the whole workload, served as vLLM's engine serves:
    its EngineCore freezes the heap once the scheduler is built (`freeze_gc_heap`: collect,
    then `gc.freeze()`), so the collector never walks what startup made, here the imports
    and either side's scheduler; the heap is unfrozen once the round is served. `phase`:
    the young generation's allocation count the round starts at (0 right after the freeze),
    advanced by that many live empty lists; see `collector_phases`."""
    from vllm.utils.gc_utils import freeze_gc_heap  # noqa: PLC0415 - the engine venv's vLLM

    freeze_gc_heap()
    ballast = [[] for _ in range(phase - 1)] if phase else None  # phase lists, this one too
    try:
        return _served(scheduler, hasher, load)
    finally:
        del ballast
        gc.unfreeze()


def collector_phases(rounds: int) -> list[int]:
    """The young generation's count each of `rounds` pairs starts at, spread evenly over
    the collector's threshold (0 for a single round). Which call a young collection falls in
    is wherever the count crosses the threshold, and one collection here walks every prompt
    list made since the last (milliseconds); a deterministic round from the same count
    would put it in the same call in every pair, so the median over pairs would rest on one
    draw of where it falls. A serving engine reaches its steps at whatever count its history
    left, so each pair starts at another (both sides of a pair at the same)."""
    threshold = gc.get_threshold()[0]
    return [i * threshold // rounds for i in range(rounds)]


def _served(scheduler: Any, hasher: Any, load: Workload) -> tuple[float, int, int]:
    v = vllm()
    pending = list(load.arrivals)
    hits = steps = 0
    unread: list[tuple[Any, Any]] = []  # scheduled steps whose output is not read yet
    start = time.perf_counter()
    while pending or scheduler.has_requests() or unread:
        for arrival in [a for a in pending if a.step <= steps]:
            pending.remove(arrival)
            params = v.SamplingParams(max_tokens=arrival.max_tokens, ignore_eos=True)
            scheduler.add_request(
                v.Request(arrival.rid, list(arrival.prompt), params, None, block_hasher=hasher)
            )
        output = scheduler.schedule()
        hits += sum(new.num_computed_tokens for new in output.scheduled_new_reqs)
        ids = list(output.num_scheduled_tokens)
        done = [scheduler.requests[r] for r in ids]
        verified = output.scheduled_spec_decode_tokens  # every draft accepted, then token 7
        sampled = [
            [11] * len(verified.get(r.request_id, ())) + [7]
            if r.num_computed_tokens >= r.num_tokens
            else []
            for r in done
        ]
        index = {r: i for i, r in enumerate(ids)}
        runner = v.ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, req_id_to_index=index)
        if ids:
            unread.append((output, runner))
        if unread and (len(unread) > load.async_scheduling or not ids):
            scheduler.update_from_output(*unread.pop(0))
            if load.spec_tokens and not load.async_scheduling:  # the drafter's next drafts
                running = [r for r in ids if r in scheduler.requests]
                drafts = [[11] * load.spec_tokens for _ in running]
                scheduler.update_draft_token_ids(v.DraftTokenIds(running, drafts))
        steps += 1
    return time.perf_counter() - start, hits, steps


# Rounds a side for the by-call ratio: with five, its pairs' median read 3.5x and 5.6x in two
# runs of one commit (this machine slows by up to 2x for seconds at a time); a median over
# more pairs moves less between runs, and leans neither way (every pair is printed)
BY_CALL_ROUNDS = 9


def time_by_call(
    load: Workload, rounds: int = BY_CALL_ROUNDS
) -> tuple[dict[str, dict[str, tuple[int, float]]], dict[str, list[float]]]:
    """Per side, (calls, seconds) of each public KV-cache-manager method the scheduler
    calls, inclusive of what it calls (a public method called inside another is timed as
    part of that one, never twice), over extra rounds played after the timed ones (the
    wrappers would slow those): the sides alternate, each round starts from a collected,
    frozen heap (`serve`: so neither pays for the other's garbage), and each method's time
    is its least round (where the time goes). Beside it, each round's time over every call
    (`totals`, per side, in round order): the ratio is taken per back-to-back pair of rounds,
    so a slow spell of the machine falls on both sides of a pair, and each pair starts the
    collector at its own phase (`collector_phases`). The third side, "floor",
    is the least any manager answering these calls spends: each method replays kvcert's
    answers from a recorded round, in order (the scheduler is deterministic, so it asks the
    same calls; the round must serve the same hits in the same steps, or nothing is
    reported). The collector's pauses inside the timed calls are counted beside them too
    (`PAUSES`)."""
    answers, played = record_answers(load)
    spent: dict[str, dict[str, tuple[int, float]]] = {}
    totals: dict[str, list[float]] = {}
    for phase in collector_phases(rounds):
        for side in ("vLLM", "kvcert", "floor"):
            replay = answers if side == "floor" else None
            timings, served = one_round_by_call(load, side != "vLLM", replay, phase)
            if replay is not None and served != played:
                raise SystemExit(f"the replayed round served {served}, the recorded {played}")
            for label, counts in ((side, timings[0]), (side + UNPAUSED, timings[1])):
                totals.setdefault(label, []).append(calls_time(counts))
                best = spent.setdefault(label, {})
                for name, (calls, seconds) in counts.items():
                    earlier = best.get(name)
                    least = seconds if earlier is None else min(seconds, earlier[1])
                    best[name] = (calls, least)
    return spent, totals


def calls_time(counts: dict[str, tuple[int, float]]) -> float:
    """Seconds over every manager call (the hasher and the pauses are reported beside)."""
    return sum(seconds for name, (_, seconds) in counts.items() if name not in (HASHER, PAUSES))


def paired(totals: dict[str, list[float]], side: str, other: str) -> tuple[float, list[float]]:
    """`side`'s time / `other`'s per back-to-back pair of rounds: the median and each."""
    ratios = [a / b for a, b in zip(totals[side], totals[other], strict=True)]
    return statistics.median(ratios), ratios


Answers = dict[str, list[Any]]  # per public manager method, its answers in call order
# The block hasher a Request runs as it is built and as tokens are appended, outside either
# manager: vLLM's on vLLM's side (its manager reads the hashes), kvcert's on kvcert's (the
# hasher kvcert's scheduler has the engine use: it digests a prompt for the allocator as the
# request is built, and skips vLLM's hashing, which nothing reads there); timed beside the
# calls, never in their sum
HASHER = "(the block hasher, outside the manager)"
# The collector's pauses that fall inside the timed calls (already part of their times): a
# young collection walks every container made since the last one, mostly vLLM's new prompt
# lists, so its cost is the process's, and which call pays it is where the allocation count
# happens to cross the threshold; reported beside the calls, never added to their sum
PAUSES = "(collector pauses inside these calls)"
# A side's calls timed without the collector's pauses inside each (a second view of the same
# rounds, each method's least round again): the calls' own cost, wherever a collection fell
UNPAUSED = " without pauses"


def public_methods(manager: Any) -> list[str]:
    return [
        name
        for name in dir(manager)
        if not name.startswith("_")
        and callable(method := getattr(manager, name, None))
        and not isinstance(method, type)
    ]


def record_answers(load: Workload) -> tuple[Answers, tuple[int, int]]:
    """kvcert's answers to every public manager call over one round, and (hits, steps)."""
    scheduler, _, hasher, _ = build(load, kvcert=True)
    manager, answers = scheduler.kv_cache_manager, {}

    def recorded(name: str, method: Any) -> Any:
        said = answers.setdefault(name, [])

        def call(*args: Any, **kwargs: Any) -> Any:
            answer = method(*args, **kwargs)
            said.append(answer)
            return answer

        return call

    for name in public_methods(manager):
        setattr(manager, name, recorded(name, getattr(manager, name)))
    _, hits, steps = serve(scheduler, hasher, load)
    return answers, (hits, steps)


Timings = dict[str, tuple[int, float]]  # per method (calls, seconds)


def one_round_by_call(
    load: Workload, kvcert: bool, replay: Answers | None = None, phase: int = 0
) -> tuple[tuple[Timings, Timings], tuple[int, int]]:
    """(calls, seconds) per public manager method over one round of `load` served from the
    collector's `phase` (`serve`), with and without the collector's pauses inside each call,
    and the round's (hits, steps); with `replay`, every method answers from it instead (on
    kvcert's manager, whose other attributes the scheduler still reads)."""
    scheduler, _, hasher, _ = build(load, kvcert=kvcert)
    manager, counts, unpaused = scheduler.kv_cache_manager, {}, {}
    inside = [""]  # the call being timed: the public methods it calls are part of it
    paused = [0.0, 0.0]  # when the collection in progress started; pauses in this call

    def collector(phase: str, info: dict[str, Any]) -> None:
        if not inside[0]:
            return
        if phase == "start":
            paused[0] = time.perf_counter()
            return
        pause = time.perf_counter() - paused[0]
        paused[1] += pause
        calls, seconds = counts.get(PAUSES, (0, 0.0))
        counts[PAUSES] = (calls + 1, seconds + pause)

    def timed(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:  # e.g. vLLM's allocate_slots -> create_kv_cache_blocks: counted once
                return method(*args, **kwargs)
            inside[0], paused[1] = name, 0.0
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                taken = time.perf_counter() - start
                inside[0] = ""
                calls, seconds = counts.get(name, (0, 0.0))
                counts[name] = (calls + 1, seconds + taken)
                calls, seconds = unpaused.get(name, (0, 0.0))
                unpaused[name] = (calls + 1, seconds + taken - paused[1])

        return call

    for name in public_methods(manager):
        method = getattr(manager, name)
        if replay is not None:
            method = _replayer(iter(replay.get(name, ())).__next__)
        setattr(manager, name, timed(name, method))
    gc.callbacks.append(collector)
    try:
        _, hits, steps = serve(scheduler, timed(HASHER, hasher), load, phase)
    finally:
        gc.callbacks.remove(collector)
    return (counts, unpaused), (hits, steps)


def _replayer(next_answer: Any) -> Any:
    def answer(*args: Any, **kwargs: Any) -> Any:
        return next_answer()

    return answer


def calls_summary(
    spent: dict[str, dict[str, tuple[int, float]]], totals: dict[str, list[float]]
) -> str:
    """The by-call ratio, vLLM / kvcert over every manager call, the median over back-to-back
    pairs of rounds (each pair listed), with and without the collector's pauses; the floor's
    (vLLM / floor: the most any manager answering these calls could reach); and each side's
    least round, pauses and hasher beside."""
    least = {side: calls_time(counts) for side, counts in spent.items()}
    sides = ("vLLM", "kvcert", "floor")
    pauses = {side: spent[side].get(PAUSES, (0, 0.0)) for side in sides}
    inside = ", ".join(
        f"{side} {seconds * 1e3:.1f} ms ({calls})" for side, (calls, seconds) in pauses.items()
    )
    ratio, each = paired(totals, "vLLM", "kvcert")
    bare, bare_each = paired(totals, "vLLM" + UNPAUSED, "kvcert" + UNPAUSED)
    floor, _ = paired(totals, "vLLM", "floor")

    def listed(ratios: list[float]) -> str:
        return ", ".join(f"{r:.2f}" for r in ratios)

    return (
        f"every manager call, vLLM / kvcert, median of {len(each)} back-to-back pair(s), "
        f"each from its own collector phase: "
        f"{ratio:.2f}x ({listed(each)}); without the collector's pauses inside each call: "
        f"{bare:.2f}x ({listed(bare_each)}); vLLM / floor {floor:.1f}x. Least rounds: vLLM "
        f"{least['vLLM'] * 1e3:.1f} ms, kvcert {least['kvcert'] * 1e3:.1f} ms, floor "
        f"{least['floor'] * 1e3:.1f} ms; of these, the collector's pauses: {inside}; without "
        f"them: vLLM {least['vLLM' + UNPAUSED] * 1e3:.1f} ms, kvcert "
        f"{least['kvcert' + UNPAUSED] * 1e3:.1f} ms; each side's block hasher beside them "
        f"(vLLM's; kvcert's, digesting its prompts): vLLM "
        f"{spent['vLLM'].get(HASHER, (0, 0.0))[1] * 1e3:.1f} ms, kvcert "
        f"{spent['kvcert'].get(HASHER, (0, 0.0))[1] * 1e3:.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small round (CI smoke)")
    parser.add_argument("--model", default="gpt-oss-20b", help="gpt-oss-20b or qwen3.5-0.8b")
    parser.add_argument("--state-checkpoints", action="store_true",
                        help="the state layers save checkpoints inside a prefill")  # fmt: skip
    parser.add_argument("--drafts", type=int, default=0,
                        help="EAGLE/MTP drafts per decode step, all accepted")  # fmt: skip
    parser.add_argument("--by-call", action="store_true",
                        help="also time each manager method over nine extra rounds")  # fmt: skip
    args = parser.parse_args()
    if args.state_checkpoints and args.model not in STATE_MODELS:
        parser.error(f"--state-checkpoints needs a state model ({', '.join(STATE_MODELS)})")
    rounds = 1 if args.quick else 5
    for asynchronous in (False, True):
        requests, output = (16, 8) if args.quick else (64, 64)
        load = workload(
            requests,
            output,
            asynchronous,
            args.model,
            checkpoints=args.state_checkpoints,
            drafts=args.drafts,
        )
        times: dict[str, list[float]] = {"vLLM": [], "kvcert": []}
        seen: dict[str, tuple[int, int]] = {}
        for _ in range(rounds):
            for side, taken in times.items():
                scheduler, _, hasher, _ = build(load, kvcert=side == "kvcert")
                seconds, hits, steps = serve(scheduler, hasher, load)
                taken.append(seconds)
                seen.setdefault(side, (hits, steps))
                if seen[side] != (hits, steps) or scheduler.has_requests():
                    raise SystemExit(f"{side} served differently between rounds")
        if seen["kvcert"][0] < seen["vLLM"][0]:
            raise SystemExit(
                f"kvcert's manager served {seen['kvcert'][0]} hit tokens, fewer than vLLM's "
                f"{seen['vLLM'][0]} on the same workload (issue 40: at least vLLM's hits)"
            )
        best = {side: min(t) for side, t in times.items()}
        ratios = [a / b for a, b in zip(times["vLLM"], times["kvcert"], strict=True)]
        mode = "asynchronous" if asynchronous else "synchronous"
        saving = ", checkpoints inside prefills" if args.state_checkpoints else ""
        saving += f", {args.drafts} drafts per step" if args.drafts else ""
        print(f"{args.model}{saving}, {mode}: {len(load.arrivals)} requests, {rounds} "
              f"round(s), hits (tokens, steps): {seen}")  # fmt: skip
        print(
            f"{mode}: vLLM's manager {best['vLLM'] * 1e3:.1f} ms, kvcert's "
            f"{best['kvcert'] * 1e3:.1f} ms; ratio (vLLM / kvcert, median of rounds) "
            f"{statistics.median(ratios):.2f}x"
        )
        if args.by_call:
            spent, totals = time_by_call(load, rounds=1 if args.quick else BY_CALL_ROUNDS)
            for side, counts in spent.items():
                if side == "floor" or side.endswith(UNPAUSED):  # in the summary, below
                    continue
                ranked = sorted(counts.items(), key=lambda item: -item[1][1])
                label = f"  {side}, ms in each manager method (calls), least round: "
                print(label + ", ".join(
                    f"{name} {seconds * 1e3:.1f} ({calls})"
                    for name, (calls, seconds) in ranked if seconds >= 5e-4
                ))  # fmt: skip
            print("  " + calls_summary(spent, totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
