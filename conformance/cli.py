"""The `kvcert` command.

    kvcert certify [--engine NAME|module:factory | --cmd "..."] [--json FILE]
                                     run every conformance vector against an engine
    kvcert serve --engine NAME       expose an in-process engine over kvcert-stdio/1
    kvcert explain SCENARIO.json     why a lookup hits what it hits, group by group
    kvcert explain --example NAME    the same for a bundled example
    kvcert examples                  list the bundled examples
    kvcert rules                     print the rule index (spec/RULES.md)
    kvcert plan MODEL [--kv-cache-dtype D] [--memory GIB] [--compare] [--json FILE]
                                     page plan: groups, block sizes, page bytes, capacity
    kvcert simulate MODEL [--trace resend|shared-prefix|agentic|FILE.jsonl] [--pool-requests X]
                     [--eviction lru,hybrid] [--placement align,branch] [--plot FILE.png]
                                     hit rates of eviction/placement policies on a trace
    kvcert check [--tier pr|long] [--only z3,crosshair,hypothesis] [--json FILE]
                                     model checks: Z3 obligations, CrossHair, state machines

Exit status: 0 on success, 1 when certification finds unexpected results, 2 on bad input
(the message says what to fix), 3 when kvcert's reference and spec disagree (a kvcert bug).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from kvcert.conformance import check, plan_cli, simulate_cli
from kvcert.conformance.engines import Engine, EngineError, load_engine
from kvcert.conformance.explain import explain, render
from kvcert.conformance.runner import (
    PASSING,
    Result,
    iter_cases,
    load_reasons,
    render_report,
    run_vectors,
)
from kvcert.conformance.scenario import ScenarioError, load_scenario, parse_scenario
from kvcert.conformance.stdio import StdioEngine, serve
from kvcert.spec import SpecError
from kvcert.spec.rules import all_rules, render_rules_md

EXAMPLES = resources.files("kvcert.conformance") / "examples"


def example_names() -> list[str]:
    """Names of the bundled example scenarios."""
    return sorted(
        p.name.removesuffix(".json") for p in EXAMPLES.iterdir() if p.name.endswith(".json")
    )


def _cmd_explain(args: argparse.Namespace) -> int:
    if (args.scenario is None) == (args.example is None):
        raise ScenarioError("give either a SCENARIO.json path or --example NAME (not both)")
    if args.example is not None:
        if args.example not in example_names():
            raise ScenarioError(
                f"no bundled example {args.example!r}; choose one of {example_names()}"
            )
        text = (EXAMPLES / f"{args.example}.json").read_text(encoding="utf-8")
        scenario = parse_scenario(json.loads(text), args.example)
    else:
        scenario = load_scenario(Path(args.scenario))
    print(render(explain(scenario.view), scenario.name, scenario.description), end="")
    return 0


def _cmd_examples(_: argparse.Namespace) -> int:
    for name in example_names():
        description = json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))
        print(f"{name:28} {description.get('description', '')}")
    return 0


def _cmd_rules(_: argparse.Namespace) -> int:
    print(render_rules_md(all_rules()), end="")
    return 0


def _cmd_certify(args: argparse.Namespace) -> int:
    if args.cmd is not None:
        engine: Engine = StdioEngine(args.cmd, timeout=args.timeout)
    else:
        engine = load_engine(args.engine)
    total = sum(1 for _ in iter_cases())

    def progress(done: int, result: Result) -> None:
        if done % 50 == 0 or done == total or result.status not in PASSING:
            print(f"[{done:4d}/{total}] {result.status:8} {result.id}", file=sys.stderr)

    report = run_vectors(
        engine,
        skips=load_reasons(args.skips, "skip"),
        xfails=load_reasons(args.xfails, "xfail"),
        timeout=args.timeout,
        progress=None if args.quiet else progress,
    )
    if isinstance(engine, StdioEngine):
        engine.close()
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    print(render_report(report), end="")
    return 0 if report.ok else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    return serve(load_engine(args.engine))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="kvcert",
        description="Executable spec, reference allocator and conformance suite for hybrid "
        "KV-cache prefix caching.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    certify = commands.add_parser(
        "certify",
        help="run every conformance vector against an engine (default: the bundled reference)",
        description="Run every conformance vector against an engine and report per suite and "
        "per rule; exits 1 on any unexpected result.",
    )
    certify.add_argument(
        "--engine", default="reference", help="entry-point name (reference, spec) or module:factory"
    )
    certify.add_argument("--cmd", help="an out-of-process engine speaking kvcert-stdio/1")
    certify.add_argument("--json", type=Path, help="also write the JSON report here")
    certify.add_argument("--skips", type=Path, help="JSON {case id: reason} to skip")
    certify.add_argument(
        "--xfails", type=Path, help="JSON {case id: reason} expected to fail (strict)"
    )
    certify.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    certify.add_argument("--quiet", action="store_true", help="no progress lines")
    certify.set_defaults(run=_cmd_certify)
    serve_parser = commands.add_parser("serve", help="serve an engine over kvcert-stdio/1")
    serve_parser.add_argument(
        "--engine", default="reference", help="entry-point name or module:factory"
    )
    serve_parser.set_defaults(run=_cmd_serve)
    explain_parser = commands.add_parser(
        "explain",
        help="explain the hybrid hit of a scenario, group by group",
        description="Print the hybrid hit of a scenario (layout + what each group has cached "
        "+ request length), each group's longest hit alone and why it stops there, and a "
        "one-line-per-group block diagram.",
    )
    explain_parser.add_argument("scenario", nargs="?", help="path to a scenario JSON file")
    explain_parser.add_argument("--example", help="a bundled example (see `kvcert examples`)")
    explain_parser.set_defaults(run=_cmd_explain)
    commands.add_parser("examples", help="list the bundled example scenarios").set_defaults(
        run=_cmd_examples
    )
    commands.add_parser("rules", help="print the rule index (spec/RULES.md)").set_defaults(
        run=_cmd_rules
    )
    plan_cli.add_parser(commands)
    simulate_cli.add_parser(commands)
    check.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvcert` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ScenarioError, SpecError, EngineError, ValueError, OSError) as error:
        print(f"kvcert: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
