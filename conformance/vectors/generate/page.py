"""The page suite: every bundled model in three dtypes, the PAGE rules' worked examples,
refusals and seeded random layer mixes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from kvcert.conformance.contract.codec import (
    JSON,
)
from kvcert.conformance.tools.catalog import load_model, model_names
from kvcert.conformance.vectors.generate.cases import make_case, spec_answer

GIB = 1 << 30


def page_case(case_id: str, plan: JSON, origin: str | None = None, comment: str = "") -> JSON:
    """A page-plan case; the expectation is the spec's plan (or refusal)."""
    case_input = {"suite": "page", "plan": plan}
    expect, rules = spec_answer(case_input)
    if not rules and expect.get("refused"):
        rules = ["INPUT-1"]  # refused by the JSON checks before any rule could run
    return make_case(case_id, rules, ["page.plan"], case_input, expect, origin, comment, ())


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower())


def _model_plan(name: str, dtype: str, **options: Any) -> JSON:
    model = load_model(name)
    plan: JSON = {
        "layers": list(model.layers),
        "kv_cache_dtype": model.dtype if dtype == "auto" else dtype,
        "memory_bytes": 24 * GIB,
        **options,
    }
    if model.speculative:
        plan["speculative"] = model.speculative
    return plan


def _layer(kind: str, heads: int, head: int, **extra: Any) -> JSON:
    return {"kind": kind, "num_kv_heads": heads, "head_size_k": head, "head_size_v": head, **extra}


OBJECTIVE_MODELS = ("deepseek-v4-flash", "qwen3.5-35b-a3b", "gemma-4-31B", "gpt-oss-120b")


def objective_scenarios() -> Iterator[JSON]:
    """PAGE-OBJ-1: the plan each objective picks for the models docs/plan.md compares."""
    for name in OBJECTIVE_MODELS:
        for objective in ("capacity", "balanced", "alignment"):
            yield page_case(
                f"page.objective.{_slug(name)}.{objective}",
                _model_plan(name, "auto", objective=objective, memory_bytes=40 * GIB),
                comment=f"{name}, 40 GiB: the plan objective {objective} picks (kvcert plan)",
            )
    for share in ("1", "1/2"):
        yield page_case(
            f"page.objective.deepseek-v4-flash.share-{_slug(share)}",
            _model_plan("deepseek-v4-flash", "auto", capacity_share=share, memory_bytes=40 * GIB),
            comment="balanced with another capacity share: 1 keeps the most capacity (2048), "
            "1/2 allows the finest alignment (128)",
        )
    cross_plan = {
        "layers": [_layer("full", 4, 64), _layer("cross", 2, 64)],
        "kv_cache_dtype": "fp32",
        "memory_bytes": 1 << 20,
        "block_size": 8,
        "kernel": {"multiple": 8, "maximum": 1024},
        "objective": "alignment",
    }
    yield page_case(
        "page.objective.cross-keeps-its-block",
        cross_plan,
        comment="PAGE-ALIGN-1: a cross-attention layer takes no hits, so no cap shrinks its block",
    )


