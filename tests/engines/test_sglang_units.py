"""The SGLang adapter's `unit U` mapping (conformance/sglang/units.py), checked against the
spec without SGLang: a unit-U case and the block-U case holding the same units get the same
hit, and the per-unit answer read back per block is the spec's (HIT-UNIT-1..4)."""

from __future__ import annotations

from hypothesis import given, settings

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.contract.codec import layout_to_json, to_ranges
from kvcert.conformance.engines.spec_engine import SpecEngine
from kvcert.conformance.sglang import units
from kvcert.spec import CacheView, FullAttention, MambaMode, MambaState, SlidingWindow
from tests.strategies import unit_views


def _sglang_kinds(view: CacheView) -> bool:
    """Layouts SGLang's tree has components for: full, sliding window, Mamba align / all."""
    return all(
        isinstance(g, FullAttention | SlidingWindow)
        or (isinstance(g, MambaState) and g.mode is not MambaMode.NONE and not g.speculative_blocks)
        for g in view.layout.groups
    )


def _case(view: CacheView) -> dict[str, object]:
    return {
        "suite": "hit",
        "layout": layout_to_json(view.layout),
        "num_tokens": view.num_tokens,
        "cached": [to_ranges(sorted(c)) for c in view.cached],
        "partial": [sorted(p) for p in view.partial],
    }


@settings(max_examples=400, deadline=None)
@given(unit_views().filter(_sglang_kinds))
def test_a_unit_case_is_the_block_unit_case_holding_the_same_units(view):
    case = _case(view)
    spec = SpecEngine()
    groups, unit = case["layout"]["groups"], view.layout.hit_unit
    sizes = [g["block_size"] for g in groups]
    assert units.unit_of(case["layout"]) == unit
    assert units.partial_problem(case, groups, sizes, unit) is None
    cached = [set(c) for c in view.cached]
    unit_groups, unit_cached = units.in_units(groups, cached, case["partial"], unit)
    layout = {k: v for k, v in case["layout"].items() if k != "hit_unit"}
    unit_case = {
        "suite": "hit",
        "layout": {**layout, "groups": unit_groups},
        "num_tokens": view.num_tokens,
        "cached": [to_ranges(sorted(c)) for c in unit_cached],
    }
    assert units.to_blocks(spec.run(unit_case), sizes, unit) == spec.run(case)


def test_held_units_and_checkpoints_read_partial_keys_inside_a_block():
    """The docstring's example: B=64, U=16, block 0 cached, partial keys at 96 and 80."""
    assert units.held_units({0}, [96], 64, 16) == {0, 1, 2, 3, 4, 5}
    assert units.checkpoint_units({0}, [80], 64, 16) == {3, 4}
    answer = {"hit": 80, "blocks": [[0, 1, 2, 3, 4], [None, None, None, None, 4]]}
    assert units.to_blocks(answer, [64, 64], 16) == {"hit": 80, "blocks": [[0, 1], [None, 1]]}
    assert units.to_blocks({"unsupported": "why"}, [64], 16) == {"unsupported": "why"}


def _unit_refusals() -> list[dict[str, object]]:
    return [
        case
        for _, case, _ in iter_cases()
        if case is not None
        and case["input"].get("suite") == "hit"
        and case["expect"].get("refused")
        and ("hit_unit" in case["input"]["layout"] or "partial" in case["input"])
    ]


def test_every_unit_refusal_vector_is_refused_and_every_unit_vector_accepted():
    refusals = _unit_refusals()
    assert len(refusals) >= 9  # the refusal suite's unit and partial-key cases
    for case in refusals:
        given_input = case["input"]
        groups = given_input["layout"]["groups"]
        sizes = [g["block_size"] for g in groups]
        unit = units.unit_of(given_input["layout"])
        refused = isinstance(unit, str) or units.partial_problem(given_input, groups, sizes, unit)
        assert refused, case["id"]
    accepted = [
        case["input"]
        for _, case, _ in iter_cases()
        if case is not None
        and case["input"].get("suite") == "hit"
        and "hit_unit" in case["input"]["layout"]
        and not case["expect"].get("refused")
    ]
    assert len(accepted) >= 200
    for given_input in accepted:
        groups = given_input["layout"]["groups"]
        sizes = [g["block_size"] for g in groups]
        unit = units.unit_of(given_input["layout"])
        assert isinstance(unit, int)
        assert units.partial_problem(given_input, groups, sizes, unit) is None
