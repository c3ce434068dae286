"""Page plans as JSON: plan inputs and plans, for the spec and the reference alike.

A plan input (what a `page` vector's input and `kvcert plan` build):

    {"layers": [LAYER, ...], "kv_cache_dtype": "int8_per_token_head", "memory_bytes": 2**34,
     "block_size": 16, "kernel": {"multiple": 16, "maximum": 4096},        optional
     "mamba_mode": "align", "state_chunk": 1, "speculative": "exact",      optional
     "group_padding": "1/20",                                             optional
     "objective": "balanced", "capacity_share": "19/20"}                   optional

    LAYER  {"kind": "full" | "sliding_window" | "chunked_local" | "cross",
            "num_kv_heads": 8, "head_size_k": 256, "head_size_v": 256,
            "window": 1024 | "chunk": 8192, "draft": false}               attention
           {"kind": "full" | "sliding_window", "latent_size": 512, "rope_size": 64,
            "ratio": 4, "window": 128}                                    latent (MLA)
           {"kind": "mamba", "tensors": [{"shape": [3, 6144], "dtype": "bf16"}, ...]}

A plan (what engines answer): page_size, num_blocks, token_capacity, hit_alignment, and the
groups with their layers (null for an empty slot), block size, page bytes and draft flag.
Unknown fields are refused so typos cannot pass. This module reads plan inputs into
kvcert.spec's types; the reference engine reads the same JSON on its own
(kvcert.conformance.engines.reference_engine), so the two planners stay independent.
"""

from __future__ import annotations

from typing import Any

from kvcert.conformance.contract.codec import (
    JSON,
    InputError,
    check_fields,
    choice,
    expect_object,
    fraction,
    spec_call,
)
from kvcert.spec import hit_alignment
from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    KVDtype,
    LatentLayer,
    Layer,
    StateLayer,
    StateTensor,
)
from kvcert.spec.layout import MambaMode, Speculative
from kvcert.spec.plan import KernelLimits, Objective, Plan, PlanInput

MAX_LAYERS = 4096  # cache layers of one plan input; the deepest models have a few hundred
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
    "objective",
    "capacity_share",
)


def check_plan_fields(obj: object, where: str = "plan") -> dict[str, Any]:
    """A plan input's field names, everywhere in it, and the containers that hold them
    (values are each planner's to judge): both planners' readers start here, so neither
    ignores a field the other refuses."""
    fields = expect_object(obj, where)
    check_fields(fields, where, ("layers", "kv_cache_dtype", "memory_bytes"), INPUT_FIELDS)
    kernel = expect_object(fields.get("kernel", {}), f"{where}.kernel")
    check_fields(kernel, f"{where}.kernel", (), ("multiple", "maximum"))
    if not isinstance(fields["layers"], list):
        raise InputError(f"{where}.layers: expected a list of layers")
    if len(fields["layers"]) > MAX_LAYERS:
        raise InputError(f"{where}.layers: {len(fields['layers']):,} layers, over {MAX_LAYERS:,}")
    for i, layer in enumerate(fields["layers"]):
        check_layer_fields(layer, f"{where}.layers[{i}]")
    return fields


def check_layer_fields(obj: object, where: str) -> dict[str, Any]:
    """A LAYER object's field names by its kind (attention, latent, state), values unjudged."""
    entry = expect_object(obj, where)
    if entry.get("kind") == "mamba":
        check_fields(entry, where, ("kind", "tensors"), ("name",))
        if not isinstance(entry["tensors"], list):
            raise InputError(f"{where}.tensors: expected a list of state tensors")
        for j, tensor in enumerate(entry["tensors"]):
            at = f"{where}.tensors[{j}]"
            check_fields(expect_object(tensor, at), at, ("shape", "dtype"))
    elif "latent_size" in entry:
        check_fields(entry, where, ("kind", "latent_size"), ("name", *LATENT_FIELDS))
    else:
        required = ("kind", "num_kv_heads", "head_size_k", "head_size_v")
        check_fields(entry, where, required, ("name", *ATTENTION_FIELDS))
    return entry


def _state_tensor(shape: list[Any], dtype: str, where: str) -> StateTensor:
    return spec_call(where, lambda: StateTensor(tuple(shape), KVDtype(dtype)))


def layer_from_json(obj: object, where: str) -> Layer:
    """One LAYER object -> a spec layer."""
    fields = check_layer_fields(obj, where)
    kind = choice(fields.get("kind"), [*AttentionKind, "mamba"], f"{where}.kind")
    name = str(fields.get("name", where))
    if kind == "mamba":
        parsed = []
        for i, t in enumerate(fields["tensors"]):
            shape = t.get("shape")
            if not isinstance(shape, list):
                raise InputError(f"{where}.tensors[{i}].shape: expected a list of sizes")
            dtype = choice(t.get("dtype"), list(KVDtype), f"{where}.tensors[{i}].dtype")
            parsed.append(_state_tensor(shape, dtype, where))
        return spec_call(where, lambda: StateLayer(tuple(parsed), name=name))
    if "latent_size" in fields:
        args = {k: fields[k] for k in LATENT_FIELDS if k in fields}
        args.setdefault("rope_size", 0)
        return spec_call(where, lambda: LatentLayer(AttentionKind(kind), name=name, **args))
    args = {k: fields[k] for k in ATTENTION_FIELDS if k in fields}
    return spec_call(where, lambda: AttentionLayer(AttentionKind(kind), name=name, **args))


def plan_input_from_json(obj: object, where: str = "plan") -> PlanInput:
    """A plan-input object -> the spec's PlanInput."""
    fields = check_plan_fields(obj, where)
    layers_json = fields["layers"]
    layers = tuple(layer_from_json(x, f"{where}.layers[{i}]") for i, x in enumerate(layers_json))
    kernel_json = fields.get("kernel", {})
    kernel = spec_call(f"{where}.kernel", lambda: KernelLimits(**kernel_json))
    dtype = choice(fields["kv_cache_dtype"], list(KVDtype), f"{where}.kv_cache_dtype")
    mode = choice(fields.get("mamba_mode", "align"), list(MambaMode), f"{where}.mamba_mode")
    speculative = fields.get("speculative")
    if speculative is not None:
        speculative = Speculative(choice(speculative, list(Speculative), f"{where}.speculative"))
    padding = fraction(fields.get("group_padding", "1/20"), f"{where}.group_padding")
    objective = choice(fields.get("objective", "balanced"), list(Objective), f"{where}.objective")
    share = fraction(fields.get("capacity_share", "19/20"), f"{where}.capacity_share")
    return spec_call(
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
            objective=Objective(objective),
            capacity_share=share,
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
