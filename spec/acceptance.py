"""§3 Per-group acceptance: which hit lengths one group alone can serve from its cache.

Every kind is described by one function: the blocks a hit of length L *needs*, i.e. the cached
KV (or state) without which the tokens from L onwards cannot be computed. For every kind that
is a contiguous run of blocks ending at block L/B (possibly empty):

    full            [0 ............ L/B)        every earlier token
    sliding window        [first .. L/B)        the W-1 tokens before L
    chunked local         [first .. L/B)        the tokens of L's chunk before L
    state                      [L/B-1, L/B)     the checkpoint at L
    cross attention                             nothing from the decoder prefix

A group *accepts* L when L is a multiple of its block size and every needed block is cached
(HIT-GROUP-1). Its lookup result is one entry per block before L: the needed blocks, and the
null block everywhere else (HIT-GROUP-2).

Full attention is downward closed (accepting L implies accepting every aligned L' < L); sliding
window, chunked local and state groups are not. tests/spec shows both with examples.

Under the hit-granularity profile `unit U` (HIT-UNIT-1) a hit may end inside a block. The same
rules then read at block size U say which *units* of U tokens a hit needs (HIT-UNIT-2); a unit
is held by the block it lies in, cached in full or under a partial key that reaches past it. A
state group needs a checkpoint at exactly L (HIT-UNIT-3). Under same-pass visibility a block in
flight holds no unit of the block a hit ends inside (HIT-UNIT-5), so a full group that accepts
the end of such a block may refuse a unit inside it: downward closed per block, not per unit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kvcert.spec.layout import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    MambaMode,
    MambaState,
    SlidingWindow,
    is_cacheable,
)

NULL = None  # the null block: "this group needs nothing here", never a cached block


def full_needed(group: FullAttention, length: int) -> range:
    """HIT-FULL-1: A full-attention group needs every block before the hit length.

        B=16, L=48:   tokens 0..47 are read by every later token
        blocks        | 0 | 1 | 2 | 3 |
        needed        | 0 | 1 | 2 |          -> range(0, 3)

    pre: length >= 0 and length % group.block_size == 0
    post: __return__ == range(0, length // group.block_size)
    """
    return range(0, length // group.block_size)


def sliding_window_needed(group: SlidingWindow, length: int) -> range:
    """HIT-SW-1: A sliding-window group needs the blocks holding the W-1 tokens before the hit.

    Token L, the first one computed, attends to [L-W+1, L]; its own KV is computed, so the
    cache must supply [max(0, L-W+1), L). At aligned L >= W-1 that is cdiv(W-1, B) blocks;
    below W-1 it reaches back to block 0.

        B=16, W=32, L=64:  needed tokens [33, 64)
        blocks        | 0 | 1 | 2 | 3 |
        needed                | 2 | 3 |      -> range(2, 4) = cdiv(31, 16) blocks

    pre: length >= 0 and length % group.block_size == 0
    post: __return__.stop == length // group.block_size
    """
    first_token = max(0, length - (group.window - 1))
    return range(first_token // group.block_size, length // group.block_size)


def chunked_local_needed(group: ChunkedLocal, length: int) -> range:
    """HIT-CHUNK-1: A chunked-local group needs the blocks of the hit's chunk that precede it.

    Token L attends to [floor(L/C)*C, L]; the cache must supply [floor(L/C)*C, L). At a chunk
    boundary (L % C == 0) nothing is needed: every later token starts a fresh chunk.

        B=16, C=32, L=48:  chunk of token 48 starts at 32; needed tokens [32, 48)
        blocks        | 0 | 1 | 2 |
        needed                    | 2 |      -> range(2, 3)

    pre: length >= 0 and length % group.block_size == 0
    post: __return__.stop == length // group.block_size
    """
    chunk_start = (length // group.chunk) * group.chunk
    return range(chunk_start // group.block_size, length // group.block_size)


def state_needed(group: MambaState, length: int) -> range:
    """HIT-MAMBA-1: A state group needs exactly one checkpoint, taken at the hit boundary.

    The recurrent state after token L-1 summarises the whole prefix; a checkpoint anywhere
    else is useless for resuming at L. The empty hit needs no checkpoint.

        B=16, L=48:   checkpoints at 16, 32, 48 (end of blocks 0, 1, 2)
        blocks        | 0 | 1 | 2 |
        needed                    | 2 |      -> range(2, 3): the state after token 47

    pre: length >= 0 and length % group.block_size == 0
    post: len(__return__) == (1 if length > 0 else 0)
    """
    last = length // group.block_size
    return range(max(0, last - 1), last)


def state_serves_hits(group: MambaState) -> bool:
    """HIT-MAMBA-2: A state group in mode `none` serves only the empty hit; modes `align`
    and `all` differ only in where checkpoints get written, not in what a hit needs.

        mode none:  no checkpoints kept      -> accepts {0}
        mode align: checkpoint at 48 only    -> accepts {0, 48}
        mode all:   checkpoints 16, 32, 48   -> accepts {0, 16, 32, 48}

    pre: True
    post: __return__ == (group.mode is not MambaMode.NONE)
    """
    return group.mode is not MambaMode.NONE


def cross_needed(group: CrossAttention, length: int) -> range:
    """HIT-CROSS-1: A cross-attention group needs nothing from the decoder-prefix cache and
    constrains no hit length.

    Its KV is a function of the encoder input alone, computed once per request and never
    cached; decoder groups carry the encoder input in their keys instead (HASH-EXTRA-1).

        decoder tokens  | 0 | 1 | 2 |      cross-attention block list: [] for every L

    pre: length >= 0
    post: len(__return__) == 0
    """
    return range(0)


NEEDED_BY_KIND: Mapping[type, Callable[[Any, int], range]] = {
    FullAttention: full_needed,
    SlidingWindow: sliding_window_needed,
    ChunkedLocal: chunked_local_needed,
    MambaState: state_needed,
    CrossAttention: cross_needed,
}


def needed_blocks(group: Group, length: int) -> range:
    """The blocks a hit of `length` needs, by kind (dispatch only; the rules are above)."""
    return NEEDED_BY_KIND[type(group)](group, length)


def group_accepts(
    group: Group,
    cached: frozenset[int],
    length: int,
    *,
    unit: int | None = None,
    partial: frozenset[int] = frozenset(),
    in_flight: frozenset[int] = frozenset(),
) -> bool:
    """HIT-GROUP-1: A group accepts a hit length when it is a multiple of the group's block
    size and every block the group needs there is cached.

    Cross-attention groups accept every length (HIT-CROSS-1); a state group in mode none
    accepts only 0 (HIT-MAMBA-2). Under `unit U` (a `unit` is given, with the group's partial
    keys and blocks in flight) HIT-UNIT-2, HIT-UNIT-3 and HIT-UNIT-5 decide instead.

        full B=16, cached {0, 1, 2}:     accepts 0, 16, 32, 48; not 8 (unaligned), not 64
        SW B=16 W=32, cached {2, 3}:     accepts 0, 64; not 32 or 48 (they need block 1)

    pre: length >= 0
    post: __return__ or length > 0
    post: not __return__ or length % (unit or group.block_size) == 0 or not is_cacheable(group)
    """
    if unit is not None and is_cacheable(group):
        if isinstance(group, MambaState):
            return length % unit == 0 and state_unit_accepts(group, cached, partial, length)
        return length % unit == 0 and unit_accepts(
            group, cached, partial, unit, length, in_flight=in_flight
        )
    if isinstance(group, MambaState) and not state_serves_hits(group):
        return length == 0
    aligned = isinstance(group, CrossAttention) or length % group.block_size == 0
    return aligned and all_cached(cached, needed_blocks(group, length))


def unit_accepts(
    group: Group,
    cached: frozenset[int],
    partial: frozenset[int],
    unit: int,
    length: int,
    *,
    in_flight: frozenset[int] = frozenset(),
) -> bool:
    """HIT-UNIT-2: Under `unit U` an attention group accepts a multiple L of U when every unit
    its kind's rule needs at block size U is held: unit u (tokens [uU, (u+1)U)) lies in block
    j = uU // B, which holds it when j is cached in full or under a partial key at a position
    P >= (u+1)U inside it (that block holds the request's KV for [jB, P), HIT-UNIT-4).

        full B=4, U=1, L=6:   needs units 0..5; block 0 cached, block 1 under partial key 7
        blocks        | 0 0 0 0 | 1 1 1 . |        unit 5 (token 5) is in block 1, 7 >= 6
        accepts 6 (and 5, 7); with the partial key at 5 instead it refuses 6 (token 5 missing)

    Only the block the hit ends in can be held partially: every earlier needed block holds a
    needed unit ending at its boundary, which a partial key never reaches.

    pre: length >= 0 and unit >= 1 and group.block_size % unit == 0 and length % unit == 0
    pre: not isinstance(group, (MambaState, CrossAttention))
    post: __return__ or length > 0
    """
    size = group.block_size
    units = needed_blocks(replace(group, block_size=unit), length)
    reach: dict[int, int] = {}  # block -> the furthest token its cached content reaches
    for position in partial:
        block = position // size
        reach[block] = max(reach.get(block, 0), position)
    for block in cached:
        reach[block] = (block + 1) * size
    copied = length // size if length % size else None  # the block a hit ending inside copies
    if copied in in_flight:  # a case cites the rules it reaches
        reach = uncopied(reach, size, partial, copied)
    return all(reach.get(u * unit // size, -1) >= (u + 1) * unit for u in units)


def uncopied(
    reach: dict[int, int], size: int, partial: frozenset[int], block: int
) -> dict[int, int]:
    """HIT-UNIT-5: Under same-pass visibility a block in flight (published by ALLOC-VIS-2 for a
    chunk whose pass has not run) holds its units for a hit ending at or past its end, never
    for a hit ending inside it: that hit copies the block before the pass (ALLOC-UNIT-3), and
    the copy would read KV nobody has written yet; only its partial keys (registered when an
    earlier step ended) reach into it then.

        full B=4, U=1; block 0 cached, block 1 cached but in flight (a's chunk writes it now)
        blocks        | 0 0 0 0 | 1 1 1 1 |
        L=8  [0, 1]   block 1 is a table entry: b's pass reads it after a's pass wrote it
        L=6  refused  block 1 would be copied before the pass wrote tokens 4, 5
        L=6  with a partial key at 7 registered when an earlier step ended: accepted, the
             copy reads the block under that older key

    Returns `reach` (block -> the furthest token its content reaches) with `block`, the one
    the hit ends inside, reaching only as far as its partial keys.

    pre: size >= 1 and block >= 0
    post: __return__.get(block, block * size) < (block + 1) * size
    """
    inside = [p for p in partial if p // size == block]
    kept = {j: r for j, r in reach.items() if j != block}
    return {**kept, block: max(inside)} if inside else kept


def state_unit_accepts(
    group: MambaState, cached: frozenset[int], partial: frozenset[int], length: int
) -> bool:
    """HIT-UNIT-3: Under `unit U` a state group accepts L > 0 only with a checkpoint at exactly
    L: at a block boundary the block ending there (HIT-MAMBA-1), inside a block a checkpoint
    keyed at L; mode none still serves only 0 (HIT-MAMBA-2).

        B=16, U=4, checkpoints: block 0 (at 16), partial 40
        accepts 0, 16, 40;   refuses 36 and 44 (no state there), 32 (block 1 not cached)

    pre: length >= 0
    post: __return__ or length > 0
    """
    if length == 0:
        return True
    if not state_serves_hits(group):
        return False
    if length % group.block_size == 0:
        return length // group.block_size - 1 in cached
    return length in partial


def all_cached(cached: frozenset[int], needed: range) -> bool:
    """Whether every block of `needed` is cached: `all(j in cached for j in needed)`.

    `needed` is always a run of consecutive blocks, so it is cached exactly when the run of
    cached blocks holding its last block starts at or before its first. That answers in O(1)
    per length once a view's runs are known (CachedBlocks), where the literal check costs
    O(L/B) per length and a whole lookup O((L/B)^2).

        cached {0, 1, 2, 5, 6}:   runs start 0 (blocks 0-2) and 5 (blocks 5-6)
        needed range(1, 3) -> last block 2, its run starts at 0 <= 1   -> True
        needed range(4, 7) -> last block 6, its run starts at 5 >  4   -> False
    """
    if not needed:
        return True
    runs = cached if isinstance(cached, CachedBlocks) else CachedBlocks(cached)
    start = runs.run_start.get(needed[-1])
    return start is not None and start <= needed.start


class CachedBlocks(frozenset[int]):
    """A group's cached block indices, each with the first block of the run of consecutive
    cached blocks it is in (so `all_cached` needs no scan). Equal to the plain frozenset."""

    run_start: Mapping[int, int]

    def __new__(cls, blocks: frozenset[int] = frozenset()) -> CachedBlocks:
        made = super().__new__(cls, blocks)
        starts: dict[int, int] = {}
        for j in sorted(made):
            starts[j] = starts.get(j - 1, j)
        made.run_start = starts
        return made


def group_blocks(
    group: Group, cached: frozenset[int], length: int, unit: int | None = None
) -> tuple[int | None, ...]:
    """HIT-GROUP-2: A group's lookup result at an accepted length lists, for each block
    before it, the cached block where the group needs one and the null block elsewhere.

        SW B=16 W=32, L=64, cached {0, 2, 3}:   [null, null, 2, 3]
        full B=16, L=48:                        [0, 1, 2]
        cross attention:                        []

    pre: unit is not None or group_accepts(group, cached, length)
    post: unit is not None or all(b is NULL or b in cached for b in __return__)
    """
    if unit is not None and not isinstance(group, CrossAttention):
        return unit_blocks(group, length, unit)
    needed = needed_blocks(group, length)
    count = 0 if isinstance(group, CrossAttention) else length // group.block_size
    return tuple(j if j in needed else NULL for j in range(count))


def unit_blocks(group: Group, length: int, unit: int) -> tuple[int | None, ...]:
    """HIT-UNIT-4: Under `unit U` a group's lookup result at an accepted L lists one entry per
    block the hit reaches, cdiv(L, B): each block holding a needed unit (a state group: the
    block holding the checkpoint at L), the null block elsewhere; the block L falls in, when L
    is inside it, is a copy source: the request computes from L on in a private copy of its
    first L - jB tokens (or of the state), never in the cached block.

        full B=4, U=1, L=6:        [0, 1]     block 1 is copied: tokens 4, 5 kept, 6.. written
        SW B=4 W=2, U=1, L=6:      [null, 1]  (needs token 5 only; copied likewise)
        state B=4, U=1, L=6:       [null, 1]  the checkpoint at 6, held by block 1

    pre: length >= 0 and length % unit == 0
    post: isinstance(group, CrossAttention) or len(__return__) == -(-length // group.block_size)
    """
    size = group.block_size
    count = -(-length // size)
    if isinstance(group, MambaState):
        needed = {(length - 1) // size} if length else set()
    else:
        needed = {u * unit // size for u in needed_blocks(replace(group, block_size=unit), length)}
    return tuple(j if j in needed else NULL for j in range(count))
