"""§10 Page byte layout: where each cached element and scale lives.

Memory is `g` tensors of `num_blocks` pages of P bytes (§9). A layer lives in one tensor; its
block n is that tensor's page n. Inside a page, scales come first so every region starts
aligned to its element size (scale regions are whole fp32s, and no element exceeds 4 bytes):

    attention  | K scales B.H x 4 | V scales B.H x 4 | K  B.H.Dk x e | V  B.H.Dv x e | padding |
               (scales only with the per-token-head dtypes; token-major, then head, then d)
    latent     | scales E x 4 | entries E x (latent + rope) x e | padding |     E = B / ratio
    state      | tensor 0 | tensor 1 | ... | padding |   each aligned to its element size

These functions are the contract for the data-path kernels (kvcert.kernels, issue 8): a kernel
is certified by comparing every address it touches with them.
"""

from __future__ import annotations

import math
from enum import StrEnum

from kvcert.spec import layers
from kvcert.spec.errors import InvalidRequest, as_choice, refuse
from kvcert.spec.layers import AttentionLayer, KVDtype, LatentLayer, StateLayer


class Part(StrEnum):
    """Which of an attention layer's two caches."""

    K = "k"
    V = "v"


def _inside(value: int, bound: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
        refuse(InvalidRequest, f"{what} must be in [0, {bound}), got {value!r}")


def _dtype(dtype: object) -> KVDtype:
    return as_choice(KVDtype, dtype, "dtype", InvalidRequest)


def _part(part: object) -> Part:
    return as_choice(Part, part, "part", InvalidRequest)


def attention_offset(
    layer: AttentionLayer,
    dtype: KVDtype,
    block_size: int,
    *,
    token: int,
    head: int,
    part: Part,
    index: int,
) -> int:
    """PAGE-ADDR-1: Element d of head h of token t's K (or V) sits after the scales, token-major,
    then head, then element.

        H=2, Dk=Dv=4, int8_per_token_head (e=1, s=4), B=2:   scales 2 x 2 x 2 x 4 = 32 bytes
        K t=1 h=0 d=3:  32 + ((1 x 2 + 0) x 4 + 3) x 1           = 43
        V t=0 h=1 d=0:  32 + 2 x 2 x 4  + ((0 x 2 + 1) x 4 + 0)  = 52

    pre: 0 <= token < block_size and 0 <= head < layer.num_kv_heads
    post: 0 <= __return__ < layers.page_bytes(layer, dtype, block_size)
    raises: InvalidRequest
    """
    dtype, part = _dtype(dtype), _part(part)
    heads = layer.num_kv_heads
    size = layer.head_size_k if part is Part.K else layer.head_size_v
    _inside(token, block_size, "token")
    _inside(head, heads, "head")
    _inside(index, size, "element index")
    element = layers.ELEMENT_BYTES[dtype]
    start = 2 * block_size * heads * layers.scale_bytes(dtype)
    if part is Part.V:
        start += block_size * heads * layer.head_size_k * element
    return start + ((token * heads + head) * size + index) * element


def attention_scale_offset(
    layer: AttentionLayer, dtype: KVDtype, block_size: int, *, token: int, head: int, part: Part
) -> int:
    """PAGE-ADDR-2: The fp32 scale of token t, head h of K (or V) is entry t x H + h of the page's K
    (or V) scale region.

        H=2, B=2, int8_per_token_head:   K scale t=1 h=1 -> (1 x 2 + 1) x 4 = 12
                                         V scale t=0 h=0 -> 2 x 2 x 4 + 0  = 16

    pre: 0 <= token < block_size and 0 <= head < layer.num_kv_heads
    post: 0 <= __return__ < 2 * block_size * layer.num_kv_heads * 4
    raises: InvalidRequest
    """
    dtype, part = _dtype(dtype), _part(part)
    if not layers.scale_bytes(dtype):
        refuse(InvalidRequest, f"{dtype.value} pages hold no scales; only *_per_token_head do")
    heads = layer.num_kv_heads
    _inside(token, block_size, "token")
    _inside(head, heads, "head")
    start = block_size * heads * layers.scale_bytes(dtype) if part is Part.V else 0
    return start + (token * heads + head) * layers.scale_bytes(dtype)


def latent_offset(
    layer: LatentLayer, dtype: KVDtype, block_size: int, entry: int, index: int
) -> int:
    """PAGE-ADDR-3: Element d of a latent page's entry j sits after the E scales, entry-major; entry
    j holds tokens [j x ratio, (j + 1) x ratio) of the block.

        latent 4 + rope 2, fp8_per_token_head, ratio 2, B=4 -> E=2, scales 8 bytes
        entry 1, d=5:  8 + (1 x 6 + 5) x 1 = 19;   its scale at 1 x 4 = 4

    pre: block_size % layer.ratio == 0 and 0 <= entry < block_size // layer.ratio
    post: 0 <= __return__ < layers.page_bytes(layer, dtype, block_size)
    raises: InvalidRequest
    """
    dtype = _dtype(dtype)
    entries = block_size // layer.ratio
    width = layer.latent_size + layer.rope_size
    _inside(entry, entries, "entry")
    _inside(index, width, "element index")
    return (
        entries * layers.scale_bytes(dtype) + (entry * width + index) * layers.ELEMENT_BYTES[dtype]
    )


def latent_scale_offset(layer: LatentLayer, dtype: KVDtype, block_size: int, *, entry: int) -> int:
    """PAGE-ADDR-5: The fp32 scale of a latent page's entry j is the j-th fp32 of the page.

        E=2 entries, fp8_per_token_head:   entry 1 -> 1 x 4 = 4;   entries start at 8

    pre: block_size % layer.ratio == 0 and 0 <= entry < block_size // layer.ratio
    post: 0 <= __return__ < (block_size // layer.ratio) * 4
    raises: InvalidRequest
    """
    dtype = _dtype(dtype)
    if not layers.scale_bytes(dtype):
        refuse(InvalidRequest, f"{dtype.value} pages hold no scales; only *_per_token_head do")
    _inside(entry, block_size // layer.ratio, "entry")
    return entry * layers.scale_bytes(dtype)


def state_offset(layer: StateLayer, tensor: int, index: int) -> int:
    """PAGE-ADDR-4: Flat element i of state tensor k sits at the tensor's aligned start plus i
    elements.

        conv (3, 6144) bf16, ssm (16, 128, 128) fp32:   ssm element 5 -> 36864 + 5 x 4 = 36884

    pre: 0 <= tensor < len(layer.tensors)
    post: 0 <= __return__ < layers.page_bytes(layer, KVDtype.FP32, 1)
    raises: InvalidRequest
    """
    _inside(tensor, len(layer.tensors), "state tensor")
    chosen = layer.tensors[tensor]
    _inside(index, math.prod(chosen.shape), "flat element index")
    return layers.state_tensor_offsets(layer)[tensor] + index * layers.ELEMENT_BYTES[chosen.dtype]


def slot_address(
    block_table: tuple[int, ...], block_size: int, page_size: int, position: int
) -> tuple[int, int, int]:
    """PAGE-SLOT-1: Token position p of a request lives in block table entry p // B, at token offset
    p % B, and that block's page starts at byte block_id x P of the layer's tensor.

        B=16, P=66560, block table (7, 3):  p=20 -> entry 1, block 3, offset 4,
                                            page start 3 x 66560 = 199680

    Returns (block id, token offset in the block, byte where the page starts).

    pre: 0 <= position < len(block_table) * block_size
    post: __return__[2] == __return__[0] * page_size and 0 <= __return__[1] < block_size
    raises: InvalidRequest
    """
    _inside(position, len(block_table) * block_size, "position")
    block = block_table[position // block_size]
    return block, position % block_size, block * page_size
