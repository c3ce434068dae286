"""kvcert.kernels.accuracy: its fp32 bound holds for the kernel and the oracle against the exact
(float64) answer, and stays tight enough to reject decodes that are wrong."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvcert.kernels import accuracy, attention_layout, paged_decode, reference, write_kv
from tests.kernels.test_kernels import FAST, decode_cases, values


def exact_decode(query, pages, tables, lengths, layout, window, scale) -> torch.Tensor:
    """reference.decode in float64: the answer both fp32 evaluations approximate."""
    requests, query_heads, _ = query.shape
    group = query_heads // layout.heads
    out = torch.zeros(requests, query_heads, layout.head_v, dtype=torch.float64)
    for r in range(requests):
        table = tuple(int(b) for b in tables[r])
        k, v = (x.double() for x in reference.window_rows(pages, table, int(lengths[r]), layout,
                                                          window))  # fmt: skip
        for h in range(query_heads):
            weights = torch.softmax((k[:, h // group, :] @ query[r, h].double()) * scale, dim=0)
            out[r, h] = weights @ v[:, h // group, :]
    return out


def gemma4_pages(dtype: str, block: int, heads: int, head: int):
    """test_kernels' Gemma 4 pages: values over six decades, one request of 2 blocks - 3."""
    layout = attention_layout(block, heads, head, head, dtype, page_size=66560)
    pages = torch.full((4, 66560), 0xFF, dtype=torch.uint8)
    slots = torch.arange(block, 3 * block, dtype=torch.int64)
    write_kv(values((len(slots), heads, head), torch.bfloat16, block),
             values((len(slots), heads, head), torch.bfloat16, block + 1), pages, slots,
             layout)  # fmt: skip
    query = values((1, heads * 2, head), torch.bfloat16, 3)
    tables = torch.tensor([[1, 2]], dtype=torch.int32)
    lengths = torch.tensor([2 * block - 3], dtype=torch.int32)
    return layout, pages, query, tables, lengths


GEMMA4 = [(dtype, *shape) for dtype in ("int8_per_token_head", "fp8_per_token_head")
          for shape in ((16, 8, 256, 24), (32, 2, 512, 0))]  # fmt: skip


def assert_bound_holds(query, pages, tables, lengths, layout, window):
    scale = reference.softmax_scale(layout.head_k)
    exact = exact_decode(query, pages, tables, lengths, layout, window, scale)
    bound = accuracy.decode_error_bound(query, pages, tables, lengths, layout, window=window,
                                        sm_scale=scale)  # fmt: skip
    oracle = reference.decode(query, pages, tables, lengths, layout, window=window,
                              sm_scale=scale)  # fmt: skip
    kernel = paged_decode(query, pages, tables, lengths, layout, window=window)
    for name, got in (("oracle", oracle), ("kernel", kernel)):
        error = (got.double() - exact).abs()
        assert bool((error <= bound).all()), f"{name}: {float((error - bound).max()):.3g} over"


@FAST
@given(decode_cases(), st.integers(0, 99))
def test_the_bound_holds_for_the_kernel_and_the_oracle(case, seed):
    layout, blocks, tables, lengths, window, group, src = case
    pages = torch.full((blocks, layout.page_size), 0xFF, dtype=torch.uint8)
    slots = torch.arange(layout.block_size, blocks * layout.block_size, dtype=torch.int64)
    write_kv(values((len(slots), layout.heads, layout.head_k), src, seed),
             values((len(slots), layout.heads, layout.head_v), src, seed + 1), pages, slots,
             layout)  # fmt: skip
    query = values((len(lengths), layout.heads * group, layout.head_k), src, seed + 2)
    assert_bound_holds(query, pages, tables, lengths, layout, window)


@pytest.mark.parametrize(("dtype", "block", "heads", "head", "window"), GEMMA4)
def test_the_bound_holds_on_the_gemma4_pages(dtype, block, heads, head, window):
    layout, pages, query, tables, lengths = gemma4_pages(dtype, block, heads, head)
    assert_bound_holds(query, pages, tables, lengths, layout, window)


@pytest.mark.parametrize(("dtype", "block", "heads", "head", "window"), GEMMA4)
def test_wrong_decodes_fall_outside_the_bound(dtype, block, heads, head, window):
    """Broken twins of a decode: the blocks of its table swapped, its scores scaled 1% off,
    its query heads mapped to the next KV head's outputs. Each must be rejected."""
    layout, pages, query, tables, lengths = gemma4_pages(dtype, block, heads, head)
    scale = reference.softmax_scale(head)
    right = reference.decode(query, pages, tables, lengths, layout, window=window,
                             sm_scale=scale)  # fmt: skip
    bound = accuracy.decode_error_bound(query, pages, tables, lengths, layout, window=window,
                                        sm_scale=scale)  # fmt: skip
    assert accuracy.decode_mismatch(right, right, bound) == ""
    twins = {
        "swapped blocks": reference.decode(query, pages, tables.flip(1), lengths, layout,
                                           window=window, sm_scale=scale),
        "scale 1% off": reference.decode(query, pages, tables, lengths, layout, window=window,
                                         sm_scale=scale * 1.01),
        "heads shifted": right.roll(2, dims=1),  # the group is 2: the next KV head's answers
    }  # fmt: skip
    for name, wrong in twins.items():
        assert accuracy.decode_mismatch(wrong, right, bound), f"{name} passed as correct"


def test_a_nan_output_never_agrees():
    want = torch.zeros(1, 1, 2)
    got = torch.tensor([[[0.0, math.nan]]])
    why = accuracy.decode_mismatch(got, want, torch.full((1, 1, 2), math.inf))
    assert why.startswith("1 of 2 elements outside the fp32 bound; the worst, (0, 0, 1)")


def test_gamma_is_higham_and_refuses_to_bound_too_many_roundings():
    u = 2.0**-24
    assert accuracy.gamma(0) == 0
    assert accuracy.gamma(10) == pytest.approx(10 * u / (1 - 10 * u), rel=1e-15)
    assert accuracy.gamma(1 << 24) == math.inf
