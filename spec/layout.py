"""§1 Layout: the KV-cache groups of a model, as the prefix cache sees them.

A *group* is a set of layers that share one block table: the same block size, the same hit
rule. A model's layout is an ordered tuple of groups plus the speculative-decoding profile.
Group order carries no meaning for hits (THM-HYB-ORDER in tests/spec): it only names groups.

MLA is full attention with another page layout; SWA-MLA is a sliding window with another page
layout. Page layouts do not change which tokens a hit needs, so they are not kinds here.

Construction validates every field and raises `InvalidLayout` with what to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kvcert.spec.errors import AlignmentImpossible, InvalidLayout, as_choice, refuse


class MambaMode(StrEnum):
    """Where a recurrent-state group writes state checkpoints (vLLM's `mamba_cache_mode`)."""

    NONE = "none"  # no checkpoints are kept: the group never serves a hit
    ALIGN = "align"  # a checkpoint where a scheduler step ends on a block boundary
    ALL = "all"  # a checkpoint at every block boundary


class Speculative(StrEnum):
    """How draft-layer blocks are keyed; see HIT-SPEC-1 and HIT-SPEC-2 for the rationale."""

    EXACT = "exact"  # draft keys also cover the token after the block (HASH-DRAFT-1)
    DROP = "drop"  # draft keys are the target's keys; the hit drops one step (HIT-SPEC-2)


def _require_int(value: object, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(InvalidLayout, f"{what} must be an integer, got {value!r}")
    if value < minimum:
        refuse(InvalidLayout, f"{what} must be >= {minimum}, got {value}")


def _require_bool(value: object, what: str) -> None:
    if not isinstance(value, bool):
        refuse(InvalidLayout, f"{what} must be true or false, got {value!r}")


@dataclass(frozen=True)
class FullAttention:
    """Layers that attend to every earlier token (also MLA, attention sinks, MTP layers)."""

    block_size: int  # tokens per block
    draft: bool = False  # the group holds speculative-decoding draft layers
    name: str = "full"  # display name only

    def __post_init__(self) -> None:
        _require_int(self.block_size, f"group {self.name!r}: block_size", 1)
        _require_bool(self.draft, f"group {self.name!r}: draft")


@dataclass(frozen=True)
class SlidingWindow:
    """Layers whose token p attends to the `window` tokens [p - window + 1, p], itself included."""

    block_size: int  # tokens per block
    window: int  # tokens seen by one query, the query's own token included (HF `sliding_window`)
    draft: bool = False  # the group holds speculative-decoding draft layers
    name: str = "sliding_window"  # display name only

    def __post_init__(self) -> None:
        _require_int(self.block_size, f"group {self.name!r}: block_size", 1)
        _require_int(self.window, f"group {self.name!r}: window", 1)
        _require_bool(self.draft, f"group {self.name!r}: draft")


@dataclass(frozen=True)
class ChunkedLocal:
    """Layers whose token p attends to [floor(p / chunk) * chunk, p] (Llama-4 local attention)."""

    block_size: int  # tokens per block
    chunk: int  # tokens per attention chunk
    draft: bool = False  # the group holds speculative-decoding draft layers
    name: str = "chunked_local"  # display name only

    def __post_init__(self) -> None:
        _require_int(self.block_size, f"group {self.name!r}: block_size", 1)
        _require_int(self.chunk, f"group {self.name!r}: chunk", 1)
        _require_bool(self.draft, f"group {self.name!r}: draft")


@dataclass(frozen=True)
class MambaState:
    """Recurrent layers (Mamba, GDN, linear attention): one state summarises the whole prefix."""

    block_size: int  # tokens between two possible checkpoint positions
    mode: MambaMode = MambaMode.ALL  # where checkpoints are written
    name: str = "mamba"  # display name only
    # blocks the engine's kernel writes the states after draft tokens into while a step
    # verifies up to this many drafts (MTP/EAGLE on a state model; ALLOC-SPEC-1); mode align
    speculative_blocks: int = 0

    def __post_init__(self) -> None:
        _require_int(self.block_size, f"group {self.name!r}: block_size", 1)
        mode = as_choice(MambaMode, self.mode, f"group {self.name!r}: mode", InvalidLayout)
        object.__setattr__(self, "mode", mode)
        _require_int(self.speculative_blocks, f"group {self.name!r}: speculative_blocks", 0)
        if self.speculative_blocks and self.mode is not MambaMode.ALIGN:
            refuse(
                InvalidLayout,
                f"group {self.name!r}: speculative_blocks={self.speculative_blocks} needs mode "
                f"align (the running state moves with the chunk), not {self.mode.value}; "
                "set mode to align or speculative_blocks to 0",
            )


@dataclass(frozen=True)
class CrossAttention:
    """Decoder layers attending to encoder output: their KV depends on the encoder input only."""

    block_size: int  # tokens per block of encoder output
    name: str = "cross"  # display name only

    def __post_init__(self) -> None:
        _require_int(self.block_size, f"group {self.name!r}: block_size", 1)


Group = FullAttention | SlidingWindow | ChunkedLocal | MambaState | CrossAttention
GROUP_KINDS: tuple[type, ...] = (
    FullAttention,
    SlidingWindow,
    ChunkedLocal,
    MambaState,
    CrossAttention,
)
AttentionGroup = FullAttention | SlidingWindow | ChunkedLocal


def is_cacheable(group: Group) -> bool:
    """A group takes part in prefix hits unless its KV is a function of the encoder input."""
    return not isinstance(group, CrossAttention)


def is_draft(group: Group) -> bool:
    """Whether the group holds speculative-decoding draft layers."""
    return isinstance(group, AttentionGroup) and group.draft


@dataclass(frozen=True)
class Layout:
    """The groups of one model and how its draft layers are keyed."""

    groups: tuple[Group, ...]  # in the engine's order; order does not change any hit
    speculative: Speculative | None = None  # None: no speculative decoding
    max_model_len: int | None = None  # longest request the engine admits, if known
    # tokens after a position that the position's draft KV reads: 1 for EAGLE and one-module
    # MTP (draft KV at i reads token i+1), k for k-module MTP (module m reads token i+m)
    draft_reach: int = 1
    # the hit-granularity profile: None is `block` (a hit ends on every cacheable group's block
    # boundary, HIT-GROUP-1); an int U is `unit U` (a hit may end at any multiple of U, also
    # inside a block: HIT-UNIT-1; vLLM's --prefix-match-unit)
    hit_unit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.groups, tuple) or not self.groups:  # type guard: Python callers only
            refuse(InvalidLayout, "a layout needs a non-empty tuple of groups")
        for index, group in enumerate(self.groups):
            if not isinstance(group, GROUP_KINDS):  # type guard: Python callers only
                kinds = ", ".join(k.__name__ for k in GROUP_KINDS)
                refuse(InvalidLayout, f"group {index} is {group!r}; expected one of {kinds}")
        if self.speculative is not None:
            speculative = as_choice(Speculative, self.speculative, "speculative", InvalidLayout)
            object.__setattr__(self, "speculative", speculative)
        drafts = [g.name for g in self.groups if is_draft(g)]
        if self.speculative is None and drafts:
            refuse(
                InvalidLayout,
                f"groups {drafts} hold draft layers but no speculative profile is set; "
                "set speculative to 'exact' or 'drop'",
            )
        if self.speculative is not None and not drafts:
            refuse(
                InvalidLayout,
                f"speculative={self.speculative.value!r} but no group holds draft layers; "
                "mark the group(s) holding the draft layers with draft=true",
            )
        _require_int(self.draft_reach, "draft_reach", 1)
        if self.hit_unit is not None:
            check_hit_unit(self, self.hit_unit)
        if self.draft_reach > 1 and self.speculative is None:
            refuse(
                InvalidLayout,
                f"draft_reach={self.draft_reach} describes draft layers but the layout has "
                "none; drop draft_reach or mark the draft groups and set speculative",
            )
        if self.speculative is Speculative.DROP and self.draft_reach > hit_alignment(self):
            refuse(
                InvalidLayout,
                f"speculative='drop' steps a hit down by at least {hit_alignment(self)} tokens "
                f"(the hit alignment), fewer than the draft_reach={self.draft_reach} tokens a "
                "draft position reads, so a dropped hit could still serve draft KV computed "
                "from other tokens (HIT-SPEC-2); use speculative='exact' or larger blocks",
            )
        if self.max_model_len is not None:
            _require_int(self.max_model_len, "max_model_len", 1)
            alignment = hit_alignment(self)
            if alignment > self.max_model_len - 1:
                refuse(
                    AlignmentImpossible,
                    f"the smallest positive hit is {alignment} tokens (the hit alignment) "
                    f"but a request of max_model_len={self.max_model_len} tokens can reuse at "
                    f"most {self.max_model_len - 1}; prefix caching could never hit. Choose "
                    "block sizes (or a hit_unit) whose alignment is below max_model_len",
                )


def check_hit_unit(layout: Layout, unit: int) -> None:
    """HIT-UNIT-1: Under the hit-granularity profile `unit U` a hit may end at any multiple of
    U, which divides every cacheable group's block size; under `block` (no unit) it ends on
    every cacheable group's block boundary (HIT-GROUP-1), so the step is their lcm.

        full B=16 + state B=64, block profile:   hits 0, 64, 128, ...
        the same with hit_unit=16:               hits 0, 16, 32, 48, 64, ...
        (48 is inside state block 0: it needs a state checkpoint at exactly 48, HIT-UNIT-3)
        hit_unit=12:                             refused (12 does not divide 16)

    pre: True
    post: all(g.block_size % unit == 0 for g in layout.groups if is_cacheable(g))
    raises: InvalidLayout
    """
    _require_int(unit, "hit_unit", 1)
    coarse = [g.name for g in layout.groups if is_cacheable(g) and g.block_size % unit]
    if coarse:
        refuse(
            InvalidLayout,
            f"hit_unit={unit} does not divide the block size of groups {coarse}; a hit ending "
            "at a multiple of the unit must fall on a whole unit of every block (HIT-UNIT-1): "
            "choose a unit dividing every block size, or leave hit_unit unset for block hits",
        )


def hit_alignment(layout: Layout) -> int:
    """Every hit is a multiple of this: the lcm of the cacheable groups' block sizes, or the
    unit under `unit U` (HIT-UNIT-1).

    A corollary of HIT-GROUP-1 and HIT-UNIT-1, not a rule of its own; tests/spec checks it.
    """
    if layout.hit_unit is not None:
        return layout.hit_unit
    return math.lcm(*(g.block_size for g in layout.groups if is_cacheable(g)))
