"""The small models the vLLM integration checks build: block size, prompt, group specs, engine
config (vLLM 0.33.0's own objects), and how a refusal is read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvcert.conformance.vllm import runtime
from kvcert.reference.vllm import UnsupportedConfigError

BLOCK = 16
TOKENS = list(range(100, 164))  # 64 tokens: 3 blocks can hit (the last token is computed)
FULL = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)


def config(*specs: Any) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs or (FULL,))]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def request(rid: str, **extra: Any) -> Request:
    tokens = extra.pop("tokens", TOKENS)
    return Request(rid, tokens, SamplingParams(max_tokens=1), None, **extra)


STATE = MambaSpec(
    block_size=BLOCK, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align"
)


def state_config(asynchronous: bool = False) -> Any:
    """A full-attention + Mamba (align) model's engine config: blocks of 16, a 128-token
    step budget, 64 blocks."""
    vllm_config = runtime.engine_config(
        runtime.Settings(
            max_len=256,
            block_size=BLOCK,
            budget=128,
            max_num_seqs=128,  # vLLM's default
            async_scheduling=asynchronous,
            flags=(("cache", "mamba_cache_mode", "align"), ("cache", "mamba_block_size", BLOCK)),
        )
    )
    vllm_config.cache_config.num_gpu_blocks = 64
    return vllm_config


def refused(
    build: Callable[[], Any], error: type[Exception] = UnsupportedConfigError
) -> str | None:
    """What `build` was refused with (an `error`), or None when it went through."""
    try:
        build()
    except error as why:
        return str(why)
    return None


def make_scheduler(cls: Any, vllm_config: Any, *specs: Any, hash_block_size: int = BLOCK) -> Any:
    """A scheduler of class `cls` (kvcert's, possibly `configured`) over groups of `specs`
    (one full-attention group when none), blocks of 16 for the scheduler."""
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=config(*specs),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        hash_block_size=hash_block_size,
    )


def run_step(
    scheduler: Any, prompts: dict[str, list[int]], seen: Callable[[Any], None] | None = None
) -> Any:
    """One schedule() and its output (a token sampled where a prompt's last token ran);
    `seen` looks at the scheduler output before the output is given back."""
    out = scheduler.schedule()
    if seen is not None:
        seen(out)
    ids = list(out.num_scheduled_tokens)
    done = [r for r in ids if scheduler.requests[r].num_computed_tokens >= len(prompts[r])]
    runner = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] if r in done else [] for r in ids],
    )
    scheduler.update_from_output(out, runner)
    return out
