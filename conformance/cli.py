"""The `kvcert` command.

    kvcert explain SCENARIO.json     why a lookup hits what it hits, group by group
    kvcert explain --example NAME    the same for a bundled example
    kvcert examples                  list the bundled examples
    kvcert rules                     print the rule index (spec/RULES.md)

Exit status: 0 on success, 2 on bad input (the message says what to fix).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from kvcert.conformance.explain import explain, render
from kvcert.conformance.scenario import ScenarioError, load_scenario, parse_scenario
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="kvcert",
        description="Executable spec, reference allocator and conformance suite for hybrid "
        "KV-cache prefix caching.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvcert` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ScenarioError, SpecError) as error:
        print(f"kvcert: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
