"""Page plans as JSON: plan inputs and plans, for the spec and the reference alike.

A plan input (what a `page` vector's input and `kvcert plan` build):

    {"layers": [LAYER, ...], "kv_cache_dtype": "int8_per_token_head", "memory_bytes": 2**34,
     "block_size": 16, "kernel": {"multiple": 16, "maximum": 4096},        optional
     "mamba_mode": "align", "state_chunk": 1, "speculative": "exact",      optional
     "group_padding": "1/20"}                                             optional

    LAYER  {"kind": "full" | "sliding_window" | "chunked_local" | "cross",
            "num_kv_heads": 8, "head_size_k": 256, "head_size_v": 256,
            "window": 1024 | "chunk": 8192, "draft": false}               attention
           {"kind": "full" | "sliding_window", "latent_size": 512, "rope_size": 64,
            "ratio": 4, "window": 128}                                    latent (MLA)
           {"kind": "mamba", "tensors": [{"shape": [3, 6144], "dtype": "bf16"}, ...]}

A plan (what engines answer): page_size, num_blocks, token_capacity, hit_alignment, and the
groups with their layers (null for an empty slot), block size, page bytes and draft flag.
Unknown fields are refused so typos cannot pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

from kvcert.conformance.scenario import ScenarioError
from kvcert.reference import planner as ref
from kvcert.reference.config import DraftKeying, Kind
from kvcert.reference.config import MambaMode as RefMambaMode
from kvcert.reference.errors import ConfigError
from kvcert.spec import SpecError, hit_alignment
from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    KVDtype,
    LatentLayer,
    Layer,
    StateLayer,
    StateTensor,
    page_bytes,
)
from kvcert.spec.layout import MambaMode, Speculative
from kvcert.spec.plan import (
    KernelLimits,
    Plan,
    PlanInput,
    anchor_block_size,
    bucket_key,
    pool_blocks,
    token_capacity,
)

JSON = dict[str, Any]
T = TypeVar("T")

ATTENTION_FIELDS = ("num_kv_heads", "head_size_k", "head_size_v", "window", "chunk", "draft")
LATENT_FIELDS = ("latent_size", "rope_size", "ratio", "window", "draft")
INPUT_FIELDS = (
    "layers",
    "kv_cache_dtype",
    "memory_bytes",
    "block_size",
    "kernel",
    "mamba_mode",
    "state_chunk",
    "speculative",
    "group_padding",
)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _only(obj: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _choice(value: object, choices: list[str], where: str) -> str:
    if value not in choices:
        raise ScenarioError(f"{where}: expected one of {choices}, got {value!r}")
    return str(value)


def _spec(where: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except (SpecError, TypeError) as error:
        raise ScenarioError(f"{where}: {error}") from error


def _fraction(value: object, where: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ScenarioError(f'{where}: expected a number or a fraction "a/b", got {value!r}')
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError) as error:
        raise ScenarioError(f'{where}: expected a number or a fraction "a/b": {error}') from error


def _state_tensor(shape: list[Any], dtype: str, where: str) -> StateTensor:
    return _spec(where, lambda: StateTensor(tuple(shape), KVDtype(dtype)))


def layer_from_json(obj: object, where: str) -> Layer:
    """One LAYER object -> a spec layer."""
    fields = _object(obj, where)
    kind = _choice(fields.get("kind"), [*AttentionKind, "mamba"], f"{where}.kind")
    name = str(fields.get("name", where))
    if kind == "mamba":
        _only(fields, where, ("kind", "tensors", "name"))
        tensors = fields.get("tensors")
        if not isinstance(tensors, list):
            raise ScenarioError(f"{where}.tensors: expected a list of state tensors")
        parsed = []
        for i, tensor in enumerate(tensors):
            t = _object(tensor, f"{where}.tensors[{i}]")
            _only(t, f"{where}.tensors[{i}]", ("shape", "dtype"))
            shape = t.get("shape")
            if not isinstance(shape, list):
                raise ScenarioError(f"{where}.tensors[{i}].shape: expected a list of sizes")
            dtype = _choice(t.get("dtype"), list(KVDtype), f"{where}.tensors[{i}].dtype")
            parsed.append(_state_tensor(shape, dtype, where))
        return _spec(where, lambda: StateLayer(tuple(parsed), name=name))
    if "latent_size" in fields:
        _only(fields, where, ("kind", "name", *LATENT_FIELDS))
        args = {k: fields[k] for k in LATENT_FIELDS if k in fields}
        args.setdefault("rope_size", 0)
        return _spec(where, lambda: LatentLayer(AttentionKind(kind), name=name, **args))
    _only(fields, where, ("kind", "name", *ATTENTION_FIELDS))
    args = {k: fields[k] for k in ATTENTION_FIELDS if k in fields}
    for required in ("num_kv_heads", "head_size_k", "head_size_v"):
        if required not in args:
            raise ScenarioError(f"{where}: missing field {required!r}")
    return _spec(where, lambda: AttentionLayer(AttentionKind(kind), name=name, **args))


def plan_input_from_json(obj: object, where: str = "plan") -> PlanInput:
    """A plan-input object -> the spec's PlanInput."""
    fields = _object(obj, where)
    _only(fields, where, INPUT_FIELDS)
    for required in ("layers", "kv_cache_dtype", "memory_bytes"):
        if required not in fields:
            raise ScenarioError(f"{where}: missing field {required!r}")
    layers_json = fields["layers"]
    if not isinstance(layers_json, list):
        raise ScenarioError(f"{where}.layers: expected a list of layers")
    layers = tuple(layer_from_json(x, f"{where}.layers[{i}]") for i, x in enumerate(layers_json))
    kernel_json = _object(fields.get("kernel", {}), f"{where}.kernel")
    _only(kernel_json, f"{where}.kernel", ("multiple", "maximum"))
    kernel = _spec(f"{where}.kernel", lambda: KernelLimits(**kernel_json))
    dtype = _choice(fields["kv_cache_dtype"], list(KVDtype), f"{where}.kv_cache_dtype")
    mode = _choice(fields.get("mamba_mode", "align"), list(MambaMode), f"{where}.mamba_mode")
    speculative = fields.get("speculative")
    if speculative is not None:
        speculative = Speculative(_choice(speculative, list(Speculative), f"{where}.speculative"))
    padding = _fraction(fields.get("group_padding", "1/20"), f"{where}.group_padding")
    return _spec(
        where,
        lambda: PlanInput(
            layers,
            KVDtype(dtype),
            fields["memory_bytes"],
            block_size=fields.get("block_size", 16),
            kernel=kernel,
            mamba_mode=MambaMode(mode),
            state_chunk=fields.get("state_chunk", 1),
            speculative=speculative,
            group_padding=padding,
        ),
    )


