"""Engines the runner can certify, and how it finds them.

An engine is any object with `describe() -> dict` and `run(case) -> dict`, both plain JSON:

    describe() -> {"name": ..., "version": ..., "features": [...], "profiles": [...]}
    run({"suite": "hit", "layout": {...}, "num_tokens": n, "cached": [[[start, stop], ...], ...]})
        -> {"hit": L, "blocks": [[j or null, ...], ...]}
    run({"suite": "alloc", "layout": {...}, "num_blocks": N, "ops": [{...}, ...]})
        -> {"observations": [{...} or {"refused": true}, ...]}
    run({"suite": "page", "plan": {...}})   (kvcert.conformance.planning)
        -> {"page_size": P, "num_blocks": N, "token_capacity": T, "hit_alignment": A,
            "groups": [{"kind", "layers", "block_size", "page_bytes", "draft"}, ...]}

Engines are found by name through the `kvcert.engines` entry points (`reference`, `spec` ship
with kvcert) or as `module:factory`. Out-of-process engines speak the same messages over
stdio (kvcert.conformance.stdio).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points, version
from typing import Any, Protocol, runtime_checkable

from kvcert.conformance.codec import (
    JSON,
    REFUSED,
    eviction_from_json,
    from_ranges,
    layout_from_json,
    observation_to_json,
    op_from_json,
)
from kvcert.conformance.planning import (
    plan_input_from_json,
    safe_reference_plan,
    spec_plan_to_json,
)
from kvcert.conformance.reference_engine import ReferenceSession, check_view, config_from_json
from kvcert.conformance.scenario import ScenarioError
from kvcert.reference.coordinator import find_hit
from kvcert.reference.errors import KVCacheError
from kvcert.reference.manager import KVCacheManager
from kvcert.spec import CacheView, SpecError, hybrid_hit
from kvcert.spec import alloc as spec
from kvcert.spec.invariants import violated
from kvcert.spec.plan import plan

FEATURES = (
    "kind.full",
    "kind.sliding_window",
    "kind.chunked_local",
    "kind.mamba.none",
    "kind.mamba.align",
    "kind.mamba.all",
    "kind.cross",
    "speculative.exact",
    "speculative.drop",
    "extras.cache_salt",
    "extras.lora",
    "extras.encoder_input",
    "extras.multimodal",
    "extras.prompt_embeds",
    "alloc.lookahead",
    "alloc.preempt",
    "alloc.reset_cache",
    "page.plan",
)
PROFILES = ("eviction.lru", "eviction.hybrid", "eviction.lru-unkeyed-first")


class EngineError(Exception):
    """The engine could not be loaded or answered outside the protocol."""


@runtime_checkable
class Engine(Protocol):
    """What the runner drives."""

    def describe(self) -> JSON: ...

    def run(self, case: JSON) -> JSON: ...


def _cached(case: JSON) -> tuple[frozenset[int], ...]:
    return tuple(from_ranges(ranges) for ranges in case["cached"])


def describe_builtin(name: str) -> JSON:
    """The bundled engines implement every feature and both eviction profiles."""
    return {
        "name": name,
        "version": version("kvcert"),
        "features": list(FEATURES),
        "profiles": list(PROFILES),
    }


class SpecEngine:
    """The executable spec as an engine: the vectors' own oracle, used for the coverage gate."""

    def describe(self) -> JSON:
        return describe_builtin("kvcert.spec")

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "page":
            try:
                return spec_plan_to_json(plan(plan_input_from_json(case["plan"])))
            except (SpecError, ScenarioError):
                return REFUSED
        try:
            layout = layout_from_json(case["layout"])
            if case["suite"] == "hit":
                view = CacheView(layout, case["num_tokens"], _cached(case))
                hit = hybrid_hit(view)
                return {"hit": hit.length, "blocks": [list(b) for b in hit.blocks]}
            eviction = eviction_from_json(case.get("eviction"))
            state = spec.initial_state(spec.PoolConfig(layout, case["num_blocks"], eviction))
        except (SpecError, ScenarioError):
            return REFUSED
        observations = []
        for op in case["ops"]:
            try:
                state, observation = spec.step(state, op_from_json(op))
            except (SpecError, ScenarioError):
                observations.append(REFUSED)
                continue
            if broken := violated(state):  # pragma: no cover - the spec keeps its invariants
                raise EngineError(f"the spec broke its own invariants {broken} after {op}")
            observations.append(observation_to_json(observation))
        return {"observations": observations}


class ReferenceEngine:
    """kvcert.reference: hits through its coordinator, traces through KVCacheManager."""

    def describe(self) -> JSON:
        return describe_builtin("kvcert.reference")

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "page":
            return safe_reference_plan(case["plan"]) or REFUSED
        try:
            if case["suite"] == "hit":
                return self._hit(case)
            session = ReferenceSession(
                case["layout"], case["num_blocks"], case.get("eviction", "lru")
            )
        except KVCacheError:
            return REFUSED
        return {"observations": [session.apply(op) for op in case["ops"]]}

    def _hit(self, case: JSON) -> JSON:
        config = config_from_json(case["layout"], 2)
        KVCacheManager(config)  # refuses layouts it cannot manage (cross attention only)
        cached = list(_cached(case))
        num_tokens = check_view(config, case["num_tokens"], cached)
        length, tables = find_hit(
            config, num_tokens, lambda g, j: j + 1 if j in cached[g] else None
        )
        return {"hit": length, "blocks": [[None if b == 0 else b - 1 for b in t] for t in tables]}


def make_reference() -> ReferenceEngine:
    """Entry point `reference`."""
    return ReferenceEngine()


def make_spec() -> SpecEngine:
    """Entry point `spec`."""
    return SpecEngine()


def load_engine(name: str) -> Engine:
    """An engine from an entry-point name or `module:factory`."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            factory: Any = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise EngineError(f"cannot load engine {name!r}: {error}") from error
    else:
        found = entry_points(group="kvcert.engines", name=name)
        if not found:
            known = sorted(e.name for e in entry_points(group="kvcert.engines"))
            raise EngineError(
                f"no engine named {name!r}; installed: {known}, or give module:factory"
            )
        factory = next(iter(found)).load()
    engine = factory()
    if not isinstance(engine, Engine):
        raise EngineError(f"{name!r} made {engine!r}, which has no describe()/run()")
    return engine
