"""`kvcert fuzz`: the scheduler-level soundness campaign, seeded, sharded, shrinking.

    kvcert fuzz --runs 2000                     seeds 0..1999 through vLLM's real scheduler
    kvcert fuzz --runs 2000 --shard 2/4         the seeds s with s % 4 == 1: one machine's share
    kvcert fuzz --merge a.json b.json           one report from the shards' --json reports
    kvcert fuzz --replay regression.json        play a saved (shrunk) workload again
    kvcert fuzz --fix ...                       the same with the preempt-in-flight fix

    kvcert fuzz --mutant no-eagle-drop ...      against a broken twin (violations expected)
    kvcert fuzz --kvcert ...                    served by kvcert's manager in vLLM's Scheduler
    kvcert fuzz --kvcert --mutant kvcert-state-source-released ...   kvcert's broken twin

Runs inside a vLLM release venv (`scripts/engine-venv.sh vllm VERSION`): the engine under test
is the release installed there. A finding is an unsound read (of the served model's KV, which
changes outputs, or of the drafter's, which changes only which drafts are accepted) or an
engine crash on a workload the release accepted at start-up. Each is shrunk to a smaller
workload with a finding of the same class and, with --save DIR, written as a regression file.
Exit 1 when anything is found, 0 when nothing, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcert.conformance.arguments import non_negative_int, output_path, positive_int
from kvcert.conformance.campaign.workload import Workload, generate, shrink
from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.vllm.campaign.mutants import KVCERT_MUTANTS, MUTANTS

if TYPE_CHECKING:
    from kvcert.conformance.vllm.campaign.loop import Outcome

REPORT_FORMAT = "kvcert-fuzz/1"
# summed over workloads
COUNTS = ("preemptions", "hit_tokens", "drafts", "accepted", "state_copies", "served_tokens",
          "owed_tokens", "beyond_tokens", "lost_hits")  # fmt: skip


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


def play(workload: Workload, fix: bool, mutant: str | None = None, kvcert: bool = False) -> Outcome:
    """One workload through vLLM's scheduler (`kvcert.conformance.vllm.campaign.loop`),
    imported on use: it needs vLLM (the drop-in's schedulers subclass vLLM's), which the
    `kvcert` command does not."""
    from kvcert.conformance.vllm.campaign.loop import play as played  # noqa: PLC0415

    return played(workload, fix, mutant, kvcert)


def campaign(
    seeds: list[int],
    fix: bool,
    shrink_budget: int,
    mutant: str | None = None,
    kvcert: bool = False,
    *,
    state_checkpoints: bool = False,
    state_drafts: bool = False,
    mtp: bool = False,
    families: bool = False,
) -> dict[str, Any]:
    """Play every seed's workload; shrink each violation. The report is JSON-ready.
    `state_checkpoints` (always with `kvcert`): most Qwen3.5 seeds are served by a backend
    that saves state inside a prefill; `state_drafts` (always with `kvcert`): half the state
    hybrids' seeds decode with drafts (`generate`); `mtp` (always with `kvcert`): half the
    drafted attention-only seeds run a multi-module MTP drafter; `families` (always with
    `kvcert`): about half the later requests take a shape lost hits show on."""
    state_checkpoints = state_checkpoints or kvcert
    state_drafts = state_drafts or kvcert
    mtp = mtp or kvcert
    families = families or kvcert
    start = time.perf_counter()
    report: dict[str, Any] = {
        "format": REPORT_FORMAT, "engine": f"vllm {_engine_release()}", "fix": fix,
        "mutant": mutant, "kvcert": kvcert,
        **({"state_checkpoints": True} if state_checkpoints and not kvcert else {}),
        **({"state_drafts": True} if state_drafts and not kvcert else {}),
        **({"mtp": True} if mtp and not kvcert else {}),
        **({"families": True} if families and not kvcert else {}),
        "shrink_budget": shrink_budget, "seeds": seeds, "runs": 0,
        **dict.fromkeys(COUNTS, 0),
        "stalled": [],
        "unreachable": {},
        "violations": [],  # every finding, crashes included (the format's name for them)
    }  # fmt: skip
    for seed in seeds:
        workload = generate(seed, state_checkpoints=state_checkpoints,
                            state_drafts=state_drafts, mtp=mtp, families=families)  # fmt: skip
        outcome = play(workload, fix, mutant, kvcert)
        report["runs"] += 1
        if outcome.unreachable is not None:
            report["unreachable"].setdefault(outcome.unreachable, []).append(seed)
            continue
        for key in COUNTS:
            report[key] += getattr(outcome, key)
        if outcome.stalled:
            report["stalled"].append(seed)
        if outcome.kind is None:
            continue
        found = time.perf_counter() - start
        kind = outcome.kind

        def same_class(w: Workload, k: tuple[str, str | None] = kind) -> bool:
            return play(w, fix, mutant, kvcert).kind == k

        small = shrink(workload, same_class, shrink_budget)
        report["violations"].append(
            {
                "seed": seed,
                "found_after_runs": report["runs"],
                "found_after_seconds": round(found, 2),
                "kind": kind[0],  # unsound | crash | lost
                "role": kind[1],  # target | draft: whose KV the unsound read found
                "keying": outcome.keying,  # the EAGLE keying played (exact | drop | None)
                "violation": outcome.finding,
                "shrunk": {
                    "violation": play(small, fix, mutant, kvcert).finding,
                    "workload": small.to_json(),
                },
            }
        )
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the shards' reports (same engine and fix)."""
    engines = {(r["engine"], r["fix"], r.get("mutant")) for r in reports}
    if len(engines) != 1 or any(r.get("format") != REPORT_FORMAT for r in reports):
        raise InputError(
            f"--merge: reports of one engine, fix and mutant setting only, got {engines}"
        )
    merged: dict[str, Any] = {
        "format": REPORT_FORMAT, "engine": reports[0]["engine"], "fix": reports[0]["fix"],
        "mutant": reports[0].get("mutant"), "shrink_budget": reports[0].get("shrink_budget"),
        "seeds": sorted(s for r in reports for s in r["seeds"]),
        "seconds": round(sum(r["seconds"] for r in reports), 2),
    }  # fmt: skip
    if len(set(merged["seeds"])) != len(merged["seeds"]):
        raise InputError("--merge: two reports played the same seed (overlapping shards)")
    merged["runs"] = sum(r["runs"] for r in reports)
    for key in COUNTS:  # older reports lack the later counts: kept only where one has it
        if any(key in r for r in reports):
            merged[key] = sum(r.get(key, 0) for r in reports)
    merged["stalled"] = sorted(s for r in reports for s in r["stalled"])
    merged["unreachable"] = {}
    for r in reports:
        for why, which in r.get("unreachable", {}).items():
            merged["unreachable"].setdefault(why, []).extend(which)
    merged["violations"] = sorted(
        (v for r in reports for v in r["violations"]), key=lambda v: v["seed"]
    )
    return merged


