"""§2 Cache view: what each group has cached for one request, in block indices.

Block j of a group with block size B covers the request's tokens [j*B, (j+1)*B). "Group g has
block j cached" means the group holds a block whose key equals the request's key for block j
(HASH-MATCH-1); because keys chain, that block holds KV computed from exactly the request's
tokens [0, (j+1)*B). For a state group, block j cached means a state checkpoint taken after
token (j+1)*B - 1, i.e. at boundary (j+1)*B.

Under the hit-granularity profile `unit U` (HIT-UNIT-1) a group may also hold *partial keys*:
position P, a multiple of U inside block j = P // B, means the group holds a block under the
request's key for its first P tokens, so that block holds the KV of tokens [jB, P) (a state
group: a checkpoint after token P - 1). Block-boundary positions stay in `cached`. Under
same-pass visibility (ALLOC-VIS-2) some cached blocks may be *in flight*: the block serving
their key was published for a chunk whose pass has not run, so its KV is not written yet.

The hit rules (§3, §4) read only this view, so they can be stated without hashes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcert.spec.acceptance import CachedBlocks
from kvcert.spec.errors import InvalidRequest, refuse
from kvcert.spec.hashing import key_lookahead
from kvcert.spec.layout import CrossAttention, Layout, MambaMode, MambaState


def keyable_blocks(layout: Layout, group_index: int, num_tokens: int) -> int:
    """How many of the request's blocks can have a key in this group.

    Only full blocks are keyed; under the exact speculative profile a draft block's key also
    covers the draft_reach tokens after it (HASH-DRAFT-1), so those tokens must exist.
    """
    group = layout.groups[group_index]
    return max(0, (num_tokens - key_lookahead(layout, group)) // group.block_size)


@dataclass(frozen=True)
class CacheView:
    """One request's length and, per group, which of its blocks are cached."""

    layout: Layout  # the model's groups
    num_tokens: int  # tokens in the request (prompt plus any output so far)
    cached: tuple[frozenset[int], ...]  # per group, the cached block indices
    # per group, the positions held under partial keys (unit U only); () when there are none
    partial: tuple[frozenset[int], ...] = ()
    # per group, the cached blocks in flight (unit U only): a table entry may name them, a copy
    # may not (HIT-UNIT-5); () when there are none
    in_flight: tuple[frozenset[int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int):
            refuse(InvalidRequest, f"num_tokens must be an integer, got {self.num_tokens!r}")
        if self.num_tokens < 1:
            refuse(
                InvalidRequest,
                f"num_tokens must be >= 1 (a request has at least one token to compute), "
                f"got {self.num_tokens}",
            )
        limit = self.layout.max_model_len
        if limit is not None and self.num_tokens > limit:
            refuse(
                InvalidRequest,
                f"num_tokens={self.num_tokens} exceeds max_model_len={limit}; "
                "shorten the request or raise max_model_len",
            )
        self._check_per_group("cached", self.cached)
        for index, blocks in enumerate(self.cached):
            self._check_group(index, blocks)
        if self.partial == ():
            object.__setattr__(self, "partial", tuple(frozenset() for _ in self.cached))
        self._check_per_group("partial", self.partial)
        for index, positions in enumerate(self.partial):
            self._check_partial(index, positions)
        if self.in_flight == ():
            object.__setattr__(self, "in_flight", tuple(frozenset() for _ in self.cached))
        self._check_per_group("in_flight", self.in_flight)
        for index, blocks in enumerate(self.in_flight):
            self._check_in_flight(index, blocks)
        # the same sets, each knowing its runs of consecutive blocks: HIT-GROUP-1 then asks
        # whether a needed run is cached in O(1) instead of scanning it
        object.__setattr__(self, "cached", tuple(CachedBlocks(b) for b in self.cached))

    def _check_per_group(self, field: str, entries: tuple[frozenset[int], ...]) -> None:
        if len(entries) != len(self.layout.groups):
            refuse(
                InvalidRequest,
                f"{field} lists {len(entries)} groups but the layout has "
                f"{len(self.layout.groups)}; give one entry per group, in layout order",
            )

    def _check_group(self, index: int, blocks: frozenset[int]) -> None:
        group = self.layout.groups[index]
        label = f"group {index} ({group.name!r})"
        if not isinstance(blocks, frozenset):  # type guard: Python callers only
            refuse(InvalidRequest, f"{label}: cached blocks must be a frozenset of indices")
        if blocks and isinstance(group, CrossAttention):
            refuse(
                InvalidRequest,
                f"{label}: cross-attention KV is never cached (HIT-CROSS-1); leave it empty",
            )
        if blocks and isinstance(group, MambaState) and group.mode is MambaMode.NONE:
            refuse(
                InvalidRequest,
                f"{label}: mode 'none' keeps no state checkpoints (HIT-MAMBA-2); "
                "leave it empty or use mode 'align' or 'all'",
            )
        count = keyable_blocks(self.layout, index, self.num_tokens)
        valid = f"0..{count - 1}" if count else "none"
        for j in blocks:
            if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < count:
                refuse(
                    InvalidRequest,
                    f"{label}: cached block {j!r} is not a keyed block of this "
                    f"{self.num_tokens}-token request (valid indices: {valid}); "
                    "only full blocks have keys",
                )

    def _check_partial(self, index: int, positions: frozenset[int]) -> None:
        group = self.layout.groups[index]
        label = f"group {index} ({group.name!r})"
        if not isinstance(positions, frozenset):  # type guard: Python callers only
            refuse(InvalidRequest, f"{label}: partial positions must be a frozenset of tokens")
        if not positions:
            return
        unit = self.layout.hit_unit
        if unit is None:
            refuse(
                InvalidRequest,
                f"{label}: partial keys {sorted(positions)} need the hit-granularity profile "
                "`unit U` (HIT-UNIT-1); set the layout's hit_unit or leave partial empty",
            )
        if isinstance(group, CrossAttention) or (
            isinstance(group, MambaState) and group.mode is MambaMode.NONE
        ):
            refuse(InvalidRequest, f"{label}: this group keeps no keys; leave partial empty")
        keyable = self.num_tokens - key_lookahead(self.layout, group)
        for p in positions:
            if (
                isinstance(p, bool)
                or not isinstance(p, int)
                or not 0 < p <= keyable
                or p % unit
                or not p % group.block_size
            ):
                refuse(
                    InvalidRequest,
                    f"{label}: partial key {p!r} is not a position inside a block of this "
                    f"{self.num_tokens}-token request: it must be a multiple of hit_unit={unit}, "
                    f"not of block_size={group.block_size} (block ends go in cached), and "
                    f"between 1 and {keyable} (a key covers the tokens it names)",
                )

    def _check_in_flight(self, index: int, blocks: frozenset[int]) -> None:
        label = f"group {index} ({self.layout.groups[index].name!r})"
        if not isinstance(blocks, frozenset):  # type guard: Python callers only
            refuse(InvalidRequest, f"{label}: blocks in flight must be a frozenset of indices")
        if blocks and self.layout.hit_unit is None:  # direct callers only: no vector lists them
            refuse(
                InvalidRequest,
                f"{label}: blocks in flight {sorted(blocks)} matter only to copies, which need "
                "the hit-granularity profile `unit U` (HIT-UNIT-5); leave in_flight empty",
            )
        stray = sorted(blocks - self.cached[index])
        if stray:  # direct callers only
            refuse(
                InvalidRequest,
                f"{label}: blocks in flight {stray} are not cached; a block in flight is a "
                "cached block whose pass has not run, so list it in cached too",
            )
