"""The Triton kernels against the spec-built torch reference, under the Triton interpreter.

Writes and copies must be byte-exact (untouched bytes included); attention outputs must agree
within twice `kvcert.kernels.accuracy`'s fp32 error bound per element (fp32 arithmetic in both,
different summation orders).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcert.kernels import (
    KernelInputError,
    accuracy,
    attention_layout,
    copy_blocks,
    latent_layout,
    paged_decode,
    reference,
    slot_mapping,
    use_triton,
    write_kv,
    write_latent,
)
from kvcert.kernels.layout import ELEMENT
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, LatentLayer, page_bytes
from tests.tiers import tiered

DTYPES = sorted(ELEMENT)
PTH = "int8_per_token_head"
FAST = settings(
    max_examples=tiered(50, 400), deadline=None, suppress_health_check=list(HealthCheck)
)


def test_the_kernels_really_run_under_the_interpreter():
    assert use_triton(), "TRITON_INTERPRET=1 must be set before triton is imported"


def input_dtype(cache: str, draw_choice: str) -> torch.dtype:
    return reference.TORCH_DTYPES.get(cache) or reference.TORCH_DTYPES[draw_choice]


def assert_within_fp32_bound(got, want, query, pages, tables, lengths, layout, window):
    scale = reference.softmax_scale(layout.head_k)
    bound = accuracy.decode_error_bound(query, pages, tables, lengths, layout, window=window,
                                        sm_scale=scale)  # fmt: skip
    mismatch = accuracy.decode_mismatch(got, want, bound)
    assert not mismatch, mismatch


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normals over six decades, some all-zero rows (scale 1), in the given dtype."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    x = x * torch.pow(10.0, torch.empty((*shape[:-1], 1)).uniform_(-3, 3, generator=generator))
    x[torch.rand(shape[:-1], generator=generator) < 0.1] = 0.0
    return x.to(dtype)


@st.composite
def attention_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    block, heads = draw(st.sampled_from([1, 2, 4, 16])), draw(st.integers(1, 3))
    head_k, head_v = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    data = attention_layout(block, heads, head_k, head_v, dtype, page_size=1 << 30).data_bytes
    padding = draw(st.sampled_from([0, 4, 64]))
    page = -(-(data + padding) // 4) * 4
    layout = attention_layout(block, heads, head_k, head_v, dtype, page_size=page)
    blocks = draw(st.integers(2, 5))
    tokens = draw(st.integers(1, 12))
    free = list(range(block, blocks * block))
    chosen = draw(st.lists(st.sampled_from(free), min_size=1, max_size=min(tokens, len(free)),
                           unique=True))  # fmt: skip
    slots = chosen + [-1] * (tokens - len(chosen))
    order = draw(st.permutations(slots))
    src = input_dtype(dtype, draw(st.sampled_from(["fp32", "fp16", "bf16"])))
    return layout, blocks, torch.tensor(order, dtype=torch.int64), src, draw(st.integers(0, 99))


@FAST
@given(attention_cases())
def test_write_kv_is_byte_exact(case):
    layout, blocks, slots, src, seed = case
    tokens = len(slots)
    key = values((tokens, layout.heads, layout.head_k), src, seed)
    value = values((tokens, layout.heads, layout.head_v), src, seed + 1)
    pages = torch.randint(0, 256, (blocks, layout.page_size), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
    expected = pages.clone()
    write_kv(key, value, pages, slots, layout)
    reference.write_region(key, expected, slots, layout, "k")
    reference.write_region(value, expected, slots, layout, "v")
    assert torch.equal(pages, expected)
    assert torch.equal(pages[0], expected[0])  # the null block is untouched


def test_quantization_error_is_within_half_a_step():
    x = values((64, 2, 16), torch.float32, 7)
    for dtype, relative in (("int8_per_token_head", 0.5 / 127), ("fp8_per_token_head", 1 / 16)):
        codes, scale = reference.quantize(x, dtype)
        error = (reference.dequantize(codes, scale, dtype) - x).abs()
        amax = x.abs().amax(dim=-1, keepdim=True)
        assert bool((error <= amax * relative + 1e-12).all()), dtype


@FAST
@given(st.sampled_from(DTYPES), st.integers(1, 3), st.integers(1, 40), st.integers(0, 99))
def test_write_latent_is_byte_exact(dtype, block_pow, width, seed):
    block = 1 << block_pow
    data = latent_layout(block, width, dtype, page_size=1 << 30).data_bytes
    layout = latent_layout(block, width, dtype, page_size=-(-data // 4) * 4 + 8)
    pages = torch.zeros(3, layout.page_size, dtype=torch.uint8)
    expected = pages.clone()
    src = reference.TORCH_DTYPES.get(dtype, torch.float32)
    latent = values((block, 1, width), src, seed)[:, 0, :]
    slots = torch.arange(block, 2 * block, dtype=torch.int64)
    slots[0] = -1
    write_latent(latent, pages, slots, layout)
    reference.write_region(latent[:, None, :], expected, slots, layout, "k")
    assert torch.equal(pages, expected)


@st.composite
def decode_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    block = draw(st.sampled_from([1, 2, 4, 8]))
    heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    head_k, head_v = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    data = attention_layout(block, heads, head_k, head_v, dtype, page_size=1 << 30).data_bytes
    layout = attention_layout(block, heads, head_k, head_v, dtype, page_size=-(-data // 4) * 4 + 4)
    requests = draw(st.integers(1, 3))
    lengths = [draw(st.integers(1, 24)) for _ in range(requests)]
    window = draw(st.sampled_from([0, 0, 1, 3, 9]))
    width = max(-(-n // block) for n in lengths)
    blocks = 1 + requests * width
    tables = torch.zeros(requests, width, dtype=torch.int32)
    for r, n in enumerate(lengths):
        first = max(0, n - window) // block if window else 0
        for j in range(first, -(-n // block)):
            tables[r, j] = 1 + r * width + j  # blocks before the window stay null (0)
    src = input_dtype(dtype, draw(st.sampled_from(["fp32", "fp16", "bf16"])))
    return layout, blocks, tables, torch.tensor(lengths, dtype=torch.int32), window, group, src


@FAST
@given(decode_cases(), st.integers(0, 99))
def test_paged_decode_matches_the_reference(case, seed):
    layout, blocks, tables, lengths, window, group, src = case
    pages = torch.full((blocks, layout.page_size), 0xFF, dtype=torch.uint8)  # NaN if read
    slots = torch.arange(layout.block_size, blocks * layout.block_size, dtype=torch.int64)
    tokens = len(slots)
    write_kv(values((tokens, layout.heads, layout.head_k), src, seed),
             values((tokens, layout.heads, layout.head_v), src, seed + 1), pages, slots,
             layout)  # fmt: skip
    pages[0] = 0xFF  # the null block: reading it would poison the output with NaN
    query = values((len(lengths), layout.heads * group, layout.head_k), src, seed + 2)
    got = paged_decode(query, pages, tables, lengths, layout, window=window)
    want = reference.decode(query, pages, tables, lengths, layout, window=window,
                            sm_scale=reference.softmax_scale(layout.head_k))  # fmt: skip
    assert bool(torch.isfinite(got).all()), "a null or out-of-window block was read"
    assert_within_fp32_bound(got, want, query, pages, tables, lengths, layout, window)


@FAST
@given(st.integers(2, 6), st.integers(1, 300), st.integers(0, 99), st.data())
def test_copy_blocks_is_byte_exact(blocks, page, seed, data):
    pages = torch.randint(0, 256, (blocks, page), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
    ids = list(range(1, blocks))
    sources = data.draw(st.lists(st.sampled_from(ids), max_size=len(ids)))
    targets = [i for i in ids if i not in sources]
    count = min(len(sources), len(targets))
    pairs = torch.tensor(list(zip(sources[:count], targets[:count], strict=True)) or [],
                         dtype=torch.int64).reshape(-1, 2)  # fmt: skip
    expected = pages.clone()
    copy_blocks(pages, pairs)
    reference.copy_pages(expected, pairs)
    assert torch.equal(pages, expected)


@FAST
@given(st.integers(1, 3), st.integers(1, 5), st.sampled_from([1, 2, 16]), st.data())
def test_slot_mapping_matches_the_spec(requests, width, block, data):
    tables = torch.tensor(
        [[data.draw(st.integers(1, 50)) for _ in range(width)] for _ in range(requests)],
        dtype=torch.int32,
    )
    tokens = data.draw(st.integers(1, 20))
    ids = [data.draw(st.integers(0, requests - 1)) for _ in range(tokens)]
    positions = [data.draw(st.integers(-1, width * block - 1)) for _ in range(tokens)]
    ids_t, positions_t = torch.tensor(ids), torch.tensor(positions)
    got = slot_mapping(tables, ids_t, positions_t, block)
    assert torch.equal(got, reference.slots(tables, ids_t, positions_t, block))


# --- adversarial inputs: refused, never a silent read or write --------------------------------


def small_layout(dtype="fp16"):
    return attention_layout(4, 2, 8, 8, dtype, page_size=1024)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: write_kv(torch.zeros(1, 2, 8, dtype=torch.float16),
                          torch.zeros(1, 2, 8, dtype=torch.float16),
                          torch.zeros(3, 1024, dtype=torch.uint8), torch.tensor([2]),
                          small_layout()), "null block"),
        (lambda: write_kv(torch.zeros(2, 2, 8, dtype=torch.float16),
                          torch.zeros(2, 2, 8, dtype=torch.float16),
                          torch.zeros(3, 1024, dtype=torch.uint8), torch.tensor([5, 5]),
                          small_layout()), "same slot"),
        (lambda: write_kv(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8),
                          torch.zeros(3, 1024, dtype=torch.uint8), torch.tensor([5]),
                          small_layout()), "convert it first"),
        (lambda: write_kv(torch.zeros(1, 2, 8, dtype=torch.float16),
                          torch.zeros(1, 2, 8, dtype=torch.float16),
                          torch.zeros(3, 1000, dtype=torch.uint8), torch.tensor([5]),
                          small_layout()), "bytes per page"),
        (lambda: paged_decode(torch.zeros(1, 2, 8, dtype=torch.float16),
                              torch.zeros(3, 1024, dtype=torch.uint8),
                              torch.tensor([[1]], dtype=torch.int32),
                              torch.tensor([9], dtype=torch.int32), small_layout()),
         "its table has 1"),
        (lambda: paged_decode(torch.zeros(1, 2, 8, dtype=torch.float16),
                              torch.zeros(3, 1024, dtype=torch.uint8),
                              torch.tensor([[0, 1]], dtype=torch.int32),
                              torch.tensor([6], dtype=torch.int32), small_layout()),
         "null or past the pool"),
        (lambda: copy_blocks(torch.zeros(3, 8, dtype=torch.uint8), torch.tensor([[0, 1]])),
         "null block"),
        (lambda: copy_blocks(torch.zeros(4, 8, dtype=torch.uint8),
                             torch.tensor([[1, 2], [2, 3]])), "both a source"),
        (lambda: slot_mapping(torch.tensor([[1]], dtype=torch.int32), torch.tensor([0]),
                              torch.tensor([4]), 4), "table is too short"),
        (lambda: slot_mapping(torch.tensor([[0]], dtype=torch.int32), torch.tensor([0]),
                              torch.tensor([1]), 4), "null block"),
        (lambda: attention_layout(4, 2, 8, 8, PTH, page_size=100), "smaller than"),
        (lambda: attention_layout(4, 1, 1, 1, PTH, page_size=42), "multiple of 4"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_with_what_to_fix(call, message):
    with pytest.raises(KernelInputError, match=message):
        call()


def test_padding_tokens_write_nothing():
    layout = small_layout("int8_per_token_head")
    pages = torch.randint(0, 256, (3, 1024), dtype=torch.uint8)
    before = pages.clone()
    write_kv(torch.ones(2, 2, 8), torch.ones(2, 2, 8), pages, torch.tensor([-1, -1]), layout)
    assert torch.equal(pages, before)


# --- the layout the kernels compute equals the spec's ----------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_layout_offsets_equal_the_spec(dtype):
    from kvcert.spec.page_layout import Part, attention_offset

    layout = attention_layout(16, 8, 256, 128, dtype, page_size=1 << 20)
    spec_layer = AttentionLayer(AttentionKind.FULL, 8, 256, 128)
    spec_dtype = KVDtype(dtype)
    assert layout.data_bytes == page_bytes(spec_layer, spec_dtype, 16)
    for part, start in ((Part.K, layout.k_data), (Part.V, layout.v_data)):
        assert start == attention_offset(spec_layer, spec_dtype, 16, token=0, head=0, part=part,
                                         index=0)  # fmt: skip
    latent = latent_layout(16, 576, dtype, page_size=1 << 20)
    assert latent.data_bytes == page_bytes(LatentLayer(AttentionKind.FULL, 512, 64), spec_dtype, 16)


def test_the_fallback_gives_the_same_bytes(monkeypatch):
    layout = attention_layout(4, 2, 8, 4, "fp8_per_token_head", page_size=256)
    key, value = values((5, 2, 8), torch.float32, 1), values((5, 2, 4), torch.float32, 2)
    slots = torch.tensor([4, 9, -1, 15, 6])
    pages = torch.zeros(5, 256, dtype=torch.uint8)
    write_kv(key, value, pages, slots, layout)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not use_triton()
    fallback = torch.zeros(5, 256, dtype=torch.uint8)
    write_kv(key, value, fallback, slots, layout)
    assert torch.equal(pages, fallback)


def test_fp8_rounding_ties_go_to_even_in_both_ranges():
    """Random data rarely lands on ties; these rows do (amax 448 makes the scale exactly 1)."""
    step = 2.0**-9  # e4m3 subnormal spacing
    ties = [0.5 * step, 1.5 * step, 2.5 * step, 7.5 * step, 1.0625, 1.1875, -2.5 * step, 300.0]
    row = torch.tensor([448.0, *ties])
    layout = attention_layout(1, 1, len(row), 1, "fp8_per_token_head", page_size=64)
    pages = torch.zeros(2, 64, dtype=torch.uint8)
    expected = pages.clone()
    key, value = row[None, None, :], torch.ones(1, 1, 1)
    write_kv(key, value, pages, torch.tensor([1]), layout)
    reference.write_region(key, expected, torch.tensor([1]), layout, "k")
    reference.write_region(value, expected, torch.tensor([1]), layout, "v")
    assert torch.equal(pages, expected)


def test_traffic_against_the_minimum():
    from kvcert.kernels import traffic

    sliding = attention_layout(16, 8, 256, 256, "int8_per_token_head", page_size=66560)
    doubled = attention_layout(32, 2, 512, 512, "int8_per_token_head", page_size=66560)
    padded = attention_layout(16, 2, 512, 512, "int8_per_token_head", page_size=66560)  # vLLM 0.26
    write = traffic.write_kv(256, 16, sliding, 2)
    assert 1.0 <= write.ratio < 1.01  # only the slot mapping is overhead
    decode = traffic.paged_decode([4000] * 4, sliding, 16, 2, window=1024)
    assert 1.0 <= decode.ratio < 1.01  # only block-table entries are overhead
    assert traffic.copy_blocks(8, doubled).ratio < 1.01  # 512 padding bytes per page
    assert traffic.copy_blocks(8, padded).ratio > 1.99  # half of each page is padding
    assert traffic.slot_mapping(100).ratio == 1.0


@pytest.mark.parametrize("dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_gemma4_padded_pages_of_seed_002(dtype):
    """The planned Gemma 4 26B-A4B pages: sliding 16 x 8 x 256 fills the 66,560-byte page;
    global 32 x 2 x 512 (block doubled by PAGE-FIT-1) leaves 512 bytes of padding."""
    for block, heads, head, window in ((16, 8, 256, 24), (32, 2, 512, 0)):
        layout = attention_layout(block, heads, head, head, dtype, page_size=66560)
        pages = torch.full((4, 66560), 0xFF, dtype=torch.uint8)
        slots = torch.arange(block, 3 * block, dtype=torch.int64)
        key = values((len(slots), heads, head), torch.bfloat16, block)
        value = values((len(slots), heads, head), torch.bfloat16, block + 1)
        expected = pages.clone()
        write_kv(key, value, pages, slots, layout)
        reference.write_region(key, expected, slots, layout, "k")
        reference.write_region(value, expected, slots, layout, "v")
        assert torch.equal(pages, expected)
        assert bool((pages[1:3, layout.data_bytes :] == 0xFF).all())  # padding untouched
        query = values((1, heads * 2, head), torch.bfloat16, 3)
        tables = torch.tensor([[1, 2]], dtype=torch.int32)
        lengths = torch.tensor([2 * block - 3], dtype=torch.int32)
        got = paged_decode(query, pages, tables, lengths, layout, window=window)
        want = reference.decode(query, pages, tables, lengths, layout, window=window,
                                sm_scale=reference.softmax_scale(head))  # fmt: skip
        assert_within_fp32_bound(got, want, query, pages, tables, lengths, layout, window)
