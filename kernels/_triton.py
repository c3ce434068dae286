# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def,no-any-return"
"""The Triton kernels. Imported only when a GPU or the interpreter (TRITON_INTERPRET=1) is there.

Portability rules from the interpreter (toolchain notes §2): bf16 is moved as raw 16-bit
integers and widened by a shift, never computed on; arithmetic is fp32; no libdevice; every
load and store is masked (the interpreter does not fault on stray reads). fp8 e4m3 is encoded
and decoded with integer arithmetic (round to nearest even, subnormals kept), because the
interpreter's own conversion flushes subnormals where GPUs do not.
"""

from __future__ import annotations

import triton
import triton.language as tl

# input / cache element kinds
FP32, FP16, BF16, INT8_PTH, FP8_PTH = 0, 1, 2, 3, 4


@triton.jit
def _load_f32(ptr, offsets, mask, KIND: tl.constexpr):
    """Elements of an input tensor widened to fp32 (bf16 through its bits)."""
    if KIND == 2:
        bits = tl.load(ptr.to(tl.pointer_type(tl.int16)) + offsets, mask=mask, other=0)
        wide = (bits.to(tl.int32) & 0xFFFF) << 16
        return wide.to(tl.float32, bitcast=True)
    elif KIND == 1:
        return tl.load(ptr.to(tl.pointer_type(tl.float16)) + offsets, mask=mask, other=0.0).to(
            tl.float32
        )
    else:
        return tl.load(ptr.to(tl.pointer_type(tl.float32)) + offsets, mask=mask, other=0.0)


