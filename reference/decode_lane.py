"""Which managers run their decode steps' table changes, their registrations, their prompts'
chunks and their admissions' first chunks compiled (reference/_decodelane.c).

A decode step that crosses a block boundary, or moves a window past a block, changes the
request's tables, and the step's end registers the block it completed: in Python these are
KVCacheManager.extend's general path and commit.Registrar.register, about ten microseconds
each per request. A prompt's next chunk takes that general path too. An admission, once its
hit is found, plans its first chunk, checks that it fits, takes the hit and allocates
(KVCacheManager._first_chunk: 37 microseconds of Python a GPT-OSS admission, 56 a Qwen3.5
one). The compiled lane takes each in one call over the request's lists, its digest chains
and the pool's arrays, and answers None (changing nothing) whenever the Python code must
answer instead: a malformed call, a chunk in flight, max_model_len, a pool that cannot fit
the step or the admission (Waiting), a step or first chunk naming an inner checkpoint, a
registration while one is open. Its definitions are that Python code, which
tests/reference/test_decode_lane.py holds it equal to, state for state.

It serves the layouts and pools that code then needs nothing else for: every group attention
(full, sliding window, chunked local) or state (Mamba), no `unit U`, the lru queue, and a
pool that tracks no liveness and records no events; under same-pass visibility a launch
publishes the blocks its chunk completes (ALLOC-VIS-2), as KVCacheManager._launch does. A
state group's tables change at a decode step too (the running state moves to the block the
step ends in, drafts' positions after it, the block it leaves released: TablePlanner.
changes, groups.table_end); the lane plans them as that code does. With a state group,
registration and `reserve`'s allocation stay the Python code's. It registers when, besides,
every group is attention, every committed block is kept (`Registrar.keeps_every_block`) and
keys are the compiled SHA-256's. Anywhere else, or without the extension built, or with
KVCERT_PURE_PYTHON=1, `decode_lane` is None and the Python code takes every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcert.reference.block_pool import BlockPool
from kvcert.reference.commit import Registrar
from kvcert.reference.config import CacheConfig, Kind, MambaMode, Visibility
from kvcert.reference.errors import ConfigError
from kvcert.reference.eviction import FreeQueue
from kvcert.reference.hashing import hasher
from kvcert.reference.inputs import TOKEN_LIMIT
from kvcert.reference.native import native
from kvcert.reference.requests import Scheduled

if TYPE_CHECKING:
    from kvcert.reference._decodelane import DecodeLane

ATTENTION = {Kind.FULL: 0, Kind.SLIDING_WINDOW: 1, Kind.CHUNKED_LOCAL: 2}
KIND_CODES = {**ATTENTION, Kind.MAMBA: 3}  # a state group: no registration, no reserve
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


def registers(config: CacheConfig, commits: Registrar) -> bool:
    """Whether the lane also registers what steps complete (the module docstring's list)."""
    compiled = native("_chain")
    sha256 = None if compiled is None else compiled.Sha256
    return (
        all(g.kind in ATTENTION for g in config.groups)
        and commits.keeps_every_block
        and hasher(config.hash_algorithm) is sha256
    )


Answers = tuple[tuple[tuple[int, ...], ...], dict[int, Scheduled]]


def decode_lane(
    config: CacheConfig, pool: BlockPool, commits: Registrar, answers: Answers
) -> DecodeLane | None:
    """The compiled lane for this manager, or None (the Python code takes every step).
    `answers`: what a step allocating nothing holds as its new blocks, and the answers of
    quiet steps per token count (the manager's own, shared with its Python path)."""
    compiled = native("_decodelane")
    if compiled is None or not serves(config, pool):
        return None
    return build(compiled.DecodeLane, config, pool, commits, answers)


def build(
    lane: type[DecodeLane],
    config: CacheConfig,
    pool: BlockPool,
    commits: Registrar,
    answers: Answers,
) -> DecodeLane:
    """A `lane` (the compiled type) over this pool (refused where `serves` says no)."""
    links = pool.queue.links
    if links is None or not serves(config, pool):
        raise ConfigError(
            "the decode lane serves attention and state layouts over a plain lru pool only"
        )
    return lane(
        kinds=tuple(KIND_CODES[g.kind] for g in config.groups),
        sizes=tuple(g.block_size for g in config.groups),
        spans=tuple(g.window or g.chunk for g in config.groups),
        spares=tuple(g.speculative_blocks for g in config.groups),
        every_state=tuple(
            int(g.kind is Kind.MAMBA and g.mode is MambaMode.ALL) for g in config.groups
        ),
        limit=config.max_model_len,
        key_lookahead=tuple(commits.lookahead),
        commit_delay=tuple(commits.commit_delay),
        unit=config.alignment,
        pool=pool,
        counts=pool.ref_count,
        links=links,
        keys=pool.keys,
        evictions=pool.evictions,
        dead_evictions=pool.dead_evictions,
        no_blocks=answers[0],
        token_limit=TOKEN_LIMIT,
        scheduled=Scheduled,
        quiet_steps=answers[1],
        same_pass=config.visibility is Visibility.SAME_PASS,
        registers=registers(config, commits),
        commits=commits,
    )
