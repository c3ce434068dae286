"""The `kvcert` command: argument parsing and dispatch; each command lives in its room.

    kvcert certify [--engine NAME|module:factory | --cmd "..."] [--json FILE]
                                     every conformance vector against an engine (certify/)
    kvcert serve --engine NAME       an in-process engine over kvcert-stdio/1 (certify/)
    kvcert explain SCENARIO.json     why a lookup hits what it hits, group by group (tools/)
    kvcert explain --example NAME    the same for a bundled example
    kvcert examples                  the bundled examples
    kvcert rules                     the rule index (spec/RULES.md)
    kvcert plan MODEL [--kv-cache-dtype D] [--memory GIB] [--compare] [--json FILE]
                                     page plan: groups, block sizes, page bytes (tools/)
    kvcert simulate MODEL [--trace resend|shared-prefix|agentic|FILE.jsonl] [...]
                                     hit rates of eviction/placement policies (tools/)
    kvcert check [--tier pr|long] [--only z3,crosshair,hypothesis] [--json FILE]
                                     Z3 obligations, CrossHair, state machines (checks/)
    kvcert fuzz [--runs N] [--shard K/N] [--fix] [--replay FILE] [--merge FILE...]
                                     soundness campaign through vLLM's scheduler (campaign/)

Exit status: 0 on success, 1 when certification or a check finds unexpected results, 2 on bad
input (the message says what to fix), 3 when kvcert's reference and spec disagree (a kvcert
bug: please report it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import version

from kvcert.conformance.campaign import command as fuzz
from kvcert.conformance.certify import command as certify
from kvcert.conformance.checks import check
from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.tools import explain, model_plan, plan
from kvcert.conformance.tools.simulate import cli as simulate
from kvcert.spec import SpecError
from kvcert.spec.rules import all_rules, render_rules_md


def _rules(_: argparse.Namespace) -> int:
    print(render_rules_md(all_rules()), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="kvcert",
        description="Executable spec, reference allocator and conformance suite for hybrid "
        "KV-cache prefix caching.",
    )
    parser.add_argument("--version", action="version", version=f"kvcert {version('kvcert')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    certify.add_parsers(commands)
    explain.add_parsers(commands)
    commands.add_parser(
        "rules",
        help="print the rule index (spec/RULES.md)",
        description="Print the index of the spec's rules (tag, sentence, where it is defined), "
        "generated from kvcert.spec's docstrings: the text of spec/RULES.md.",
    ).set_defaults(run=_rules)
    plan.add_parser(commands)
    simulate.add_parser(commands)
    check.add_parser(commands)
    fuzz.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvcert` command."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse: --help, --version, or a bad argument (usage shown)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        return int(args.run(args))
    except (explain.ExplainDisagreement, model_plan.PlanDisagreement) as error:
        print(f"kvcert: internal error, please report: {error}", file=sys.stderr)
        return 3
    except (InputError, SpecError, EngineError, ValueError, OSError) as error:
        print(f"kvcert: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
