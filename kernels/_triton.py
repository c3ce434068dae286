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
    is skipped. Grid: (token tiles, heads). Each token's row is addressed through a pointer
    of the stored element type (so rows move in wide, aligned words); shapes are run-time
    arguments (one compilation per tile size and element kind). Divisions are IEEE
    round-to-nearest, as torch's, so scales and codes match the oracle bit for bit."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(slots_ptr + t, mask=t_ok, other=-1)
    valid = t_ok & (slot >= 0)
    slot = tl.where(valid, slot, 0)
    offset = slot % block_size
    row = pages_ptr + (slot // block_size) * page_size  # each token's page
    mask = valid[:, None] & (d < DIM)[None, :]
    src = t.to(tl.int64)[:, None] * src_stride_t + h * src_stride_h + d[None, :]
    element = (offset[:, None] * HEADS + h) * DIM + d[None, :]
    if OUT_KIND <= 2:  # unquantized: the input's own elements (their dtype is the cache's)
        x = tl.load(src_ptr + src, mask=mask, other=0)
        typed = (row + data_offset).to(tl.pointer_type(src_ptr.dtype.element_ty))
        tl.store(typed[:, None] + element, x, mask=mask)
    else:
        x = _load_f32(src_ptr, src, mask, IN_KIND)
        amax = tl.max(tl.abs(x), axis=1)
        if OUT_KIND == 3:
            scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
            q = tl.math.div_rn(x, scale[:, None])
            r = tl.floor(tl.abs(q) + 0.5)
            r = tl.minimum(r, 127.0)
            code = tl.where(q < 0, -r, r).to(tl.int8)
            typed = (row + data_offset).to(tl.pointer_type(tl.int8))
            tl.store(typed[:, None] + element, code, mask=mask)
        else:
            scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
            code8 = _fp8_encode(tl.math.div_rn(x, scale[:, None]))
            tl.store((row + data_offset)[:, None] + element, code8, mask=mask)
        scales = (row + scale_offset).to(tl.pointer_type(tl.float32))
        tl.store(scales + offset * HEADS + h, scale, mask=valid)


@triton.jit
def _load_rows(pages_ptr, page, scale_offset, data_offset, offset, head, d, valid, HEADS, DIM,
               KIND: tl.constexpr):  # fmt: skip
    """A [tokens, DIM] tile of one head, token i (where `valid`) at byte `page[i]` and slot
    `offset[i]` of its block, dequantized to fp32 (rows read through pointers of the stored
    element type)."""
    element = (offset[:, None] * HEADS + head) * DIM + d[None, :]
    mask = valid[:, None] & (d < DIM)[None, :]
    base = pages_ptr + page + data_offset
    if KIND == 0:
        typed = base.to(tl.pointer_type(tl.float32))
        return tl.load(typed[:, None] + element, mask=mask, other=0.0)
    elif KIND == 1:
        typed = base.to(tl.pointer_type(tl.float16))
        return tl.load(typed[:, None] + element, mask=mask, other=0.0).to(tl.float32)
    elif KIND == 2:
        typed = base.to(tl.pointer_type(tl.int16))
        bits = tl.load(typed[:, None] + element, mask=mask, other=0)
        return ((bits.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        scales = (pages_ptr + page + scale_offset).to(tl.pointer_type(tl.float32))
        scale = tl.load(scales + offset * HEADS + head, mask=valid, other=0.0)
        if KIND == 3:
            typed = base.to(tl.pointer_type(tl.int8))
            value = tl.load(typed[:, None] + element, mask=mask, other=0).to(tl.float32)
        else:
            value = _fp8_decode(tl.load(base[:, None] + element, mask=mask, other=0))
        return value * scale[:, None]


@triton.jit
def decode_kernel(
    q_ptr,
    pages_ptr,
    tables_ptr,
    lens_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    q_stride_b,
    q_stride_h,
    table_stride,
    page_size,
    block_size,
    window,
    split_tokens,
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
    """One (request, KV head, split of its window): online softmax over the split's tokens,
    BLOCK_N at a time whatever the block size (each token finds its block through the table),
    the GQA group's queries as one fp32 matrix product (no TF32). Writes the split's running
    max, sum and weighted values; combine_kernel merges the splits (flash-decoding), so long
    windows keep the whole GPU busy."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    g = tl.arange(0, BLOCK_G)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    n = tl.arange(0, BLOCK_N)
    seq_len = tl.load(lens_ptr + b)
    start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    first = start + split * split_tokens
    end = tl.minimum(seq_len, first + split_tokens)
    q_heads = head * GROUP + g
    q_mask = (g < GROUP)[:, None] & (dk < DK)[None, :]
    q_at = b * q_stride_b + q_heads[:, None] * q_stride_h + dk[None, :]
    q = _load_f32(q_ptr, q_at, q_mask, Q_KIND)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    for chunk in range(first, end, BLOCK_N):
        position = chunk + n
        valid = position < end
        block = tl.load(tables_ptr + b * table_stride + position // block_size, mask=valid,
                        other=0)  # fmt: skip
        page = block.to(tl.int64) * page_size
        offset = position % block_size
        k = _load_rows(pages_ptr, page, k_scale_offset, k_offset, offset, head, dk, valid,
                       HEADS, DK, KIND)  # fmt: skip
        v = _load_rows(pages_ptr, page, v_scale_offset, v_offset, offset, head, dv, valid,
                       HEADS, DV, KIND)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision="tf32x3") * sm_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32x3")
        m_i = m_new
    rows = (b * HEADS * GROUP + q_heads) * splits + split  # [requests, query heads, splits]
    g_ok = g < GROUP
    tl.store(part_m_ptr + rows, m_i, mask=g_ok)
    tl.store(part_l_ptr + rows, l_i, mask=g_ok)
    tl.store(part_acc_ptr + rows[:, None] * BLOCK_DV + dv[None, :], acc,
             mask=g_ok[:, None] & (dv < DV)[None, :])  # fmt: skip


@triton.jit
def combine_kernel(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, out_stride_b, out_stride_h,
                   query_heads, splits, DV, BLOCK_S: tl.constexpr,
                   BLOCK_DV: tl.constexpr):  # fmt: skip
    """One (request, query head): its splits' partial softmaxes merged into the output. A
    split that read nothing has max -inf and weight 0."""
    b = tl.program_id(0)
    qh = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    rows = (b * query_heads + qh) * splits + s
    s_ok = s < splits
    m = tl.load(part_m_ptr + rows, mask=s_ok, other=float("-inf"))
    l_s = tl.load(part_l_ptr + rows, mask=s_ok, other=0.0)
    acc = tl.load(part_acc_ptr + rows[:, None] * BLOCK_DV + dv[None, :],
                  mask=s_ok[:, None] & (dv < DV)[None, :], other=0.0)  # fmt: skip
    top = tl.max(m, axis=0)
    weight = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    total = tl.sum(l_s * weight, axis=0)
    out = tl.sum(acc * weight[:, None], axis=0) / total
    tl.store(out_ptr + b * out_stride_b + qh * out_stride_h + dv, out, mask=dv < DV)


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
