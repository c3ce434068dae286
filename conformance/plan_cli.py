"""`kvcert plan`: the page plan of a model, as a table or JSON, with comparisons.

The plan comes from kvcert.reference's planner and is checked equal to kvcert.spec's on every
run (a disagreement is a kvcert bug and exits 3). `--compare` adds what vLLM 0.26-0.33 would
do with the same input (pad the smaller page, keep its block size) and, for the per-token-head
dtypes, the same model with the plain 1-byte dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from pathlib import Path

from kvcert.conformance.catalog import Model, load_model, model_names
from kvcert.conformance.planning import (
    JSON,
    plan_input_from_json,
    reference_plan,
    reference_plan_to_json,
    spec_plan_to_json,
    vllm_padded_plan,
)
from kvcert.conformance.scenario import ScenarioError
from kvcert.spec.plan import plan as spec_plan

GIB = 1 << 30
PLAIN = {"int8_per_token_head": "int8", "fp8_per_token_head": "fp8"}


class PlanDisagreement(RuntimeError):
    """The reference planner and the spec disagree: a kvcert bug, please report it."""


def plan_input(model: Model, args: argparse.Namespace, dtype: str | None = None) -> JSON:
    """The plan-input JSON for a model and the command's options."""
    kv_dtype = dtype or (model.dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype)
    if args.memory <= 0:
        raise ScenarioError(f"--memory must be a positive number of GiB, got {args.memory}")
    obj: JSON = {
        "layers": list(model.layers),
        "kv_cache_dtype": kv_dtype,
        "memory_bytes": int(args.memory * GIB),
        "block_size": args.block_size,
        "kernel": {"multiple": args.kernel_multiple, "maximum": args.kernel_maximum},
        "mamba_mode": args.mamba_mode,
        "state_chunk": args.state_chunk,
        "group_padding": args.group_padding,
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


def _pct(value: Fraction | float) -> str:
    return f"{float(value) * 100:.1f}%"


def _layers(slots: list[int | None]) -> str:
    text = " ".join("-" if x is None else str(x) for x in slots)
    return text if len(text) <= 40 else text[:37] + "..."


def render(model: Model, obj: JSON, plan: JSON, compare: list[tuple[str, JSON]]) -> str:
    """The readable table."""
    size = len(plan["groups"][0]["layers"])
    lines = [
        f"{model.name}: {len(obj['layers'])} cache layers, kv-cache dtype {obj['kv_cache_dtype']}, "
        f"{obj['memory_bytes'] / GIB:.2f} GiB, requested block size {obj['block_size']}",
        f"page {plan['page_size']:,} B | {len(plan['groups'])} groups of {size} layers "
        f"({size} tensors) | {plan['num_blocks']:,} blocks | capacity "
        f"{plan['token_capacity']:,} tokens | hit alignment {plan['hit_alignment']}",
        "",
        f"{'group':>5}  {'kind':15} {'layers':40} {'block':>6} {'page bytes':>11} {'padding':>8}",
    ]
    for i, group in enumerate(plan["groups"]):
        used = sum(1 for x in group["layers"] if x is not None) * group["page_bytes"]
        padding = 1 - Fraction(used, len(group["layers"]) * plan["page_size"])
        kind = group["kind"] + (" (draft)" if group["draft"] else "")
        lines.append(
            f"{i:>5}  {kind:15} {_layers(group['layers']):40} {group['block_size']:>6} "
            f"{group['page_bytes']:>11,} {_pct(padding):>8}"
        )
    total = sum(len(g["layers"]) for g in plan["groups"]) * plan["page_size"]
    used = sum(
        sum(1 for x in g["layers"] if x is not None) * g["page_bytes"] for g in plan["groups"]
    )
    lines.append(
        f"{'':>5}  padding over all groups (one block each): {_pct(1 - Fraction(used, total))}"
    )
    for label, other in compare:
        lines.append("")
        if "refused" in other:
            lines.append(f"{label}: {other['refused']}")
            continue
        change = Fraction(other["token_capacity"] - plan["token_capacity"], plan["token_capacity"])
        blocks = sorted({g["block_size"] for g in other["groups"]})
        lines.append(
            f"{label}: page {other['page_size']:,} B, block sizes {blocks}, "
            f"{other['num_blocks']:,} blocks, capacity {other['token_capacity']:,} tokens "
            f"({'+' if change >= 0 else ''}{_pct(change)} vs this plan)"
        )
    for assumption in model.assumptions:
        lines.append(f"\nnote: this model file holds assumptions: {assumption}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """The `plan` command."""
    if args.list:
        for name in model_names():
            model = load_model(name)
            print(f"{name:22} {model.description}")
        return 0
    if args.model is None:
        raise ScenarioError(
            "give a MODEL (a bundled name, a model file or a config.json), or --list"
        )
    model = load_model(args.model)
    obj = plan_input(model, args)
    try:
        plan = checked_plan(obj)
    except PlanDisagreement as error:
        print(f"kvcert: internal error, please report: {error}", file=sys.stderr)
        return 3
    compare: list[tuple[str, JSON]] = []
    if args.compare:
        compare.append(
            ("vLLM 0.26-0.33 (pad the smaller page)", vllm_padded_plan(plan_input_from_json(obj)))
        )
        plain = PLAIN.get(obj["kv_cache_dtype"])
        if plain is not None:
            compare.append(
                (f"this planner with plain {plain}", checked_plan(plan_input(model, args, plain)))
            )
    if args.json is not None:
        report = {
            "model": model.name,
            "input": obj,
            "plan": plan,
            "compare": dict(compare),
            "assumptions": list(model.assumptions),
        }
        text = json.dumps(report, indent=1) + "\n"
        if str(args.json) == "-":
            print(text, end="")
        else:
            args.json.write_text(text, encoding="utf-8")
            print(render(model, obj, plan, compare), end="")
    else:
        print(render(model, obj, plan, compare), end="")
    return 0


def add_plan_options(parser: argparse.ArgumentParser, memory: float = 40.0) -> None:
    """The planner's options (shared by `kvcert plan` and `kvcert simulate`)."""
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto (the model's dtype), fp32, fp16, bf16, fp8, int8, fp8_per_token_head, "
        "int8_per_token_head",
    )
    parser.add_argument("--memory", type=float, default=memory, help="KV-cache GiB per worker")
    parser.add_argument("--block-size", type=int, default=16, help="requested block size")
    parser.add_argument("--kernel-multiple", type=int, default=16, help="block sizes' multiple")
    parser.add_argument("--kernel-maximum", type=int, default=4096, help="largest block size")
    parser.add_argument("--mamba-mode", default="align", help="none, align or all")
    parser.add_argument("--state-chunk", type=int, default=1, help="mode all: checkpoint step")
    parser.add_argument(
        "--group-padding", default="1/20", help="most empty layer slots accepted for fewer groups"
    )
    parser.add_argument("--speculative", help="exact or drop (for models with draft layers)")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert plan`."""
    parser = commands.add_parser(
        "plan",
        help="plan a model's KV-cache groups, block sizes and shared page size",
        description="Plan the KV cache of a model (a bundled name, a kvcert model file, or a "
        "Hugging Face config.json): groups, layers, block sizes, page bytes, padding, token "
        "capacity and hit alignment. The spec's rules PAGE-* decide; see spec/RULES.md.",
    )
    parser.add_argument("model", nargs="?", help="bundled model name, model file or config.json")
    parser.add_argument("--list", action="store_true", help="list the bundled models")
    add_plan_options(parser)
    parser.add_argument("--compare", action="store_true", help="add vLLM's padding and plain dtype")
    parser.add_argument("--json", type=Path, help="write the JSON report here ('-': stdout)")
    parser.set_defaults(run=run)
