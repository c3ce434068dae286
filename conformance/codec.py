"""Plain JSON for layouts, operations and observations: what engines and vectors speak.

Engines never see kvcert.spec's Python types: a vector's case and an engine's answer are
JSON values, so an engine in any language can take part (CONFORMANCE.md documents them).
"""

from __future__ import annotations

from typing import Any

from kvcert.conformance.scenario import ScenarioError, parse_layout
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    Extra,
    ExtraKind,
    FullAttention,
    Group,
    InvalidRequest,
    Layout,
    MambaState,
    SlidingWindow,
)
from kvcert.spec import alloc as spec

JSON = dict[str, Any]


def group_to_json(group: Group) -> JSON:
    """A spec group as a layout entry."""
    match group:
        case FullAttention():
            out: JSON = {"kind": "full", "block_size": group.block_size}
        case SlidingWindow():
            out = {"kind": "sliding_window", "block_size": group.block_size, "window": group.window}
        case ChunkedLocal():
            out = {"kind": "chunked_local", "block_size": group.block_size, "chunk": group.chunk}
        case MambaState():
            out = {"kind": "mamba", "block_size": group.block_size, "mode": group.mode.value}
        case CrossAttention():
            out = {"kind": "cross", "block_size": group.block_size}
    if getattr(group, "draft", False):
        out["draft"] = True
    out["name"] = group.name
    return out


def layout_to_json(layout: Layout) -> JSON:
    """A spec layout as JSON (the inverse of scenario.parse_layout)."""
    out: JSON = {"groups": [group_to_json(g) for g in layout.groups]}
    if layout.speculative is not None:
        out["speculative"] = layout.speculative.value
    if layout.max_model_len is not None:
        out["max_model_len"] = layout.max_model_len
    return out


def layout_from_json(obj: object) -> Layout:
    """JSON -> spec layout (ScenarioError on malformed input)."""
    return parse_layout(obj)


def eviction_from_json(value: object) -> spec.Eviction:
    """An alloc case's eviction profile; absent means lru."""
    try:
        return spec.Eviction("lru" if value is None else str(value))
    except ValueError:
        choices = ", ".join(e.value for e in spec.Eviction)
        raise ScenarioError(f"eviction must be one of {choices}, got {value!r}") from None


def extra_to_json(extra: Extra) -> JSON:
    out: JSON = {"kind": extra.kind.value, "value": extra.value}
    if extra.end is not None:
        out.update(start=extra.start, end=extra.end)
    return out


def extra_from_json(obj: JSON) -> Extra:
    try:
        return Extra(ExtraKind(obj["kind"]), obj["value"], obj.get("start", 0), obj.get("end"))
    except (KeyError, ValueError, InvalidRequest) as error:
        raise ScenarioError(f"bad extra key {obj!r}: {error}") from error


def op_to_json(op: spec.Op) -> JSON:
    """One allocator operation as JSON."""
    match op:
        case spec.Admit():
            out: JSON = {
                "op": "admit",
                "rid": op.rid,
                "tokens": list(op.tokens),
                "budget": op.budget,
            }
            if op.extras:
                out["extras"] = [extra_to_json(e) for e in op.extras]
            if op.lookahead:
                out["lookahead"] = op.lookahead
            return out
        case spec.Extend():
            out = {"op": "extend", "rid": op.rid, "budget": op.budget}
            if op.appended:
                out["appended"] = list(op.appended)
            if op.lookahead:
                out["lookahead"] = op.lookahead
            return out
        case spec.EndStep():
            return {"op": "end_step"}
        case spec.Finish():
            return {"op": "finish", "rid": op.rid}
        case spec.Preempt():
            return {"op": "preempt", "rid": op.rid}
        case spec.ResetCache():
            return {"op": "reset_cache"}
    raise ScenarioError(f"unknown operation {op!r}")  # pragma: no cover


def op_from_json(obj: JSON) -> spec.Op:
    """JSON -> one allocator operation."""
    try:
        kind = obj["op"]
        if kind == "admit":
            return spec.Admit(
                obj["rid"],
                tuple(obj["tokens"]),
                obj["budget"],
                tuple(extra_from_json(e) for e in obj.get("extras", ())),
                obj.get("lookahead", 0),
            )
        if kind == "extend":
            return spec.Extend(
                obj["rid"], obj["budget"], tuple(obj.get("appended", ())), obj.get("lookahead", 0)
            )
        if kind == "end_step":
            return spec.EndStep()
        if kind == "finish":
            return spec.Finish(obj["rid"])
        if kind == "preempt":
            return spec.Preempt(obj["rid"])
        if kind == "reset_cache":
            return spec.ResetCache()
    except (KeyError, TypeError) as error:
        raise ScenarioError(f"bad operation {obj!r}: missing or wrong field {error}") from error
    raise ScenarioError(f"unknown operation {obj.get('op')!r} in {obj!r}")


def observation_to_json(observation: spec.Observation) -> JSON:
    """One observation as JSON; tables are lists of physical ids (0 = null)."""
    match observation:
        case spec.Admitted():
            return {
                "admitted": {
                    "hit": observation.hit,
                    "scheduled": observation.scheduled,
                    "tables": [list(t) for t in observation.tables],
                }
            }
        case spec.Extended():
            return {
                "extended": {
                    "scheduled": observation.scheduled,
                    "tables": [list(t) for t in observation.tables],
                }
            }
        case spec.Waiting():
            return {"waiting": {"needed": observation.needed, "free": observation.free}}
        case spec.StepEnded():
            return {"step_ended": {"registered": observation.registered}}
        case spec.Released():
            return {"released": {"blocks": observation.blocks}}
        case spec.CacheReset():
            return {"cache_reset": {"done": observation.done}}
    raise ScenarioError(f"unknown observation {observation!r}")  # pragma: no cover


REFUSED: JSON = {"refused": True}  # the operation breaks the protocol; the engine must refuse


def to_ranges(indices: list[int] | frozenset[int]) -> list[list[int]]:
    """Block indices as sorted half-open ranges: {0,1,2,5} -> [[0, 3], [5, 6]]."""
    ranges: list[list[int]] = []
    for j in sorted(indices):
        if ranges and ranges[-1][1] == j:
            ranges[-1][1] = j + 1
        else:
            ranges.append([j, j + 1])
    return ranges


def from_ranges(ranges: list[list[int]]) -> frozenset[int]:
    """Half-open ranges -> block indices."""
    return frozenset(j for start, stop in ranges for j in range(start, stop))


def to_runs(blocks: list[int | None]) -> list[list[int | None]]:
    """A block list as runs [first, count]: consecutive indices, or nulls with first = null."""
    runs: list[list[int | None]] = []
    for b in blocks:
        if runs:
            first, count = runs[-1]
            length = int(count or 0)
            follows = b is None if first is None else b is not None and b == first + length
            if follows:
                runs[-1][1] = length + 1
                continue
        runs.append([b, 1])
    return runs
