"""How far an fp32 evaluation of a decode step may lie from the exact answer.

A fixed tolerance is wrong for attention: the rounding error of fp32 scores grows with their
magnitude, and the softmax turns an absolute score error into a relative weight error. A
tolerance of 1e-4 passed rows of moderate values on one machine and failed a row of large ones
on another (a different BLAS summation order, both answers fp32-correct). This module bounds
the error per output element, for every summation order, following Higham (*Accuracy and
Stability of Numerical Algorithms*, 2nd ed., §3.1), so the kernel tests and
`kvcert.kernels.certify` allow what fp32 arithmetic needs and no more than that bound.

One query head; i runs over the N tokens of its window; u = 2^-24; gamma(n) = n u / (1 - n u):

    scores     s_i  = scale * sum_d q_d k_id
               e_i  = gamma(Dk + 16) scale sum_d |q_d k_id|   products (TF32x3 on a GPU: under
                                                              16 u each) and their sum
                    + 2 u |s_i - max s| + 4 u                 s - m, the exp's argument scaling
                                                              (exp2 on a GPU), the exp's ulps
    weights    p'_i / p_i = e^{d_i} / sum_j p_j e^{d_j} with |d_j| <= e_j, so
               |p'_i - p_i| <= p_i max(e^{e_i} / D_- - 1, 1 - e^{-e_i} / D_+),
               D_+- = sum_j p_j e^{+-e_j}
    output     |o'_d - o_d| <= sum_i |p'_i - p_i| |v_id|
                               + gamma(N + 32) sum_i (p_i + |p'_i - p_i|) |v_id|
                                                   the sums, the online softmax's rescaling,
                                                   the splits' merge, the final division
                               + t (sum_i |v_id| + 2 N + 2)
                                                   underflow: t = 2^-126, the smallest normal
                                                   fp32, lost per weight, product or value
                                                   (a GPU flushes subnormals to zero)

and t scale (Dk + sum_d |q_d|) joins each e_i for the products and elements of k flushed.

p is the exact softmax of the exact scores, computed here in float64 from the dequantized
pages, which both evaluations read alike. A worst-case bound is loose (about sqrt(n) on random
data, far more where scores are large); tests/kernels/test_accuracy.py shows it holds and still
rejects a decode that reads a wrong block or scales its scores 1% off.
"""

from __future__ import annotations

import math

import torch

from kvcert.kernels.layout import PageLayout
from kvcert.kernels.reference import window_rows

UNIT_ROUNDOFF = 2.0**-24  # fp32
SMALLEST_NORMAL = 2.0**-126  # fp32: below it a value may flush to zero


def gamma(n: int) -> float:
    """Higham's gamma_n: the relative error bound of n compounded fp32 roundings."""
    if n * UNIT_ROUNDOFF >= 1:
        return math.inf
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


def decode_error_bound(q: torch.Tensor, pages: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, layout: PageLayout, *, window: int,
                       sm_scale: float) -> torch.Tensor:  # fmt: skip
    """[R, Hq, Dv] float64 bounds on |fp32 decode - exact decode| for `reference.decode`'s
    inputs; two fp32 evaluations differ by at most twice this."""
    requests, query_heads, _ = q.shape
    group = query_heads // layout.heads
    bound = torch.zeros(requests, query_heads, layout.head_v, dtype=torch.float64)
    u, tiny = UNIT_ROUNDOFF, SMALLEST_NORMAL
    for r in range(requests):
        table = tuple(int(b) for b in block_tables[r])
        k, v = (x.double() for x in window_rows(pages, table, int(seq_lens[r]), layout, window))
        for h in range(query_heads):
            kv, query = h // group, q[r, h].double()
            scores = (k[:, kv, :] @ query) * sm_scale
            magnitude = (k[:, kv, :].abs() @ query.abs()) * abs(sm_scale)
            flushed = tiny * abs(sm_scale) * (layout.head_k + float(query.abs().sum()))
            spread = scores.max() - scores
            error = gamma(layout.head_k + 16) * magnitude + 2 * u * spread + 4 * u + flushed
            weights = torch.softmax(scores, dim=0)
            high = (weights * torch.exp(error)).sum()
            low = (weights * torch.exp(-error)).sum()
            relative = torch.maximum(torch.exp(error) / low - 1, 1 - torch.exp(-error) / high)
            moved = weights * relative  # |p'_i - p_i|
            size = v[:, kv, :].abs()
            tokens = k.shape[0]
            rounding = gamma(tokens + 32) * ((weights + moved) @ size)
            underflow = tiny * (size.sum(0) + 2 * tokens + 2)
            # an overflowing e^{e_i} leaves inf or 0 * inf: fp32 then says nothing there
            bound[r, h] = torch.nan_to_num(moved @ size + rounding + underflow, nan=math.inf)
    return bound


def decode_mismatch(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> str:
    """'' when two fp32 decodes agree within twice the bound at every element (NaN never
    agrees); else the worst element, its error and what was allowed."""
    error = (got.cpu().double() - want.cpu().double()).abs()
    allowed = 2 * bound
    outside = ~(error <= allowed)
    if not bool(outside.any()):
        return ""
    excess = torch.where(outside, error.nan_to_num(nan=math.inf) - allowed, -math.inf)
    worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    return (f"{int(outside.sum())} of {error.numel()} elements outside the fp32 bound; the "
            f"worst, {worst}: error {float(error[worst]):.3g}, allowed "
            f"{float(allowed[worst]):.3g}")  # fmt: skip
