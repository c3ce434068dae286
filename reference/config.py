"""Configuration of the reference allocator: the groups sharing one pool.

These types mirror kvcert.spec.layout on purpose but share no code with it: the differential
tests compare two independent implementations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from kvcert.reference.errors import ConfigError

MAX_BLOCKS = 2**31 - 1  # block ids are int32 in engines' block tables


E = TypeVar("E", bound=StrEnum)


def as_choice(choices: type[E], value: object, what: str) -> E:
    """An enum-typed setting is the member itself or its exact value string (settings arrive
    from environment variables and JSON); anything else is a ConfigError naming the choices,
    because the allocator compares members by identity and would silently take another path."""
    if isinstance(value, choices):
        return value
    if isinstance(value, str):
        for member in choices:
            if member.value == value:
                return member
    names = ", ".join(m.value for m in choices)
    raise ConfigError(
        f"{what} must be one of {names} (a {choices.__name__} or its value), got {value!r}"
    )


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
    """Which free block a new allocation takes (spec ALLOC-EVICT-1, EVICT-HYB-1), or the
    radix profile's tree, which evicts its own way (RADIX-EVICT-1)."""

    LRU = "lru"  # the head of the free queue; requests freed group by group
    HYBRID = "hybrid"  # provably dead blocks first; requests freed tail first
    LRU_UNKEYED_FIRST = "lru-unkeyed-first"  # lru, but unregistered blocks go to the head
    RADIX = "radix"  # SGLang's tree of page runs (spec §13): kvcert.reference.radix


# the profiles a KVCacheManager's block pool serves (its free queue's order, §6)
BLOCK_POOL_EVICTIONS = (Eviction.LRU, Eviction.HYBRID, Eviction.LRU_UNKEYED_FIRST)


class Visibility(StrEnum):
    """From when a block a chunk computes serves hits (spec ALLOC-VIS-1, ALLOC-VIS-2)."""

    STEP_END = "step-end"  # once the step that wrote it has ended
    SAME_PASS = "same-pass"  # attention blocks from their chunk's scheduling on


class Retention(StrEnum):
    """Which committed blocks of bounded groups stay cached (spec RET-DENSE-1, RET-SPARSE-2)."""

    DENSE = "dense"  # every committed block
    SPARSE = "sparse"  # only those a hit at a retained length needs


