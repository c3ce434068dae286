"""`kvcert check`: the model checks CI runs, as one command with honest verdicts.

    kvcert check [--tier pr|long] [--only z3,crosshair,hypothesis] [--json FILE] [--list]

Three parts, each bounded and reproducible:

* z3: every obligation of kvcert.conformance.checks.proofs.MANIFEST in the tier (proofs, their
  broken twins, drift checks). Verdicts: proved, counterexample, agrees; vacuous, unknown,
  error and disagrees are failures.
* crosshair: the spec's `pre:`/`post:` contracts per function, spec-vs-reference
  `diffbehavior`, and golden controls (a correct function must pass, a buggy one must fail).
  A pass reads "no counterexample within budget", never "proved". Budgets count paths, and
  the solver's work is bounded by a resource limit, so a verdict does not depend on how busy
  the machine is; a CrossHair crash (an internal error, a traceback) is "crashed", never
  "counterexample".
* hypothesis: the shipped state machine as the spec's self-check (invariants only) and
  against the reference; then, for every seeded bug class (kvcert.conformance.engines.mutants), how
  long the machine takes from scratch to find it and shrink it.

Every row has an expected and an actual verdict; the exit status is 0 only when all match.
With more than one job (the default: the CPU count) the parts run side by side. The pr tier
fits in CI (about two minutes on 2 cores); the long tier is one command for depth.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcert.conformance.arguments import output_path
from kvcert.conformance.engines.mutants import BROKEN
from kvcert.conformance.engines.reference_engine import ReferenceEngine

PARTS = ("z3", "crosshair", "hypothesis")
NO_COUNTEREXAMPLE = "no counterexample within budget"
FOUND = "counterexample"
CRASHED = "crashed"  # the tool itself failed: never a verdict on the code it checks
# A divergence that is a Python crash of the engine (a seeded bug that no longer fits the code
# it patches, or an engine bug of that kind) is reported as such, not as the counterexample.
CRASH = re.compile(r"raised (TypeError|AttributeError|NameError)\b")


@dataclass(frozen=True)
class Tier:
    """Budgets of one tier."""

    name: str
    crosshair_paths: int  # paths CrossHair explores per condition (its max_iterations)
    diff_iterations: int  # CrossHair diffbehavior's --max_uninteresting_iterations
    machine_examples: int  # state machine runs per machine check
    machine_steps: int  # steps per run
    bug_examples: int  # most runs the machine gets to find one seeded bug
    bug_steps: int  # steps per bug-hunting run (longer traces reach a full pool sooner)
    shrink: bool  # whether a found bug is also shrunk (and the shrinking timed)


TIERS = {
    "pr": Tier("pr", 100, 8, 300, 15, 2000, 30, shrink=False),
    "long": Tier("long", 1000, 200, 3000, 50, 10000, 50, shrink=True),
}

# The spec functions whose contracts CrossHair checks (their arguments are plain values or
# small dataclasses; CacheView-level rules are covered by Hypothesis and Z3 instead).
CONTRACT_TARGETS = (
    "kvcert.spec.acceptance.full_needed",
    "kvcert.spec.acceptance.sliding_window_needed",
    "kvcert.spec.acceptance.chunked_local_needed",
    "kvcert.spec.acceptance.state_needed",
    "kvcert.spec.hashing.block_extras",
    "kvcert.spec.errors.refuse",
    "kvcert.spec.layers.page_bytes",
    "kvcert.spec.plan.group_size",
    "kvcert.spec.plan.split_bucket",
    "kvcert.spec.plan.pool_blocks",
    "kvcert.spec.plan.token_capacity",
    "kvcert.spec.page_layout.attention_offset",
    "kvcert.spec.page_layout.attention_scale_offset",
    "kvcert.spec.page_layout.latent_offset",
    "kvcert.spec.page_layout.latent_scale_offset",
    "kvcert.spec.page_layout.state_offset",
    "kvcert.spec.page_layout.slot_address",
)
# Per-target caps on the paths explored: crosshair-tool 0.0.112 raises an internal error
# ("assert_true on a non-symbolic", building a symbolic Fraction) on group_size's 30th to
# 50th path; below that it runs clean. Z3 (THM-PAGE-GROUP) and diffbehavior cover it in
# depth. token_capacity's paths grow slow past ~40 (100 take 20 s).
PATH_CAPS = {"kvcert.spec.plan.group_size": 25, "kvcert.spec.plan.token_capacity": 40}
# CPU seconds one path may take (CrossHair counts process time, which load barely moves);
# the solver's wall-clock timeout is half of it and only a backstop behind SOLVER_RLIMIT.
PATH_SECONDS = 20
# z3's deterministic work limit per solver query inside CrossHair (CROSSHAIR_SMT_RLIMIT): a
# query stops at the same point on any machine, however loaded, where a wall-clock timeout
# would stop it earlier on a busy one and change which paths are explored.
SOLVER_RLIMIT = 5_000_000
SYMBOLIC = "kvcert.conformance.checks.symbolic"
DIFF_TARGETS = (  # (spec side, reference side, expected verdict)
    (f"{SYMBOLIC}.spec_window_start", f"{SYMBOLIC}.reference_window_start", NO_COUNTEREXAMPLE),
    (f"{SYMBOLIC}.spec_group_size", f"{SYMBOLIC}.reference_group_size", NO_COUNTEREXAMPLE),
    (
        f"{SYMBOLIC}.spec_window_start",
        f"{SYMBOLIC}.reference_window_start_without_minus_one",
        FOUND,
    ),
)
GOLDEN = (
    (f"{SYMBOLIC}.golden_aligned_hit", NO_COUNTEREXAMPLE),
    (f"{SYMBOLIC}.golden_aligned_hit_buggy", FOUND),
)


@dataclass
class Row:
    """One line of the verdict table."""

    part: str
    check: str
    expected: str
    got: str
    seconds: float
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.got == self.expected


# --- z3 ---------------------------------------------------------------------------------------


def z3_rows(tier: Tier, jobs: int = 1) -> Iterator[Row]:
    from kvcert.conformance.checks.proofs import tier as obligations  # noqa: PLC0415 - optional z3
    from kvcert.conformance.checks.proofs.core import discharge  # noqa: PLC0415 - optional z3

    for obligation in obligations(tier.name):
        verdict = discharge(obligation)
        yield Row(
            "z3",
            obligation.id,
            obligation.expect,
            verdict.got,
            verdict.seconds,
            verdict.detail,
            {"rules": list(obligation.rules), "bounds": obligation.bounds},
        )


# --- crosshair --------------------------------------------------------------------------------


# What CrossHair prints for a counterexample: `check` a located "error: ... when calling"
# line, `diffbehavior` the inputs on which the two functions differ.
COUNTEREXAMPLE_LINE = re.compile(r"^\S+:\d+: error: .* when calling |^Given: \(", re.MULTILINE)
TOOL_CRASH = re.compile(r"Traceback \(most recent call last\)|CrossHairInternal")


def crosshair_verdict(returncode: int, output: str) -> str:
    """CrossHair's exit status and output as a verdict. Exit 1 is a counterexample only when
    CrossHair printed one and did not crash: its internal errors also exit 1."""
    if returncode not in (0, 1):
        return "error"  # CrossHair refused its arguments (e.g. a target that does not import)
    if TOOL_CRASH.search(output):
        return CRASHED
    if returncode == 0:
        return NO_COUNTEREXAMPLE
    if COUNTEREXAMPLE_LINE.search(output):
        return FOUND
    return "error"


def _crosshair(args: list[str], budget: float) -> tuple[str, float, str]:
    command = [sys.executable, "-m", SYMBOLIC, *args]
    environment = os.environ | {"CROSSHAIR_SMT_RLIMIT": str(SOLVER_RLIMIT)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=budget, check=False, env=environment
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start, f"over the {budget:.0f} s backstop"
    seconds = time.perf_counter() - start
    output = (done.stdout + done.stderr).strip()
    return crosshair_verdict(done.returncode, output), seconds, output[-300:]


def crosshair_tasks(tier: Tier) -> list[tuple[str, str, list[str], float]]:
    """(label, expected verdict, arguments, backstop seconds) of every CrossHair check."""
    path_time = ["--per_path_timeout", str(PATH_SECONDS)]
    backstop = 600.0 + tier.crosshair_paths
    tasks: list[tuple[str, str, list[str], float]] = []  # (label, expected, args, backstop)
    for target, expected in GOLDEN:
        label = f"golden {target.rsplit('.', 1)[1]}"
        paths = ["--max_iterations", str(tier.crosshair_paths)]
        tasks.append((label, expected, ["check", *paths, *path_time, target], backstop))
    for target in CONTRACT_TARGETS:
        paths = ["--max_iterations", str(min(tier.crosshair_paths, PATH_CAPS.get(target, 10**9)))]
        label = f"contracts {target.removeprefix('kvcert.spec.')}"
        tasks.append((label, NO_COUNTEREXAMPLE, ["check", *paths, *path_time, target], backstop))
    iterations = ["--max_uninteresting_iterations", str(tier.diff_iterations)]
    for spec_side, reference_side, expected in DIFF_TARGETS:
        args = ["diffbehavior", "--per_path_timeout", "2", *iterations, spec_side, reference_side]
        label = f"diff {spec_side.rsplit('.', 1)[1]} ~ {reference_side.rsplit('.', 1)[1]}"
        tasks.append((label, expected, args, backstop + tier.diff_iterations * 2))
    return tasks


def crosshair_rows(tier: Tier, jobs: int = 1) -> Iterator[Row]:
    """Every CrossHair check, `jobs` processes at a time (each is its own subprocess and its
    budget is a count of paths, so running them side by side changes no verdict)."""
    tasks = crosshair_tasks(tier)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_crosshair, args, limit) for _, _, args, limit in tasks]
        for (label, expected, _, _), future in zip(tasks, futures, strict=True):
            got, seconds, detail = future.result()
            yield Row("crosshair", label, expected, got, seconds, detail)


# --- hypothesis -------------------------------------------------------------------------------


@dataclass
class MachineRun:
    """What one state-machine run gave."""

    got: str
    detail: str = ""
    find_seconds: float = 0.0  # from the start to the first divergence
    total_seconds: float = 0.0  # from the start to the end of shrinking
    shrunk_ops: int = 0  # operations in the minimal failing trace


def _run_machine(factory: Callable[[], Any] | None, settings_: Any) -> MachineRun:
    from hypothesis.stateful import run_state_machine_as_test  # noqa: PLC0415 - test extra

    from kvcert.conformance.checks.stateful import machine_for  # noqa: PLC0415 - needs hypothesis

    machine = machine_for(factory)
    start = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=settings_)
    except AssertionError as error:
        end = time.perf_counter()
        lengths = machine.failing_trace_lengths  # type: ignore[attr-defined]
        found = machine.first_failure_at  # type: ignore[attr-defined]
        return MachineRun(
            CRASHED if CRASH.search(str(error)) else FOUND,
            str(error)[:300],
            (found[0] if found else end) - start,
            end - start,
            lengths[-1] if lengths else 0,
        )
    return MachineRun("no divergence", "", 0.0, time.perf_counter() - start)


def hypothesis_rows(tier: Tier, jobs: int = 1) -> Iterator[Row]:
    from hypothesis import HealthCheck, Phase, settings  # noqa: PLC0415 - the test extra

    common = settings(
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    machine_settings = settings(
        common, max_examples=tier.machine_examples, stateful_step_count=tier.machine_steps
    )
    for label, factory in (("spec self-check", None), ("spec vs reference", ReferenceEngine)):
        result = _run_machine(factory, machine_settings)
        yield Row("hypothesis", f"machine: {label}", "no divergence", result.got,
                  result.total_seconds, result.detail)  # fmt: skip
    phases = list(Phase) if tier.shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    bug_settings = settings(
        common,
        max_examples=tier.bug_examples,
        stateful_step_count=tier.bug_steps,
        phases=phases,
    )
    for name, (engine_class, rule) in BROKEN.items():
        result = _run_machine(engine_class, bug_settings)
        if tier.shrink:
            detail = (
                f"found in {result.find_seconds:.1f} s, shrunk to {result.shrunk_ops} ops in "
                f"{result.total_seconds - result.find_seconds:.1f} s"
            )
        else:
            detail = (
                f"found in {result.find_seconds:.1f} s by a trace of {result.shrunk_ops} ops "
                "(not shrunk in this tier; --tier long shrinks and times it)"
            )
        extra = {"rule": rule, "find_seconds": result.find_seconds, "shrunk": tier.shrink}
        extra["shrunk_ops" if tier.shrink else "trace_ops"] = result.shrunk_ops
        yield Row(
            "hypothesis",
            f"bug class: {name}",
            FOUND,
            result.got,
            result.total_seconds,
            detail,
            extra,
        )


# --- the command ------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Tier, int], Iterator[Row]]] = {
    "z3": z3_rows,
    "crosshair": crosshair_rows,
    "hypothesis": hypothesis_rows,
}


def render(rows: list[Row]) -> str:
    """The verdict table and a closing line."""
    width = max((len(r.check) for r in rows), default=10)
    lines = [f"{'part':10} {'check':{width}} {'expected':32} {'got':32} {'time':>8}"]
    for row in rows:
        mark = "" if row.ok else "   <-- UNEXPECTED"
        lines.append(
            f"{row.part:10} {row.check:{width}} {row.expected:32} {row.got:32} "
            f"{row.seconds:7.2f}s{mark}"
        )
        if row.detail and (not row.ok or row.check.startswith("bug class")):
            lines.append(f"{'':10} {row.detail}")
    bad = sum(not r.ok for r in rows)
    lines.append(f"check: {len(rows) - bad} as expected, {bad} unexpected")
    return "\n".join(lines) + "\n"


def _parts(text: str) -> list[str]:
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or not chosen:
        raise ValueError(f"--only takes a comma list of {', '.join(PARTS)}; got {text!r}")
    return chosen


def _part_rows(part: str, tier: Tier, jobs: int) -> list[Row]:
    """One part's rows, each announced on stderr as it comes."""
    rows = []
    for row in RUNNERS[part](tier, jobs):
        rows.append(row)
        status = "ok " if row.ok else "BAD"
        print(f"[{status}] {row.part:10} {row.check} ({row.seconds:.1f}s)", file=sys.stderr)
    return rows


