"""A model's plan input from `kvcert plan`'s and `kvcert simulate`'s planner options, and the
plan both commands use: kvcert.reference's, checked equal to kvcert.spec's on every run."""

from __future__ import annotations

import argparse

from kvcert.conformance.arguments import positive_int, positive_number
from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.plans import plan_input_from_json, spec_plan_to_json
from kvcert.conformance.engines.reference_engine import (
    reference_plan,
    reference_plan_to_json,
    reference_request,
)
from kvcert.conformance.tools.catalog import Model
from kvcert.reference.planner import plan_options as reference_options
from kvcert.spec.plan import Objective
from kvcert.spec.plan import plan as spec_plan
from kvcert.spec.plan import plan_options as spec_options

GIB = 1 << 30


class PlanDisagreement(RuntimeError):
    """The reference planner and the spec disagree: a kvcert bug, please report it."""


def plan_input(model: Model, args: argparse.Namespace, dtype: str | None = None) -> JSON:
    """The plan-input JSON for a model and the command's options."""
    kv_dtype = dtype or (model.dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype)
    if args.memory <= 0:
        raise InputError(f"--memory must be a positive number of GiB, got {args.memory}")
    obj: JSON = {
        "layers": list(model.layers),
        "kv_cache_dtype": kv_dtype,
        "memory_bytes": int(args.memory * GIB),
        "block_size": args.block_size,
        "kernel": {"multiple": args.kernel_multiple, "maximum": args.kernel_maximum},
        "mamba_mode": args.mamba_mode,
        "state_chunk": args.state_chunk,
        "group_padding": args.group_padding,
        "objective": args.objective,
        "capacity_share": args.capacity_share,
    }
    speculative = args.speculative or model.speculative
    if speculative is not None:
        obj["speculative"] = speculative
    return obj


def checked_plan(obj: JSON) -> JSON:
    """The reference's plan, after the spec validated the input and agreed with the result."""
    expected = spec_plan_to_json(spec_plan(plan_input_from_json(obj)))
    got = reference_plan_to_json(reference_plan(obj))
    if got != expected:
        raise PlanDisagreement(f"reference {got} != spec {expected}")
    return got


def checked_options(obj: JSON) -> list[JSON]:
    """Every plan the objective weighed (PAGE-ALIGN-2), finest alignment first: the
    reference's, after the spec agreed with each."""
    expected = [spec_plan_to_json(x) for x in spec_options(plan_input_from_json(obj))]
    got = [reference_plan_to_json(x) for x in reference_options(reference_request(obj))]
    if got != expected:
        raise PlanDisagreement(f"reference options {got} != spec {expected}")
    return got


def gibibytes(text: str) -> float:
    """`--memory`: a positive, finite number of GiB."""
    return positive_number(text, "number of GiB")


def add_plan_options(parser: argparse.ArgumentParser, memory: float = 40.0) -> None:
    """The planner's options (shared by `kvcert plan` and `kvcert simulate`)."""
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto (the model's dtype), fp32, fp16, bf16, fp8, int8, fp8_per_token_head, "
        "int8_per_token_head",
    )
    parser.add_argument("--memory", type=gibibytes, default=memory, help="KV-cache GiB per worker")
    parser.add_argument("--block-size", type=positive_int, default=16, help="requested block size")
    parser.add_argument(
        "--kernel-multiple", type=positive_int, default=16, help="block sizes' multiple"
    )
    parser.add_argument(
        "--kernel-maximum", type=positive_int, default=4096, help="largest block size"
    )
    parser.add_argument("--mamba-mode", default="align", help="none, align or all")
    parser.add_argument(
        "--state-chunk", type=positive_int, default=1, help="mode all: checkpoint step"
    )
    parser.add_argument(
        "--group-padding", default="1/20", help="most empty layer slots accepted for fewer groups"
    )
    parser.add_argument("--speculative", help="exact or drop (for models with draft layers)")
    parser.add_argument(
        "--objective",
        default=Objective.BALANCED.value,
        choices=[x.value for x in Objective],
        help="what the plan maximises (PAGE-OBJ-1): capacity (most tokens), balanced (finest "
        "hit alignment within --capacity-share of the most tokens; the default) or alignment "
        "(finest hits)",
    )
    parser.add_argument(
        "--capacity-share",
        default="19/20",
        help="objective balanced: the least share of the most capacity to keep (default 19/20)",
    )