class HashAlgorithm(StrEnum):
    """Collision-resistant digests for block keys."""

    SHA256 = "sha256"
    BLAKE2B = "blake2b"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One KV-cache group: layers sharing a block table."""

    kind: Kind
    block_size: int
    window: int = 0  # sliding window groups only: the window, the query token included
    chunk: int = 0  # chunked local groups only: the attention chunk
    mode: MambaMode | None = None  # state groups only (default all)
    draft: bool = False  # holds speculative-decoding draft layers
    name: str = ""
    # state groups in mode align only: the blocks a step verifying up to this many draft
    # tokens writes the drafts' states into (MTP/EAGLE on a state model; ALLOC-SPEC-1)
    speculative_blocks: int = 0

    def __post_init__(self) -> None:
        label = self.name or str(self.kind)
        object.__setattr__(self, "kind", as_choice(Kind, self.kind, f"group {label!r}: kind"))
        for name, value, kind in (
            ("window", self.window, Kind.SLIDING_WINDOW),
            ("chunk", self.chunk, Kind.CHUNKED_LOCAL),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"group {label!r}: {name} must be an integer, got {value!r}")
            if value and self.kind is not kind:
                raise ConfigError(
                    f"group {label!r}: {name}={value} applies to {kind.value} groups only, "
                    f"not {self.kind.value}; drop it or change the kind"
                )
        if self.mode is not None and self.kind is not Kind.MAMBA:
            raise ConfigError(
                f"group {label!r}: mode applies to mamba groups only, not {self.kind.value}"
            )
        if self.kind is Kind.MAMBA:
            mode = MambaMode.ALL if self.mode is None else self.mode
            object.__setattr__(self, "mode", as_choice(MambaMode, mode, f"group {label!r}: mode"))
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
        spare = self.speculative_blocks
        if isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
            raise ConfigError(
                f"group {label!r}: speculative_blocks must be an integer >= 0, got {spare!r}"
            )
        if spare and self.mode is not MambaMode.ALIGN:
            raise ConfigError(
                f"group {label!r}: speculative_blocks={spare} needs a state group in mode "
                "align (the running state moves with the chunk); set mode to align or "
                "speculative_blocks to 0"
            )
        if not isinstance(self.draft, bool):
            raise ConfigError(f"group {label!r}: draft must be True or False, got {self.draft!r}")
        if self.draft and self.kind in (Kind.MAMBA, Kind.CROSS):
            raise ConfigError(f"group {label!r}: only attention groups can hold draft layers")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Everything the allocator is built from."""

    groups: tuple[GroupConfig, ...]
    num_blocks: int  # physical blocks, the null block (id 0) included
    speculative: DraftKeying | None = None
    max_model_len: int | None = None
    # tokens after a position that its draft KV reads: 1 (EAGLE, one MTP module) or k (k MTP
    # modules, each reading one token further)
    draft_reach: int = 1
    hash_algorithm: HashAlgorithm = HashAlgorithm.SHA256
    eviction: Eviction = Eviction.LRU
    # same-pass: the engine writes each layer's KV for the whole batch before that layer's
    # attention, and never drops a scheduled chunk another request hit (spec ALLOC-VIS-2/3)
    visibility: Visibility = Visibility.STEP_END
    # sparse: sliding-window, chunked and state groups keep only the blocks a hit at a
    # retained length needs (re-send, extension, junction, interval multiples; spec §6b)
    retention: Retention = Retention.DENSE
    retention_interval: int = 0  # sparse only: also retain every multiple of this (0: none)
    count_dead_evictions: bool = False  # track EVICT-DEAD-1 under lru too (hybrid always does)
    # bytes of recent prompts' digest chains kept so a shared prefix is hashed once
    # (kvcert.reference.hashing.DigestMemo); 0 turns the memo off
    digest_memo_bytes: int = 16 * 2**20
    # record what becomes hittable or is evicted (kvcert.reference.events), for engines that
    # publish KV events; costs a per-block path where batches run otherwise
    record_events: bool = False
    # the hit-granularity profile: None is `block` (hits end on every group's block boundary);
    # U is `unit U` (a hit may end at any multiple of U, inside a block too; spec HIT-UNIT-1)
    hit_unit: int | None = None
    # every hit is a multiple of this: the lcm of the cacheable block sizes, or the hit unit
    # when one is set (derived once: each hit search reads it)
    alignment: int = field(init=False, repr=False, compare=False)
    # per group (kind code, block size, window or chunk) for the compiled hit search; None
    # with a state group, whose search is only the Python one (derived once, as alignment)
    search_plan: tuple[tuple[int, int, int], ...] | None = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.groups, tuple | list) or not self.groups:
            raise ConfigError("a cache needs at least one group: a non-empty tuple of GroupConfig")
        if not all(isinstance(g, GroupConfig) for g in self.groups):
            raise ConfigError(f"groups must be GroupConfig values, got {self.groups!r}")
        object.__setattr__(self, "groups", tuple(self.groups))
        self._check_hit_unit()
        unit = self.hit_unit
        object.__setattr__(self, "alignment", unit or hit_alignment(self.groups))
        object.__setattr__(self, "search_plan", search_plan(self.groups))
        if self.speculative is not None:
            object.__setattr__(
                self, "speculative", as_choice(DraftKeying, self.speculative, "speculative")
            )
        algorithm = as_choice(HashAlgorithm, self.hash_algorithm, "hash_algorithm")
        object.__setattr__(self, "hash_algorithm", algorithm)
        object.__setattr__(self, "eviction", as_choice(Eviction, self.eviction, "eviction"))
        visibility = as_choice(Visibility, self.visibility, "visibility")
        object.__setattr__(self, "visibility", visibility)
        object.__setattr__(self, "retention", as_choice(Retention, self.retention, "retention"))
        if (
            isinstance(self.num_blocks, bool)
            or not isinstance(self.num_blocks, int)
            or not 2 <= self.num_blocks <= MAX_BLOCKS
        ):
            raise ConfigError(
                f"num_blocks must be an integer in [2, 2**31 - 1] (the null block plus one at "
                f"least; block ids are int32 in engines' block tables), got {self.num_blocks!r}"
            )
        drafts = any(g.draft for g in self.groups)
        if drafts != (self.speculative is not None):
            raise ConfigError(
                "draft groups and a speculative keying go together: mark the "
                "draft groups with draft=True and set speculative, or neither"
            )
        reach = self.draft_reach
        if isinstance(reach, bool) or not isinstance(reach, int) or not 1 <= reach <= 255:
            raise ConfigError(
                f"draft_reach must be an integer in [1, 255] (a key records it in one byte; "
                f"drafters read 1 to a few tokens ahead), got {reach!r}"
            )
        if reach > 1 and not drafts:
            raise ConfigError(
                f"draft_reach={reach} describes draft layers but no group holds any; drop "
                "draft_reach or mark the draft groups and set speculative"
            )
        if self.speculative is DraftKeying.DROP and reach > self.alignment:
            raise ConfigError(
                f"speculative=drop steps a hit down by at least {self.alignment} tokens (the "
                f"hit alignment), fewer than the draft_reach={reach} tokens a draft "
                "position reads: a dropped hit could still serve draft KV computed from "
                "other tokens; use exact keying or larger blocks"
            )
        if (
            isinstance(self.digest_memo_bytes, bool)
            or not isinstance(self.digest_memo_bytes, int)
            or self.digest_memo_bytes < 0
        ):
            raise ConfigError(
                f"digest_memo_bytes must be an integer >= 0 (0 turns the memo off), "
                f"got {self.digest_memo_bytes!r}"
            )
        if not isinstance(self.count_dead_evictions, bool):
            raise ConfigError(
                f"count_dead_evictions must be True or False, got {self.count_dead_evictions!r}"
            )
        if not isinstance(self.record_events, bool):
            raise ConfigError(f"record_events must be True or False, got {self.record_events!r}")
        self._check_retention_interval()
        length = self.max_model_len
        if length is not None and (
            isinstance(length, bool) or not isinstance(length, int) or length < 1
        ):
            raise ConfigError(
                f"max_model_len must be an integer >= 1 or None (no limit), got {length!r}"
            )
        if self.max_model_len is not None and self.alignment > self.max_model_len - 1:
            raise ConfigError(
                f"every hit is a multiple of {self.alignment} tokens (the hit alignment) "
                f"but a request of max_model_len={self.max_model_len} can reuse at most "
                f"{self.max_model_len - 1}: prefix caching could never hit; choose smaller "
                "blocks or a longer max_model_len"
            )

    def _check_hit_unit(self) -> None:
        """Implements HIT-UNIT-1's condition: the unit divides every cacheable block size."""
        unit = self.hit_unit
        if unit is None:
            return
        if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1:
            raise ConfigError(
                f"hit_unit must be an integer >= 1 or None (block hits), got {unit!r}"
            )
        coarse = [g.name or g.kind.value for g in self.groups
                  if g.kind is not Kind.CROSS and g.block_size % unit]  # fmt: skip
        if coarse:
            raise ConfigError(
                f"hit_unit={unit} does not divide the block size of groups {coarse}: a hit "
                "ending on the unit grid must end on a whole unit of every block; choose a "
                "unit dividing every block size, or None for block hits"
            )

    def _check_retention_interval(self) -> None:
        interval = self.retention_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise ConfigError(
                f"retention_interval must be an integer >= 0 (0: none), got {interval!r}"
            )
        if interval and self.retention is not Retention.SPARSE:
            raise ConfigError(
                f"retention_interval={interval} applies to sparse retention only; set "
                "retention='sparse' or leave the interval at 0"
            )
        if interval % self.alignment:
            raise ConfigError(
                f"retention_interval={interval} is not a multiple of the hit alignment "
                f"{self.alignment} (the lcm of the block sizes); no hit could end at it"
            )


# each kind's code in the compiled hit search (reference/_keyindex_hit.c)
SEARCH_CODES = {
    Kind.FULL: 0,
    Kind.SLIDING_WINDOW: 1,
    Kind.CHUNKED_LOCAL: 2,
    Kind.CROSS: 3,
    Kind.MAMBA: 4,
}


def search_plan(groups: tuple[GroupConfig, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """What the compiled hit search reads of the groups: per group its kind's code, block
    size, and window or chunk (0 for the others); None when a state group keeps no
    checkpoint (mode none: every hit is 0, which the search's scan says at once)."""
    if any(g.kind is Kind.MAMBA and g.mode is MambaMode.NONE for g in groups):
        return None
    return tuple((SEARCH_CODES[g.kind], g.block_size, g.window or g.chunk) for g in groups)


def hit_alignment(groups: tuple[GroupConfig, ...]) -> int:
    """The tokens every hit is a multiple of: the lcm of the cacheable groups' block sizes."""
    return math.lcm(*(g.block_size for g in groups if g.kind is not Kind.CROSS))
