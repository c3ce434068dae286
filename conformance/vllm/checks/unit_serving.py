"""The kvcert manager serving vLLM's --prefix-match-unit through vLLM 0.33.0's own Scheduler,
beside vLLM's own manager on the same model.

A Qwen3.5-like model (full attention and an align-mode Mamba group, 32-token blocks, hashed
every 16 tokens: `--prefix-match-unit 16`), a 90-token prompt whose last unit boundary below
its last token is 80 (inside block 2):

    writer a:  the scheduler stops its prefill at 64 (a block end), then at 80 (the tail
               boundary, where ALLOC-UNIT-2 keys the state), then runs to 90; before that
               last chunk overwrites the state block keyed at 80, the block is copied out
               (ALLOC-UNIT-4), and the worker's table for a never changes
    reader b:  the same prompt once a has finished: a hit of 80, copying full attention's
               block 2 (tokens 64..79 of a's) and the state at 80 (ALLOC-UNIT-3)

Both managers must give the same chunks, the same hit and as many copies per step (block
ids are not compared: the two free queues hand out different blocks), and b's state copy must
read the block a's keep copy filled (a chain the worker runs in order, a step apart).

Then 30 seeded workloads (8 prompts of 20-150 tokens, most sharing a prefix of an earlier
one, arriving alone or in pairs, served to completion): every request must get the same hit
from both managers, and the steps the same number of copies in all. When requests are
admitted may differ, and is counted: a reader arriving in the step its writer's last chunk
copies the writer's tail checkpoint out waits a step under vLLM, which moves the key to the
copy at scheduling and defers hits on it ("the moved entry is only filled by this step's
copy"), and the requests behind it wait too; kvcert keeps the key on the written block until
the step ends (ALLOC-UNIT-4) and every copy runs before the pass, so the reader copies the
same state a step earlier (seeds 19, 21 and 37, read step by step). The same claims hold without
the flag, where vLLM hits every hash block on its own and kvcert's manager serves `unit 16`
too (`all_checks` names those "without the flag"), and with state layers that save the state
at the prompt's tail inside a prefill chunk (Qwen's GDN layers: `num_prefill_checkpoint_blocks
=1`), where vLLM's scheduler runs a's prompt in one chunk and its runner saves the state at 80
in passing, into the table column before the running one (CKPT-INNER-2): b still hits 80.
`checks()` returns one (name, ok, detail) per claim.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.structured_output import StructuredOutputManager

from kvcert.conformance.vllm.checks.fixtures import (
    FULL,
    STATE,
    config,
    request,
    run_step,
    state_config,
)
from kvcert.reference.vllm.scheduler import Scheduler

UNIT, BLOCK = 16, 32
PROMPT = list(range(100, 190))  # 90 tokens: tail boundary 80, inside block 2 [64, 96)


def scheduler(cls: Any, flag: bool, saver: bool = False) -> Any:
    """`cls` over the two groups, as vLLM resolves them: the scheduler's block is the lcm of
    the groups' (32), its hash block the unit (16). `flag`: `--prefix-match-unit 16` given;
    without it vLLM 0.33 hits every hash block on its own (the state group's blocks are
    longer: `partial_hash_hits_enabled`), and kvcert's manager serves `unit 16` as well.
    `saver`: the state layers save a state inside a prefill chunk, as Qwen's GDN layers do
    (`num_prefill_checkpoint_blocks=1`, every 16 tokens): vLLM's scheduler then runs the
    prompt past its tail and the runner saves the tail's state in passing (CKPT-INNER-2)."""
    vllm_config = state_config()
    if flag:
        vllm_config.cache_config.prefix_match_unit = UNIT
    vllm_config.cache_config.block_size = BLOCK
    saving = {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": UNIT}
    state = dataclasses.replace(STATE, block_size=BLOCK, **(saving if saver else {}))
    groups = config(dataclasses.replace(FULL, block_size=BLOCK), state)
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=groups,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        hash_block_size=UNIT,
    )


def _hasher() -> Any:
    """vLLM's request block hasher at the unit, as its engine builds one per request."""
    init_none_hash(sha256)
    return get_request_block_hasher(UNIT, sha256)


def played(
    cls: Any, flag: bool, saver: bool = False
) -> list[tuple[dict[str, int], list[tuple[str, int]], list[tuple[int, int]]]]:
    """Per step: tokens scheduled per request, (request, hit) of the new ones, the copies."""
    hasher = _hasher()
    sched = scheduler(cls, flag, saver)
    prompts = {"a": PROMPT, "b": PROMPT}
    steps = []
    for rid, count in (("a", 1 if saver else 3), ("b", 1)):
        sched.add_request(request(rid, tokens=PROMPT, block_hasher=hasher))
        for _ in range(count):
            out = run_step(sched, prompts)
            steps.append(
                (
                    dict(out.num_scheduled_tokens),
                    [(new.req_id, new.num_computed_tokens) for new in out.scheduled_new_reqs],
                    [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ()],
                )
            )
    return steps


