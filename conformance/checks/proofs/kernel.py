"""Obligations for §10 the page byte layout: every kernel index lands in its page, in bounds,
and no two elements or scales share a byte.

For each shape below (as the planner produces for real models), token, head, element, part
and block id are symbolic; the sizes are constants, so every product is linear.
"""

from __future__ import annotations

import random
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import (
    AGREES,
    COUNTEREXAMPLE,
    PROVED,
    Obligation,
    evaluate,
)
from kvcert.spec.layers import ELEMENT_BYTES, AttentionKind, AttentionLayer, KVDtype, page_bytes
from kvcert.spec.page_layout import Part, attention_offset, attention_scale_offset

SHAPES = (  # (block size, KV heads, K head, V head, dtype)
    (16, 8, 256, 256, KVDtype.INT8_PER_TOKEN_HEAD),  # Gemma 4 sliding
    (32, 2, 512, 512, KVDtype.INT8_PER_TOKEN_HEAD),  # Gemma 4 global, doubled block
    (16, 4, 192, 128, KVDtype.BF16),  # K and V heads of different sizes
    (544, 2, 256, 256, KVDtype.BF16),  # Qwen3.5's anchor block
)
MAX_BLOCKS = 1 << 20


def offset(shape: tuple[Any, ...], index: list[Any], v_after_k: bool = True) -> Any:
    """PAGE-ADDR-1 with symbolic indices (t, h, v, d); v is 1 for V, 0 for K."""
    t, h, v, d = index
    block, heads, dk, dv, dtype = shape
    element = ELEMENT_BYTES[dtype]
    scales = 2 * block * heads * (4 if dtype.value.endswith("per_token_head") else 0)
    v_start = scales + (block * heads * dk * element if v_after_k else 0)
    k_off = scales + ((t * heads + h) * dk + d) * element
    v_off = v_start + ((t * heads + h) * dv + d) * element
    return z3.If(v == 1, v_off, k_off)


def scale_offset(shape: tuple[Any, ...], t: Any, h: Any, v: Any) -> Any:
    """PAGE-ADDR-2 with symbolic indices."""
    block, heads, _, _, _ = shape
    return z3.If(v == 1, block * heads * 4, 0) + (t * heads + h) * 4


def _index(shape: tuple[Any, ...], name: str) -> tuple[list[Any], list[Any]]:
    block, heads, dk, dv, _ = shape
    t, h, v, d = z3.Ints(f"t{name} h{name} v{name} d{name}")
    domain = [t >= 0, t < block, h >= 0, h < heads, z3.Or(v == 0, v == 1), d >= 0,
              z3.If(v == 1, d < dv, d < dk)]  # fmt: skip
    return [t, h, v, d], domain


def in_bounds_and_disjoint(v_after_k: bool = True) -> Any:
    def build() -> tuple[list[Any], Any]:
        assumptions, claims = [], []
        for n, shape in enumerate(SHAPES):
            block, heads, dk, dv, dtype = shape
            layer = AttentionLayer(AttentionKind.FULL, heads, dk, dv)
            page = page_bytes(layer, dtype, block)
            element = ELEMENT_BYTES[dtype]
            a, domain_a = _index(shape, f"a{n}")
            b, domain_b = _index(shape, f"b{n}")
            block_id, num_blocks = z3.Ints(f"block{n} num_blocks{n}")
            assumptions += [*domain_a, *domain_b, num_blocks >= 1, num_blocks <= MAX_BLOCKS,
                            block_id >= 0, block_id < num_blocks]  # fmt: skip
            off_a = offset(shape, a, v_after_k=v_after_k)
            off_b = offset(shape, b, v_after_k=v_after_k)
            different = z3.Or([x != y for x, y in zip(a, b, strict=True)])
            address = block_id * page + off_a
            claims += [
                off_a >= 0,
                off_a + element <= page,
                address + element <= num_blocks * page,
                z3.Implies(different, z3.Or(off_a + element <= off_b, off_b + element <= off_a)),
            ]
            if dtype.value.endswith("per_token_head"):
                scale = scale_offset(shape, *a[:3])
                claims += [scale >= 0, z3.Or(scale + 4 <= off_b, off_b + element <= scale)]
        return assumptions, z3.And(claims)

    return build


def drift() -> None:
    rng = random.Random(3)
    for shape in SHAPES:
        block, heads, dk, dv, dtype = shape
        layer = AttentionLayer(AttentionKind.FULL, heads, dk, dv)
        t, h, v, d = z3.Ints("t h v d")
        encoded, scaled = offset(shape, [t, h, v, d]), scale_offset(shape, t, h, v)
        for _ in range(100):
            token, head, part = rng.randrange(block), rng.randrange(heads), rng.choice([0, 1])
            index = rng.randrange(dv if part else dk)
            spec_part = Part.V if part else Part.K
            want = attention_offset(layer, dtype, block, token=token, head=head, part=spec_part,
                                    index=index)  # fmt: skip
            got = evaluate(encoded, t=token, h=head, v=part, d=index)
            assert got == want, f"PAGE-ADDR-1 encoding {got} != spec {want} for {shape}"
            if dtype.value.endswith("per_token_head"):
                want = attention_scale_offset(layer, dtype, block, token=token, head=head,
                                              part=spec_part)  # fmt: skip
                got = evaluate(scaled, t=token, h=head, v=part)
                assert got == want, f"PAGE-ADDR-2 encoding {got} != spec {want}"


OBLIGATIONS = (
    Obligation("THM-KERNEL-INBOUNDS", ("PAGE-ADDR-1", "PAGE-ADDR-2", "PAGE-SLOT-1"),
               "4 planner shapes, block ids < 2^20", PROVED, "pr", in_bounds_and_disjoint(),
               about="every element and scale lies in its page and in its tensor; none overlap"),
    Obligation("TWIN-KERNEL-V-OVER-K", ("PAGE-ADDR-1",), "as THM-KERNEL-INBOUNDS",
               COUNTEREXAMPLE, "pr", in_bounds_and_disjoint(v_after_k=False),
               twin_of="THM-KERNEL-INBOUNDS", about="V written from the start of the data region "
               "overwrites K"),
    Obligation("DRIFT-KERNEL", ("PAGE-ADDR-1", "PAGE-ADDR-2"), "400 random indices", AGREES,
               "pr", drift, about="the address encodings equal kvcert.spec.page_layout"),
)  # fmt: skip