@triton.jit
def _fp8_encode(y):
    """fp32 (|y| <= 448) -> e4m3fn byte, round to nearest even, subnormals kept."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    exponent = a >> 23
    # normal range of e4m3 (|y| >= 2^-6): keep 3 mantissa bits, round to nearest even
    kept = a >> 20
    round_bit = (a >> 19) & 1
    sticky = (a & 0x7FFFF) != 0
    up = (round_bit == 1) & (sticky | ((kept & 1) == 1))
    normal = kept + up.to(tl.int32) - ((127 - 7) << 3)
    normal = tl.minimum(normal, 126)
    # subnormal range: value = m x 2^-9, m = round_half_even(|y| x 512) in 0..8
    scaled = a.to(tl.float32, bitcast=True) * 512.0
    floor = tl.floor(scaled)
    diff = scaled - floor
    odd = (floor.to(tl.int32) & 1) == 1
    sub = floor.to(tl.int32) + ((diff > 0.5) | ((diff == 0.5) & odd)).to(tl.int32)
    code = tl.where(exponent >= 121, normal, sub)
    return (code | sign).to(tl.uint8)


@triton.jit
def _fp8_decode(byte):
    """e4m3fn byte -> fp32."""
    b = byte.to(tl.int32) & 0xFF
    exponent = (b >> 3) & 0xF
    mantissa = b & 7
    normal = ((exponent + 120) << 23) | (mantissa << 20)
    value = tl.where(
        exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True)
    )
    return tl.where((b & 0x80) != 0, -value, value)


@triton.jit
def write_kernel(
    src_ptr,
    pages_ptr,
    slots_ptr,
    num_tokens,
    src_stride_t,
    src_stride_h,
    page_size,
    block_size,
    scale_offset,
    data_offset,
    HEADS,
    DIM,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IN_KIND: tl.constexpr,
    OUT_KIND: tl.constexpr,
):
    """One head of one region (K, V or a latent) for BLOCK_T tokens into their slots; slot -1
    is skipped. Grid: (token tiles, heads), so a tile is [BLOCK_T, DIM] at any head count.
    Shapes are run-time arguments (one compilation per tile size and element kind)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(slots_ptr + t, mask=t_ok, other=-1)
    valid = t_ok & (slot >= 0)
    slot = tl.where(valid, slot, 0)
    offset = slot % block_size
    page = (slot // block_size) * page_size
    mask = valid[:, None] & (d < DIM)[None, :]
    src = t.to(tl.int64)[:, None] * src_stride_t + h * src_stride_h + d[None, :]
    element = (offset[:, None] * HEADS + h) * DIM + d[None, :]
    if OUT_KIND <= 2:  # unquantized: move the element's bits
        if OUT_KIND == 0:
            bits32 = tl.load(src_ptr.to(tl.pointer_type(tl.int32)) + src, mask=mask, other=0)
            target = pages_ptr + page[:, None] + data_offset + element * 4
            tl.store(target.to(tl.pointer_type(tl.int32)), bits32, mask=mask)
        else:
            bits16 = tl.load(src_ptr.to(tl.pointer_type(tl.int16)) + src, mask=mask, other=0)
            target = pages_ptr + page[:, None] + data_offset + element * 2
            tl.store(target.to(tl.pointer_type(tl.int16)), bits16, mask=mask)
    else:
        x = _load_f32(src_ptr, src, mask, IN_KIND)
        amax = tl.max(tl.abs(x), axis=1)
        if OUT_KIND == 3:
            scale = tl.where(amax > 0, amax / 127.0, 1.0)
            q = x / scale[:, None]
            r = tl.floor(tl.abs(q) + 0.5)
            r = tl.minimum(r, 127.0)
            code = tl.where(q < 0, -r, r).to(tl.int8)
            target = pages_ptr + page[:, None] + data_offset + element
            tl.store(target.to(tl.pointer_type(tl.int8)), code, mask=mask)
        else:
            scale = tl.where(amax > 0, amax / 448.0, 1.0)
            code8 = _fp8_encode(x / scale[:, None])
            target = pages_ptr + page[:, None] + data_offset + element
            tl.store(target, code8, mask=mask)
        where = pages_ptr + page + scale_offset + (offset * HEADS + h) * 4
        tl.store(where.to(tl.pointer_type(tl.float32)), scale, mask=valid)


@triton.jit
def _load_rows(pages_ptr, page, scale_offset, data_offset, offset, head, d, mask, HEADS, DIM,
               KIND: tl.constexpr):  # fmt: skip
    """A [tokens, DIM] tile of one head, token i at byte `page[i]` and slot `offset[i]` of
    its block, dequantized to fp32."""
    element = (offset[:, None] * HEADS + head) * DIM + d[None, :]
    base = pages_ptr + page[:, None] + data_offset
    if KIND == 0:
        return tl.load((base + element * 4).to(tl.pointer_type(tl.float32)), mask=mask, other=0.0)
    elif KIND == 1:
        where = (base + element * 2).to(tl.pointer_type(tl.float16))
        return tl.load(where, mask=mask, other=0.0).to(tl.float32)
    elif KIND == 2:
        bits = tl.load((base + element * 2).to(tl.pointer_type(tl.int16)), mask=mask, other=0)
        return ((bits.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        row = tl.max(mask.to(tl.int32), axis=1) > 0
        at = (pages_ptr + page + scale_offset + (offset * HEADS + head) * 4).to(
            tl.pointer_type(tl.float32)
        )
        scale = tl.load(at, mask=row, other=0.0)
        if KIND == 3:
            value = tl.load((base + element).to(tl.pointer_type(tl.int8)), mask=mask, other=0)
            value = value.to(tl.float32)
        else:
            value = _fp8_decode(tl.load(base + element, mask=mask, other=0))
        return value * scale[:, None]


@triton.jit
def decode_kernel(
    q_ptr,
    pages_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    q_stride_b,
    q_stride_h,
    out_stride_b,
    out_stride_h,
    table_stride,
    page_size,
    block_size,
    window,
    sm_scale,
    k_scale_offset,
    v_scale_offset,
    k_offset,
    v_offset,
    GROUP,
    HEADS,
    DK,
    DV,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    Q_KIND: tl.constexpr,
    KIND: tl.constexpr,
):
    """One (request, KV head): online softmax over the tokens of its window, BLOCK_N tokens
    at a time whatever the block size (each token finds its block through the table), the
    GQA group's queries as one matrix (fp32 products, no TF32)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    n = tl.arange(0, BLOCK_N)
    seq_len = tl.load(lens_ptr + b)
    start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    q_heads = head * GROUP + g
    q_mask = (g < GROUP)[:, None] & (dk < DK)[None, :]
    q_at = b * q_stride_b + q_heads[:, None] * q_stride_h + dk[None, :]
    q = _load_f32(q_ptr, q_at, q_mask, Q_KIND)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    for first in range(start, seq_len, BLOCK_N):
        position = first + n
        valid = position < seq_len
        block = tl.load(tables_ptr + b * table_stride + position // block_size, mask=valid,
                        other=0)  # fmt: skip
        page = block.to(tl.int64) * page_size
        offset = position % block_size
        k = _load_rows(pages_ptr, page, k_scale_offset, k_offset, offset, head, dk,
                       valid[:, None] & (dk < DK)[None, :], HEADS, DK, KIND)  # fmt: skip
        v = _load_rows(pages_ptr, page, v_scale_offset, v_offset, offset, head, dv,
                       valid[:, None] & (dv < DV)[None, :], HEADS, DV, KIND)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    o_mask = (g < GROUP)[:, None] & (dv < DV)[None, :]
    tl.store(out_ptr + b * out_stride_b + q_heads[:, None] * out_stride_h + dv[None, :], out,
             mask=o_mask)  # fmt: skip


@triton.jit
def copy_kernel(pages_ptr, pairs_ptr, page_words, BLOCK: tl.constexpr, WORD: tl.constexpr):
    """Page src -> page dst for one (src, dst) pair and BLOCK words of WORD bytes (the
    largest of 8, 4, 2, 1 dividing the page: a page moves in its widest aligned words)."""
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    if WORD == 8:
        words = pages_ptr.to(tl.pointer_type(tl.int64))
    elif WORD == 4:
        words = pages_ptr.to(tl.pointer_type(tl.int32))
    elif WORD == 2:
        words = pages_ptr.to(tl.pointer_type(tl.int16))
    else:
        words = pages_ptr
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < page_words
    data = tl.load(words + src * page_words + offsets, mask=mask, other=0)
    tl.store(words + dst * page_words + offsets, data, mask=mask)


@triton.jit
def slot_kernel(tables_ptr, requests_ptr, positions_ptr, out_ptr, num_tokens, table_stride,
                block_size, BLOCK_T: tl.constexpr):  # fmt: skip
    """PAGE-SLOT-1 for BLOCK_T tokens: block_table[p // B] x B + p % B, or -1 for padding."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < num_tokens
    position = tl.load(positions_ptr + t, mask=t_ok, other=-1)
    request = tl.load(requests_ptr + t, mask=t_ok, other=0)
    real = t_ok & (position >= 0)
    safe = tl.where(real, position, 0)
    block = tl.load(tables_ptr + request * table_stride + safe // block_size, mask=real, other=0)
    slot = tl.where(real, block.to(tl.int64) * block_size + safe % block_size, -1)
    tl.store(out_ptr + t, slot, mask=t_ok)
