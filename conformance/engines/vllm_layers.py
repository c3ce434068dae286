"""Per-layer KVCacheSpecs as vLLM's attention backends publish them, for kvcert's layers.

Runs inside a vLLM release venv. Shared by the scripts that hand vLLM's own planner a model's
layers (engines/vllm/plan/plan_check.py) and by the scheduler campaign
(kvcert.conformance.campaign), so both build the same specs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1 import kv_cache_interface  # type: ignore[import-not-found]
from vllm.v1.kv_cache_interface import (  # type: ignore[import-not-found]
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, LatentLayer, StateLayer

TORCH_DTYPE = {
    KVDtype.FP32: torch.float32,
    KVDtype.FP16: torch.float16,
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP8: torch.uint8,  # vLLM stores fp8 KV as bytes
    KVDtype.INT8: torch.int8,
}
# Per-token-head quantization: one byte per element plus an fp32 scale for K and one for V
# per (token, head), which the backend publishes as the packed cell size (an assumption of
# this script, from the research notes: 520 B for two heads of 256, 1032 B for 512).
KVQuantMode = getattr(kv_cache_interface, "KVQuantMode", None)  # from 0.20 on
PER_TOKEN_HEAD = {
    KVDtype.INT8_PER_TOKEN_HEAD: (torch.int8, getattr(KVQuantMode, "INT8_PER_TOKEN_HEAD", None)),
    KVDtype.FP8_PER_TOKEN_HEAD: (torch.uint8, getattr(KVQuantMode, "FP8_PER_TOKEN_HEAD", None)),
}


class NotCompared(Exception):
    """A layer vLLM's planner would get from a kernel this script cannot stand in for."""


def _built(cls: Any, layer: AttentionLayer, **fields: Any) -> KVCacheSpec:
    """`cls(**fields)`, without head_size_v on releases whose spec has one head size (< 0.20)."""
    if "head_size_v" not in {f.name for f in dataclasses.fields(cls)}:
        if layer.head_size_v != layer.head_size_k:
            raise NotCompared("K and V head sizes differ (this release has one head_size)")
        fields.pop("head_size_v")
    return cls(**fields)


def spec_of(layer: object, dtype: KVDtype, block_size: int) -> KVCacheSpec:
    """The KVCacheSpec vLLM's attention backends publish for one kvcert layer."""
    quant: dict[str, Any] = {}
    if dtype in PER_TOKEN_HEAD:
        torch_dtype, mode = PER_TOKEN_HEAD[dtype]
        if mode is None:
            raise NotCompared("per-token-head KV quantization (this release has no KVQuantMode)")
        if isinstance(layer, AttentionLayer):
            cell = layer.head_size_k + layer.head_size_v + 2 * 4
            quant = {"kv_quant_mode": mode, "state_content_bytes": cell}
    else:
        torch_dtype = TORCH_DTYPE[dtype]
    if isinstance(layer, LatentLayer):
        if dtype in PER_TOKEN_HEAD:
            raise NotCompared("per-token-head scales on MLA latents")
        if layer.ratio != 1 or layer.window is not None:
            raise NotCompared("DeepSeek-V4 compressed / windowed latents (vLLM's sparse MLA)")
        return MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=layer.latent_size + layer.rope_size,
            dtype=torch_dtype,
        )
    if not isinstance(layer, AttentionLayer):
        raise NotCompared("state layers: vLLM sizes them from the Mamba/GDN kernel's shapes")
    common: dict[str, Any] = {
        "block_size": block_size,
        "num_kv_heads": layer.num_kv_heads,
        "head_size": layer.head_size_k,
        "head_size_v": layer.head_size_v,
        "dtype": torch_dtype,
        **quant,
    }
    if layer.kind is AttentionKind.SLIDING_WINDOW:
        return _built(SlidingWindowSpec, layer, sliding_window=layer.window, **common)
    if layer.kind is AttentionKind.CHUNKED_LOCAL:
        return _built(ChunkedLocalAttentionSpec, layer, attention_chunk_size=layer.chunk, **common)
    if layer.kind is AttentionKind.FULL:
        return _built(FullAttentionSpec, layer, **common)
    raise NotCompared(f"{layer.kind.value} layers")


KIND = {
    "MambaSpec": "mamba",
    "FullAttentionSpec": "full",
    "MLAAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local",
}


def state_spec_of(layer: StateLayer, block_size: int, page: int) -> KVCacheSpec:
    """The MambaSpec a Mamba/GDN layer publishes in prefix-caching align mode, as the
    platform leaves it for a hybrid: the attention block size, its state page padded to the
    attention page `page` (vLLM's `mamba_page_size_padded`)."""
    return MambaSpec(
        block_size=block_size,
        shapes=tuple(tensor.shape for tensor in layer.tensors),
        dtypes=tuple(TORCH_DTYPE[tensor.dtype] for tensor in layer.tensors),
        page_size_padded=page,
        mamba_cache_mode="align",
    )


def kind_of(spec: KVCacheSpec) -> str:
    """A group's attention kind (a UniformTypeKVCacheSpecs holds layers of one kind)."""
    inner = getattr(spec, "kv_cache_specs", None)
    first = next(iter(inner.values())) if inner else spec
    return KIND[type(first).__name__]
