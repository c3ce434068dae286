"""`kvcert plan`: the page plan of a model, as a table or JSON, with comparisons.

The plan comes from kvcert.reference's planner and is checked equal to kvcert.spec's on every
run (a disagreement is a kvcert bug and exits 3), and so is every option the objective
weighed: the trade-off table shows, per hit alignment, the block sizes, padding, capacity and
the tokens a lookup recomputes (PAGE-RECOMP-1), which option each objective picks, and vLLM's
plan as a reference row where kvcert's model of vLLM's planner can express the model.
`--compare` adds what vLLM 0.26-0.33 would do with the same input (pad the smaller page, keep
its block size) and, for the per-token-head dtypes, the same model with the plain 1-byte dtype.
"""

from __future__ import annotations

import argparse
import json
import math
from fractions import Fraction

from kvcert.conformance.arguments import output_path_or_stdout
from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.conformance.tools.catalog import Model, load_model, model_names
from kvcert.conformance.tools.model_plan import (
    GIB,
    add_plan_options,
    checked_options,
    checked_plan,
    plan_input,
)
from kvcert.conformance.vllm.planner_model import vllm_padded_plan
from kvcert.reference.planner import Objective, chosen_index, recompute_per_lookup

OBJECTIVES = {
    Objective.CAPACITY: "the most token capacity",
    Objective.BALANCED: "the finest hit alignment within {share} of the most capacity",
    Objective.ALIGNMENT: "the finest hit alignment",
}

PLAIN = {"int8_per_token_head": "int8", "fp8_per_token_head": "fp8"}


def _pct(value: Fraction | float) -> str:
    return f"{float(value) * 100:.1f}%"


def _layers(slots: list[int | None]) -> str:
    text = " ".join("-" if x is None else str(x) for x in slots)
    return text if len(text) <= 40 else text[:37] + "..."


def padding_share(plan: JSON) -> Fraction:
    """Share of one block in every group (empty slots included) that holds no KV."""
    total = sum(len(g["layers"]) for g in plan["groups"]) * plan["page_size"]
    used = sum(
        sum(1 for x in g["layers"] if x is not None) * g["page_bytes"] for g in plan["groups"]
    )
    return 1 - Fraction(used, total)


def chosen_by(options: list[JSON], obj: JSON) -> dict[str, int]:
    """Which option each objective picks (PAGE-OBJ-1), by index into `options`."""
    scores = [(o["hit_alignment"], o["token_capacity"]) for o in options]
    share = Fraction(obj["capacity_share"])
    return {x.value: chosen_index(scores, x, share) for x in Objective}


def _versus(capacity: int, most: int) -> str:
    """A capacity as a change from the most; "-" when nothing counts tokens (a model whose
    every layer keeps a recurrent state stores no per-token KV: PAGE-CAP-1 gives 0)."""
    return _pct(Fraction(capacity - most, most)) if most else "-"


def _capacity(plan: JSON) -> str:
    if plan["token_capacity"] or any(g["kind"] != "mamba" for g in plan["groups"]):
        return f"capacity {plan['token_capacity']:,} tokens"
    return "no per-token KV (state layers only): capacity is counted in requests, not tokens"


def _sizes(plan: JSON) -> str:
    text = " ".join(str(b) for b in sorted({g["block_size"] for g in plan["groups"]}))
    return text if len(text) <= 22 else text[:19] + "..."