def page_scenarios() -> Iterator[JSON]:
    """Every bundled model in three dtypes, and the worked examples of the PAGE rules."""
    for name in model_names():
        for dtype in ("auto", "fp8", "int8_per_token_head"):
            if (name, dtype) == ("qwen3.5-0.8b", "auto"):
                yield page_case(
                    "page.vllm-544",
                    _model_plan(name, dtype),
                    "lmcache-docs",
                    "vLLM's unified block size for Qwen3.5-0.8B is 544 tokens: the attention "
                    "block grows until its page holds the GDN state",
                )
                continue
            origin = "vllm#40388" if name.startswith("gemma-4") and "per_token" in dtype else None
            yield page_case(
                f"page.model.{_slug(name)}.{_slug(dtype)}",
                _model_plan(name, dtype),
                origin,
                f"{name} with kv-cache dtype {dtype}, 24 GiB",
            )
    yield page_case(
        "page.mamba-all-state-chunk",
        _model_plan("qwen3.5-0.8b", "auto", mamba_mode="all", state_chunk=64),
        comment="mode all: the anchor is also a multiple of the state chunk (576, not 544)",
    )
    full, sw = _layer("full", 8, 128), _layer("sliding_window", 8, 128, window=128)
    for layers, padding, label in [
        ([full, sw], "1/20", "1-full-1-sw"),
        ([full, full, sw, sw, sw, sw], "1/20", "2-full-4-sw"),
        ([full] * 3 + [sw] * 7, "1/4", "3-full-7-sw"),
        ([full] * 6 + [sw] * 5, "1/10", "6-full-5-sw"),
        ([full] * 3 + [sw] * 7, "0", "no-empty-slots"),
    ]:
        yield page_case(
            f"page.grouping.{label}",
            {
                "layers": layers,
                "kv_cache_dtype": "bf16",
                "memory_bytes": GIB,
                "group_padding": padding,
            },
            "vllm-notes-4.3",
            "strided groups of g layers; g is the largest with empty slots within the share",
        )
    gemma_sw = _layer("sliding_window", 8, 256, window=1024)
    gemma_global = _layer("full", 2, 512)
    for block in (16, 32, 64):
        yield page_case(
            f"page.gemma4-pth.block-{block}",
            {
                "layers": [gemma_sw] * 5 + [gemma_global],
                "kv_cache_dtype": "int8_per_token_head",
                "memory_bytes": GIB,
                "block_size": block,
            },
            "vllm#40388",
            "520 vs 1032 bytes per token-head: the global block doubles and pads 512 bytes",
        )
    latent = {"kind": "full", "latent_size": 448, "rope_size": 64, "ratio": 128}
    yield page_case(
        "page.latent-ratio-above-anchor",
        {"layers": [gemma_sw, latent], "kv_cache_dtype": "fp8", "memory_bytes": GIB},
        comment="a compressed latent layer (128 tokens per entry) gets anchor x 2^k >= 128",
    )
    draft = _layer("full", 8, 128, draft=True)
    yield page_case(
        "page.draft-joins-its-bucket",
        {
            "layers": [full, full, sw, sw, draft],
            "kv_cache_dtype": "bf16",
            "memory_bytes": GIB,
            "speculative": "exact",
        },
        comment="a draft layer equal to the target's full layers shares their group",
    )
    yield page_case(
        "page.cross-and-chunked",
        {
            "layers": [_layer("cross", 4, 64), _layer("chunked_local", 8, 128, chunk=8192), full],
            "kv_cache_dtype": "fp16",
            "memory_bytes": GIB,
        },
        comment="cross-attention groups take part in the page but not in the capacity",
    )
    yield from objective_scenarios()


