"""Configuration of the reference allocator: the groups sharing one pool.

These types mirror kvcert.spec.layout on purpose but share no code with it: the differential
tests compare two independent implementations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kvcert.reference.errors import ConfigError


class Kind(StrEnum):
    """How a group's layers read earlier tokens."""

    FULL = "full"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MAMBA = "mamba"
    CROSS = "cross"


class MambaMode(StrEnum):
    """Where a state group writes checkpoints."""

    NONE = "none"
    ALIGN = "align"
    ALL = "all"


class DraftKeying(StrEnum):
    """How draft-layer blocks are keyed (spec HIT-SPEC-1/2)."""

    EXACT = "exact"
    DROP = "drop"


class Eviction(StrEnum):
    """Which free block a new allocation takes (spec ALLOC-EVICT-1, EVICT-HYB-1)."""

    LRU = "lru"  # the head of the free queue; requests freed group by group
    HYBRID = "hybrid"  # provably dead blocks first; requests freed tail first
    LRU_UNKEYED_FIRST = "lru-unkeyed-first"  # lru, but unregistered blocks go to the head


class HashAlgorithm(StrEnum):
    """Collision-resistant digests for block keys."""

    SHA256 = "sha256"
    BLAKE2B = "blake2b"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One KV-cache group: layers sharing a block table."""

    kind: Kind
    block_size: int
    window: int = 0  # sliding window, the query token included
    chunk: int = 0  # chunked local attention chunk
    mode: MambaMode = MambaMode.ALL  # state groups only
    draft: bool = False  # holds speculative-decoding draft layers
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or self.kind
        if not isinstance(self.kind, Kind):
            raise ConfigError(f"group {label!r}: kind must be a Kind, got {self.kind!r}")
        if (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, int)
            or (self.block_size < 1)
        ):
            raise ConfigError(
                f"group {label!r}: block_size must be an integer >= 1, got {self.block_size!r}"
            )
        if self.kind is Kind.SLIDING_WINDOW and self.window < 1:
            raise ConfigError(f"group {label!r}: a sliding window needs window >= 1")
        if self.kind is Kind.CHUNKED_LOCAL and self.chunk < 1:
            raise ConfigError(f"group {label!r}: chunked local attention needs chunk >= 1")
        if self.draft and self.kind in (Kind.MAMBA, Kind.CROSS):
            raise ConfigError(f"group {label!r}: only attention groups can hold draft layers")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Everything the allocator is built from."""

    groups: tuple[GroupConfig, ...]
    num_blocks: int  # physical blocks, the null block (id 0) included
    speculative: DraftKeying | None = None
    max_model_len: int | None = None
    hash_algorithm: HashAlgorithm = HashAlgorithm.SHA256
    eviction: Eviction = Eviction.LRU
    count_dead_evictions: bool = False  # track EVICT-DEAD-1 under lru too (hybrid always does)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("a cache needs at least one group")
        if (
            isinstance(self.num_blocks, bool)
            or not isinstance(self.num_blocks, int)
            or (self.num_blocks < 2)
        ):
            raise ConfigError(
                f"num_blocks must be an integer >= 2 (the null block plus one), "
                f"got {self.num_blocks!r}"
            )
        drafts = any(g.draft for g in self.groups)
        if drafts != (self.speculative is not None):
            raise ConfigError(
                "draft groups and a speculative keying go together: mark the "
                "draft groups with draft=True and set speculative, or neither"
            )
        if not isinstance(self.eviction, Eviction):
            choices = ", ".join(e.value for e in Eviction)
            raise ConfigError(f"eviction must be one of {choices}, got {self.eviction!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")

    @property
    def alignment(self) -> int:
        """Every hit is a multiple of this (lcm of the cacheable block sizes)."""
        return math.lcm(*(g.block_size for g in self.groups if g.kind is not Kind.CROSS))
