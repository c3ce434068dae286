"""Drive kvcert.reference from the vectors' JSON, without kvcert.spec in the path.

The translation is mechanical (field names and types only) and never goes through the
spec's parsers, so the reference's own validation decides what it refuses: a difference from
the spec is a difference in behaviour.
"""

from __future__ import annotations

from typing import Any

from kvcert.reference import config as ref
from kvcert.reference.errors import ConfigError, KVCacheError, RequestStateError
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Waiting

JSON = dict[str, Any]
REFUSED: JSON = {"refused": True}


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    return value


def group_from_json(obj: JSON) -> ref.GroupConfig:
    """One layout group as the reference's GroupConfig."""
    try:
        kind = ref.Kind(obj["kind"])
        mode = ref.MambaMode(obj.get("mode", "all"))
    except (KeyError, ValueError) as error:
        raise ConfigError(f"bad group {obj!r}: {error}") from error
    draft = obj.get("draft", False)
    if not isinstance(draft, bool):
        raise ConfigError(f"draft must be a boolean, got {draft!r}")
    return ref.GroupConfig(
        kind,
        _int(obj.get("block_size"), "block_size"),
        window=_int(obj.get("window", 0), "window"),
        chunk=_int(obj.get("chunk", 0), "chunk"),
        mode=mode,
        draft=draft,
        name=str(obj.get("name", "")),
    )


def config_from_json(layout: JSON, num_blocks: int, eviction: object = "lru") -> ref.CacheConfig:
    """A layout object, pool size and eviction profile as the reference's CacheConfig."""
    groups = layout.get("groups")
    if not isinstance(groups, list):
        raise ConfigError("layout.groups must be a list")
    speculative = layout.get("speculative")
    try:
        keying = ref.DraftKeying(speculative) if speculative is not None else None
    except ValueError as error:
        raise ConfigError(f"bad speculative keying {speculative!r}") from error
    limit = layout.get("max_model_len")
    try:
        profile = ref.Eviction(str(eviction))
    except ValueError as error:
        raise ConfigError(f"bad eviction profile {eviction!r}") from error
    config = ref.CacheConfig(
        tuple(group_from_json(g) for g in groups),
        num_blocks,
        speculative=keying,
        max_model_len=None if limit is None else _int(limit, "max_model_len"),
        eviction=profile,
    )
    if limit is not None and config.alignment > limit - 1:
        raise ConfigError(
            f"alignment {config.alignment} exceeds what max_model_len={limit} can ever reuse"
        )
    return config


def extra_from_json(obj: JSON) -> ExtraKey:
    try:
        return ExtraKey(ExtraKind(obj["kind"]), obj["value"], obj.get("start", 0), obj.get("end"))
    except (KeyError, ValueError, TypeError) as error:
        raise ConfigError(f"bad extra key {obj!r}: {error}") from error


def tables_json(tables: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    return [list(t) for t in tables]


class ReferenceSession:
    """One reference allocator answering the alloc suite's JSON operations."""

    def __init__(self, layout: JSON, num_blocks: int, eviction: object = "lru") -> None:
        self.manager = KVCacheManager(config_from_json(layout, num_blocks, eviction))

    def apply(self, op: JSON) -> JSON:
        """Run one operation; reference errors become {"refused": true}."""
        try:
            return self._apply(op)
        except KVCacheError:
            return REFUSED

    def _apply(self, op: JSON) -> JSON:
        manager = self.manager
        kind = op.get("op")
        if kind == "admit":
            result = manager.admit(
                str(op["rid"]),
                list(op["tokens"]),
                _int(op["budget"], "budget"),
                [extra_from_json(e) for e in op.get("extras", ())],
                _int(op.get("lookahead", 0), "lookahead"),
            )
            if isinstance(result, Waiting):
                return {"waiting": {"needed": result.needed, "free": result.free}}
            return {
                "admitted": {
                    "hit": result.hit,
                    "scheduled": result.scheduled,
                    "tables": tables_json(result.tables),
                }
            }
        if kind == "extend":
            result = manager.extend(
                str(op["rid"]),
                _int(op["budget"], "budget"),
                list(op.get("appended", ())),
                _int(op.get("lookahead", 0), "lookahead"),
            )
            if isinstance(result, Waiting):
                return {"waiting": {"needed": result.needed, "free": result.free}}
            return {
                "extended": {"scheduled": result.scheduled, "tables": tables_json(result.tables)}
            }
        if kind == "end_step":
            return {"step_ended": {"registered": manager.end_step()}}
        if kind in ("finish", "preempt"):
            release = manager.finish if kind == "finish" else manager.preempt
            return {"released": {"blocks": release(str(op["rid"]))}}
        if kind == "reset_cache":
            return {"cache_reset": {"done": manager.reset_prefix_cache()}}
        raise RequestStateError(f"unknown operation {op!r}")


def check_view(config: ref.CacheConfig, num_tokens: object, cached: list[frozenset[int]]) -> int:
    """The reference's checks on a hit query: a cache it could hold for this request."""
    tokens = _int(num_tokens, "num_tokens")
    if tokens < 1 or (config.max_model_len is not None and tokens > config.max_model_len):
        raise RequestStateError(f"num_tokens={tokens} is not a valid request length")
    if len(cached) != len(config.groups):
        raise RequestStateError("one cached entry per group is required")
    exact = config.speculative is ref.DraftKeying.EXACT
    for group, blocks in zip(config.groups, cached, strict=True):
        never = group.kind is ref.Kind.CROSS or (
            group.kind is ref.Kind.MAMBA and group.mode is ref.MambaMode.NONE
        )
        if blocks and never:
            raise RequestStateError(f"group {group.name!r} never holds cached blocks")
        keyed = (tokens - (1 if exact and group.draft else 0)) // group.block_size
        if any(not 0 <= j < keyed for j in blocks):
            raise RequestStateError(f"group {group.name!r}: cached block outside the request")
    return tokens
