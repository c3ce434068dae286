"""kvcert.reference as a conformance engine, reading the vectors' JSON without kvcert.spec.

The translation is mechanical (field names and types only) and never goes through the
spec's parsers, so the reference's own validation decides what it refuses: a difference from
the spec is a difference in behaviour. Hits go through its coordinator, traces through
KVCacheManager (the radix profile's through RadixCacheManager), page plans through its planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from kvcert.conformance.contract.codec import (
    JSON,
    LAYOUT_FIELDS,
    REFUSED,
    InputError,
    check_fields,
    check_group_fields,
    check_op_fields,
    expect_object,
    from_ranges,
    partial_from_json,
)
from kvcert.conformance.contract.plans import check_plan_fields
from kvcert.conformance.contract.protocol import Session, claims_everything
from kvcert.reference import config as ref
from kvcert.reference import planner
from kvcert.reference.coordinator import find_hit
from kvcert.reference.errors import ConfigError, KVCacheError, RequestStateError
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Waiting
from kvcert.reference.radix import RadixCacheManager
from kvcert.reference.unit_hits import find_unit_hit


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, got {value!r}")
    return value


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    return value


def group_from_json(obj: JSON) -> ref.GroupConfig:
    """One layout group as the reference's GroupConfig (the JSON format's fields checked by
    the codec; every value is the reference's to judge)."""
    obj, _ = check_group_fields(obj, "layout group")
    try:
        kind = ref.Kind(obj["kind"])
        mode = ref.MambaMode(obj["mode"]) if "mode" in obj else None
    except (KeyError, ValueError) as error:
        raise ConfigError(f"bad group {obj!r}: {error}") from error
    draft = obj.get("draft", False)
    return ref.GroupConfig(
        kind,
        _int(obj.get("block_size"), "block_size"),
        window=_int(obj.get("window", 0), "window"),
        chunk=_int(obj.get("chunk", 0), "chunk"),
        mode=mode,
        draft=draft,
        name=_text(obj.get("name", ""), "name"),
        speculative_blocks=_int(obj.get("speculative_blocks", 0), "speculative_blocks"),
    )


PROFILE_FIELDS = ("eviction", "visibility", "retention", "retention_interval")


def config_from_json(
    layout: JSON, num_blocks: int, profiles: Mapping[str, Any] | None = None
) -> ref.CacheConfig:
    """A layout object, pool size and an alloc case's profile fields (PROFILE_FIELDS, each
    absent meaning its default) as the reference's CacheConfig, which checks the values."""
    check_fields(expect_object(layout, "layout"), "layout", *LAYOUT_FIELDS)
    groups = layout.get("groups")
    if not isinstance(groups, list):
        raise ConfigError("layout.groups must be a list")
    speculative = layout.get("speculative")
    try:
        keying = ref.DraftKeying(speculative) if speculative is not None else None
    except ValueError as error:
        raise ConfigError(f"bad speculative keying {speculative!r}") from error
    limit = layout.get("max_model_len")
    unit = layout.get("hit_unit")
    chosen = {k: v for k, v in (profiles or {}).items() if k in PROFILE_FIELDS}
    return ref.CacheConfig(
        tuple(group_from_json(g) for g in groups),
        num_blocks,
        speculative=keying,
        max_model_len=None if limit is None else _int(limit, "max_model_len"),
        draft_reach=_int(layout.get("draft_reach", 1), "draft_reach"),
        hit_unit=None if unit is None else _int(unit, "hit_unit"),
        **chosen,
    )


def extra_from_json(obj: JSON) -> ExtraKey:
    try:
        return ExtraKey(ExtraKind(obj["kind"]), obj["value"], obj.get("start", 0), obj.get("end"))
    except (KeyError, ValueError, TypeError) as error:
        raise ConfigError(f"bad extra key {obj!r}: {error}") from error


