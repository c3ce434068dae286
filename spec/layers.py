"""§8 Layers: what one model layer stores per block, in bytes.

The page planner (§9) sees a model as a tuple of layers. Each layer says which tokens its
queries read (its kind, as in §1) and how many bytes its cache needs for a block of B tokens:

    attention   B tokens x H KV heads x (Dk + Dv) elements, plus a K and a V scale per
                (token, head) with the per-token-head dtypes
    latent      (MLA) one entry of latent + rope elements per `ratio` tokens, plus one scale
                per entry with the per-token-head dtypes; ratio > 1 is compressed attention
    state       (Mamba, GDN, linear attention) fixed tensors, whatever B is

Attention stores K and V even when a model shares their weights (Gemma 4 `attention_k_eq_v`):
engines keep both caches, and so does this spec. Construction validates every field and raises
`InvalidPlan` with what to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kvcert.spec.errors import InvalidPlan, NoPageLayout, as_choice, refuse


class KVDtype(StrEnum):
    """How one cached element is stored (vLLM's `--kv-cache-dtype`, resolved from `auto`)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"  # one byte, one scale per tensor (held outside the pages)
    INT8 = "int8"  # one byte, one scale per tensor (held outside the pages)
    FP8_PER_TOKEN_HEAD = "fp8_per_token_head"  # one byte plus an fp32 scale per (token, head)
    INT8_PER_TOKEN_HEAD = "int8_per_token_head"  # one byte plus an fp32 scale per (token, head)


ELEMENT_BYTES: dict[KVDtype, int] = {
    KVDtype.FP32: 4,
    KVDtype.FP16: 2,
    KVDtype.BF16: 2,
    KVDtype.FP8: 1,
    KVDtype.INT8: 1,
    KVDtype.FP8_PER_TOKEN_HEAD: 1,
    KVDtype.INT8_PER_TOKEN_HEAD: 1,
}
SCALE_BYTES = 4  # an fp32 scale
STATE_DTYPES = (KVDtype.FP32, KVDtype.FP16, KVDtype.BF16)  # recurrent state is never quantized


def scale_bytes(dtype: KVDtype) -> int:
    """Bytes of one in-page scale: an fp32 for the per-token-head dtypes, none otherwise."""
    per_token_head = dtype in (KVDtype.FP8_PER_TOKEN_HEAD, KVDtype.INT8_PER_TOKEN_HEAD)
    return SCALE_BYTES if per_token_head else 0


class AttentionKind(StrEnum):
    """Which earlier tokens a layer's queries read; the hit rule of §3 follows from it."""

    FULL = "full"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    CROSS = "cross"


def _positive(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        refuse(InvalidPlan, f"{what} must be a positive integer, got {value!r}")


def _span(kind: AttentionKind, window: int | None, chunk: int | None, name: str) -> None:
    """A window exactly for sliding-window layers, a chunk exactly for chunked-local ones."""
    if kind is AttentionKind.SLIDING_WINDOW:
        _positive(window, f"layer {name!r}: window")
    elif window is not None:
        refuse(InvalidPlan, f"layer {name!r}: only sliding_window layers take a window")
    if kind is AttentionKind.CHUNKED_LOCAL:
        _positive(chunk, f"layer {name!r}: chunk")
    elif chunk is not None:
        refuse(InvalidPlan, f"layer {name!r}: only chunked_local layers take a chunk")


@dataclass(frozen=True)
class AttentionLayer:
    """Multi-head (also grouped-query, multi-query) attention with a K and a V cache."""

    kind: AttentionKind  # which tokens the layer's queries read
    num_kv_heads: int  # KV heads stored by this worker
    head_size_k: int  # elements of one K head
    head_size_v: int  # elements of one V head (may differ from K)
    window: int | None = None  # sliding_window only: tokens one query sees, itself included
    chunk: int | None = None  # chunked_local only: tokens per attention chunk
    draft: bool = False  # a speculative-decoding draft layer
    name: str = "attention"  # display name only

    def __post_init__(self) -> None:
        kind = as_choice(AttentionKind, self.kind, f"layer {self.name!r}: kind", InvalidPlan)
        object.__setattr__(self, "kind", kind)
        _positive(self.num_kv_heads, f"layer {self.name!r}: num_kv_heads")
        _positive(self.head_size_k, f"layer {self.name!r}: head_size_k")
        _positive(self.head_size_v, f"layer {self.name!r}: head_size_v")
        _span(self.kind, self.window, self.chunk, self.name)
        if not isinstance(self.draft, bool):  # type guard: Python callers only
            refuse(InvalidPlan, f"layer {self.name!r}: draft must be true or false")


@dataclass(frozen=True)
class LatentLayer:
    """Multi-head latent attention (MLA): one shared latent vector per stored entry."""

    kind: AttentionKind  # full or sliding_window
    latent_size: int  # elements of the compressed KV latent (`kv_lora_rank`)
    rope_size: int  # elements of the decoupled rope key (`qk_rope_head_dim`), may be 0
    window: int | None = None  # sliding_window only
    ratio: int = 1  # tokens per stored entry; > 1 for compressed attention (DeepSeek-V4)
    draft: bool = False  # a speculative-decoding draft layer
    name: str = "latent"  # display name only

    def __post_init__(self) -> None:
        kind = as_choice(AttentionKind, self.kind, f"layer {self.name!r}: kind", InvalidPlan)
        object.__setattr__(self, "kind", kind)
        if self.kind not in (AttentionKind.FULL, AttentionKind.SLIDING_WINDOW):
            refuse(InvalidPlan, f"layer {self.name!r}: a latent layer is full or sliding_window")
        _positive(self.latent_size, f"layer {self.name!r}: latent_size")
        if isinstance(self.rope_size, bool) or not isinstance(self.rope_size, int):
            refuse(InvalidPlan, f"layer {self.name!r}: rope_size must be an integer")
        if self.rope_size < 0:
            refuse(InvalidPlan, f"layer {self.name!r}: rope_size must be >= 0")
        _positive(self.ratio, f"layer {self.name!r}: ratio")
        _span(self.kind, self.window, None, self.name)
        if not isinstance(self.draft, bool):  # type guard: Python callers only
            refuse(InvalidPlan, f"layer {self.name!r}: draft must be true or false")


@dataclass(frozen=True)
class StateTensor:
    """One tensor of a recurrent layer's state (e.g. the conv window, the SSM state)."""

    shape: tuple[int, ...]  # elements per dimension, for one sequence on this worker
    dtype: KVDtype  # fp32, fp16 or bf16

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not self.shape:  # type guard: Python callers only
            refuse(InvalidPlan, f"a state tensor needs a non-empty shape, got {self.shape!r}")
        for size in self.shape:
            _positive(size, "a state tensor dimension")
        dtype = as_choice(KVDtype, self.dtype, "a state tensor's dtype", InvalidPlan)
        object.__setattr__(self, "dtype", dtype)
        if self.dtype not in STATE_DTYPES:
            allowed = ", ".join(d.value for d in STATE_DTYPES)
            refuse(InvalidPlan, f"a state tensor's dtype must be one of {allowed}")


@dataclass(frozen=True)
class StateLayer:
    """A recurrent layer: its whole prefix summarised in fixed-size state tensors."""

    tensors: tuple[StateTensor, ...]  # in page order
    name: str = "state"  # display name only

    def __post_init__(self) -> None:
        if not isinstance(self.tensors, tuple) or not self.tensors:
            refuse(InvalidPlan, f"layer {self.name!r}: a state layer needs at least one tensor")


Layer = AttentionLayer | LatentLayer | StateLayer


def state_tensor_offsets(layer: StateLayer) -> tuple[int, ...]:
    """Byte offset of each state tensor in the page: in order, each aligned to its element."""
    offsets: list[int] = []
    end = 0
    for tensor in layer.tensors:
        size = ELEMENT_BYTES[tensor.dtype]
        start = -(-end // size) * size
        offsets.append(start)
        end = start + math.prod(tensor.shape) * size
    return tuple(offsets)


def page_bytes(layer: Layer, dtype: KVDtype, block_size: int) -> int:
    """PAGE-BYTES-1: A layer's page for one block holds its elements and in-page scales only.

        attention, H=8, Dk=Dv=256, int8_per_token_head, B=16:
            16 x 8 x (256 + 256) x 1  +  16 x 8 x 2 x 4   = 65536 + 1024 = 66560
        latent, 512 + 64, fp8, ratio 4, B=256:   (256 / 4) x 576 x 1      = 36864
        state, conv (3, 6144) bf16 + ssm (16, 128, 128) fp32:  36864 + 1048576 = 1085440

    `dtype` applies to attention and latent layers; state tensors carry their own. A latent
    layer's block must hold whole entries (`ratio` divides `block_size`).

    pre: block_size >= 1
    post: __return__ >= 1
    raises: NoPageLayout
    """
    if isinstance(layer, StateLayer):
        last = layer.tensors[-1]
        return state_tensor_offsets(layer)[-1] + math.prod(last.shape) * ELEMENT_BYTES[last.dtype]
    element, scale = ELEMENT_BYTES[dtype], scale_bytes(dtype)
    if isinstance(layer, LatentLayer):
        if block_size % layer.ratio:  # direct callers only: a plan never splits an entry
            refuse(
                NoPageLayout,
                f"layer {layer.name!r} stores one entry per {layer.ratio} tokens; a block of "
                f"{block_size} tokens would split an entry. Use a multiple of {layer.ratio}",
            )
        entries = block_size // layer.ratio
        return entries * ((layer.latent_size + layer.rope_size) * element + scale)
    per_head = (layer.head_size_k + layer.head_size_v) * element + 2 * scale
    return block_size * layer.num_kv_heads * per_head
