"""Retention: which committed blocks of a bounded group stay cached.

Implements spec §6b: RET-DENSE-1 (`dense_lengths`), RET-SPARSE-1 (`retained_lengths`),
RET-SPARSE-2 (`keeps`), RET-SPARSE-3 (`keeps_checkpoint`); RET-JUNCTION-1's search lives
with the hit search (`coordinator.longest_single_group`). Only sliding-window,
chunked-local and state groups keep less than every committed block, and under dense
retention only where some block is read by no hit at the hit granularity (`keeps_less`);
the registrar asks `keeps` once per position it registers for them.

`keeps` answers in a few steps per position: the first token an attention group's hit of
length L reads never moves back as L grows, so within each family of retained lengths (the
named ones, every multiple of a period, each of those less a step) it walks up from the
shortest length past the block's start until one reads the block or the first token read
has passed it (a state block is read only by the hit ending where it ends).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, Retention
from kvcert.reference.groups import first_needed, first_token_read
from kvcert.reference.requests import Request

BOUNDED = (Kind.SLIDING_WINDOW, Kind.CHUNKED_LOCAL, Kind.MAMBA)
PERIOD_LIMIT = 4096  # positions checked for a dense mask; past it a group is just masked


@dataclass(frozen=True, slots=True)
class Retained:
    """A request's retained lengths: `named`, and every positive multiple of `every` (0: none),
    each also `below` tokens lower (the drop profile's step below; 0: not)."""

    named: frozenset[int] = frozenset()
    every: int = 0
    below: int = 0

    def __contains__(self, length: object) -> bool:
        if not isinstance(length, int) or length <= 0:
            return False
        every, below = self.every, self.below
        if every and (not length % every or (below and not (length + below) % every)):
            return True
        return length in self.named


def dense_lengths(config: CacheConfig) -> Retained:
    """Every multiple of the hit alignment. Implements RET-DENSE-1."""
    return Retained(every=config.alignment)


def retained_lengths(config: CacheConfig, prompt: int, junction: int) -> Retained:
    """The hit lengths a request's blocks stay cached for under sparse retention: re-send
    floor_A(p - max(1, r)), extension floor_A(p - r) (r: the tokens past a block exact draft
    keys cover, else 0), its junction, every multiple of the interval, and under drop keying
    the step below each. Implements RET-SPARSE-1."""
    step = config.alignment
    exact = config.speculative is DraftKeying.EXACT
    reach = config.draft_reach if exact else 0
    resend, extension = prompt - max(1, reach), prompt - reach
    lengths = {resend // step * step, extension // step * step, junction // step * step}
    drop = config.speculative is DraftKeying.DROP
    if drop:
        lengths.update([length - step for length in lengths])
    interval = config.retention_interval
    named = frozenset(length for length in lengths if length > 0)
    return Retained(named, interval, step if drop and interval else 0)


def lengths_kept(config: CacheConfig, group: GroupConfig, request: Request) -> Retained | None:
    """The hit lengths `group` keeps `request`'s committed blocks for under the profile, or
    None for a group whose hit needs every block before it (all of them)."""
    if group.kind not in BOUNDED:
        return None
    if config.retention is Retention.DENSE:
        return dense_lengths(config)
    return retained_lengths(config, request.prompt_length, request.junction)


def positions_read(group: GroupConfig, length: int) -> range:
    """The positions a hit of `length` reads in `group`: at a block boundary the run from
    `first_needed`; under `unit U`, inside a block, an attention group's run through the block
    holding its last token, a state group's none (a tail key)."""
    size = group.block_size
    if not length % size:
        return range(first_needed(group, length), length // size)
    if group.kind is Kind.MAMBA:  # a state inside a block is a tail key (RET-SPARSE-3)
        return range(0)
    first = first_token_read(group, length)
    return range(first // size, (length - 1) // size + 1) if first < length else range(0)


def reads(group: GroupConfig, length: int, position: int) -> bool:
    """Whether a hit of `length` reads `group`'s block at `position`."""
    return position in positions_read(group, length)


def keeps(group: GroupConfig, lengths: Retained, position: int) -> bool:
    """Whether a hit at one of `lengths` reads `group`'s committed block at `position`.
    Implements RET-SPARSE-2."""
    size = group.block_size
    if group.kind is Kind.MAMBA:  # read only by the hit ending where the block ends
        return (position + 1) * size in lengths
    start = position * size  # a length reading the block ends past its start
    families: list[Sequence[int]] = [sorted(n for n in lengths.named if n > start)]
    if lengths.every:
        every = lengths.every
        for shift in {0, lengths.below}:
            first = ((start + shift) // every + 1) * every - shift
            reach = size + group.window + group.chunk  # no length past it reads the block
            families.append(range(first, first + reach + every, every))
    for family in families:  # each ascending: the first token read never moves back
        for length in family:
            if first_token_read(group, length) // size > position:
                break
            if reads(group, length, position):
                return True
    return False


class Kept:
    """The committed positions of one bounded group that a request's retained lengths read,
    answered in O(1) per position (`j in kept`): the positions the named lengths read, and
    the periodic families' mask, which repeats every lcm(period, B, C) tokens (a length and
    a position shifted by that many tokens read alike). Implements RET-SPARSE-2 as `keeps`
    does (tests/reference checks the two agree)."""

    __slots__ = ("_group", "_lengths", "_mask", "_named")

    def __init__(
        self, group: GroupConfig, lengths: Retained, mask: tuple[bool, ...] | None
    ) -> None:
        """`mask`: `periodic_mask(group, lengths.every, lengths.below)`, which the caller
        keeps per configuration (() when there is no period)."""
        self._group, self._lengths, self._mask = group, lengths, mask
        self._named = frozenset(j for n in lengths.named for j in positions_read(group, n))

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, int):
            return False
        if position in self._named:
            return True
        mask = self._mask
        if mask is None:  # a period too long to tabulate: the walk
            return keeps(self._group, self._lengths, position)
        return bool(mask) and mask[position % len(mask)]


def periodic_mask(group: GroupConfig, every: int, below: int) -> tuple[bool, ...] | None:
    """Whether each position of one period is read by some length of the families `every`
    and `every - below` (() without a period; None when the period exceeds PERIOD_LIMIT
    positions)."""
    if not every:
        return ()
    span = math.lcm(every, group.block_size, group.chunk or 1) // group.block_size
    if span > PERIOD_LIMIT:
        return None
    families = Retained(every=every, below=below)
    return tuple(keeps(group, families, j) for j in range(span))


def keeps_less(config: CacheConfig, group: GroupConfig) -> bool:
    """Whether the profile leaves some of this group's committed blocks uncached: a bounded
    group under sparse retention, or under dense one with a block no hit at a multiple of the
    alignment reads (the mask repeats every lcm(A, B, C) tokens). Implements RET-DENSE-1."""
    if group.kind not in BOUNDED:
        return False
    if config.retention is Retention.SPARSE:
        return True
    dense = dense_lengths(config)
    span = math.lcm(config.alignment, group.block_size, group.chunk or 1) // group.block_size
    if span > PERIOD_LIMIT:
        return True
    return not all(keeps(group, dense, j) for j in range(span, 2 * span))


def keeps_checkpoint(lengths: Retained | None, position: int) -> bool:
    """Whether a state checkpoint saved inside a block at `position` (CKPT-INNER-2) is keyed:
    only at a retained length (every multiple of U under dense retention).
    Implements RET-SPARSE-3."""
    return lengths is None or position in lengths
