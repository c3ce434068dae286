"""The one JSON codec: layouts, operations and observations as engines and vectors speak them.

Engines never see kvcert.spec's Python types: a vector's case and an engine's answer are JSON
values, so an engine in any language can take part (CONFORMANCE.md documents them). Reading
JSON is strict: a missing or unknown field, a wrong type or a bad choice raises `InputError`
naming the JSON path and what to write instead, so a typo cannot pass.

    {"groups": [{"kind": "full", "block_size": 16},
                {"kind": "sliding_window", "block_size": 16, "window": 128,
                 "draft": true, "name": "sw"}],          kinds: full, sliding_window (window),
     "speculative": "drop",                               chunked_local (chunk), mamba
     "max_model_len": 131072}                             (mode, speculative_blocks), cross;
                                                          draft optional; draft_reach
                                                          (tokens a draft position reads
                                                          past itself, default 1)

Format kvcert-vector/2 adds an optional `shape` to attention groups (`shape_from_json`): the
layers' heads and dtype, for engines that plan their own groups from layers. Format
kvcert-vector/3 adds an optional `visibility` to alloc inputs (`visibility_from_json`), /4 an
optional `retention` (`retention_from_json`), /5 an optional `hit_unit` to layouts (the
hit-granularity profile `unit U`, HIT-UNIT-1) and an optional `partial` to hit inputs
(`partial_from_json`: per group, the positions held under partial keys), /6 the alloc suite
under `unit U` (ALLOC-UNIT-1..4), whose admissions and extensions may list `copies`:
[group, source block, target block] the engine copies before the step's pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    Extra,
    ExtraKind,
    FullAttention,
    Group,
    InvalidRequest,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.retention import Retention

JSON = dict[str, Any]
T = TypeVar("T")

REFUSED: JSON = {"refused": True}  # the input breaks the protocol; the engine must refuse
# Limits of the JSON formats (vectors, scenarios, traces; the vector schema states them): a
# lookup's cost and its answer grow with the request's tokens, and the spec models every
# block of an alloc case's pool.
MAX_TOKENS = 2**20
MAX_POOL_BLOCKS = 2**16


class InputError(ValueError):
    """Malformed input (a vector, a scenario, a plan, a trace, an option); the message names
    where and how to fix it."""


# --- checking JSON --------------------------------------------------------------------------


def expect_object(value: object, where: str) -> dict[str, Any]:
    """`value` as a JSON object, else InputError."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def check_fields(
    obj: Mapping[str, Any], where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    """Every required field present, no field outside required + optional."""
    missing = [f for f in required if f not in obj]
    if missing:
        raise InputError(f"{where}: missing field(s) {missing}")
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        allowed = sorted((*required, *optional))
        raise InputError(f"{where}: unknown field(s) {unknown}; allowed: {allowed}")


def choice(value: object, choices: list[str], where: str) -> str:
    """`value` when it is one of `choices` (StrEnum members print as their values)."""
    if value not in choices:
        names = ", ".join(str(c) for c in choices)
        raise InputError(f"{where}: expected one of {names}, got {value!r}")
    return str(value)


