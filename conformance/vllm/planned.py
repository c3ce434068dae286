"""The vLLM adapter's planned modes: a layout reaches vLLM as a served model's layers would.

The hand mode (`vllm`) gives vLLM's KVCacheManager one group per layout group and flags draft
groups itself. Real models never do that: vLLM builds its groups from per-layer specs with its
own planner (merging layers whose specs are equal, or all layers of one attention type),
unifies their page sizes by changing block sizes, and decides in its own code which groups get
EAGLE handling. Here every layout group becomes one layer (its spec as the attention
backend publishes it; drafters as real SpeculativeConfigs, their layers marked `is_draft` in
mode `marked` or not in mode `unmarked`) and vLLM does the rest through `runtime.plan` and
`runtime.wire`; docs/engines.md has the step-by-step table.

A layout vLLM's planner does not reproduce (another block size, two groups merged into one
block table where the case needs them apart) is answered `unsupported` with what vLLM made of
it: no real model reaches that case through this path. A group vLLM serves as another kind
(chunked local attention as full attention, where VllmConfig turns the hybrid manager off) is
answered as vLLM serves it: that is what the model gets.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.layers import NotCompared, spec_of
from kvcert.conformance.vllm.runtime import Unsupported
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype

KINDS = {
    "full": AttentionKind.FULL,
    "sliding_window": AttentionKind.SLIDING_WINDOW,
    "chunked_local": AttentionKind.CHUNKED_LOCAL,
}


class NotReachable(Unsupported):
    """vLLM's planner does not turn these layers into the case's layout."""


def _shape(group: JSON, unit: int) -> tuple[AttentionLayer, KVDtype]:
    kind = KINDS[group["kind"]]
    window, chunk = group.get("window"), group.get("chunk")
    shape = group.get("shape")
    if shape is None:  # one fp16 head sized so that every group's page is 4 x unit bytes
        head = unit // group["block_size"]
        return AttentionLayer(kind, 1, head, head, window, chunk), KVDtype.FP16
    size_k = shape["head_size_k"]
    heads, size_v = shape["num_kv_heads"], shape.get("head_size_v", size_k)
    return AttentionLayer(kind, heads, size_k, size_v, window, chunk), KVDtype(shape["dtype"])


def layer_specs(layout: JSON, block_size: int, mark_drafts: bool) -> dict[str, Any]:
    """Per-layer KVCacheSpecs, one layer per layout group, as the model's backends publish
    them (before vLLM's planner unifies pages)."""
    v = runtime.vllm()
    groups = layout["groups"]
    attention = [g["block_size"] for g in groups if g["kind"] in KINDS]
    unit = math.lcm(*attention) if attention else 1
    specs: dict[str, Any] = {}
    for i, group in enumerate(groups):
        if group["kind"] not in KINDS:
            continue
        layer, dtype = _shape(group, unit)
        try:
            spec = spec_of(layer, dtype, block_size)
        except NotCompared as why:
            raise NotReachable(str(why)) from None
        if group.get("draft") and mark_drafts and runtime.marks_draft_layers():
            spec = dataclasses.replace(spec, is_draft=True)
        specs[_layer_name(i, group)] = spec
    page = max((s.page_size_bytes for s in specs.values()), default=64)
    for i, group in enumerate(groups):
        if group["kind"] != "mamba":
            continue
        fields = {f.name for f in dataclasses.fields(v.kvi.MambaSpec)}
        if "mamba_cache_mode" not in fields:
            raise NotReachable("this release has no Mamba prefix-cache modes")
        if group.get("mode", "all") == "none":
            raise NotReachable("mamba mode none disables prefix caching for the whole model")
        specs[_layer_name(i, group)] = v.kvi.MambaSpec(
            block_size=group["block_size"],
            shapes=((page,),),
            dtypes=(v.torch.uint8,),
            mamba_cache_mode=group.get("mode", "all"),
        )
    # in model order: vLLM's planner orders its groups by the layers it meets first
    return {_layer_name(i, g): specs[_layer_name(i, g)] for i, g in enumerate(groups)}


def _layer_name(index: int, group: JSON) -> str:
    return f"model.layers.{index}.{'mixer' if group['kind'] == 'mamba' else 'attn'}"


@dataclass
class Planned:
    """What vLLM made of a layout: the manager its Scheduler built, the request hasher, and
    for each layout group the index of the vLLM group holding its layer."""

    manager: Any
    hasher: Any
    owner: list[int]


def _describe(kv_groups: list[Any]) -> str:
    parts = []
    for g in kv_groups:
        spec = g.kv_cache_spec
        parts.append(f"{type(spec).__name__}(block {spec.block_size}) <- {sorted(g.layer_names)}")
    return "; ".join(parts)


def planned(
    layout: JSON,
    num_blocks: int,
    mode: str,
    kv_events: bool = True,
    flags: tuple[tuple[str, str, Any], ...] = (),
) -> Planned:
    """Plan the layout's layers with vLLM's own planner and build its Scheduler over a pool of
    `num_blocks` blocks (null block included); NotReachable where vLLM's groups are not the
    layout's."""
    groups = layout["groups"]
    reach = layout.get("draft_reach", 1)
    if reach != 1 and not runtime.has_multi_module_mtp():
        raise Unsupported(
            "this release has no multi-module MTP (a drafter reading more than one token ahead)"
        )
    attention = [g["block_size"] for g in groups if g["kind"] in KINDS]
    settings = runtime.Settings(
        max_len=layout.get("max_model_len") or 1 << 20,
        block_size=min(attention) if attention else min(g["block_size"] for g in groups),
        speculative=layout.get("speculative"),
        # a drafter reading k tokens ahead: k MTP modules drafting a token each
        spec_tokens=reach,
        drafter="mtp" if reach > 1 else "eagle",
        flags=flags,
        attention_chunk_size=next(
            (g["chunk"] for g in groups if g["kind"] == "chunked_local"), None
        ),
    )
    try:
        config = runtime.engine_config(settings)
    except runtime.NoSuchFlag as why:
        raise NotReachable(str(why)) from None
    specs = layer_specs(layout, settings.block_size, mark_drafts=mode == "marked")
    try:
        kv_groups = runtime.plan(config, specs)
    except (NotImplementedError, AssertionError, ValueError) as error:
        raise NotReachable(f"vLLM's planner refuses these layers: {error}") from None
    owner = []
    for i, group in enumerate(groups):
        holders = [j for j, g in enumerate(kv_groups) if _layer_name(i, group) in g.layer_names]
        # a group vLLM turns into another kind (chunked local layers become full attention
        # where VllmConfig turns the hybrid manager off) is answered as vLLM serves it
        size = kv_groups[holders[0]].kv_cache_spec.block_size
        if size != group["block_size"]:
            raise NotReachable(
                f"vLLM's planner gives group {i} block size {size}, the case needs "
                f"{group['block_size']} ({_describe(kv_groups)})"
            )
        owner.append(holders[0])
    wired = runtime.wire(config, kv_groups, num_blocks - 1, per_group=False)
    manager = wired.scheduler.kv_cache_manager
    # The adapter counts registrations from BlockStored events. They are switched on in the
    # pool, not by --kv-events-config: up to 0.19 that flag also turns the hybrid manager off,
    # and the events only record what the pool does.
    manager.block_pool.enable_kv_cache_events = kv_events
    return Planned(manager, wired.hasher, owner)
