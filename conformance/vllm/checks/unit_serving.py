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

Both managers must give the same chunks, the same hit, the same copies (block ids up to
renaming: each copy's source is a block the writer's copies or table left keyed), and b's
state copy must read the block a's keep copy filled (a chain the worker runs in order, a step
apart). `checks()` returns one (name, ok, detail) per claim.
"""

from __future__ import annotations

import dataclasses
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


def scheduler(cls: Any) -> Any:
    """`cls` over the two groups, as vLLM resolves them: the scheduler's block is the lcm of
    the groups' (32), its hash block the unit (16)."""
    vllm_config = state_config()
    vllm_config.cache_config.prefix_match_unit = UNIT
    vllm_config.cache_config.block_size = BLOCK
    groups = config(
        dataclasses.replace(FULL, block_size=BLOCK), dataclasses.replace(STATE, block_size=BLOCK)
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=groups,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        hash_block_size=UNIT,
    )


def played(cls: Any) -> list[tuple[dict[str, int], list[tuple[str, int]], list[tuple[int, int]]]]:
    """Per step: tokens scheduled per request, (request, hit) of the new ones, the copies."""
    init_none_hash(sha256)
    hasher = get_request_block_hasher(UNIT, sha256)
    sched = scheduler(cls)
    prompts = {"a": PROMPT, "b": PROMPT}
    steps = []
    for rid, count in (("a", 3), ("b", 1)):
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


def checks() -> list[tuple[str, bool, str]]:
    ours, theirs = played(Scheduler), played(VllmScheduler)
    out: list[tuple[str, bool, str]] = []
    shape = [(tokens, new, len(copies)) for tokens, new, copies in ours]
    want = [
        ({"a": 64}, [("a", 0)], 0),
        ({"a": 16}, [], 0),
        ({"a": 10}, [], 1),  # ALLOC-UNIT-4: the state keyed at 80, copied out
        ({"b": 10}, [("b", 80)], 2),  # ALLOC-UNIT-3: both tails copied
    ]
    out.append(("chunks, b's hit of 80 and the copies", shape == want, f"{shape}"))
    same = shape == [(tokens, new, len(copies)) for tokens, new, copies in theirs]
    out.append(("the same as vLLM's own manager", same, f"kvcert {ours}, vLLM {theirs}"))
    if shape == want:
        ((_, kept),) = ours[2][2]
        chained = any(source == kept for source, _ in ours[3][2])
        out.append(("b's state copy reads the block a's keep copy filled", chained, f"{ours}"))
    return out