def tables_json(tables: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    return [list(t) for t in tables]


class ReferenceSession:
    """One reference allocator answering the alloc suite's JSON operations."""

    def __init__(
        self,
        layout: JSON,
        num_blocks: int,
        profiles: Mapping[str, Any] | None = None,
    ) -> None:
        config = config_from_json(layout, num_blocks, profiles)
        self.manager: KVCacheManager | RadixCacheManager
        if config.eviction is ref.Eviction.RADIX:  # §13: SGLang's tree, its own allocator
            self.manager = RadixCacheManager(config)
        else:
            self.manager = KVCacheManager(config)

    def apply(self, op: JSON) -> JSON:
        """Run one operation; reference errors become {"refused": true}."""
        try:
            check_op_fields(op)
            return self._apply(op)
        except (KVCacheError, InputError):
            return REFUSED

    def _apply(self, op: JSON) -> JSON:
        manager = self.manager
        kind = op.get("op")
        if kind == "admit":
            result = manager.admit(
                op["rid"],
                op["tokens"],
                _int(op["budget"], "budget"),
                [extra_from_json(e) for e in op.get("extras", ())],
                _int(op.get("lookahead", 0), "lookahead"),
                checkpoint=_int(op.get("checkpoint", 0), "checkpoint"),
            )
            if isinstance(result, Waiting):
                return {"waiting": {"needed": result.needed, "free": result.free}}
            admitted: JSON = {
                "hit": result.hit,
                "scheduled": result.scheduled,
                "tables": tables_json(manager.block_tables(op["rid"])),
            }
            if result.copies:  # `unit U`: ALLOC-UNIT-3's copies
                admitted["copies"] = [list(c) for c in result.copies]
            return {"admitted": admitted}
        if kind == "extend":
            result = manager.extend(
                op["rid"],
                _int(op["budget"], "budget"),
                op.get("appended", ()),
                _int(op.get("lookahead", 0), "lookahead"),
                checkpoint=_int(op.get("checkpoint", 0), "checkpoint"),
            )
            if isinstance(result, Waiting):
                return {"waiting": {"needed": result.needed, "free": result.free}}
            tables = tables_json(manager.block_tables(op["rid"]))
            extended: JSON = {"scheduled": result.scheduled, "tables": tables}
            if result.copies:  # `unit U`: ALLOC-UNIT-4's copies
                extended["copies"] = [list(c) for c in result.copies]
            return {"extended": extended}
        if kind == "end_step":
            return {"step_ended": {"registered": manager.end_step()}}
        if kind in ("finish", "preempt"):
            release = manager.finish if kind == "finish" else manager.preempt
            return {"released": {"blocks": release(op["rid"])}}
        if kind == "reset_cache":
            return {"cache_reset": {"done": manager.reset_prefix_cache()}}
        raise RequestStateError(f"unknown operation {op!r}")


def check_view(config: ref.CacheConfig, num_tokens: object, cached: list[frozenset[int]]) -> int:
    """The reference's checks on a hit query: a cache it could hold for this request."""
    tokens = _int(num_tokens, "num_tokens")
    if tokens < 1 or (config.max_model_len is not None and tokens > config.max_model_len):
        raise RequestStateError(f"num_tokens={tokens} is not a valid request length")
    if len(cached) != len(config.groups):
        raise RequestStateError("one cached entry per group is required")
    for group, blocks in zip(config.groups, cached, strict=True):
        never = group.kind is ref.Kind.CROSS or (
            group.kind is ref.Kind.MAMBA and group.mode is ref.MambaMode.NONE
        )
        if blocks and never:
            raise RequestStateError(f"group {group.name!r} never holds cached blocks")
        if any(not 0 <= j < keyable_blocks(config, group, tokens) for j in blocks):
            raise RequestStateError(f"group {group.name!r}: cached block outside the request")
    return tokens


# --- page plans from the same JSON (no spec types in between) -----------------------------


def _ref_layer(obj: JSON) -> planner.LayerShape:
    kind = obj["kind"]
    if kind == "mamba":
        return planner.StateShape(
            tuple((tuple(t["shape"]), t["dtype"]) for t in obj["tensors"]), name=obj.get("name", "")
        )
    if "latent_size" in obj:
        return planner.LatentShape(
            ref.Kind(kind),
            obj["latent_size"],
            obj.get("rope_size", 0),
            window=obj.get("window", 0),
            ratio=obj.get("ratio", 1),
            draft=obj.get("draft", False),
            name=obj.get("name", ""),
        )
    return planner.AttentionShape(
        ref.Kind(kind),
        obj["num_kv_heads"],
        obj["head_size_k"],
        obj["head_size_v"],
        window=obj.get("window", 0),
        chunk=obj.get("chunk", 0),
        draft=obj.get("draft", False),
        name=obj.get("name", ""),
    )


def reference_request(obj: JSON) -> planner.PlanRequest:
    """kvcert.reference's plan request straight from plan-input JSON (no spec code involved).

    Raises ConfigError on values the planner refuses, and KeyError, TypeError or ValueError on
    malformed JSON; `plan_input_from_json` gives the readable message for the latter.
    """
    check_plan_fields(obj)
    kernel = obj.get("kernel", {})
    return planner.PlanRequest(
        tuple(_ref_layer(x) for x in obj["layers"]),
        obj["kv_cache_dtype"],
        obj["memory_bytes"],
        block_size=obj.get("block_size", 16),
        multiple=kernel.get("multiple", 16),
        maximum=kernel.get("maximum", 4096),
        mamba_mode=ref.MambaMode(obj.get("mamba_mode", "align")),
        state_chunk=obj.get("state_chunk", 1),
        group_padding=Fraction(obj.get("group_padding", "1/20")),
        speculative=ref.DraftKeying(obj["speculative"]) if obj.get("speculative") else None,
        objective=planner.Objective(obj.get("objective", "balanced")),
        capacity_share=Fraction(obj.get("capacity_share", "19/20")),
    )


def reference_plan(obj: JSON) -> planner.CachePlan:
    """Plan with kvcert.reference straight from plan-input JSON; raises ConfigError when no
    layout exists (and what `reference_request` raises)."""
    return planner.plan_cache(reference_request(obj))


def reference_plan_to_json(plan: planner.CachePlan) -> JSON:
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
    except (ConfigError, InputError, KeyError, TypeError, ValueError, AttributeError):
        return None


# --- the engine ---------------------------------------------------------------------------


def cached_sets(case: JSON) -> list[frozenset[int]]:
    """A hit case's cached block indices, per group."""
    return [from_ranges(ranges) for ranges in case["cached"]]


class ReferenceEngine:
    """kvcert.reference: hits through its coordinator, traces through KVCacheManager."""

    def describe(self) -> JSON:
        return claims_everything("kvcert.reference")

    def open(self, case: JSON) -> Session:
        """A session for an alloc case (its layout, pool and profile), an op at a time."""
        return ReferenceSession(case["layout"], case["num_blocks"], case)

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "page":
            return safe_reference_plan(case["plan"]) or REFUSED
        try:
            if case["suite"] == "hit":
                return self._hit(case)
            session = self.open(case)
        except (KVCacheError, InputError):
            return REFUSED
        return {"observations": [session.apply(op) for op in case["ops"]]}

    def _hit(self, case: JSON) -> JSON:
        config = config_from_json(case["layout"], 2)
        if all(g.kind is ref.Kind.CROSS for g in config.groups):
            raise ConfigError("every group is cross attention: there is no prefix to look up")
        cached = cached_sets(case)
        num_tokens = check_view(config, case["num_tokens"], cached)
        partial = partial_from_json(case.get("partial"), len(config.groups))
        if config.hit_unit is None:
            KVCacheManager(config)  # refuses what the allocator could not manage
            if any(partial):
                raise RequestStateError("partial keys need a layout with a hit_unit")
            keys, served = block_index_cache(config, num_tokens, cached)
            length, tables = find_hit(config, num_tokens, keys, served)
        else:
            unit = config.hit_unit
            unit_keys, unit_served = position_cache(config, unit, num_tokens, cached, partial)
            length, tables = find_unit_hit(config, num_tokens, unit_keys, unit_served)
        return {"hit": length, "blocks": [[None if b == 0 else b - 1 for b in t] for t in tables]}


def block_index_cache(
    config: ref.CacheConfig, num_tokens: int, cached: list[frozenset[int]]
) -> tuple[list[range], list[dict[int, int]]]:
    """A hit case's cache as the search reads it: each group's blocks keyed by their index,
    the cached ones served as block id index + 1 (0 stays the null block)."""
    keys = [range(keyable_blocks(config, g, num_tokens)) for g in config.groups]
    return keys, [{j: j + 1 for j in blocks} for blocks in cached]


def position_cache(
    config: ref.CacheConfig,
    unit: int,
    num_tokens: int,
    cached: list[frozenset[int]],
    partial: tuple[frozenset[int], ...],
) -> tuple[list[range], list[dict[int, int]]]:
    """A `unit U` hit case's cache as find_unit_hit reads it: each group's keys are the
    positions U, 2U, ... it can key, served by the block holding the position's last token
    (block index + 1; 0 stays the null block). Refuses a partial key the group cannot hold."""
    keys, served = [], []
    for group, blocks, positions in zip(config.groups, cached, partial, strict=True):
        size = group.block_size
        keyable = (num_tokens - _reach(config, group)) // unit * unit  # a key's tokens exist
        never = group.kind is ref.Kind.CROSS or group.mode is ref.MambaMode.NONE
        if positions and never:
            raise RequestStateError(f"group {group.name!r} never holds partial keys")
        if any(p % unit or not p % size or not 0 < p <= keyable for p in positions):
            raise RequestStateError(f"group {group.name!r}: a partial key off its unit grid")
        keys.append(range(unit, keyable + 1, unit))
        ends = {(j + 1) * size: j + 1 for j in blocks}
        served.append({**ends, **{p: p // size + 1 for p in positions}})
    return keys, served


def _reach(config: ref.CacheConfig, group: ref.GroupConfig) -> int:
    exact = config.speculative is ref.DraftKeying.EXACT
    return config.draft_reach if exact and group.draft else 0


def keyable_blocks(config: ref.CacheConfig, group: ref.GroupConfig, num_tokens: int) -> int:
    """The group's blocks a request of `num_tokens` can key: under exact draft keying a draft
    group's block also needs the `draft_reach` tokens after it."""
    return (num_tokens - _reach(config, group)) // group.block_size


def make_reference() -> ReferenceEngine:
    """Entry point `reference`."""
    return ReferenceEngine()
