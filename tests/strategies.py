"""Hypothesis strategies for layouts and cache views, small enough that hits are common."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec.hashing import key_lookahead
from kvcert.spec.layout import is_cacheable
from kvcert.spec.view import keyable_blocks

BLOCK_SIZES = st.sampled_from([1, 2, 3, 4, 6, 8])


def attention_groups(draft: bool = False) -> st.SearchStrategy[Group]:
    """A full, sliding-window or chunked-local group; `draft` marks it as holding draft layers."""
    return st.one_of(
        st.builds(FullAttention, block_size=BLOCK_SIZES, draft=st.just(draft)),
        st.builds(
            SlidingWindow, block_size=BLOCK_SIZES, window=st.integers(1, 24), draft=st.just(draft)
        ),
        st.builds(
            ChunkedLocal, block_size=BLOCK_SIZES, chunk=st.integers(1, 24), draft=st.just(draft)
        ),
    )


def groups() -> st.SearchStrategy[Group]:
    """One group of any kind, never a draft group."""
    return st.one_of(
        attention_groups(),
        st.builds(MambaState, block_size=BLOCK_SIZES, mode=st.sampled_from(list(MambaMode))),
        st.builds(
            MambaState,
            block_size=BLOCK_SIZES,
            mode=st.just(MambaMode.ALIGN),
            speculative_blocks=st.integers(1, 3),
        ),
        st.builds(CrossAttention, block_size=BLOCK_SIZES),
    )


@st.composite
def layouts(
    draw: st.DrawFn, max_groups: int = 4, speculative: bool = True, reach: bool = False
) -> Layout:
    """A valid layout: at least one cacheable group; draft groups iff a speculative profile;
    with `reach`, drafters reading up to 3 tokens ahead too (an extra draw, so off by default:
    it would change every other test's derandomized examples)."""
    profile = (
        draw(st.sampled_from([None, Speculative.EXACT, Speculative.DROP])) if speculative else None
    )
    body = draw(st.lists(groups(), min_size=1, max_size=max_groups))
    if profile is not None:
        body.append(draw(attention_groups(draft=True)))
    if not any(is_cacheable(g) for g in body):
        body.append(draw(st.builds(FullAttention, block_size=BLOCK_SIZES)))
    order = draw(st.permutations(range(len(body))))
    chosen = tuple(body[i] for i in order)
    # draft reach: 1 (EAGLE) mostly, up to 3 (MTP modules); drop only within the alignment
    draft_reach = 1
    if reach and profile is not None and draw(st.integers(0, 3)) == 0:
        alignment = math.lcm(*(g.block_size for g in chosen if is_cacheable(g)))
        top = 3 if profile is Speculative.EXACT else min(3, alignment)
        draft_reach = draw(st.integers(1, top))
    return Layout(chosen, speculative=profile, draft_reach=draft_reach)


def _serves(group: Group) -> bool:
    return is_cacheable(group) and not (
        isinstance(group, MambaState) and group.mode is MambaMode.NONE
    )


@st.composite
def cached_blocks(draw: st.DrawFn, count: int) -> frozenset[int]:
    """A cached subset of `count` blocks, biased towards nearly complete caches."""
    if count == 0:
        return frozenset()
    missing = draw(
        st.one_of(
            st.sets(st.integers(0, count - 1), max_size=2),
            st.sets(st.integers(0, count - 1)),
        )
    )
    return frozenset(range(count)) - missing


@st.composite
def views(
    draw: st.DrawFn, layout: st.SearchStrategy[Layout] | None = None, max_tokens: int = 60
) -> CacheView:
    """A cache view over a drawn layout."""
    chosen = draw(layout if layout is not None else layouts())
    num_tokens = draw(st.integers(1, max_tokens))
    cached = tuple(
        draw(cached_blocks(keyable_blocks(chosen, i, num_tokens))) if _serves(g) else frozenset()
        for i, g in enumerate(chosen.groups)
    )
    return CacheView(chosen, num_tokens, cached)


@st.composite
def unit_views(draw: st.DrawFn, max_tokens: int = 60, flight: bool = False) -> CacheView:
    """A cache view under the hit-granularity profile `unit U` (U a divisor of every
    cacheable block size), with partial keys drawn per group (HIT-UNIT-1..4) and, with
    `flight`, attention blocks in flight (HIT-UNIT-5)."""
    body = draw(layouts(max_groups=3))
    sizes = math.gcd(*(g.block_size for g in body.groups if is_cacheable(g)))
    unit = draw(st.sampled_from([d for d in range(1, sizes + 1) if sizes % d == 0]))
    chosen = Layout(body.groups, body.speculative, draft_reach=body.draft_reach, hit_unit=unit)
    num_tokens = draw(st.integers(1, max_tokens))
    cached, partial = [], []
    for i, g in enumerate(chosen.groups):
        serves = _serves(g)
        cached.append(draw(cached_blocks(keyable_blocks(chosen, i, num_tokens))) if serves
                      else frozenset())  # fmt: skip
        top = num_tokens - key_lookahead(chosen, g)
        inside = [p for p in range(unit, top + 1, unit) if p % g.block_size]
        partial.append(draw(st.sets(st.sampled_from(inside))) if serves and inside
                       else frozenset())  # fmt: skip
    in_flight = [
        frozenset(draw(st.sets(st.sampled_from(sorted(c)))))
        if flight and c and not isinstance(g, MambaState)
        else frozenset()
        for c, g in zip(cached, chosen.groups, strict=True)
    ]
    return CacheView(
        chosen, num_tokens, tuple(cached), tuple(frozenset(p) for p in partial), tuple(in_flight)
    )


# --- page planning: plan-input JSON (kvcert.conformance.contract.plans) ---------------------------

KV_DTYPES = [
    "fp32",
    "fp16",
    "bf16",
    "fp8",
    "int8",
    "fp8_per_token_head",
    "int8_per_token_head",
]


@st.composite
def attention_layer_json(draw: st.DrawFn) -> dict[str, object]:
    kind = draw(st.sampled_from(["full", "sliding_window", "chunked_local", "cross"]))
    head_k = draw(st.sampled_from([32, 64, 96, 128, 256, 512]))
    layer: dict[str, object] = {
        "kind": kind,
        "num_kv_heads": draw(st.sampled_from([1, 2, 4, 8, 16])),
        "head_size_k": head_k,
        "head_size_v": draw(st.sampled_from([head_k, head_k, 64, 128])),
    }
    if kind == "sliding_window":
        layer["window"] = draw(st.sampled_from([128, 512, 1024, 4096]))
    if kind == "chunked_local":
        layer["chunk"] = draw(st.sampled_from([2048, 8192]))
    if kind != "cross" and draw(st.integers(0, 9)) == 0:
        layer["draft"] = True
    return layer


@st.composite
def latent_layer_json(draw: st.DrawFn) -> dict[str, object]:
    layer: dict[str, object] = {
        "kind": draw(st.sampled_from(["full", "sliding_window"])),
        "latent_size": draw(st.sampled_from([128, 448, 512])),
        "rope_size": draw(st.sampled_from([0, 64])),
        "ratio": draw(st.sampled_from([1, 1, 2, 4, 128])),
    }
    if layer["kind"] == "sliding_window":
        layer["window"] = 128
    return layer


@st.composite
def state_layer_json(draw: st.DrawFn) -> dict[str, object]:
    tensors = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "shape": st.lists(
                        st.sampled_from([3, 16, 128, 1024, 4096]), min_size=1, max_size=3
                    ),
                    "dtype": st.sampled_from(["fp32", "fp16", "bf16"]),
                }
            ),
            min_size=1,
            max_size=2,
        )
    )
    return {"kind": "mamba", "tensors": tensors}