def fraction(value: object, where: str) -> Fraction:
    """A number or a fraction "a/b"."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f'{where}: expected a number or a fraction "a/b", got {value!r}')
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError) as error:
        raise InputError(f'{where}: expected a number or a fraction "a/b": {error}') from error


def spec_call(where: str, build: Callable[[], T]) -> T:
    """Build a spec value; its refusal becomes an InputError at `where`."""
    try:
        return build()
    except (SpecError, TypeError) as error:
        raise InputError(f"{where}: {error}") from error


# --- layouts --------------------------------------------------------------------------------

GROUP_FIELDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (required fields besides kind and block_size, optional fields besides name)
    "full": ((), ("draft", "shape")),
    "sliding_window": (("window",), ("draft", "shape")),
    "chunked_local": (("chunk",), ("draft", "shape")),
    "mamba": ((), ("mode", "speculative_blocks")),
    "cross": ((), ("shape",)),
}
LAYOUT_FIELDS = (("groups",), ("speculative", "max_model_len", "draft_reach", "hit_unit"))
_GROUP_TYPES: Mapping[str, Callable[..., Group]] = {
    "full": FullAttention,
    "sliding_window": SlidingWindow,
    "chunked_local": ChunkedLocal,
    "mamba": MambaState,
    "cross": CrossAttention,
}
SHAPE_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")


def shape_from_json(obj: object, where: str) -> JSON:
    """An attention group's layer shape (format kvcert-vector/2), checked and completed:

        {"num_kv_heads": 8, "head_size_k": 128, "head_size_v": 128, "dtype": "bf16"}

    head_size_v defaults to head_size_k. The spec's answers never depend on it (a hit or a
    table is the same whatever the heads); it tells an engine that plans its own groups which
    layers it is planning, so two groups of one kind that differ only in shape stay apart
    wherever the engine keeps them apart."""
    fields = expect_object(obj, where)
    check_fields(fields, where, ("num_kv_heads", "head_size_k", "dtype"), ("head_size_v",))
    out = dict(fields)
    out.setdefault("head_size_v", fields["head_size_k"])
    for name in ("num_kv_heads", "head_size_k", "head_size_v"):
        value = out[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{where}.{name}: expected a positive integer, got {value!r}")
    choice(out["dtype"], list(SHAPE_DTYPES), f"{where}.dtype")
    return out


def check_group_fields(obj: object, where: str) -> tuple[dict[str, Any], str]:
    """A group object with the fields of its kind and no others: (the object, its kind)."""
    fields = expect_object(obj, where)
    kind = fields.get("kind")
    if not isinstance(kind, str) or kind not in GROUP_FIELDS:
        raise InputError(f"{where}: unknown kind {kind!r}; expected one of {list(GROUP_FIELDS)}")
    required, optional = GROUP_FIELDS[kind]
    check_fields(fields, where, ("kind", "block_size", *required), ("name", *optional))
    return fields, kind


def group_from_json(obj: object, where: str, index: int) -> Group:
    """One group object -> the spec's group type; unnamed groups are named `kind#index`."""
    fields, kind = check_group_fields(obj, where)
    spec_type = _GROUP_TYPES[kind]
    if "shape" in fields:
        shape_from_json(fields["shape"], f"{where}.shape")
    kwargs = {k: v for k, v in fields.items() if k not in ("kind", "shape")}
    if "mode" in kwargs:
        modes = [m.value for m in MambaMode]
        if kwargs["mode"] not in modes:
            raise InputError(f"{where}: mode must be one of {modes}, got {kwargs['mode']!r}")
        kwargs["mode"] = MambaMode(kwargs["mode"])
    kwargs.setdefault("name", f"{kind}#{index}")
    return spec_call(where, lambda: spec_type(**kwargs))


def layout_from_json(obj: object, where: str = "layout") -> Layout:
    """A layout object -> the spec's Layout."""
    fields = expect_object(obj, where)
    check_fields(fields, where, *LAYOUT_FIELDS)
    groups_json = fields["groups"]
    if not isinstance(groups_json, list) or not groups_json:
        raise InputError(f"{where}.groups: expected a non-empty list of groups")
    groups = tuple(group_from_json(g, f"{where}.groups[{i}]", i) for i, g in enumerate(groups_json))
    speculative = fields.get("speculative")
    if speculative is not None:
        choices = [s.value for s in Speculative]
        if speculative not in choices:
            raise InputError(
                f"{where}.speculative: expected one of {choices} or absent, got {speculative!r}"
            )
        speculative = Speculative(speculative)
    return spec_call(
        where,
        lambda: Layout(
            groups,
            speculative=speculative,
            max_model_len=fields.get("max_model_len"),
            draft_reach=fields.get("draft_reach", 1),
            hit_unit=fields.get("hit_unit"),
        ),
    )


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
            if group.speculative_blocks:
                out["speculative_blocks"] = group.speculative_blocks
        case CrossAttention():
            out = {"kind": "cross", "block_size": group.block_size}
    if getattr(group, "draft", False):
        out["draft"] = True
    out["name"] = group.name
    return out


