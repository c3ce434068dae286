"""kvcert.reference's planner against kvcert.spec's plan on random layer mixes."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings

from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.contract.plans import plan_input_from_json, spec_plan_to_json
from kvcert.conformance.engines.reference_engine import (
    reference_plan,
    reference_plan_to_json,
    safe_reference_plan,
)
from kvcert.reference import planner as ref
from kvcert.reference.config import Kind
from kvcert.reference.errors import ConfigError
from kvcert.spec import SpecError
from kvcert.spec.plan import plan
from tests.strategies import plan_inputs
from tests.tiers import tiered


def spec_answer(obj):
    try:
        return spec_plan_to_json(plan(plan_input_from_json(obj)))
    except (InputError, SpecError):
        return None


@settings(max_examples=tiered(600, 6000))
@given(plan_inputs())
def test_reference_plans_equal_the_spec_or_both_refuse(obj):
    assert safe_reference_plan(obj) == spec_answer(obj)


def test_the_differential_sees_both_plans_and_refusals():
    """The strategy is not vacuous: it reaches plans and refusals of each kind."""
    outcomes = set()

    @settings(max_examples=tiered(300, 3000), database=None)
    @given(plan_inputs())
    def sample(obj):
        answer = spec_answer(obj)
        outcomes.add("plan" if answer else "refused")
        if answer:
            outcomes.update(g["kind"] for g in answer["groups"])
            if len({g["block_size"] for g in answer["groups"]}) > 1:
                outcomes.add("mixed block sizes")

    sample()
    assert outcomes >= {"plan", "refused", "mamba", "full", "sliding_window", "mixed block sizes"}


def test_a_plan_becomes_an_allocator_config():
    obj = {
        "layers": [
            {"kind": "sliding_window", "num_kv_heads": 8, "head_size_k": 64, "head_size_v": 64,
             "window": 128},
            {"kind": "full", "num_kv_heads": 8, "head_size_k": 64, "head_size_v": 64,
             "draft": True},
        ],
        "kv_cache_dtype": "bf16",
        "memory_bytes": 1 << 24,
        "speculative": "exact",
    }  # fmt: skip
    chosen = reference_plan(obj)
    config = chosen.cache_config(max_model_len=4096)
    assert [g.kind for g in config.groups] == [Kind.SLIDING_WINDOW, Kind.FULL]
    assert config.groups[1].draft
    assert config.num_blocks == chosen.num_blocks
    assert chosen.padding(chosen.groups[0]) == 0
    assert reference_plan_to_json(chosen)["hit_alignment"] == 16


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ref.AttentionShape(Kind.MAMBA, 1, 1, 1), "not an attention kind"),
        (lambda: ref.AttentionShape(Kind.FULL, 1, 1, 1, window=3), "window exactly"),
        (lambda: ref.AttentionShape(Kind.FULL, 1, 1, 1, chunk=3), "chunk exactly"),
        (lambda: ref.LatentShape(Kind.CROSS, 1, 0), "full or sliding_window"),
        (lambda: ref.LatentShape(Kind.FULL, 1, -1), "rope_size must be >= 0"),
        (lambda: ref.LatentShape(Kind.FULL, 1, 0.5), "rope_size must be an integer"),
        (lambda: ref.LatentShape(Kind.FULL, 1, 0, window=4), "window exactly"),
        (lambda: ref.StateShape(()), "at least one tensor"),
        (lambda: ref.StateShape((((), "fp32"),)), "needs a shape"),
        (lambda: ref.StateShape((((4,), "int8"),)), "state dtype"),
        (lambda: ref.PlanRequest((), "fp8", 1), "at least one layer"),
        (lambda: ref.PlanRequest((ref.StateShape((((4,), "fp32"),)),), "fp4", 1), "dtype"),
        (
            lambda: ref.PlanRequest(
                (ref.StateShape((((4,), "fp32"),)),), "fp8", 1, multiple=32, maximum=16
            ),
            "below the multiple",
        ),
        (
            lambda: ref.PlanRequest((ref.StateShape((((4,), "fp32"),)),), "fp8", 1, block_size=24),
            "multiples of 16",
        ),
        (
            lambda: ref.PlanRequest(
                (ref.StateShape((((4,), "fp32"),)),), "fp8", 1, group_padding=2
            ),
            "group_padding",
        ),
    ],
)
def test_reference_refuses_malformed_inputs_with_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_reference_refuses_a_state_only_anchor_beyond_the_maximum():
    state = ref.StateShape((((4,), "fp32"),))
    request = ref.PlanRequest((state,), "fp8", 1 << 20, mamba_mode=ref.MambaMode.ALL,
                              state_chunk=5000)  # fmt: skip
    with pytest.raises(ref.PlanError, match="multiple of 10000"):
        ref.plan_cache(request)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"objective": "fastest"}, "objective must be one of capacity"),
     ({"mamba_mode": "sometimes"}, "mamba_mode must be one of"),
     ({"capacity_share": Fraction(0)}, "capacity_share must be in")],
)  # fmt: skip
def test_reference_refuses_bad_objectives(fields, message):
    layers = (ref.AttentionShape(Kind.FULL, 8, 64, 64),)
    with pytest.raises(ConfigError, match=message):
        ref.PlanRequest(layers, "fp8", 1 << 20, **fields)