def checks(flag: bool = True, saver: bool = False) -> list[tuple[str, bool, str]]:
    ours, theirs = played(Scheduler, flag, saver), played(VllmScheduler, flag, saver)
    out: list[tuple[str, bool, str]] = []
    shape = [(tokens, new, len(copies)) for tokens, new, copies in ours]
    want = [
        ({"a": 64}, [("a", 0)], 0),
        ({"a": 16}, [], 0),
        ({"a": 10}, [], 1),  # ALLOC-UNIT-4: the state keyed at 80, copied out
        ({"b": 10}, [("b", 80)], 2),  # ALLOC-UNIT-3: both tails copied
    ]
    if saver:  # one chunk, the state at 80 saved in passing (CKPT-INNER-2)
        want = [({"a": 90}, [("a", 0)], 0), ({"b": 10}, [("b", 80)], 2)]
    out.append(("chunks, b's hit of 80 and the copies per step", shape == want, f"{shape}"))
    same = shape == [(tokens, new, len(copies)) for tokens, new, copies in theirs]
    out.append(("the same as vLLM's own manager", same, f"kvcert {ours}, vLLM {theirs}"))
    if shape == want and not saver:
        ((_, kept),) = ours[2][2]
        chained = any(source == kept for source, _ in ours[3][2])
        out.append(("b's state copy reads the block a's keep copy filled", chained, f"{ours}"))
    return out


def workload(
    cls: Any, seed: int, flag: bool, saver: bool = False
) -> tuple[dict[str, int], int, dict[str, int]]:
    """A seeded workload: each request's hit, the copies in all, each request's first step."""
    rng = random.Random(seed)
    hasher = _hasher()
    sched = scheduler(cls, flag, saver)
    prompts: dict[str, list[int]] = {}
    hits: dict[str, int] = {}
    first: dict[str, int] = {}
    copies = step = 0
    for i in range(8):
        length = rng.randint(20, 150)
        if prompts and rng.random() < 0.7:
            other = rng.choice(list(prompts.values()))
            cut = rng.randint(1, len(other))
            tokens = other[:cut] + [rng.randint(2000, 2100) for _ in range(max(1, length - cut))]
        else:
            tokens = [rng.randint(3000, 9000) for _ in range(length)]
        prompts[f"r{i}"] = tokens
        sched.add_request(request(f"r{i}", tokens=tokens, block_hasher=hasher))
        if rng.random() < 0.5:
            continue  # it arrives with the next one
        while sched.requests and step < 200:
            out = run_step(sched, prompts)
            step += 1
            copies += len(out.kv_cache_block_copies or ())
            for new in out.scheduled_new_reqs:
                hits.setdefault(new.req_id, new.num_computed_tokens)
                first.setdefault(new.req_id, step)
    return hits, copies, first


def workload_checks(
    seeds: range = range(30), flag: bool = True, saver: bool = False
) -> list[tuple[str, bool, str]]:
    """Where both managers admit every request in the same step, the same hits and as many
    copies; where kvcert admits a reader earlier than vLLM's deferral (module docstring), the
    requests admitted in the same step still get the same hits (the others are counted: they
    start earlier, from what is cached then, and later copies follow that schedule)."""
    differ, earlier, shifted = [], 0, 0
    for seed in seeds:
        ours = workload(Scheduler, seed, flag, saver)
        theirs = workload(VllmScheduler, seed, flag, saver)
        moved = {r for r in ours[2] if ours[2][r] != theirs[2].get(r)}
        earlier += sum(ours[2][r] < theirs[2].get(r, ours[2][r]) for r in ours[2])
        shifted += bool(moved)
        same = {r: hit for r, hit in ours[0].items() if r not in moved}
        if same != {r: hit for r, hit in theirs[0].items() if r not in moved} or (
            not moved and ours[1] != theirs[1]
        ):
            differ.append(f"seed {seed}: kvcert {ours}, vLLM {theirs}")
    return [
        (
            f"{len(seeds)} seeded workloads: the same hits and as many copies as vLLM's manager "
            f"where every admission falls in the same step, the same hits for the requests "
            f"admitted in the same step elsewhere ({shifted} workloads; admitted earlier than "
            f"under vLLM's deferral: {earlier} requests)",
            not differ,
            "; ".join(differ),
        )
    ]


def all_checks() -> list[tuple[str, bool, str]]:
    """The claims with `--prefix-match-unit 16`, then without the flag, then with state
    layers saving checkpoints inside chunks (each named so)."""
    unflagged = [
        (f"without the flag: {name}", ok, detail)
        for name, ok, detail in checks(flag=False) + workload_checks(flag=False)
    ]
    saving = [
        (f"state saved inside chunks (CKPT-INNER-2), without the flag: {name}", ok, detail)
        for name, ok, detail in checks(False, True) + workload_checks(flag=False, saver=True)
    ]
    return checks() + workload_checks() + unflagged + saving
