"""Scenario files: a layout, what each group has cached, and a request, as JSON.

The format is what `kvcert explain` reads and what the `hit` vectors build on:

    {
      "name": "gpt-oss-eagle",                      optional, for display
      "description": "...", "origin": "vllm#32802", optional
      "layout": {
        "groups": [{"kind": "full", "block_size": 16},
                   {"kind": "sliding_window", "block_size": 16, "window": 128,
                    "draft": true, "name": "sw"}],
        "speculative": "drop",                       optional: "exact" | "drop"
        "max_model_len": 131072                      optional
      },
      "request": {"num_tokens": 71},
      "cached": ["all", "2-3"]                       one entry per group
    }

A `cached` entry is "all" (every keyed block of the request), "none", or a list whose items
are block indices or inclusive ranges "a-b". Unknown fields are refused so typos cannot pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
)
from kvcert.spec.view import keyable_blocks

T = TypeVar("T")


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the JSON path and the fix."""


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: the spec's cache view plus descriptive fields."""

    name: str
    description: str
    origin: str | None
    view: CacheView


_GROUP_FIELDS: Mapping[str, tuple[Callable[..., Group], tuple[str, ...], tuple[str, ...]]] = {
    # kind: (spec type, required fields besides block_size, optional fields besides name)
    "full": (FullAttention, (), ("draft",)),
    "sliding_window": (SlidingWindow, ("window",), ("draft",)),
    "chunked_local": (ChunkedLocal, ("chunk",), ("draft",)),
    "mamba": (MambaState, (), ("mode",)),
    "cross": (CrossAttention, (), ()),
}


def _expect_object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _check_fields(
    obj: Mapping[str, Any], where: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    missing = [f for f in required if f not in obj]
    if missing:
        raise ScenarioError(f"{where}: missing field(s) {missing}")
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        allowed = sorted(required + optional)
        raise ScenarioError(f"{where}: unknown field(s) {unknown}; allowed: {allowed}")


def _spec_call(where: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except SpecError as error:
        raise ScenarioError(f"{where}: {error}") from error


def parse_group(obj: object, where: str, index: int) -> Group:
    """One group object -> the spec's group type; unnamed groups are named `kind#index`."""
    fields = _expect_object(obj, where)
    kind = fields.get("kind")
    if not isinstance(kind, str) or kind not in _GROUP_FIELDS:
        raise ScenarioError(
            f"{where}: unknown kind {kind!r}; expected one of {list(_GROUP_FIELDS)}"
        )
    spec_type, required, optional = _GROUP_FIELDS[kind]
    _check_fields(fields, where, ("kind", "block_size", *required), ("name", *optional))
    kwargs = {k: v for k, v in fields.items() if k != "kind"}
    if "mode" in kwargs:
        modes = [m.value for m in MambaMode]
        if kwargs["mode"] not in modes:
            raise ScenarioError(f"{where}: mode must be one of {modes}, got {kwargs['mode']!r}")
        kwargs["mode"] = MambaMode(kwargs["mode"])
    kwargs.setdefault("name", f"{kind}#{index}")
    return _spec_call(where, lambda: spec_type(**kwargs))


def parse_layout(obj: object, where: str = "layout") -> Layout:
    """A layout object -> the spec's Layout."""
    fields = _expect_object(obj, where)
    _check_fields(fields, where, ("groups",), ("speculative", "max_model_len"))
    groups_json = fields["groups"]
    if not isinstance(groups_json, list) or not groups_json:
        raise ScenarioError(f"{where}.groups: expected a non-empty list of groups")
    groups = tuple(parse_group(g, f"{where}.groups[{i}]", i) for i, g in enumerate(groups_json))
    speculative = fields.get("speculative")
    if speculative is not None:
        choices = [s.value for s in Speculative]
        if speculative not in choices:
            raise ScenarioError(
                f"{where}.speculative: expected one of {choices} or absent, got {speculative!r}"
            )
        speculative = Speculative(speculative)
    return _spec_call(
        where,
        lambda: Layout(groups, speculative=speculative, max_model_len=fields.get("max_model_len")),
    )


def parse_blocks(entry: object, count: int, where: str) -> frozenset[int]:
    """A `cached` entry -> block indices; `count` is how many blocks the request keys."""
    if entry == "all":
        return frozenset(range(count))
    if entry == "none":
        return frozenset()
    if not isinstance(entry, list):
        raise ScenarioError(f'{where}: expected "all", "none" or a list of indices/ranges')
    blocks: set[int] = set()
    for item in entry:
        if isinstance(item, int) and not isinstance(item, bool):
            blocks.add(item)
            continue
        low, dash, high = str(item).partition("-") if isinstance(item, str) else ("", "", "")
        if not (dash and low.isdigit() and high.isdigit() and int(low) <= int(high)):
            raise ScenarioError(f'{where}: {item!r} is neither a block index nor a range "a-b"')
        blocks.update(range(int(low), int(high) + 1))
    return frozenset(blocks)


def parse_scenario(obj: object, source: str = "scenario") -> Scenario:
    """A whole scenario object -> Scenario (raises ScenarioError naming the bad path)."""
    fields = _expect_object(obj, source)
    _check_fields(
        fields, source, ("layout", "request", "cached"), ("name", "description", "origin")
    )
    layout = parse_layout(fields["layout"], f"{source}: layout")
    request = _expect_object(fields["request"], f"{source}: request")
    _check_fields(request, f"{source}: request", ("num_tokens",), ())
    num_tokens = request["num_tokens"]
    cached_json = fields["cached"]
    if not isinstance(cached_json, list) or len(cached_json) != len(layout.groups):
        raise ScenarioError(
            f"{source}: cached: expected a list with one entry per group "
            f"({len(layout.groups)}), in layout order"
        )
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise ScenarioError(
            f"{source}: request.num_tokens: expected an integer, got {num_tokens!r}"
        )
    cached = tuple(
        parse_blocks(entry, keyable_blocks(layout, i, num_tokens), f"{source}: cached[{i}]")
        for i, entry in enumerate(cached_json)
    )
    view = _spec_call(source, lambda: CacheView(layout, num_tokens, cached))
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
        raise ScenarioError(f"{path}: cannot read: {error.strerror or error}") from error
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise ScenarioError(f"{path}: not valid JSON: {error}") from error
    return parse_scenario(obj, str(path))
