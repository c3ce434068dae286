"""kvcert.spec as a conformance engine: the vectors' own oracle, used for the coverage gate.

It answers through the spec's functions and the contract's codec, and checks the spec's
invariants (§7) after every operation: a violation is a kvcert bug, raised as an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcert.conformance.contract.codec import (
    JSON,
    REFUSED,
    InputError,
    eviction_from_json,
    from_ranges,
    layout_from_json,
    observation_to_json,
    op_from_json,
    partial_from_json,
    retention_from_json,
    retention_interval_from_json,
    visibility_from_json,
)
from kvcert.conformance.contract.plans import plan_input_from_json, spec_plan_to_json
from kvcert.conformance.contract.protocol import EngineError, claims_everything
from kvcert.spec import CacheView, SpecError, hybrid_hit, radix
from kvcert.spec import alloc as spec
from kvcert.spec.invariants import violated
from kvcert.spec.plan import plan


def refused(error: Exception) -> JSON:
    """The spec's refusal, with its reason (compared as a refusal; the reason is for people)."""
    return {**REFUSED, "reason": str(error)}


class SpecEngine:
    """The executable spec as an engine."""

    def describe(self) -> JSON:
        return claims_everything("kvcert.spec")

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "page":
            try:
                return spec_plan_to_json(plan(plan_input_from_json(case["plan"])))
            except (SpecError, InputError) as error:
                return refused(error)
        try:
            layout = layout_from_json(case["layout"])
            if case["suite"] == "hit":
                cached = tuple(from_ranges(ranges) for ranges in case["cached"])
                partial = partial_from_json(case.get("partial"), len(cached))
                hit = hybrid_hit(CacheView(layout, case["num_tokens"], cached, partial))
                return {"hit": hit.length, "blocks": [list(b) for b in hit.blocks]}
            config = spec.PoolConfig(
                layout,
                case["num_blocks"],
                eviction_from_json(case.get("eviction")),
                visibility_from_json(case.get("visibility")),
                retention_from_json(case.get("retention")),
                retention_interval_from_json(case.get("retention_interval")),
            )
            machine = Machine.of(config)
            state = machine.initial_state(config)
        except (SpecError, InputError) as error:
            return refused(error)
        observations = []
        for op in case["ops"]:
            try:
                state, observation = machine.step(state, op_from_json(op))
            except (SpecError, InputError) as error:
                observations.append(refused(error))
                continue
            if broken := machine.violated(state):  # pragma: no cover - the spec keeps them
                raise EngineError(f"the spec broke its own invariants {broken} after {op}")
            observations.append(observation_to_json(observation))
        return {"observations": observations}


@dataclass(frozen=True)
class Machine:
    """The spec's allocator for a configuration: §6's block pool, or §13's radix tree."""

    initial_state: Callable[[spec.PoolConfig], Any]
    step: Callable[[Any, spec.Op], tuple[Any, spec.Observation]]
    violated: Callable[[Any], list[str]]

    @staticmethod
    def of(config: spec.PoolConfig) -> Machine:
        if config.eviction is spec.Eviction.RADIX:
            return Machine(radix.initial_state, radix.step, radix.violated)
        return Machine(spec.initial_state, spec.step, violated)


def make_spec() -> SpecEngine:
    """Entry point `spec`."""
    return SpecEngine()
