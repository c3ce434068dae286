"""What the cache announces as it changes: a block became hittable, stopped being, or all did.

Engines publish these to routers that steer requests to the replica holding their prefix
(vLLM's KV events). They are recorded only when `CacheConfig.record_events` is on; one
event per block, so a key held by two blocks is announced twice and withdrawn twice.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stored:
    """Block `block` of group `group` is hittable under `key`: the digest of the request's
    tokens up to `start + len(tokens)` (and one more for an exactly keyed draft group); the
    previous block of that group in the request's table is keyed `parent` (None at 0)."""

    rid: str
    group: int
    block: int
    key: bytes
    parent: bytes | None
    start: int  # the block's first token position
    tokens: tuple[int, ...]  # the tokens the block holds


@dataclass(frozen=True, slots=True)
class Removed:
    """Block `block` of group `group`, keyed `key`, was evicted (its key forgotten)."""

    group: int
    block: int
    key: bytes


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every key was forgotten (a prefix-cache reset)."""


Event = Stored | Removed | Cleared
