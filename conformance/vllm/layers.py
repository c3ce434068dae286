"""Per-layer KVCacheSpecs as vLLM's attention backends publish them, for kvcert's layers.

Runs inside a vLLM release venv. Shared by the check that hands vLLM's own planner a model's
layers (`checks.plan`), the planned adapter modes and the scheduler campaign, so all of them
build the same specs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvcert.conformance.vllm import runtime
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, LatentLayer, StateLayer


def torch_dtype(dtype: KVDtype) -> Any:
    """The torch dtype vLLM's specs carry for a plain KV dtype (fp8 KV is stored as bytes)."""
    torch = runtime.vllm().torch
    return {
        KVDtype.FP32: torch.float32,
        KVDtype.FP16: torch.float16,
        KVDtype.BF16: torch.bfloat16,
        KVDtype.FP8: torch.uint8,
        KVDtype.INT8: torch.int8,
    }[dtype]


# Per-token-head quantization: one byte per element plus an fp32 scale for K and one for V
# per (token, head), which the backend publishes as the packed cell size (an assumption of
# this module: 520 B for two heads of 256, 1032 B for 512).
PER_TOKEN_HEAD = {KVDtype.INT8_PER_TOKEN_HEAD: "INT8_PER_TOKEN_HEAD",
                  KVDtype.FP8_PER_TOKEN_HEAD: "FP8_PER_TOKEN_HEAD"}  # fmt: skip


def _quantized(dtype: KVDtype) -> tuple[Any, Any]:
    """(torch dtype, vLLM's KVQuantMode member or None on releases before 0.20)."""
    v = runtime.vllm()
    mode = getattr(getattr(v.kvi, "KVQuantMode", None), PER_TOKEN_HEAD[dtype], None)
    return (v.torch.int8 if dtype is KVDtype.INT8_PER_TOKEN_HEAD else v.torch.uint8), mode


class NotCompared(Exception):
    """A layer vLLM's planner would get from a kernel this script cannot stand in for."""


def _built(cls: Any, layer: AttentionLayer, **fields: Any) -> Any:
    """`cls(**fields)`, without head_size_v on releases whose spec has one head size (< 0.20)."""
    if "head_size_v" not in {f.name for f in dataclasses.fields(cls)}:
        if layer.head_size_v != layer.head_size_k:
            raise NotCompared("K and V head sizes differ (this release has one head_size)")
        fields.pop("head_size_v")
    return cls(**fields)


def spec_of(layer: object, dtype: KVDtype, block_size: int) -> Any:
    """The KVCacheSpec vLLM's attention backends publish for one kvcert layer."""
    specs = runtime.vllm().kvi
    quant: dict[str, Any] = {}
    if dtype in PER_TOKEN_HEAD:
        element, mode = _quantized(dtype)
        if mode is None:
            raise NotCompared("per-token-head KV quantization (this release has no KVQuantMode)")
        if isinstance(layer, AttentionLayer):
            cell = layer.head_size_k + layer.head_size_v + 2 * 4
            quant = {"kv_quant_mode": mode, "state_content_bytes": cell}
    else:
        element = torch_dtype(dtype)
    if isinstance(layer, LatentLayer):
        if dtype in PER_TOKEN_HEAD:
            raise NotCompared("per-token-head scales on MLA latents")
        if layer.ratio != 1 or layer.window is not None:
            raise NotCompared("DeepSeek-V4 compressed / windowed latents (vLLM's sparse MLA)")
        return specs.MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=layer.latent_size + layer.rope_size,
            dtype=element,
        )
    if not isinstance(layer, AttentionLayer):
        raise NotCompared("state layers: vLLM sizes them from the Mamba/GDN kernel's shapes")
    common: dict[str, Any] = {
        "block_size": block_size,
        "num_kv_heads": layer.num_kv_heads,
        "head_size": layer.head_size_k,
        "head_size_v": layer.head_size_v,
        "dtype": element,
        **quant,
    }
    if layer.kind is AttentionKind.SLIDING_WINDOW:
        return _built(specs.SlidingWindowSpec, layer, sliding_window=layer.window, **common)
    if layer.kind is AttentionKind.CHUNKED_LOCAL:
        chunked = specs.ChunkedLocalAttentionSpec
        return _built(chunked, layer, attention_chunk_size=layer.chunk, **common)
    if layer.kind is AttentionKind.FULL:
        return _built(specs.FullAttentionSpec, layer, **common)
    raise NotCompared(f"{layer.kind.value} layers")


KIND = {
    "MambaSpec": "mamba",
    "FullAttentionSpec": "full",
    "MLAAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local",
}


def state_spec_of(layer: StateLayer, block_size: int, page: int) -> Any:
    """The MambaSpec a Mamba/GDN layer publishes in prefix-caching align mode, as the
    platform leaves it for a hybrid: the attention block size, its state page padded to the
    attention page `page` (vLLM's `mamba_page_size_padded`)."""
    return runtime.vllm().kvi.MambaSpec(
        block_size=block_size,
        shapes=tuple(tensor.shape for tensor in layer.tensors),
        dtypes=tuple(torch_dtype(tensor.dtype) for tensor in layer.tensors),
        page_size_padded=page,
        mamba_cache_mode="align",
    )


def kind_of(spec: Any) -> str:
    """A group's attention kind (a UniformTypeKVCacheSpecs holds layers of one kind)."""
    inner = getattr(spec, "kv_cache_specs", None)
    first = next(iter(inner.values())) if inner else spec
    return KIND[type(first).__name__]