def render(report: dict[str, Any]) -> str:
    """The summary lines."""
    seeds = report["seeds"]
    span = f"{len(seeds)} seeds" + (f" ({seeds[0]}..{seeds[-1]})" if seeds else "")
    fix = " with the preempt-in-flight fix" if report["fix"] else ""
    if report.get("mutant"):
        fix += f", mutant {report['mutant']} (a broken twin: violations expected)"
    if report.get("kvcert"):
        fix += " served by kvcert.reference.vllm (kvcert's allocator in vLLM's Scheduler)"
    if report.get("state_checkpoints"):
        fix += ", state backends saving checkpoints inside a prefill"
    if report.get("state_drafts"):
        fix += ", state hybrids decoding with drafts"
    if report.get("mtp"):
        fix += ", multi-module MTP drafters"
    if report.get("families"):
        fix += ", lost-hit workload families"
    lines = [
        f"kvcert fuzz: {report['engine']}{fix}: {report['runs']} workloads, {span}, in "
        f"{report['seconds']} s; {report['preemptions']} preemptions, {report['hit_tokens']:,} "
        f"hit tokens, {report.get('accepted', 0):,} of {report.get('drafts', 0):,} drafts "
        f"accepted; {len(report['violations'])} finding(s)"
    ]
    if "owed_tokens" in report:
        lines.append(
            f"  completeness: owed {report['owed_tokens']:,} hit tokens at admissions, served "
            f"{report['served_tokens']:,}; {report['lost_hits']:,} admission(s) lost a hit; "
            f"{report['beyond_tokens']:,} tokens served past what was owed (not a finding)"
        )
    if report.get("state_copies"):
        lines.append(
            f"  {report['state_copies']:,} passes verifying drafts crossed a state block "
            "boundary (the runner copied the state there, ALLOC-SPEC-2)"
        )
    classes = sorted({finding_class(v) for v in report["violations"]})
    for name in classes:
        which = [v["seed"] for v in report["violations"] if finding_class(v) == name]
        lines.append(f"  {name}: {len(which)} (seeds {which[:10]})")
    for why, which in sorted(report.get("unreachable", {}).items()):
        lines.append(f"  not played, {len(which)} workload(s) (seeds {which[:5]}): {why}")
    if report["stalled"]:
        lines.append(f"  stalled (step limit, not a violation): seeds {report['stalled'][:10]}")
    for v in report["violations"]:
        shrunk = Workload.from_json(v["shrunk"]["workload"])
        lines.append(
            f"  seed {v['seed']} (found after {v['found_after_runs']} workloads, "
            f"{v['found_after_seconds']} s) [{finding_class(v)}]: {v['violation']}"
        )
        lines.append(
            f"    shrunk to {len(shrunk.arrivals)} requests, {shrunk.policy} policy, "
            f"{'async' if shrunk.async_scheduling else 'sync'} scheduling, {shrunk.model}"
            + (
                f" with {shrunk.spec_tokens} drafts per step ({shrunk.spec_keying} keying)"
                if shrunk.spec_tokens
                else ""
            )
            + f": {v['shrunk']['violation']}"
        )
    return "\n".join(lines) + "\n"


