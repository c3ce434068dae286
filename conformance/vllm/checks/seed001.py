"""Seed 001 end to end: DeepSeek-V4-Flash's re-sent prompt through vLLM 0.33.0's Scheduler.

Run in the vLLM venv (`scripts/engine-venv.sh vllm 0.33.0`):

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.seed001

The scenario is `kvcert simulate deepseek-v4-flash --trace resend --budget 2048
--pool-requests 2` (docs/simulate.md, seed 001): prompts A, A, B, A of 8,192 tokens, one after the
other, prefilled in 2,048-token chunks, in a pool of two working sets. It is served three
times by vLLM's own `Scheduler` (scheduling, chunking, the model runner's outputs): with
vLLM's KVCacheManager, and with kvcert.reference.vllm's (its Scheduler subclass) under the
lru and the hybrid eviction profiles; then twice by vLLM's `AsyncScheduler` (its default
mode: step N+1 scheduled before step N's output is read), with vLLM's manager and with
kvcert's AsyncScheduler under the hybrid profile. Each line gives the hit vLLM's
scheduler adopted for each send (`num_computed_tokens` of its first scheduled chunk) and the
cacheable maximum (A's 8,192 tokens but the last, at the 256-token hit alignment: 7,936).

The KV-cache groups are those of `kvcert plan deepseek-v4-flash` (kvcert's model of vLLM's
plan: 9 sliding-window groups of 16-token blocks, window 128, 4 full-attention groups of 64
and 8 of 256), given to the scheduler as vLLM's FullAttentionSpec / SlidingWindowSpec groups:
vLLM's own planner needs DeepSeek-V4's sparse-MLA layer specs, which only its model code
builds. Exit 0 when kvcert's hybrid profile serves the third send every cacheable token,
synchronous and async.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvcert.conformance.cli import build_parser
from kvcert.conformance.tools.simulate.cli import load_config, load_trace, policies_of
from kvcert.conformance.tools.simulate.model import compare
from kvcert.conformance.vllm import runtime
from kvcert.reference.config import Eviction, Kind
from kvcert.reference.vllm import AsyncScheduler as KvcertAsyncScheduler
from kvcert.reference.vllm import Scheduler as KvcertScheduler
from kvcert.reference.vllm import Settings

ARGS = ["simulate", "deepseek-v4-flash", "--trace", "resend", "--budget", "2048",
        "--pool-requests", "2"]  # fmt: skip
MAX_LEN = 16384
MAX_STEPS = 64  # a send takes 5 steps (4 prefill chunks and a decode)


def scenario() -> tuple[Any, list[Any], int, int]:
    """(kvcert's CacheConfig, the trace, the pool's blocks, the cacheable hit of A)."""
    args = build_parser().parse_args(ARGS)
    _, config = load_config(args)
    _, trace = load_trace(args)
    result = compare(config, trace, policies_of(args, config)[:1], pool_requests=2,
                     budget=args.budget)  # fmt: skip
    alignment = config.alignment
    cacheable = (len(trace[0].prompt) - 1) // alignment * alignment
    return config, trace, result.runs[0].num_blocks, cacheable


def vllm_groups(config: Any) -> list[Any]:
    """kvcert's planned groups as vLLM group specs (one layer name per group)."""
    groups = []
    for g, group in enumerate(config.groups):
        common = {"block_size": group.block_size, "num_kv_heads": 1, "head_size": 64,
                  "dtype": torch.bfloat16}  # fmt: skip
        if group.kind is Kind.FULL:
            spec = FullAttentionSpec(**common)
        elif group.kind is Kind.SLIDING_WINDOW:
            spec = SlidingWindowSpec(**common, sliding_window=group.window)
        else:
            raise SystemExit(f"group {g} is {group.kind}: not in this scenario")
        groups.append(KVCacheGroupSpec([f"model.layers.{g}.attn"], spec))
    return groups