def _side_by_side(parts: list[str], tier: Tier, jobs: int) -> list[list[Row]]:
    """Each part's rows, in the order asked. With more than one job the parts run side by side,
    one thread each: z3 solves and CrossHair runs outside the interpreter's lock (CrossHair in
    subprocesses, at most `jobs`), so the pure-Python state machines keep a core busy while
    they do. Every budget counts work, not time (paths, examples, z3's rlimit), so running
    side by side changes no verdict, only the seconds a row reports."""
    if jobs <= 1 or len(parts) == 1:
        return [_part_rows(part, tier, jobs) for part in parts]
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        futures = [pool.submit(_part_rows, part, tier, jobs) for part in parts]
        return [future.result() for future in futures]


def run(args: argparse.Namespace) -> int:
    """The `check` command."""
    tier = TIERS[args.tier]
    parts = _parts(args.only)
    if args.list:
        if _missing_tools(["z3"]):
            raise ValueError(
                "kvcert check --list reads the Z3 obligations: pip install 'kvcert[proofs]'"
            )
        from kvcert.conformance.checks.proofs import tier as obligations  # noqa: PLC0415 - optional z3

        for o in obligations(tier.name):
            print(f"{o.id:28} {o.tier:5} {o.expect:15} {','.join(o.rules):40} {o.bounds}")
        return 0
    missing = _missing_tools(parts)
    if missing:
        raise ValueError(
            f"kvcert check needs {', '.join(missing)}: pip install 'kvcert[proofs,symbolic,test]'"
        )
    rows = [row for part_rows in _side_by_side(parts, tier, args.jobs) for row in part_rows]
    if args.json is not None:
        report = {"tier": tier.name, "rows": [asdict(r) | {"ok": r.ok} for r in rows]}
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(render(rows), end="")
    return 0 if all(r.ok for r in rows) else 1


def _missing_tools(parts: list[str]) -> list[str]:
    needed = {"z3": "z3", "crosshair": "crosshair", "hypothesis": "hypothesis"}
    return [needed[p] for p in parts if importlib.util.find_spec(needed[p]) is None]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert check`."""
    parser = commands.add_parser(
        "check",
        help="model-check the spec and the reference: Z3, CrossHair, Hypothesis",
        description="Discharge the Z3 obligations (with their broken twins and drift checks), "
        "CrossHair's contract and spec-vs-reference checks (with golden controls), and the "
        "state machines (with the time to find and shrink each seeded bug class). Exits 1 "
        "when any verdict differs from the expected one.",
    )
    parser.add_argument("--tier", choices=sorted(TIERS), default="pr", help="budget (pr: CI)")
    parser.add_argument("--only", default=",".join(PARTS), help="comma list of parts to run")
    parser.add_argument("--json", type=output_path, help="also write the verdicts as JSON here")
    parser.add_argument("--list", action="store_true", help="list the Z3 obligations")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="the parts, and CrossHair checks, run side by side (default: the CPU count)",
    )
    parser.set_defaults(run=run)