def render_tradeoffs(obj: JSON, plan: JSON, options: list[JSON], vllm: JSON) -> list[str]:
    """The trade-off table: every option weighed, the objective's choice marked."""
    share = Fraction(obj["capacity_share"])
    objective = Objective(obj["objective"])
    most = max(o["token_capacity"] for o in options)
    picks = chosen_by(options, obj)
    lines = [
        "",
        f"objective {objective.value}: {OBJECTIVES[objective].format(share=_pct(share))} "
        "(PAGE-OBJ-1; --objective to change)",
        f"{'alignment':>9}  {'block sizes':22} {'padding':>8} {'capacity':>11} {'vs most':>8} "
        f"{'recompute':>9}  chosen by",
    ]
    for i, option in enumerate(options):
        by = [name for name, index in picks.items() if index == i]
        mark = ", ".join(by) + ("  <- this plan" if option == plan else "")
        lines.append(
            f"{option['hit_alignment']:>9}  {_sizes(option):22} "
            f"{_pct(padding_share(option)):>8} {option['token_capacity']:>11,} "
            f"{_versus(option['token_capacity'], most):>8} "
            f"{float(recompute_per_lookup(option['hit_alignment'])):>9.1f}  {mark}".rstrip()
        )
    if "refused" in vllm:
        lines.append(f"{'vLLM':>9}  {vllm['refused']}")  # e.g. a block would split an entry
    else:
        cacheable = [g["block_size"] for g in vllm["groups"] if g["kind"] != "cross"]
        alignment = math.lcm(*cacheable)
        lines.append(
            f"{alignment:>9}  {' '.join(str(b) for b in sorted(set(cacheable))):22} "
            f"{'':>8} {vllm['token_capacity']:>11,} "
            f"{_versus(vllm['token_capacity'], most):>8} "
            f"{float(recompute_per_lookup(alignment)):>9.1f}  vLLM 0.26-0.33 (reference row)"
        )
    lines.append(
        "recompute: reusable tokens a lookup recomputes on average, (alignment - 1) / 2 "
        "(PAGE-RECOMP-1); `kvcert simulate --compare-plans` measures it on a trace"
    )
    return lines


def render(
    model: Model,
    obj: JSON,
    plan: JSON,
    compare: list[tuple[str, JSON]],
    tradeoffs: list[str] | None = None,
) -> str:
    """The readable table."""
    size = len(plan["groups"][0]["layers"])
    lines = [
        f"{model.name}: {len(obj['layers'])} cache layers, kv-cache dtype {obj['kv_cache_dtype']}, "
        f"{obj['memory_bytes'] / GIB:.2f} GiB, requested block size {obj['block_size']}",
        f"page {plan['page_size']:,} B | {len(plan['groups'])} groups of {size} layers "
        f"({size} tensors) | {plan['num_blocks']:,} blocks | {_capacity(plan)} | hit "
        f"alignment {plan['hit_alignment']}",
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
    lines.append(f"{'':>5}  padding over all groups (one block each): {_pct(padding_share(plan))}")
    lines.extend(tradeoffs or [])
    for label, other in compare:
        lines.append("")
        if "refused" in other:
            lines.append(f"{label}: {other['refused']}")
            continue
        blocks = sorted({g["block_size"] for g in other["groups"]})
        change = _versus(other["token_capacity"], plan["token_capacity"])
        lines.append(
            f"{label}: page {other['page_size']:,} B, block sizes {blocks}, "
            f"{other['num_blocks']:,} blocks, capacity {other['token_capacity']:,} tokens "
            f"({'' if change.startswith('-') else '+'}{change} vs this plan)"
        )
    for assumption in model.assumptions:
        lines.append(f"\nnote: this model file holds assumptions: {assumption}")
    if model.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in model.notes)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """The `plan` command."""
    if args.list:
        for name in model_names():
            model = load_model(name)
            print(f"{name:22} {model.description}")
        return 0
    if args.model is None:
        raise InputError("give a MODEL (a bundled name, a model file or a config.json), or --list")
    model = load_model(args.model)
    obj = plan_input(model, args)
    plan = checked_plan(obj)  # PlanDisagreement (a kvcert bug) exits 3 in kvcert.conformance.cli
    options = checked_options(obj)
    vllm = vllm_padded_plan(plan_input_from_json(obj))
    tradeoffs = render_tradeoffs(obj, plan, options, vllm)
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
        picks = chosen_by(options, obj)
        report = {
            "model": model.name,
            "input": obj,
            "plan": plan,
            "options": [
                dict(
                    option,
                    padding=str(padding_share(option)),
                    expected_recompute=str(recompute_per_lookup(option["hit_alignment"])),
                    chosen_by=[k for k, i in picks.items() if i == n],
                )
                for n, option in enumerate(options)
            ],
            "compare": dict(compare),
            "assumptions": list(model.assumptions),
            "notes": list(model.notes),
        }
        text = json.dumps(report, indent=1) + "\n"
        if str(args.json) == "-":
            print(text, end="")
        else:
            args.json.write_text(text, encoding="utf-8")
            print(render(model, obj, plan, compare, tradeoffs), end="")
    else:
        print(render(model, obj, plan, compare, tradeoffs), end="")
    return 0


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
    parser.add_argument(
        "--json", type=output_path_or_stdout, help="write the JSON report here ('-': stdout)"
    )
    parser.set_defaults(run=run)