def serve(cls: type, config: Any, trace: list[Any], num_blocks: int,
          asynchronous: bool = False) -> list[int]:  # fmt: skip
    """Each send's adopted hit, the requests served one after another by `cls`;
    `asynchronous`: as vLLM's engine drives an AsyncScheduler, step N+1 scheduled before
    step N's output is read (two steps in flight)."""
    vllm_config = runtime.engine_config(
        runtime.Settings(
            max_len=MAX_LEN, block_size=16, budget=2048, max_num_seqs=8,
            async_scheduling=asynchronous,
        )
    )  # fmt: skip
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    groups = vllm_groups(config)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    sizes = [g.kv_cache_spec.block_size for g in groups]
    scheduler = cls(vllm_config=vllm_config, kv_cache_config=kv,
                    structured_output_manager=StructuredOutputManager(vllm_config),
                    block_size=max(sizes), hash_block_size=min(sizes))  # fmt: skip
    hasher = get_request_block_hasher(min(sizes), sha256)
    hits = []
    in_flight: deque[tuple[Any, Any]] = deque()  # scheduled steps whose output is unread
    for i, sent in enumerate(trace):
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        request = Request(f"{sent.rid}-{i}", list(sent.prompt), params, None,
                          block_hasher=hasher)  # fmt: skip
        scheduler.add_request(request)
        hit = None
        for _ in range(MAX_STEPS):  # until it is finished and reported
            if not scheduler.has_requests() and not in_flight:
                break
            output = scheduler.schedule()
            if not output.num_scheduled_tokens and not in_flight and not request.is_finished():
                raise SystemExit(f"{cls.__module__}: {request.request_id} was never scheduled")
            for new in output.scheduled_new_reqs:
                hit = new.num_computed_tokens if hit is None else hit
            ids = list(output.num_scheduled_tokens)
            # a step that reaches the prompt's end samples (its count includes the step)
            done = [
                scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
                for r in ids
            ]
            runner = ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                sampled_token_ids=[[7] if d else [] for d in done],
            )  # fmt: skip
            if ids:
                in_flight.append((output, runner))
            if in_flight and (len(in_flight) > asynchronous or not ids):
                scheduler.update_from_output(*in_flight.popleft())
        hits.append(hit or 0)
    return hits


def main() -> int:
    init_none_hash(sha256)
    config, trace, num_blocks, cacheable = scenario()
    print(f"DeepSeek-V4-Flash (kvcert's plan: {len(config.groups)} groups), sends "
          f"{', '.join(t.rid for t in trace)} of {len(trace[0].prompt):,} tokens, 2,048-token "
          f"chunks, a pool of {num_blocks:,} blocks (two working sets); cacheable hit "
          f"{cacheable:,}")  # fmt: skip
    served = {"vLLM's KVCacheManager": serve(Scheduler, config, trace, num_blocks)}
    for profile in (Eviction.LRU, Eviction.HYBRID):
        cls = KvcertScheduler.configured(Settings(eviction=profile))
        served[f"kvcert, {profile} profile"] = serve(cls, config, trace, num_blocks)
    served["vLLM's KVCacheManager, async"] = serve(AsyncScheduler, config, trace, num_blocks,
                                                   asynchronous=True)  # fmt: skip
    cls = KvcertAsyncScheduler.configured(Settings(eviction=Eviction.HYBRID))
    served["kvcert, hybrid profile, async"] = serve(cls, config, trace, num_blocks,
                                                    asynchronous=True)  # fmt: skip
    width = max(map(len, served))
    for name, hits in served.items():
        print(
            f"{name:<{width}}  "
            + "  ".join(f"{t.rid} {h:,}" for t, h in zip(trace, hits, strict=True))
        )
    thirds = [served[name][-1] for name in ("kvcert, hybrid profile",
                                            "kvcert, hybrid profile, async")]  # fmt: skip
    verdict = ("every cacheable token" if set(thirds) == {cacheable}
               else " and ".join(f"{t:,} of {cacheable:,}" for t in thirds))  # fmt: skip
    print(f"third send of A: vLLM's manager {served[next(iter(served))][-1]:,}; kvcert hybrid "
          f"(synchronous and async) {verdict}")  # fmt: skip
    return 0 if set(thirds) == {cacheable} else 1


if __name__ == "__main__":
    sys.exit(main())