@st.composite
def plan_inputs(draw: st.DrawFn) -> dict[str, object]:
    """Plan-input JSON: a few layer types repeated in a random order; mostly plannable."""
    kinds = [attention_layer_json(), latent_layer_json(), state_layer_json()]
    types = draw(st.lists(st.one_of(*kinds[:1], *kinds), min_size=1, max_size=4))
    order = draw(st.lists(st.integers(0, len(types) - 1), min_size=1, max_size=24))
    layers = [dict(types[i], name=f"{n}") for n, i in enumerate(order)]
    multiple = draw(st.sampled_from([8, 16, 16]))
    maximum = draw(st.sampled_from([1024, 4096, 4096, 16384]))
    obj: dict[str, object] = {
        "layers": layers,
        "kv_cache_dtype": draw(st.sampled_from(KV_DTYPES)),
        "memory_bytes": draw(st.sampled_from([1 << 20, 1 << 26, 1 << 30, 24 << 30])),
        "block_size": multiple * draw(st.sampled_from([1, 1, 2, 4])),
        "kernel": {"multiple": multiple, "maximum": maximum},
        "mamba_mode": draw(st.sampled_from(["none", "align", "all"])),
        "state_chunk": draw(st.sampled_from([1, 64])),
        "group_padding": draw(st.sampled_from(["0", "1/20", "1/4"])),
    }
    objective = draw(st.sampled_from([None, "capacity", "balanced", "alignment"]))
    if objective is not None:
        obj["objective"] = objective
    if draw(st.booleans()):
        obj["capacity_share"] = draw(st.sampled_from(["1", "19/20", "1/2", 0.8]))
    if any(layer.get("draft") for layer in layers):
        obj["speculative"] = draw(st.sampled_from(["exact", "drop"]))
    return obj