def finding_role(finding: dict[str, Any]) -> str:
    """`crash`, `lost` (a lost hit), or what the unsound read found: the served model's KV
    (`target`) or Mamba state (`state`), or the drafter's KV (`draft`). Reports from before
    roles were recorded hold target reads only."""
    if finding.get("kind") in ("crash", "lost"):
        return str(finding["kind"])
    return str(finding.get("role") or "target")


def finding_class(finding: dict[str, Any]) -> str:
    """A finding's class in words."""
    role = finding_role(finding)
    if role == "crash":
        return "engine crash"
    if role == "lost":
        return "lost hit"
    if role == "state":
        return "unsound read of Mamba state"
    keying = f", {finding['keying']} keying" if finding.get("keying") else ""
    return f"unsound read of {role} KV{keying}"


def run(args: argparse.Namespace) -> int:
    """The `fuzz` command."""
    twin_of_kvcert = args.mutant in KVCERT_MUTANTS
    if args.kvcert and (
        args.fix or (args.mutant and not twin_of_kvcert) or args.save or args.merge
    ):
        raise InputError(
            "--kvcert serves every workload with kvcert's own manager: it takes no --fix, "
            "--save, --merge or --mutant of vLLM (those are about vLLM's manager); its own "
            f"twins: {', '.join(sorted(KVCERT_MUTANTS))}"
        )
    if twin_of_kvcert and not args.kvcert:
        raise InputError(f"--mutant {args.mutant} is a twin of kvcert's manager: add --kvcert")
    if args.merge:
        report = merge([_report(Path(p)) for p in args.merge])
    elif args.replay:
        return replay(args)
    else:
        if args.mutant and args.save:
            raise InputError(
                "--save with --mutant: a mutant's findings fail only against that broken "
                "twin, so they make no regression for vLLM; drop one of the two"
            )
        k, n = args.shard
        seeds = [s for s in range(args.start, args.start + args.runs) if s % n == k - 1]
        report = campaign(seeds, args.fix, args.shrink_budget, args.mutant, args.kvcert,
                          state_checkpoints=args.state_checkpoints,
                          state_drafts=args.state_drafts, mtp=args.mtp,
                          families=args.families)  # fmt: skip
    print(render(report), end="")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.save is not None:
        _save(report, args.save)
    return 1 if report["violations"] else 0


