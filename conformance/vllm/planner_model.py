"""What vLLM 0.26-0.33 would plan for the same model: a peer's page planning, for comparison.

Not normative: `kvcert plan --compare` prints it beside kvcert's plan to show what the PAGE
rules buy, and kvcert.conformance.vllm.checks.plan holds this model to vLLM 0.33.0's own planner.
"""

from __future__ import annotations

import dataclasses

from kvcert.conformance.contract.codec import JSON
from kvcert.spec import SpecError
from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    LatentLayer,
    Layer,
    StateLayer,
    page_bytes,
)
from kvcert.spec.layout import MambaMode
from kvcert.spec.plan import PlanInput, anchor_block_size, bucket_key, pool_blocks, token_capacity


def vllm_padded_plan(plan_input: PlanInput) -> JSON:
    """A model of vLLM 0.26-0.33's `unify_kv_cache_spec_page_size` and grouping.

    Every attention layer starts at the anchor block size; the largest page P is kept; a
    smaller page is scaled to P when it divides P and otherwise padded to P with its block
    size unchanged (MLA pages that do not divide raise in vLLM: reported as `refused`).
    Groups: `min` bucket size, or `max` when max < 1.5 x min. Capacity uses PAGE-CAP-1, and
    `reported_tokens` is the figure vLLM up to 0.19 logs, num_blocks // groups x the smallest
    block; from 0.20 vLLM logs max concurrency x max_model_len instead, which depends on
    max_model_len and is not modelled here.
    With chunked local attention vLLM switches its hybrid manager off by default (unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1): every attention layer is then
    allocated as full attention, in one group. kvcert.conformance.vllm.checks.plan checks this
    model against vLLM 0.33.0's own planner. Not normative: a peer's behaviour, to show what
    the planner's rules buy.
    """
    try:
        return _vllm_padded_plan(plan_input)
    except SpecError as error:
        return {"refused": f"not modelled: {error}"}


def _vllm_padded_plan(plan_input: PlanInput) -> JSON:
    anchor = anchor_block_size(plan_input)
    layers = plan_input.layers
    if any(getattr(layer, "kind", None) is AttentionKind.CHUNKED_LOCAL for layer in layers):
        layers = tuple(_as_full_attention(layer) for layer in layers)
    buckets: dict[tuple[object, ...], list[int]] = {}
    for index, layer in enumerate(layers):
        buckets.setdefault(bucket_key(layer), []).append(index)
    pages = {key: page_bytes(layers[m[0]], plan_input.dtype, anchor) for key, m in buckets.items()}
    page = max(pages.values())
    sizes = [len(m) for m in buckets.values()]
    size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups: list[JSON] = []
    blocks_by_group: list[int] = []
    for key, members in buckets.items():
        first = layers[members[0]]
        block = anchor
        if not isinstance(first, StateLayer) and page % pages[key] == 0:
            block = anchor * (page // pages[key])
        elif isinstance(first, LatentLayer):
            return {"refused": "NotImplementedError: MLA pages that do not divide"}
        used = page_bytes(first, plan_input.dtype, block)
        count = -(-len(members) // size)
        kind = "mamba" if isinstance(first, StateLayer) else first.kind.value
        counts = kind not in ("cross", "mamba") or plan_input.mamba_mode is MambaMode.ALL
        for _ in range(count):
            groups.append({"kind": kind, "block_size": block, "page_bytes": used})
            if counts:
                blocks_by_group.append(block)
    blocks = pool_blocks(plan_input.memory_bytes, size, page)
    return {
        "page_size": page,
        "group_size": size,
        "num_blocks": blocks,
        "token_capacity": token_capacity(blocks_by_group, blocks),
        "reported_tokens": blocks // len(groups) * min(int(g["block_size"]) for g in groups),
        "groups": groups,
    }


def _as_full_attention(layer: Layer) -> Layer:
    """vLLM without its hybrid manager: windowed and chunked layers keep every token."""
    if isinstance(layer, AttentionLayer) and layer.kind is not AttentionKind.CROSS:
        return dataclasses.replace(layer, kind=AttentionKind.FULL, window=None, chunk=None)
    if isinstance(layer, LatentLayer) and layer.window is not None:
        return dataclasses.replace(layer, window=None)
    return layer