def layout_to_json(layout: Layout) -> JSON:
    """A spec layout as JSON (the inverse of layout_from_json)."""
    out: JSON = {"groups": [group_to_json(g) for g in layout.groups]}
    if layout.speculative is not None:
        out["speculative"] = layout.speculative.value
    if layout.max_model_len is not None:
        out["max_model_len"] = layout.max_model_len
    if layout.draft_reach != 1:  # 1 (EAGLE, one MTP module) is the default: older vectors
        out["draft_reach"] = layout.draft_reach
    if layout.hit_unit is not None:  # absent: block hits, as every vector before /5
        out["hit_unit"] = layout.hit_unit
    return out


P = TypeVar("P", spec.Eviction, spec.Visibility, Retention)


def _profile_from_json(profiles: type[P], value: object, absent: P, name: str) -> P:
    """A profile named by its exact value, `absent` when the field is."""
    try:
        return absent if value is None else profiles(str(value))
    except ValueError:
        choices = ", ".join(p.value for p in profiles)
        raise InputError(f"{name} must be one of {choices}, got {value!r}") from None


def visibility_from_json(value: object) -> spec.Visibility:
    """An alloc case's visibility profile; absent means step-end."""
    return _profile_from_json(spec.Visibility, value, spec.Visibility.STEP_END, "visibility")


def retention_from_json(value: object) -> Retention:
    """An alloc case's retention profile; absent means dense."""
    return _profile_from_json(Retention, value, Retention.DENSE, "retention")


def retention_interval_from_json(value: object) -> int:
    """An alloc case's retention interval; absent means 0 (none). Range checks are the
    spec's (PoolConfig), so an engine is judged on refusing them."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"retention_interval must be an integer, got {value!r}")
    return value


def eviction_from_json(value: object) -> spec.Eviction:
    """An alloc case's eviction profile; absent means lru."""
    return _profile_from_json(spec.Eviction, value, spec.Eviction.LRU, "eviction")


# --- operations and observations ------------------------------------------------------------


def extra_to_json(extra: Extra) -> JSON:
    out: JSON = {"kind": extra.kind.value, "value": extra.value}
    if extra.end is not None:
        out.update(start=extra.start, end=extra.end)
    return out


def extra_from_json(obj: JSON) -> Extra:
    try:
        return Extra(ExtraKind(obj["kind"]), obj["value"], obj.get("start", 0), obj.get("end"))
    except (KeyError, ValueError, InvalidRequest) as error:
        raise InputError(f"bad extra key {obj!r}: {error}") from error


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
            if op.checkpoint:
                out["checkpoint"] = op.checkpoint
            return out
        case spec.Extend():
            out = {"op": "extend", "rid": op.rid, "budget": op.budget}
            if op.appended:
                out["appended"] = list(op.appended)
            if op.lookahead:
                out["lookahead"] = op.lookahead
            if op.checkpoint:
                out["checkpoint"] = op.checkpoint
            return out
        case spec.EndStep():
            return {"op": "end_step"}
        case spec.Finish():
            return {"op": "finish", "rid": op.rid}
        case spec.Preempt():
            return {"op": "preempt", "rid": op.rid}
        case spec.ResetCache():
            return {"op": "reset_cache"}
    raise InputError(f"unknown operation {op!r}")  # pragma: no cover


OP_FIELDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # op: (required fields besides "op", optional fields)
    "admit": (("rid", "tokens", "budget"), ("extras", "lookahead", "checkpoint")),
    "extend": (("rid", "budget"), ("appended", "lookahead", "checkpoint")),
    "end_step": ((), ()),
    "finish": (("rid",), ()),
    "preempt": (("rid",), ()),
    "reset_cache": ((), ()),
}


def check_op_fields(obj: object) -> dict[str, Any]:
    """An operation object with the fields of its op and no others."""
    fields = expect_object(obj, "operation")
    if fields.get("op") not in OP_FIELDS:
        raise InputError(f"unknown operation {fields.get('op')!r}; one of {list(OP_FIELDS)}")
    required, optional = OP_FIELDS[fields["op"]]
    check_fields(fields, f"operation {fields['op']}", ("op", *required), optional)
    return fields


