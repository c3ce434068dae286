"""Pure torch references, built on kvcert.spec's page layout (§10): the kernels' oracle.

Every byte position comes from `kvcert.spec.page_layout` (PAGE-ADDR-1/2/3/5, PAGE-SLOT-1):
offset tables are computed once per layout by calling the spec for each (token, head,
element), then used to scatter and gather. Quantization is defined here (the spec says where
scales live, not how they are chosen):

    int8_per_token_head   scale = amax / 127 (1 when amax = 0); q = round half away from 0
                          of x / scale, clamped to +-127
    fp8_per_token_head    scale = amax / 448 (1 when amax = 0); q = e4m3fn(x / scale), round
                          to nearest even (torch's conversion)

amax is over one (token, head)'s elements of K (or of V), in fp32. These also run as the
kernels' fallback on a machine with neither a GPU nor the Triton interpreter.
"""

from __future__ import annotations

import functools
import math
from typing import cast

import torch

from kvcert.kernels.layout import PageLayout
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, LatentLayer
from kvcert.spec.page_layout import (
    Part,
    attention_offset,
    attention_scale_offset,
    latent_offset,
    latent_scale_offset,
    slot_address,
)

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@functools.lru_cache(maxsize=64)
def offsets(layout: PageLayout, part: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(element byte offsets [B, H, D], scale byte offsets [B, H] or None) from the spec."""
    dtype = KVDtype(layout.dtype)
    block, heads = layout.block_size, layout.heads
    quantized = layout.quantized
    if layout.head_v == 0:  # latent: entries of `head_k` elements, one scale each
        latent = LatentLayer(AttentionKind.FULL, layout.head_k, 0)
        data = [[[latent_offset(latent, dtype, block, entry=t, index=d)
                  for d in range(layout.head_k)]] for t in range(block)]  # fmt: skip
        if not quantized:
            return torch.tensor(data), None
        scales = [[latent_scale_offset(latent, dtype, block, entry=t)] for t in range(block)]
        return torch.tensor(data), torch.tensor(scales)
    layer = AttentionLayer(AttentionKind.FULL, heads, layout.head_k, layout.head_v)
    spec_part = Part.K if part == "k" else Part.V
    width = layout.head_k if part == "k" else layout.head_v
    data = [
        [[attention_offset(layer, dtype, block, token=t, head=h, part=spec_part, index=d)
          for d in range(width)] for h in range(heads)]
        for t in range(block)
    ]  # fmt: skip
    if not quantized:
        return torch.tensor(data), None
    scales = [[attention_scale_offset(layer, dtype, block, token=t, head=h, part=spec_part)
               for h in range(heads)] for t in range(block)]  # fmt: skip
    return torch.tensor(data), torch.tensor(scales)


def quantize(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes as uint8 [T, H, D], fp32 scales [T, H]) per (token, head)."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1)
    if dtype == "int8_per_token_head":
        scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        q = x / scale[..., None]
        r = torch.clamp(torch.floor(q.abs() + 0.5), max=127.0)
        codes = torch.where(q < 0, -r, r).to(torch.int8).view(torch.uint8)
    else:
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        codes = (x / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: str) -> torch.Tensor:
    """fp32 values from codes (uint8) and their per-(token, head) scales."""
    if dtype == "int8_per_token_head":
        values = codes.view(torch.int8).to(torch.float32)
    else:
        values = codes.view(torch.float8_e4m3fn).to(torch.float32)
    return values * scale[..., None]


def _element_bytes(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """[T, H, D, e] little-endian bytes of each element in the cache dtype."""
    stored = x.to(TORCH_DTYPES[dtype]).contiguous()
    return stored.view(torch.uint8).reshape(*x.shape, -1)


def write_region(x: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor,
                 layout: PageLayout, part: str) -> None:  # fmt: skip
    """Write x [T, H, D] into its slots' pages (slot -1 skipped), in place."""
    data, scale_at = offsets(layout, part)
    flat = pages.view(-1)
    keep = slots >= 0
    slots = slots[keep]
    x = x[keep]
    if not len(slots):
        return
    block = slots // layout.block_size
    token = slots % layout.block_size
    base = block * layout.page_size
    where = base[:, None, None] + data[token]  # [T, H, D] first byte of each element
    if layout.quantized:
        codes, scale = quantize(x, layout.dtype)
        flat[where.reshape(-1)] = codes.reshape(-1)
        scale_where = base[:, None] + cast(torch.Tensor, scale_at)[token]
        scale_bytes = scale.contiguous().view(torch.uint8).reshape(*scale.shape, 4)
        for i in range(4):
            flat[(scale_where + i).reshape(-1)] = scale_bytes[..., i].reshape(-1)
        return
    raw = _element_bytes(x, layout.dtype)
    for i in range(raw.shape[-1]):
        flat[(where + i).reshape(-1)] = raw[..., i].reshape(-1)


def read_region(pages: torch.Tensor, block: int, layout: PageLayout, part: str) -> torch.Tensor:
    """fp32 values [B, H, D] of one region of one page."""
    data, scale_at = offsets(layout, part)
    flat = pages.view(-1)
    base = block * layout.page_size
    if layout.quantized:
        codes = flat[base + data]
        scale_at = cast(torch.Tensor, scale_at)  # quantized layouts have scales
        scale_bytes = torch.stack([flat[base + scale_at + i] for i in range(4)], dim=-1)
        scale = scale_bytes.contiguous().view(torch.float32).squeeze(-1)
        return dequantize(codes, scale, layout.dtype)
    width = layout.element
    raw = torch.stack([flat[base + data + i] for i in range(width)], dim=-1).contiguous()
    return raw.view(TORCH_DTYPES[layout.dtype]).squeeze(-1).to(torch.float32)


def window_rows(pages: torch.Tensor, table: tuple[int, ...], length: int, layout: PageLayout,
                window: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(K [N, H, Dk], V [N, H, Dv]) of the tokens one request's decode reads: its last
    `window` tokens (all when 0), each found through the table (PAGE-SLOT-1)."""
    start = max(0, length - window) if window else 0
    regions: dict[tuple[int, str], torch.Tensor] = {}  # each block's regions read once

    def region(block: int, part: str) -> torch.Tensor:
        if (block, part) not in regions:
            regions[block, part] = read_region(pages, block, layout, part)
        return regions[block, part]

    keys, values = [], []
    for position in range(start, length):
        block, offset, _ = slot_address(table, layout.block_size, layout.page_size, position)
        keys.append(region(block, "k")[offset])
        values.append(region(block, "v")[offset])
    return torch.stack(keys), torch.stack(values)


def decode(q: torch.Tensor, pages: torch.Tensor, block_tables: torch.Tensor,
           seq_lens: torch.Tensor, layout: PageLayout, *, window: int,
           sm_scale: float) -> torch.Tensor:  # fmt: skip
    """Attention of one query token per request over its cached window, in fp32."""
    requests, query_heads, _ = q.shape
    group = query_heads // layout.heads
    out = torch.zeros(requests, query_heads, layout.head_v, dtype=torch.float32)
    for r in range(requests):
        table = tuple(int(b) for b in block_tables[r])
        k, v = window_rows(pages, table, int(seq_lens[r]), layout, window)
        for h in range(query_heads):
            kv = h // group
            scores = (k[:, kv, :] @ q[r, h].to(torch.float32)) * sm_scale
            weights = torch.softmax(scores, dim=0)
            out[r, h] = weights @ v[:, kv, :]
    return out


def copy_pages(pages: torch.Tensor, pairs: torch.Tensor) -> None:
    """Each (src, dst): page dst becomes a copy of page src (sources read first)."""
    sources = [pages[int(s)].clone() for s, _ in pairs]
    for (_, dst), data in zip(pairs, sources, strict=True):
        pages[int(dst)] = data


def slots(block_tables: torch.Tensor, requests: torch.Tensor, positions: torch.Tensor,
          block_size: int) -> torch.Tensor:  # fmt: skip
    """PAGE-SLOT-1 per token (the spec's slot_address); -1 for padding positions."""
    out = []
    for request, position in zip(requests.tolist(), positions.tolist(), strict=True):
        if position < 0:
            out.append(-1)
            continue
        table = tuple(int(b) for b in block_tables[request])
        block, offset, _ = slot_address(table, block_size, 1, position)
        out.append(block * block_size + offset)
    return torch.tensor(out, dtype=torch.int64)


def softmax_scale(head_k: int) -> float:
    """The usual 1 / sqrt(head size)."""
    return 1.0 / math.sqrt(head_k)