def _report(path: Path) -> dict[str, Any]:
    """A shard's --json report, for --merge."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"--merge {path}: not a readable kvcert fuzz report: {error}") from error
    if not isinstance(body, dict) or body.get("format") != REPORT_FORMAT:
        raise InputError(
            f"--merge {path}: not a kvcert fuzz --json report (format {REPORT_FORMAT!r})"
        )
    return body


def _save(report: dict[str, Any], directory: Path) -> None:
    """Each shrunk finding as a regression file, with whether a finding of its kind (sound-
    ness, or a lost hit) is found unfixed and fixed (what kvcert.conformance.vllm.campaign.check
    replays it against)."""
    directory.mkdir(parents=True, exist_ok=True)
    for v in report["violations"]:
        workload = Workload.from_json(v["shrunk"]["workload"])
        kind = "lost" if v["kind"] == "lost" else "unsound"
        expect = {key: play(workload, fix).found(kind)
                  for key, fix in (("unfixed", False), ("fixed", True))}  # fmt: skip
        release = report["engine"].split()[-1]
        target = directory / f"vllm-{release}-seed-{v['seed']}.json"
        body = {"engine": report["engine"], "kind": kind, "expect": expect, **v["shrunk"]}
        target.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
        print(f"regression written to {target}")


def replay(args: argparse.Namespace) -> int:
    """`--replay FILE...`: exit 1 when any saved workload still has a finding of its kind
    (soundness; a lost hit for a file of kind `lost`)."""
    release = _engine_release()
    failed = 0
    for path in args.replay:
        try:
            body = json.loads(Path(path).read_text(encoding="utf-8"))
            workload = Workload.from_json(body["workload"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"--replay {path}: not a kvcert fuzz regression ({error})") from error
        outcome = play(workload, args.fix, args.mutant, args.kvcert)
        kind = body.get("kind", "unsound")
        verdict = outcome.finding if outcome.found(kind) else (
            f"not played: {outcome.unreachable}" if outcome.unreachable else f"no {kind} finding"
        )  # fmt: skip
        failed += outcome.found(kind)
        served = " (fixed)" if args.fix else " (kvcert's manager)" if args.kvcert else ""
        print(f"{path} on vllm {release}{served}: {verdict}, {outcome.hit_tokens} hit tokens")
    return 1 if failed else 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert fuzz`."""
    parser = commands.add_parser(
        "fuzz",
        help="soundness campaign: random workloads through vLLM's real scheduler (vLLM venv)",
        description="Drive vLLM's real Scheduler (or AsyncScheduler) with random seeded "
        "workloads (bundled models planned by vLLM itself, shared prefixes, FCFS and "
        "priority, small pools, chunked prefill, aborts, resets, EAGLE speculative decoding "
        "with random acceptance, Mamba/GDN hybrids in align mode) and check every read of "
        "every forward pass, the drafter's and the recurrent state's included, against a "
        "ledger of what earlier passes wrote. Run it with a vLLM release venv's kvcert.",
    )
    parser.add_argument("--runs", type=positive_int, default=500, help="workloads (seeds) to play")
    parser.add_argument("--start", type=non_negative_int, default=0, help="first seed")
    parser.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N",
                        help="play only the seeds s with s %% N == K - 1")  # fmt: skip
    parser.add_argument("--fix", action="store_true",
                        help="use the preempt-in-flight fix (a Scheduler subclass)")  # fmt: skip
    parser.add_argument("--kvcert", action="store_true",
                        help="serve with kvcert.reference.vllm's Scheduler or AsyncScheduler "
                        "(kvcert's allocator inside vLLM's scheduling)")  # fmt: skip
    parser.add_argument("--state-checkpoints", action="store_true",
                        help="serve most Qwen3.5 seeds with a backend that saves state inside "
                        "a prefill (0.33's FlashInfer GDN; always on with --kvcert)")  # fmt: skip
    parser.add_argument("--state-drafts", action="store_true",
                        help="decode half the state hybrids' seeds with MTP/EAGLE drafts "
                        "(num_speculative_blocks), some requests past a state block "
                        "boundary (always on with --kvcert)")  # fmt: skip
    parser.add_argument("--mtp", action="store_true",
                        help="serve half the drafted attention-only seeds with a multi-module "
                        "MTP drafter of 2-3 modules (always on with --kvcert)")  # fmt: skip
    parser.add_argument("--families", action="store_true",
                        help="rewrite about half the later requests into shapes lost hits "
                        "show on: re-sends, extensions, multi-turn follow-ups sent with the "
                        "engine's answer, siblings diverging at a block boundary +-1, prefixes "
                        "of exactly k blocks +-1; and give some seeds the smallest pool or a "
                        "sparse retention interval (always on with --kvcert)")  # fmt: skip
    parser.add_argument(
        "--mutant",
        choices=sorted({*MUTANTS, *KVCERT_MUTANTS}),
        help="play against a broken twin of vLLM, or with --kvcert of kvcert's manager (the "
        "oracle must catch it)",
    )
    parser.add_argument(
        "--shrink-budget", type=non_negative_int, default=400, help="runs per shrink"
    )
    parser.add_argument("--json", type=output_path, help="write the report here")
    parser.add_argument("--save", type=Path, help="write each shrunk violation here")
    parser.add_argument("--merge", nargs="+", help="merge shards' --json reports")
    parser.add_argument("--replay", nargs="+", help="play saved regression files again")
    parser.set_defaults(run=run)