def op_from_json(obj: JSON) -> spec.Op:
    """JSON -> one allocator operation; a missing or unknown field is an InputError."""
    check_op_fields(obj)
    try:
        kind = obj["op"]
        if kind == "admit":
            return spec.Admit(
                obj["rid"],
                tuple(obj["tokens"]),
                obj["budget"],
                tuple(extra_from_json(e) for e in obj.get("extras", ())),
                obj.get("lookahead", 0),
                obj.get("checkpoint", 0),
            )
        if kind == "extend":
            return spec.Extend(
                obj["rid"],
                obj["budget"],
                tuple(obj.get("appended", ())),
                obj.get("lookahead", 0),
                obj.get("checkpoint", 0),
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
        raise InputError(f"bad operation {obj!r}: missing or wrong field {error}") from error
    raise InputError(f"unknown operation {kind!r}")  # pragma: no cover - OP_FIELDS has each


def observation_to_json(observation: spec.Observation) -> JSON:
    """One observation as JSON; tables are lists of physical ids (0 = null), and under
    `unit U` an admission or extension that copies blocks lists them (format /6)."""
    match observation:
        case spec.Admitted():
            admitted: JSON = {
                "hit": observation.hit,
                "scheduled": observation.scheduled,
                "tables": [list(t) for t in observation.tables],
            }
            if observation.copies:
                admitted["copies"] = [list(c) for c in observation.copies]
            return {"admitted": admitted}
        case spec.Extended():
            extended: JSON = {
                "scheduled": observation.scheduled,
                "tables": [list(t) for t in observation.tables],
            }
            if observation.copies:
                extended["copies"] = [list(c) for c in observation.copies]
            return {"extended": extended}
        case spec.Waiting():
            return {"waiting": {"needed": observation.needed, "free": observation.free}}
        case spec.StepEnded():
            return {"step_ended": {"registered": observation.registered}}
        case spec.Released():
            return {"released": {"blocks": observation.blocks}}
        case spec.CacheReset():
            return {"cache_reset": {"done": observation.done}}
    raise InputError(f"unknown observation {observation!r}")  # pragma: no cover


# --- block sets -----------------------------------------------------------------------------


def to_ranges(indices: list[int] | frozenset[int]) -> list[list[int]]:
    """Block indices as sorted half-open ranges: {0,1,2,5} -> [[0, 3], [5, 6]]."""
    ranges: list[list[int]] = []
    for j in sorted(indices):
        if ranges and ranges[-1][1] == j:
            ranges[-1][1] = j + 1
        else:
            ranges.append([j, j + 1])
    return ranges


def from_ranges(ranges: object, where: str = "cached") -> frozenset[int]:
    """Half-open ranges [start, stop) -> block indices, each range checked before any index is
    made: integers with 0 <= start < stop <= MAX_TOKENS (a reversed or empty range is a
    typo, not "nothing cached")."""
    if not isinstance(ranges, list):
        raise InputError(f"{where}: expected a list of [start, stop] ranges, got {ranges!r}")
    for item in ranges:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in item)
            or not 0 <= item[0] < item[1] <= MAX_TOKENS
        ):
            raise InputError(
                f"{where}: {item!r} is not a block range [start, stop) with integers "
                f"0 <= start < stop <= {MAX_TOKENS}"
            )
    return frozenset(j for start, stop in ranges for j in range(start, stop))


def partial_from_json(
    obj: object, groups: int, where: str = "partial"
) -> tuple[frozenset[int], ...]:
    """A hit input's `partial` (format /5; absent: none): per group, the token positions held
    under partial keys, each an integer in [1, MAX_TOKENS] (the spec checks the rest)."""
    if obj is None:
        return tuple(frozenset() for _ in range(groups))
    if not isinstance(obj, list) or len(obj) != groups:
        raise InputError(f"{where}: expected one list of positions per group ({groups})")
    for index, positions in enumerate(obj):
        if not isinstance(positions, list) or any(
            isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= MAX_TOKENS
            for p in positions
        ):
            raise InputError(
                f"{where}[{index}]: expected a list of token positions, integers in "
                f"[1, {MAX_TOKENS}], got {positions!r}"
            )
    return tuple(frozenset(positions) for positions in obj)


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
