"""`kvcert fuzz`: the scheduler-level soundness campaign, seeded, sharded, shrinking.

    kvcert fuzz --runs 2000                     seeds 0..1999 through vLLM's real scheduler
    kvcert fuzz --runs 2000 --shard 2/4         the seeds s with s % 4 == 1: one machine's share
    kvcert fuzz --merge a.json b.json           one report from the shards' --json reports
    kvcert fuzz --replay regression.json        play a saved (shrunk) workload again
    kvcert fuzz --fix ...                       the same with the preempt-in-flight fix

Runs inside a vLLM release venv (`scripts/engine-venv.sh vllm VERSION`): the engine under test
is the release installed there. Every violation is shrunk to a smaller workload that still
fails and, with --save DIR, written as a regression file. Exit 1 when a violation is found,
0 when none, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from kvcert.conformance.campaign.workload import Workload, generate, shrink
from kvcert.conformance.contract.codec import InputError

REPORT_FORMAT = "kvcert-fuzz/1"


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N such as 2/4, got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"shard K/N needs 1 <= K <= N, got {text}")
    return k, n


def _engine_release() -> str:
    try:
        return version("vllm")
    except PackageNotFoundError:
        raise InputError(
            "kvcert fuzz drives vLLM's scheduler: run it with a vLLM release venv's kvcert, "
            "e.g. bash scripts/engine-venv.sh vllm 0.33.0 && .engines/vllm-0.33.0/bin/kvcert fuzz"
        ) from None


def campaign(seeds: list[int], fix: bool, shrink_budget: int) -> dict[str, Any]:
    """Play every seed's workload; shrink each violation. The report is JSON-ready."""
    from kvcert.conformance.campaign.vllm_loop import play  # noqa: PLC0415 - needs vLLM

    start = time.perf_counter()
    report: dict[str, Any] = {
        "format": REPORT_FORMAT, "engine": f"vllm {_engine_release()}", "fix": fix,
        "seeds": seeds, "runs": 0, "preemptions": 0, "hit_tokens": 0, "stalled": [],
        "violations": [],
    }  # fmt: skip
    for seed in seeds:
        workload = generate(seed)
        outcome = play(workload, fix)
        report["runs"] += 1
        report["preemptions"] += outcome.preemptions
        report["hit_tokens"] += outcome.hit_tokens
        if outcome.stalled:
            report["stalled"].append(seed)
        if outcome.violation is None:
            continue
        found = time.perf_counter() - start
        small = shrink(workload, lambda w: play(w, fix).violation is not None, shrink_budget)
        report["violations"].append(
            {
                "seed": seed,
                "found_after_runs": report["runs"],
                "found_after_seconds": round(found, 2),
                "violation": outcome.violation,
                "shrunk": {"violation": play(small, fix).violation, "workload": small.to_json()},
            }
        )
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the shards' reports (same engine and fix)."""
    engines = {(r["engine"], r["fix"]) for r in reports}
    if len(engines) != 1 or any(r.get("format") != REPORT_FORMAT for r in reports):
        raise InputError(f"--merge: reports of one engine and fix setting only, got {engines}")
    merged: dict[str, Any] = {
        "format": REPORT_FORMAT, "engine": reports[0]["engine"], "fix": reports[0]["fix"],
        "seeds": sorted(s for r in reports for s in r["seeds"]),
        "seconds": round(sum(r["seconds"] for r in reports), 2),
    }  # fmt: skip
    if len(set(merged["seeds"])) != len(merged["seeds"]):
        raise InputError("--merge: two reports played the same seed (overlapping shards)")
    for key in ("runs", "preemptions", "hit_tokens"):
        merged[key] = sum(r[key] for r in reports)
    merged["stalled"] = sorted(s for r in reports for s in r["stalled"])
    merged["violations"] = sorted(
        (v for r in reports for v in r["violations"]), key=lambda v: v["seed"]
    )
    return merged


