"""The `kvcert simulate` command: arguments, report table, JSON and PNG plot."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from kvcert.conformance.arguments import (
    non_negative_int,
    output_path,
    positive_int,
    positive_number,
    positive_seconds,
)
from kvcert.conformance.certify.runner import call_with_timeout
from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.protocol import Engine
from kvcert.conformance.engines.loader import load_engine
from kvcert.conformance.engines.reference_engine import reference_plan
from kvcert.conformance.tools.catalog import load_model
from kvcert.conformance.tools.model_plan import add_plan_options, checked_plan, plan_input
from kvcert.conformance.tools.simulate import traces
from kvcert.conformance.tools.simulate.model import (
    Comparison,
    Policy,
    Run,
    by_label,
    compare,
    group_counts,
    layout_json,
)
from kvcert.reference.config import BLOCK_POOL_EVICTIONS, CacheConfig, Eviction, Kind
from kvcert.reference.planner import Objective
from kvcert.reference.scheduling import Placement


def _listed(text: str, choices: Sequence[str], what: str) -> list[str]:
    values = [item.strip() for item in text.split(",")]
    for value in values:
        if value not in choices:
            raise InputError(f"--{what}: {value!r} is not one of {', '.join(choices)}")
    return values


def load_input(args: argparse.Namespace) -> tuple[str, JSON]:
    """The model's plan input (from MODEL or a `kvcert plan` report)."""
    if args.plan is not None:
        try:
            report = json.loads(Path(args.plan).read_text(encoding="utf-8"))
            obj, name = report["input"], report.get("model", str(args.plan))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(
                f"--plan {args.plan}: not a `kvcert plan --json` report ({error})"
            ) from error
    elif args.model is not None:
        model = load_model(args.model)
        obj, name = plan_input(model, args), model.name
    else:
        raise InputError("give a MODEL (bundled name, model file, config.json) or --plan FILE")
    return name, obj


def load_config(args: argparse.Namespace) -> tuple[str, CacheConfig]:
    """The model's planned allocator configuration (from MODEL or a `kvcert plan` report)."""
    name, obj = load_input(args)
    checked_plan(obj)  # the spec validates the input and agrees with the reference
    return name, reference_plan(obj).cache_config()


