"""Which managers run their table-changing decode steps compiled (reference/_decodelane.c).

A decode step that crosses a block boundary, or moves a window past a block, changes the
request's tables: in Python that is KVCacheManager.extend's general path, about ten
microseconds per request per step. The compiled lane takes such a step in one call over the
request's lists and the pool's arrays, and answers None (changing nothing) whenever the
general path must answer instead: a malformed call, a chunk in flight, max_model_len, or a
pool that cannot fit the step (Waiting). Its definition is that general path, which
tests/reference/test_decode_lane.py holds it equal to, state for state.

It serves the layouts and pools the general path then needs nothing else for: every group
attention (full, sliding window, chunked local), no `unit U`, the lru queue, and a pool that
tracks no liveness and records no events. Anywhere else, or without the extension built, or
with KVCERT_PURE_PYTHON=1, `decode_lane` is None and the general path takes every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcert.reference.block_pool import BlockPool
from kvcert.reference.config import CacheConfig, Kind
from kvcert.reference.errors import ConfigError
from kvcert.reference.eviction import FreeQueue
from kvcert.reference.inputs import TOKEN_LIMIT
from kvcert.reference.native import native

if TYPE_CHECKING:
    from kvcert.reference._decodelane import DecodeLane

KIND_CODES = {Kind.FULL: 0, Kind.SLIDING_WINDOW: 1, Kind.CHUNKED_LOCAL: 2}
SPAN_LIMIT = 2**31  # block sizes, windows and chunks the lane's arithmetic holds


def serves(config: CacheConfig, pool: BlockPool) -> bool:
    """Whether the lane's contract covers this manager (the module docstring's list)."""
    return (
        all(g.kind in KIND_CODES for g in config.groups)
        and all(max(g.block_size, g.window, g.chunk) < SPAN_LIMIT for g in config.groups)
        and config.hit_unit is None
        and type(pool.queue) is FreeQueue
        and not pool.tracking
        and pool.events is None
        and pool.tails is None
    )


def decode_lane(
    config: CacheConfig, pool: BlockPool, no_blocks: tuple[tuple[int, ...], ...]
) -> DecodeLane | None:
    """The compiled lane for this manager, or None (the general path takes every step).
    `no_blocks`: what a step allocating nothing returns (the manager's shared tuple)."""
    compiled = native("_decodelane")
    if compiled is None or not serves(config, pool):
        return None
    return build(compiled.DecodeLane, config, pool, no_blocks)


def build(
    lane: type[DecodeLane],
    config: CacheConfig,
    pool: BlockPool,
    no_blocks: tuple[tuple[int, ...], ...],
) -> DecodeLane:
    """A `lane` (the compiled type) over this pool (refused where `serves` says no)."""
    links = pool.queue.links
    if links is None or not serves(config, pool):
        raise ConfigError("the decode lane serves attention layouts over a plain lru pool only")
    return lane(
        kinds=tuple(KIND_CODES[g.kind] for g in config.groups),
        sizes=tuple(g.block_size for g in config.groups),
        spans=tuple(g.window or g.chunk for g in config.groups),
        limit=config.max_model_len,
        pool=pool,
        counts=pool.ref_count,
        links=links,
        keys=pool.keys,
        evictions=pool.evictions,
        dead_evictions=pool.dead_evictions,
        no_blocks=no_blocks,
        token_limit=TOKEN_LIMIT,
    )
