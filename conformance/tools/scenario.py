"""Scenario files: a layout, what each group has cached, and a request, as JSON.

The format is what `kvcert explain` reads and what the `hit` vectors build on (this example
is parsed by tests/conformance/test_cli.py):

    {
      "name": "gpt-oss-eagle",
      "description": "EAGLE's sliding-window draft drops one block",
      "origin": "vllm#32802",
      "layout": {
        "groups": [{"kind": "full", "block_size": 16},
                   {"kind": "sliding_window", "block_size": 16, "window": 128,
                    "draft": true, "name": "sw"}],
        "speculative": "drop",
        "max_model_len": 131072
      },
      "request": {"num_tokens": 71},
      "cached": ["all", ["2-3"]]
    }

`name`, `description` and `origin` are optional (for display); so are the layout's
`speculative` ("exact" | "drop") and `max_model_len`. `cached` has one entry per group: "all"
(every keyed block of the request), "none", or a list whose items are block indices or
inclusive ranges "a-b". Group names, where given, are unique (the report names groups), and a
request has at most MAX_TOKENS tokens (2^20: the report lists every block). Unknown fields
are refused so typos cannot pass; the layout is read by the contract's codec
(kvcert.conformance.contract.codec).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvcert.conformance.contract.codec import (
    MAX_TOKENS,
    InputError,
    check_fields,
    expect_object,
    layout_from_json,
    spec_call,
)
from kvcert.spec import CacheView
from kvcert.spec.view import keyable_blocks

EXAMPLES = resources.files("kvcert.conformance.tools") / "examples"


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: the spec's cache view plus descriptive fields."""

    name: str
    description: str
    origin: str | None
    view: CacheView


def parse_blocks(entry: object, count: int, where: str) -> frozenset[int]:
    """A `cached` entry -> block indices; `count` is how many blocks the request keys."""
    if entry == "all":
        return frozenset(range(count))
    if entry == "none":
        return frozenset()
    if not isinstance(entry, list):
        raise InputError(f'{where}: expected "all", "none" or a list of indices/ranges')
    blocks: set[int] = set()
    for item in entry:
        if isinstance(item, int) and not isinstance(item, bool):
            blocks.add(item)
            continue
        low, dash, high = str(item).partition("-") if isinstance(item, str) else ("", "", "")
        if not (dash and low.isdigit() and high.isdigit() and int(low) <= int(high)):
            raise InputError(f'{where}: {item!r} is neither a block index nor a range "a-b"')
        blocks.update(range(int(low), int(high) + 1))
    return frozenset(blocks)


def parse_scenario(obj: object, source: str = "scenario") -> Scenario:
    """A whole scenario object -> Scenario (raises InputError naming the bad path)."""
    fields = expect_object(obj, source)
    check_fields(fields, source, ("layout", "request", "cached"), ("name", "description", "origin"))
    layout = layout_from_json(fields["layout"], f"{source}: layout")
    request = expect_object(fields["request"], f"{source}: request")
    check_fields(request, f"{source}: request", ("num_tokens",), ())
    num_tokens = request["num_tokens"]
    cached_json = fields["cached"]
    if not isinstance(cached_json, list) or len(cached_json) != len(layout.groups):
        raise InputError(
            f"{source}: cached: expected a list with one entry per group "
            f"({len(layout.groups)}), in layout order"
        )
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise InputError(f"{source}: request.num_tokens: expected an integer, got {num_tokens!r}")
    if num_tokens > MAX_TOKENS:
        raise InputError(
            f"{source}: request.num_tokens={num_tokens:,} is over the {MAX_TOKENS:,} tokens a "
            "scenario may explain (the report lists every block of every group)"
        )
    names = [g.get("name") for g in fields["layout"]["groups"] if isinstance(g, dict)]
    given = [n for n in names if n is not None]
    if len(given) != len(set(given)):
        raise InputError(
            f"{source}: layout: group names {given} repeat; the report tells groups apart by "
            "name, so give each group its own (or none)"
        )
    cached = tuple(
        parse_blocks(entry, keyable_blocks(layout, i, num_tokens), f"{source}: cached[{i}]")
        for i, entry in enumerate(cached_json)
    )
    view = spec_call(source, lambda: CacheView(layout, num_tokens, cached))
    return Scenario(
        name=str(fields.get("name", source)),
        description=str(fields.get("description", "")),
        origin=fields.get("origin"),
        view=view,
    )


def load_scenario(path: Path) -> Scenario:
    """Read and parse a scenario file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from error
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON: {error}") from error
    return parse_scenario(obj, str(path))


def example_names() -> list[str]:
    """Names of the bundled example scenarios."""
    return sorted(
        p.name.removesuffix(".json") for p in EXAMPLES.iterdir() if p.name.endswith(".json")
    )


def load_example(name: str) -> Scenario:
    """A bundled example by name."""
    if name not in example_names():
        raise InputError(f"no bundled example {name!r}; choose one of {example_names()}")
    return parse_scenario(json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8")), name)