def page_refusals() -> Iterator[JSON]:
    """Malformed and infeasible plan inputs: the engine must refuse, not guess."""
    full = _layer("full", 8, 128)
    gdn = {"kind": "mamba", "tensors": [{"shape": [32, 128, 128], "dtype": "fp32"}]}
    base: JSON = {"layers": [full], "kv_cache_dtype": "bf16", "memory_bytes": GIB}
    bad: list[tuple[str, JSON, str]] = [
        ("no-layers", {**base, "layers": []}, "a plan needs layers"),
        ("heads-zero", {**base, "layers": [_layer("full", 0, 128)]}, "num_kv_heads >= 1"),
        ("sw-without-window", {**base, "layers": [_layer("sliding_window", 8, 128)]}, "window"),
        ("unknown-dtype", {**base, "kv_cache_dtype": "fp4"}, "unknown dtype"),
        ("block-not-multiple", {**base, "block_size": 24}, "kernel multiple 16"),
        ("memory-too-small", {**base, "memory_bytes": 1000}, "fewer than 2 blocks"),
        (
            "state-beyond-maximum",
            {**base, "layers": [full, gdn], "kernel": {"maximum": 256}},
            "the state page needs a block beyond the kernel maximum",
        ),
        (
            "quantized-state",
            {**base, "layers": [{"kind": "mamba", "tensors": [{"shape": [4], "dtype": "fp8"}]}]},
            "state is never quantized",
        ),
        (
            "draft-without-profile",
            {**base, "layers": [full, _layer("full", 8, 64, draft=True)]},
            "draft layers need a speculative profile",
        ),
        (
            "latent-cross",
            {**base, "layers": [{"kind": "cross", "latent_size": 4}]},
            "latent layers are full or sliding_window",
        ),
        ("group-padding-one", {**base, "group_padding": 1}, "group_padding < 1"),
        (
            "window-on-full",
            {**base, "layers": [_layer("full", 8, 128, window=64)]},
            "only sliding_window layers take a window",
        ),
        (
            "chunk-on-sliding",
            {**base, "layers": [_layer("sliding_window", 8, 128, window=64, chunk=64)]},
            "only chunked_local layers take a chunk",
        ),
        (
            "rope-negative",
            {**base, "layers": [{"kind": "full", "latent_size": 8, "rope_size": -1}]},
            "rope_size >= 0",
        ),
        (
            "rope-fraction",
            {**base, "layers": [{"kind": "full", "latent_size": 8, "rope_size": 1.5}]},
            "rope_size is an integer",
        ),
        (
            "state-without-tensors",
            {**base, "layers": [{"kind": "mamba", "tensors": []}]},
            "a state layer needs a tensor",
        ),
        (
            "state-dimension-zero",
            {**base, "layers": [{"kind": "mamba", "tensors": [{"shape": [0], "dtype": "fp32"}]}]},
            "state dimensions >= 1",
        ),
        ("kernel-multiple-zero", {**base, "kernel": {"multiple": 0}}, "kernel multiple >= 1"),
        (
            "kernel-maximum-below-multiple",
            {**base, "kernel": {"multiple": 32, "maximum": 16}},
            "kernel maximum >= multiple",
        ),
        ("memory-zero", {**base, "memory_bytes": 0}, "memory_bytes >= 1"),
        ("state-chunk-zero", {**base, "state_chunk": 0}, "state_chunk >= 1"),
        ("objective-unknown", {**base, "objective": "speed"}, "capacity, balanced or alignment"),
        ("capacity-share-zero", {**base, "capacity_share": "0"}, "capacity_share in (0, 1]"),
        ("capacity-share-above-one", {**base, "capacity_share": "5/4"}, "capacity_share <= 1"),
    ]
    for label, plan, comment in bad:
        yield page_case(f"page.refuse.{label}", plan, comment=comment)


def _random_layer(rng: random.Random) -> JSON:
    kind = rng.choice(["attention", "attention", "latent", "state"])
    if kind == "state":
        tensors = [
            {
                "shape": [rng.choice([3, 16, 128, 1024]) for _ in range(rng.randint(1, 3))],
                "dtype": rng.choice(["fp32", "bf16"]),
            }
            for _ in range(rng.randint(1, 2))
        ]
        return {"kind": "mamba", "tensors": tensors}
    if kind == "latent":
        return {
            "kind": "full",
            "latent_size": rng.choice([128, 512]),
            "rope_size": rng.choice([0, 64]),
            "ratio": rng.choice([1, 4, 128]),
        }
    attention = rng.choice(["full", "sliding_window", "chunked_local"])
    extra = {"window": 512} if attention == "sliding_window" else {}
    if attention == "chunked_local":
        extra = {"chunk": 8192}
    head = rng.choice([64, 128, 256, 512])
    return _layer(attention, rng.choice([1, 2, 4, 8]), head, **extra)


def random_plans(count: int) -> Iterator[JSON]:
    """Seeded random layer mixes, each a few layer types repeated in a random order."""
    rng = random.Random(20261122)
    objectives = random.Random(20261123)  # its own stream: the layer mixes stay as they were
    for index in range(count):
        types = [_random_layer(rng) for _ in range(rng.randint(1, 3))]
        layers = [rng.choice(types) for _ in range(rng.randint(1, 16))]
        plan = {
            "layers": layers,
            "kv_cache_dtype": rng.choice(["bf16", "fp8", "int8_per_token_head", "fp32"]),
            "memory_bytes": rng.choice([1 << 26, GIB, 16 * GIB]),
            "block_size": rng.choice([16, 32]),
            "mamba_mode": rng.choice(["align", "all"]),
            "objective": objectives.choice(["capacity", "balanced", "alignment"]),
        }
        yield page_case(f"page.random.{index:03d}", plan)