def render(report: dict[str, Any]) -> str:
    """The summary lines."""
    seeds = report["seeds"]
    span = f"{len(seeds)} seeds" + (f" ({seeds[0]}..{seeds[-1]})" if seeds else "")
    fix = " with the preempt-in-flight fix" if report["fix"] else ""
    lines = [
        f"kvcert fuzz: {report['engine']}{fix}: {report['runs']} workloads, {span}, in "
        f"{report['seconds']} s; {report['preemptions']} preemptions, {report['hit_tokens']:,} "
        f"hit tokens; {len(report['violations'])} violation(s)"
    ]
    if report["stalled"]:
        lines.append(f"  stalled (step limit, not a violation): seeds {report['stalled'][:10]}")
    for v in report["violations"]:
        shrunk = Workload.from_json(v["shrunk"]["workload"])
        lines.append(
            f"  seed {v['seed']} (found after {v['found_after_runs']} workloads, "
            f"{v['found_after_seconds']} s): {v['violation']}"
        )
        lines.append(
            f"    shrunk to {len(shrunk.arrivals)} requests, {shrunk.policy} policy, "
            f"{'async' if shrunk.async_scheduling else 'sync'} scheduling, {shrunk.model}: "
            f"{v['shrunk']['violation']}"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """The `fuzz` command."""
    if args.merge:
        report = merge([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.merge])
    elif args.replay:
        return replay(args)
    else:
        if args.runs < 1:
            raise InputError(f"--runs must be at least 1, got {args.runs}")
        k, n = args.shard
        seeds = [s for s in range(args.start, args.start + args.runs) if s % n == k - 1]
        report = campaign(seeds, args.fix, args.shrink_budget)
    print(render(report), end="")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for v in report["violations"]:
            release = report["engine"].split()[-1]
            target = args.save / f"vllm-{release}-seed-{v['seed']}.json"
            body = {"engine": report["engine"], **v["shrunk"]}
            target.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
            print(f"regression written to {target}")
    return 1 if report["violations"] else 0


def replay(args: argparse.Namespace) -> int:
    """`--replay FILE...`: exit 1 when any saved workload still violates soundness."""
    from kvcert.conformance.campaign.vllm_loop import play  # noqa: PLC0415 - needs vLLM

    release = _engine_release()
    failed = 0
    for path in args.replay:
        try:
            body = json.loads(Path(path).read_text(encoding="utf-8"))
            workload = Workload.from_json(body["workload"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"--replay {path}: not a kvcert fuzz regression ({error})") from error
        outcome = play(workload, args.fix)
        verdict = outcome.violation or "sound"
        failed += outcome.violation is not None
        print(f"{path} on vllm {release}{' (fixed)' if args.fix else ''}: {verdict}")
    return 1 if failed else 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert fuzz`."""
    parser = commands.add_parser(
        "fuzz",
        help="soundness campaign: random workloads through vLLM's real scheduler (vLLM venv)",
        description="Drive vLLM's real Scheduler (or AsyncScheduler) with random seeded "
        "workloads (bundled models planned by vLLM itself, shared prefixes, FCFS and "
        "priority, small pools, chunked prefill, aborts, resets) and check every read of "
        "every forward pass against a ledger of what earlier passes wrote. Run it with a vLLM "
        "release venv's kvcert.",
    )
    parser.add_argument("--runs", type=int, default=500, help="workloads (seeds) to play")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N",
                        help="play only the seeds s with s %% N == K - 1")  # fmt: skip
    parser.add_argument("--fix", action="store_true",
                        help="use the preempt-in-flight fix (a Scheduler subclass)")  # fmt: skip
    parser.add_argument("--shrink-budget", type=int, default=400, help="runs per shrink")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--save", type=Path, help="write each shrunk violation here")
    parser.add_argument("--merge", nargs="+", help="merge shards' --json reports")
    parser.add_argument("--replay", nargs="+", help="play saved regression files again")
    parser.set_defaults(run=run)
