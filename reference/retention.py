"""Sparse retention: which committed blocks of a bounded group stay cached.

Implements spec §6b: RET-SPARSE-1 (`retained_lengths`), RET-SPARSE-2 (`kept_positions`),
RET-SPARSE-3 (`keeps_checkpoint`);
RET-JUNCTION-1's search lives with the hit search (`coordinator.longest_single_group`).
Only sliding-window, chunked-local and state groups keep less than every committed block
(RET-DENSE-1); the registrar asks `kept_positions` once per registration it makes for them.
"""

from __future__ import annotations

from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, Retention
from kvcert.reference.groups import first_needed, first_token_read
from kvcert.reference.requests import Request

BOUNDED = (Kind.SLIDING_WINDOW, Kind.CHUNKED_LOCAL, Kind.MAMBA)


def keeps_less(config: CacheConfig, group: GroupConfig) -> bool:
    """Whether the retention profile leaves some of this group's committed blocks uncached:
    only sparse retention, only in bounded groups. Implements RET-DENSE-1."""
    return config.retention is Retention.SPARSE and group.kind in BOUNDED


def retained_lengths(
    config: CacheConfig, prompt: int, junction: int, computed: int
) -> frozenset[int]:
    """The hit lengths a request's blocks stay cached for: re-send floor_A(p - max(1, r)),
    extension floor_A(p - r) (r: the tokens past a block exact draft keys cover, else 0), its
    junction, the interval's multiples up to `computed`, and under drop keying the step
    below each. Implements RET-SPARSE-1."""
    step = config.alignment
    exact = config.speculative is DraftKeying.EXACT
    reach = config.draft_reach if exact else 0
    resend, extension = prompt - max(1, reach), prompt - reach
    lengths = {resend // step * step, extension // step * step, junction // step * step}
    if config.retention_interval:
        lengths.update(range(config.retention_interval, computed + 1, config.retention_interval))
    if config.speculative is DraftKeying.DROP:
        lengths.update([length - step for length in lengths])
    return frozenset(length for length in lengths if length > 0)


def lengths_kept(
    config: CacheConfig, group: GroupConfig, request: Request, computed: int
) -> frozenset[int] | None:
    """The hit lengths `group` keeps `request`'s blocks for once it has computed `computed`
    tokens: its retained lengths where the group keeps less, else None (every committed
    position, RET-DENSE-1). Implements RET-SPARSE-1 for a request."""
    if not keeps_less(config, group):
        return None
    return retained_lengths(config, request.prompt_length, request.junction, computed)


def kept_positions(group: GroupConfig, lengths: frozenset[int]) -> frozenset[int]:
    """The positions a hit at one of `lengths` reads in `group`: the run from `first_needed`
    to the block before the length; under `unit U`, for a length inside a block, an attention
    group's run through the block holding its last token, a state group's none (its state
    there is a tail key). Implements RET-SPARSE-2."""
    size = group.block_size
    kept: set[int] = set()
    for length in lengths:
        if not length % size:
            kept.update(range(first_needed(group, length), length // size))
        elif group.kind is not Kind.MAMBA:  # a state inside a block is a tail key (RET-SPARSE-3)
            first = first_token_read(group, length)
            if first < length:
                kept.update(range(first // size, (length - 1) // size + 1))
    return frozenset(kept)


def keeps_checkpoint(lengths: frozenset[int] | None, position: int) -> bool:
    """Whether a state checkpoint saved inside a block at `position` (CKPT-INNER-2) is keyed:
    always under dense retention (`lengths` None), else only at a retained length.
    Implements RET-SPARSE-3."""
    return lengths is None or position in lengths