def compare_plans(args: argparse.Namespace, engine: Engine | None) -> int:
    """`--compare-plans`: one trace under the plan of each objective, in the same memory."""
    objectives = _listed(args.compare_plans, [x.value for x in Objective], "compare-plans")
    if len(objectives) < 2 or len(set(objectives)) < len(objectives):
        raise InputError("--compare-plans: name two or more different objectives")
    if args.pool_requests is not None or engine is not None or args.plot is not None:
        raise InputError(
            "--compare-plans compares plans in one memory size: size the pool with --memory "
            "or --blocks (not --pool-requests), and leave --engine and --plot to single runs"
        )
    name, base = load_input(args)
    trace_name, trace = load_trace(args)
    rows: list[tuple[str, JSON, CacheConfig, Comparison]] = []
    for objective in objectives:
        obj = dict(base, objective=objective)
        plan = checked_plan(obj)
        config = reference_plan(obj).cache_config()
        result = compare(config, trace, policies_of(args, config), num_blocks=args.blocks,
                         budget=args.budget)  # fmt: skip
        rows.append((objective, plan, config, result))
    best = max(u.hit_tokens for *_, result in rows for u in result.unbounded)
    default = Objective.BALANCED.value
    lines = [
        f"kvcert simulate: {name}, trace {trace_name}: {traces.describe(trace)}",
        f"plans compared in one memory size: {rows[0][3].runs[0].num_blocks:,} blocks each "
        f"({base['memory_bytes'] / (1 << 30):.2f} GiB unless --blocks)",
        "",
        "| plan | hit alignment | capacity | policy | token hit rate | hit tokens | recomputed "
        "| lost to alignment | lost to eviction | skipped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    report = []
    for objective, plan, _, result in rows:
        label = objective + (" (default)" if objective == default else "")
        for run, unbounded in zip(result.runs, result.unbounded, strict=True):
            lines.append(
                f"| {label} | {plan['hit_alignment']} | {plan['token_capacity']:,} "
                f"| {run.policy.label} | {_pct(run.hit_tokens, run.prompt_tokens)} "
                f"| {run.hit_tokens:,} | {run.prompt_tokens - run.hit_tokens:,} "
                f"| {best - unbounded.hit_tokens:,} | {unbounded.hit_tokens - run.hit_tokens:,} "
                f"| {len(run.skipped)} |"
            )
            report.append({
                "objective": objective, "hit_alignment": plan["hit_alignment"],
                "token_capacity": plan["token_capacity"], "policy": run.policy.label,
                "num_blocks": run.num_blocks, "hit_tokens": run.hit_tokens,
                "prompt_tokens": run.prompt_tokens, "unbounded_hit_tokens": unbounded.hit_tokens,
                "skipped": len(run.skipped),
            })  # fmt: skip
    lines += [
        "",
        "lost to alignment: hits the finest compared plan gets in an unbounded pool that this "
        "plan's unbounded pool misses;",
        "lost to eviction: this plan's unbounded hits minus its hits; skipped: requests that "
        "do not fit the pool (their tokens count as neither hit nor prompt).",
    ]
    print("\n".join(lines))
    if args.json is not None:
        text = json.dumps({"model": name, "trace": trace_name, "runs": report}, indent=1)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


def load_trace(args: argparse.Namespace) -> tuple[str, list[traces.TraceRequest]]:
    """The trace: a generator by name (with its size options) or a JSONL file."""
    if args.trace == "resend":
        return "resend (A, A, B, A)", traces.resend(args.prompt_tokens, args.output_tokens)
    if args.trace == "shared-prefix":
        trace = traces.shared_prefix(
            args.users, args.prompt_tokens, args.question_tokens, args.output_tokens
        )
        return f"shared-prefix ({args.users} users)", trace
    if args.trace == "agentic":
        trace = traces.agentic(
            args.sessions,
            turns=args.turns,
            system=args.prompt_tokens,
            tool_output=args.tool_tokens,
            output=args.output_tokens,
        )
        return f"agentic ({args.sessions} sessions x {args.turns} turns)", trace
    path = Path(args.trace)
    if not path.exists():
        raise InputError(
            f"--trace {args.trace!r} is neither a generator "
            f"({', '.join(traces.GENERATORS)}) nor a file"
        )
    return path.name, traces.read_jsonl(path)


def policies_of(args: argparse.Namespace, config: CacheConfig) -> list[Policy]:
    """Every eviction x placement asked for; placements matter only with state groups."""
    pool = [e.value for e in BLOCK_POOL_EVICTIONS]  # replayed through KVCacheManager
    evictions = [Eviction(e) for e in _listed(args.eviction, pool, "eviction")]
    chosen = "align,branch" if args.placement is None else args.placement
    placements = [Placement(p) for p in _listed(chosen, [p.value for p in Placement], "placement")]
    if not any(g.kind is Kind.MAMBA for g in config.groups):
        if args.placement is not None:
            print(
                "kvcert simulate: note: --placement chooses where state checkpoints go and "
                "this model has no state groups; it changes nothing here",
                file=sys.stderr,
            )
        return [Policy(e, Placement.ALL, stateful=False) for e in evictions]
    return [Policy(e, p) for p in placements for e in evictions]


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(name: str, trace_name: str, result: Comparison, config: CacheConfig) -> str:
    """The report: summary per policy, per request, evictions per group kind."""
    runs, unbounded = result.runs, result.unbounded
    blocks = runs[0].num_blocks
    groups = ", ".join(f"{label} x{n}" for label, n in group_counts(config).items())
    lines = [
        f"kvcert simulate: {name}, trace {trace_name}: {traces.describe(result.trace)}",
        f"pool: {blocks:,} blocks; one request holds at most {result.working_set:,} "
        f"(the working set), so the pool holds {(blocks - 1) / result.working_set:.2f} of them",
        f"groups: {groups}",
        "",
        "| policy | token hit rate | hit tokens | recomputed | of cacheable | evictions "
        "| dead evictions | skipped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, best in zip(runs, unbounded, strict=True):
        evicted, dead = sum(run.evictions), sum(run.dead_evictions)
        lines.append(
            f"| {run.policy.label} | {_pct(run.hit_tokens, run.prompt_tokens)} "
            f"| {run.hit_tokens:,} | {run.prompt_tokens - run.hit_tokens:,} "
            f"| {_pct(run.hit_tokens, best.hit_tokens)} | {evicted:,} | {dead:,} "
            f"| {len(run.skipped)} |"
        )
    if len(result.trace) <= 16 and not any(r.skipped for r in runs):
        header = " | ".join(f"{r.policy.label} (cacheable)" for r in runs)
        lines += ["", f"| request | prompt | {header} |", "|---|---|" + "---|" * len(runs)]
        for i, request in enumerate(result.trace):
            cells = " | ".join(
                f"{r.hits[i]:,} ({u.hits[i]:,})" for r, u in zip(runs, unbounded, strict=True)
            )
            lines.append(f"| {request.rid} | {len(request.prompt):,} | {cells} |")
    lines += [
        "",
        "evictions per group kind, dead ones (EVICT-DEAD-1) in parentheses:",
        "| group | " + " | ".join(r.policy.label for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    per_run = [(by_label(config, r.evictions), by_label(config, r.dead_evictions)) for r in runs]
    for label in group_counts(config):
        cells = " | ".join(f"{e[label]:,} ({d[label]:,})" for e, d in per_run)
        lines.append(f"| {label} | {cells} |")
    lines += [
        "",
        "cacheable = the hits of the same policy in an unbounded pool (the most any policy gets).",
    ]
    return "\n".join(lines) + "\n"


def report_json(name: str, trace_name: str, result: Comparison, config: CacheConfig) -> JSON:
    """Everything the table shows, for scripts."""

    def run_json(run: Run, best: Run) -> JSON:
        return {
            "policy": run.policy.label,
            "num_blocks": run.num_blocks,
            "hit_tokens": run.hit_tokens,
            "prompt_tokens": run.prompt_tokens,
            "cacheable_tokens": best.hit_tokens,
            "hits": run.hits,
            "cacheable": best.hits,
            "skipped": run.skipped,
            "evictions": by_label(config, run.evictions),
            "dead_evictions": by_label(config, run.dead_evictions),
        }

    return {
        "model": name,
        "trace": trace_name,
        "requests": [r.rid for r in result.trace],
        "working_set_blocks": result.working_set,
        "runs": [run_json(r, u) for r, u in zip(result.runs, result.unbounded, strict=True)],
    }


def plot(path: Path, title: str, result: Comparison) -> None:
    """Two panels: token hit rate per policy against its cacheable rate; hits per request."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional dependency, imported on demand

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as error:
        raise InputError(
            "--plot needs matplotlib: pip install 'kvcert[sim]' (pinned in constraints.txt)"
        ) from error
    figure, (rates, per_request) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [r.policy.label for r in result.runs]
    got = [100 * r.hit_rate for r in result.runs]
    best = [100 * u.hit_rate for u in result.unbounded]
    xs = range(len(labels))
    rates.bar([x - 0.2 for x in xs], got, width=0.4, label="this pool")
    rates.bar([x + 0.2 for x in xs], best, width=0.4, label="unbounded pool", alpha=0.5)
    rates.set_xticks(list(xs), labels, rotation=20)
    rates.set_ylabel("token hit rate (%)")
    rates.set_ylim(0, 100)
    rates.legend()
    rates.set_title("hit rate by policy")
    count, width = len(result.trace), 0.8 / (len(result.runs) + 1)
    for k, run in enumerate([*result.unbounded[:1], *result.runs]):
        label = "cacheable (unbounded)" if k == 0 else run.policy.label
        positions = [i + (k - len(result.runs) / 2) * width for i in range(len(run.hits))]
        if count <= 16 and not any(r.skipped for r in result.runs):
            per_request.bar(
                positions, run.hits, width=width, label=label, alpha=0.5 if k == 0 else 1
            )
        else:
            per_request.plot(run.hits, ".", label=label)
    if count <= 16:
        per_request.set_xticks(range(count), [r.rid for r in result.trace], rotation=20)
    per_request.set_xlabel("request (arrival order)")
    per_request.set_ylabel("hit tokens")
    per_request.legend(fontsize="small", loc="upper left")
    per_request.set_title("hit per request")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def engine_check(
    engine: Engine, engine_name: str, config: CacheConfig, result: Comparison, timeout: float
) -> list[str]:
    """Re-run each policy's operations through a conformance engine, each run bounded by
    `timeout` seconds; lines saying whether its hits equal the reference's."""
    profiles = set(engine.describe().get("profiles", []))
    lines = []
    for run in result.runs:
        if f"eviction.{run.policy.eviction.value}" not in profiles:
            lines.append(f"{engine_name}: {run.policy.label}: profile not claimed, skipped")
            continue
        case = {
            "suite": "alloc",
            "layout": layout_json(config, run.policy),
            "num_blocks": run.num_blocks,
            "eviction": run.policy.eviction.value,
            "ops": run.ops,
        }

        def replay(case: JSON = case) -> JSON:
            return engine.run(case)

        try:
            answer = call_with_timeout(replay, timeout)
        except TimeoutError:
            lines.append(
                f"{engine_name}: {run.policy.label}: not checked, no answer within {timeout:g} s "
                f"({len(run.ops):,} operations on {run.num_blocks:,} blocks; the spec engine "
                "replays a trace in time that grows with operations x pool blocks: shrink the "
                "run with --blocks, --pool-requests or --prompt-tokens, or raise "
                "--engine-timeout)"
            )
            break  # the unfinished replay still holds a core; check no further policy
        observations = answer.get("observations", [])
        hits = [o["admitted"]["hit"] for o in observations if "admitted" in o]
        verdict = "same hits" if hits == run.hits else f"hits differ: {hits} vs {run.hits}"
        lines.append(f"{engine_name}: {run.policy.label}: {verdict}")
    return lines


def check_arguments(args: argparse.Namespace) -> Engine | None:
    """Everything that can be refused is refused before the replay starts; returns the
    engine to re-run the operations through, if any."""
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise InputError(
            "--plot needs matplotlib: pip install 'kvcert[sim]' (pinned in constraints.txt)"
        )
    return load_engine(args.engine) if args.engine else None


def run(args: argparse.Namespace) -> int:
    """The `simulate` command."""
    engine = check_arguments(args)
    if args.compare_plans is not None:
        return compare_plans(args, engine)
    name, config = load_config(args)
    trace_name, trace = load_trace(args)
    if args.save_trace is not None:
        args.save_trace.write_text(traces.to_jsonl(trace), encoding="utf-8")
    result = compare(
        config,
        trace,
        policies_of(args, config),
        num_blocks=args.blocks,
        pool_requests=args.pool_requests,
        budget=args.budget,
    )
    print(render(name, trace_name, result, config), end="")
    if args.json is not None:
        text = json.dumps(report_json(name, trace_name, result, config), indent=1) + "\n"
        args.json.write_text(text, encoding="utf-8")
    if args.plot is not None:
        plot(args.plot, f"{name}: {trace_name}", result)
        print(f"plot written to {args.plot}")
    if engine is not None:
        for line in engine_check(engine, args.engine, config, result, args.engine_timeout):
            print(line)
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert simulate`."""
    parser = commands.add_parser(
        "simulate",
        help="replay a request trace under several eviction/placement policies",
        description="Replay a request trace on a model's planned KV-cache layout and compare "
        "eviction profiles (lru, hybrid: spec §11) and state checkpoint placements (all, "
        "align, branch: spec §12): token hit rate, recomputed tokens, evictions and dead "
        "evictions per group kind, against the hits of an unbounded pool.",
    )
    parser.add_argument("model", nargs="?", help="bundled model name, model file or config.json")
    parser.add_argument("--plan", type=Path, help="a `kvcert plan --json` report instead of MODEL")
    add_plan_options(parser)
    parser.add_argument(
        "--trace", default="resend", help="resend, shared-prefix, agentic, or a JSONL trace file"
    )
    sizes = (
        ("--prompt-tokens", positive_int, 8192, "prompt / system prompt"),
        ("--output-tokens", non_negative_int, 0, "decoded tokens per request"),
        ("--question-tokens", positive_int, 512, "shared-prefix: per user"),
        ("--users", positive_int, 16, "shared-prefix: users"),
        ("--sessions", positive_int, 4, "agentic: sessions"),
        ("--turns", positive_int, 6, "agentic: turns per session"),
        ("--tool-tokens", positive_int, 3000, "agentic: tool output"),
        ("--budget", positive_int, 8192, "prefill chunk budget (tokens)"),
    )
    for option, kind, default, text in sizes:
        parser.add_argument(option, type=kind, default=default, help=text)
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument(
        "--blocks", type=positive_int, help="pool size in blocks (default: the plan's)"
    )
    pool.add_argument(
        "--pool-requests",
        type=positive_number,
        help="pool size in working sets (blocks one request holds)",
    )
    parser.add_argument("--eviction", default="lru,hybrid", help="eviction profiles to compare")
    parser.add_argument(
        "--placement",
        help="state checkpoint placements to compare (models with state groups; default "
        "align,branch)",
    )
    parser.add_argument(
        "--compare-plans",
        metavar="OBJECTIVES",
        help="run the trace under the plan of each objective (e.g. capacity,balanced,alignment) "
        "in the same memory and compare hits and recomputed tokens (spec PAGE-OBJ-1)",
    )
    parser.add_argument("--engine", help="also re-run the operations through this engine")
    parser.add_argument(
        "--engine-timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds each policy's re-run through --engine may take (default 300)",
    )
    parser.add_argument("--json", type=output_path, help="write the report as JSON here")
    parser.add_argument(
        "--plot", type=output_path, help="write a PNG plot here (needs kvcert[sim])"
    )
    parser.add_argument("--save-trace", type=output_path, help="write the trace as JSONL here")
    parser.set_defaults(run=run)