def spec_plan_to_json(plan: Plan) -> JSON:
    """A spec plan as the JSON engines answer."""
    return {
        "page_size": plan.page_size,
        "num_blocks": plan.num_blocks,
        "token_capacity": plan.token_capacity,
        "hit_alignment": hit_alignment(plan.layout),
        "groups": [
            {
                "kind": g.kind,
                "layers": list(g.layers),
                "block_size": g.block_size,
                "page_bytes": g.page_bytes,
                "draft": g.draft,
            }
            for g in plan.groups
        ],
    }


# --- the reference planner from the same JSON (no spec types in between) -------------------


def _ref_layer(obj: JSON) -> ref.LayerShape:
    kind = obj["kind"]
    if kind == "mamba":
        return ref.StateShape(
            tuple((tuple(t["shape"]), t["dtype"]) for t in obj["tensors"]), name=obj.get("name", "")
        )
    if "latent_size" in obj:
        return ref.LatentShape(
            Kind(kind),
            obj["latent_size"],
            obj.get("rope_size", 0),
            window=obj.get("window", 0),
            ratio=obj.get("ratio", 1),
            draft=obj.get("draft", False),
            name=obj.get("name", ""),
        )
    return ref.AttentionShape(
        Kind(kind),
        obj["num_kv_heads"],
        obj["head_size_k"],
        obj["head_size_v"],
        window=obj.get("window", 0),
        chunk=obj.get("chunk", 0),
        draft=obj.get("draft", False),
        name=obj.get("name", ""),
    )


def reference_plan(obj: JSON) -> ref.CachePlan:
    """Plan with kvcert.reference straight from plan-input JSON (no spec code involved).

    Raises ConfigError when no layout exists, and KeyError, TypeError or ValueError on
    malformed JSON; `plan_input_from_json` gives the readable message for the latter.
    """
    kernel = obj.get("kernel", {})
    request = ref.PlanRequest(
        tuple(_ref_layer(x) for x in obj["layers"]),
        obj["kv_cache_dtype"],
        obj["memory_bytes"],
        block_size=obj.get("block_size", 16),
        multiple=kernel.get("multiple", 16),
        maximum=kernel.get("maximum", 4096),
        mamba_mode=RefMambaMode(obj.get("mamba_mode", "align")),
        state_chunk=obj.get("state_chunk", 1),
        group_padding=Fraction(obj.get("group_padding", "1/20")),
        speculative=DraftKeying(obj["speculative"]) if obj.get("speculative") else None,
    )
    return ref.plan_cache(request)


def reference_plan_to_json(plan: ref.CachePlan) -> JSON:
    """A reference plan as the JSON engines answer."""
    return {
        "page_size": plan.page_size,
        "num_blocks": plan.num_blocks,
        "token_capacity": plan.token_capacity,
        "hit_alignment": plan.alignment,
        "groups": [
            {
                "kind": g.kind.value,
                "layers": list(g.layers),
                "block_size": g.block_size,
                "page_bytes": g.page_bytes,
                "draft": g.draft,
            }
            for g in plan.groups
        ],
    }


def safe_reference_plan(obj: JSON) -> JSON | None:
    """The reference's plan as JSON, or None when it refuses."""
    try:
        return reference_plan_to_json(reference_plan(obj))
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError):
        return None


# --- what vLLM 0.26-0.33 would do with the same input, for comparison ---------------------


def vllm_padded_plan(plan_input: PlanInput) -> JSON:
    """A model of vLLM 0.26-0.33's `unify_kv_cache_spec_page_size` and grouping (notes §4).

    Every attention layer starts at the anchor block size; the largest page P is kept; a
    smaller page is scaled to P when it divides P and otherwise padded to P with its block
    size unchanged (MLA pages that do not divide raise in vLLM: reported as `refused`).
    Groups: `min` bucket size, or `max` when max < 1.5 x min. Capacity uses PAGE-CAP-1, and
    `reported_tokens` is the figure vLLM up to 0.19 logs, num_blocks // groups x the smallest
    block; from 0.20 vLLM logs max concurrency x max_model_len instead, which depends on
    max_model_len and is not modelled here.
    With chunked local attention vLLM switches its hybrid manager off by default (unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1): every attention layer is then
    allocated as full attention, in one group. engines/vllm/plan/plan_check.py checks this
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
