"""§6 The allocator as a state machine: `step(state, op) -> (state, observation)`.

One pool of `num_blocks` physical blocks serves every group (one page size, §8 later). Block
0 is the null block: it stands in table positions a group needs nothing for and is never
handed out. Every other block is either held (ref_count > 0) or in the free queue; a free
block may still carry a registered key, and then a lookup can revive it until it is evicted.

Operations, in the order a scheduler issues them within one step:

    Admit(rid, tokens, budget)      look the prompt up, take the hit, allocate for the chunk
    Extend(rid, budget, appended)   next prefill chunk or decode token of a running request
                                    (either may name a `checkpoint` inside the chunk: CKPT-INNER-1,
                                    under `unit U` inside a block too: CKPT-INNER-2)
    EndStep()                       the step's KV is written: commit, register full blocks
                                    (and, under `unit U`, the prompt's tail: ALLOC-UNIT-2)
    Finish(rid) / Preempt(rid)      release the request's blocks
    ResetCache()                    forget every registered key (only when nothing is held)

Blocks record what they were computed from (`Block.content`), not only their keys, so the
invariants (§7) can check that a hit never hands a request KV of other tokens.

Under the hit-granularity profile `unit U` a hit may end inside a block; the request then
computes in a private copy of that block (ALLOC-UNIT-3), and a state block keyed at a
position inside it is copied out before its writer's chunk overwrites it, the copy taking the
key (ALLOC-UNIT-4): a running request's table only ever grows. The copies are observations
(`copies`: group, source, target), run by the engine before the step's pass.

Out of capacity is an observation (`Waiting`) that leaves the state unchanged. Misuse (an
unknown request, a second admission, work while a chunk is in flight) raises `InvalidOp`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeGuard

from kvcert.spec.acceptance import NULL
from kvcert.spec.errors import InvalidOp, as_choice, refuse
from kvcert.spec.eviction import Cached, hybrid_victim, provably_dead, tail_first
from kvcert.spec.hashing import (
    BlockKey,
    Extra,
    block_keys,
    extras_within,
    key_lookahead,
    keys_reach,
    matched_blocks,
    partial_key,
)
from kvcert.spec.hybrid import hybrid_hit
from kvcert.spec.layout import (
    AttentionGroup,
    ChunkedLocal,
    CrossAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    hit_alignment,
    is_draft,
)
from kvcert.spec.retention import (
    Retained,
    Retention,
    dense_lengths,
    is_bounded,
    junction,
    keeps,
    keeps_checkpoint,
    retained_lengths,
)
from kvcert.spec.view import CacheView

NULL_BLOCK = 0  # physical id of the null block
MAX_BLOCKS = 2**31 - 1  # block ids fit the int32 block tables engines use
TOKEN_ID_LIMIT = 2**63  # token ids are integers in [0, 2**63): what an int64 tensor holds


class Eviction(StrEnum):
    """Named eviction profiles; an engine claims one to be compared on eviction order."""

    LRU = "lru"  # the head of the free queue first; released blocks join its tail
    HYBRID = "hybrid"  # dead blocks first, requests freed tail first (§11, EVICT-HYB-1)
    LRU_UNKEYED_FIRST = "lru-unkeyed-first"  # lru, released unkeyed blocks reused first
    RADIX = "radix"  # a tree of page runs, whole leaves least recently used first (§13)


BLOCK_POOL_EVICTIONS = (Eviction.LRU, Eviction.HYBRID, Eviction.LRU_UNKEYED_FIRST)  # §6's own


class Visibility(StrEnum):
    """Named visibility profiles: from when a block a chunk computes can serve a hit."""

    STEP_END = "step-end"  # once the step that wrote it has ended (ALLOC-VIS-1)
    SAME_PASS = "same-pass"  # attention blocks from their chunk's scheduling on (ALLOC-VIS-2)


@dataclass(frozen=True)
class PoolConfig:
    """What the allocator is built for."""

    layout: Layout  # the groups sharing the pool
    num_blocks: int  # physical blocks, the null block included
    eviction: Eviction = Eviction.LRU  # the eviction profile
    visibility: Visibility = Visibility.STEP_END  # the visibility profile
    retention: Retention = Retention.DENSE  # the retention profile (§6b)
    retention_interval: int = 0  # sparse only: also keep every multiple of this (0: none)

    def __post_init__(self) -> None:
        retention = as_choice(Retention, self.retention, "retention", InvalidOp)
        object.__setattr__(self, "retention", retention)
        interval = self.retention_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            refuse(InvalidOp, f"retention_interval must be an integer >= 0, got {interval!r}")
        if interval and retention is not Retention.SPARSE:
            refuse(
                InvalidOp,
                f"retention_interval={interval} applies to sparse retention only; "
                "set retention='sparse' or leave the interval at 0",
            )
        if interval and interval % hit_alignment(self.layout):
            refuse(
                InvalidOp,
                f"retention_interval={interval} is not a multiple of the hit alignment "
                f"{hit_alignment(self.layout)}; no hit could end at it (HIT-GROUP-1)",
            )
        eviction = as_choice(Eviction, self.eviction, "eviction", InvalidOp)
        object.__setattr__(self, "eviction", eviction)
        visibility = as_choice(Visibility, self.visibility, "visibility", InvalidOp)
        object.__setattr__(self, "visibility", visibility)
        problem = unit_problem(self)
        if problem is not None:
            refuse(InvalidOp, problem)
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int):
            refuse(InvalidOp, f"num_blocks must be an integer, got {self.num_blocks!r}")
        if not 2 <= self.num_blocks <= MAX_BLOCKS:
            refuse(
                InvalidOp,
                f"num_blocks must be >= 2 (the null block plus one) and <= 2**31 - 1 (block "
                f"ids are int32 in engines' block tables), got {self.num_blocks}",
            )


def unit_problem(config: PoolConfig) -> str | None:
    """ALLOC-UNIT-1: The allocator serves the hit-granularity profile `unit U` with either
    retention, lru or lru-unkeyed-first eviction and draft layers keyed exactly (if any),
    under either visibility (same-pass through HIT-UNIT-5); what else it would need is not
    defined yet, so it is refused, saying which rule stands in the way.

        full B=64 + state B=64, U=16, dense, lru, step-end  served
        the same under same-pass visibility                 served (HIT-UNIT-5)
        + an EAGLE draft group, exact keying                served (HASH-DRAFT-1, ALLOC-UNIT-2)
        the same under sparse retention                     served (RET-SPARSE-2, -3)
        + an EAGLE draft group, the drop                    refused (HIT-SPEC-2)
        hybrid eviction                                     refused (EVICT-DEAD-1)

    pre: True
    post: __return__ is None or config.layout.hit_unit is not None
    """
    layout = config.layout
    if layout.hit_unit is None:
        return None
    unit = f"hit_unit={layout.hit_unit}"
    if config.eviction is Eviction.HYBRID:
        return (
            f"{unit} with hybrid eviction: EVICT-DEAD-1 judges blocks by their whole-block "
            "keys only, not by partial keys; use eviction 'lru' or 'lru-unkeyed-first'"
        )
    drafts = [g.name for g in layout.groups if is_draft(g)]
    if drafts and layout.speculative is Speculative.DROP:
        return (
            f"{unit} with draft groups {drafts} under the drop profile: how the drop "
            "(HIT-SPEC-2) meets a prompt's tail key is not defined for the allocator; use "
            "speculative='exact' or leave hit_unit unset"
        )
    return None


Content = tuple[int, tuple[int, ...], tuple[Extra, ...]]  # (group, tokens it covers, extras)


@dataclass(frozen=True)
class Block:
    """One physical block."""

    ref_count: int = 0  # table entries of running requests that hold it
    content: Content | None = None  # what its committed KV/state was computed from
    key: tuple[int, BlockKey] | None = None  # (group, key) once registered: then hittable
    stamp: int = 0  # registration order; the earliest of duplicate keys is the one looked up
    cold: bool = False  # hybrid profile: freed mid-request by ALLOC-SKIP-1 (EVICT-HYB-1)
    # `unit U` (ALLOC-UNIT-2): the (group, key) of a prompt's tail inside the block, the
    # position the key ends at, and its registration order; the block keeps it when it is
    # later registered whole (its first `partial_at` tokens never change)
    partial: tuple[int, BlockKey] | None = None
    partial_at: int = 0
    partial_stamp: int = 0

    def registrations(self) -> tuple[tuple[tuple[int, BlockKey], int], ...]:
        """Each (group, key) the block is registered under, with its registration order."""
        keys = ((self.key, self.stamp), (self.partial, self.partial_stamp))
        return tuple((key, stamp) for key, stamp in keys if key is not None)


@dataclass(frozen=True)
class Request:
    """A request the allocator holds blocks for."""

    tokens: tuple[int, ...]  # prompt plus the outputs appended so far
    extras: tuple[Extra, ...]  # extra keys (salt, LoRA, ...) of the request
    computed: int  # tokens whose KV is written (committed at an end of step)
    scheduled: int  # tokens being computed in the current step
    lookahead: int  # speculative slots allocated beyond computed + scheduled
    tables: tuple[tuple[int, ...], ...]  # per group, physical ids; NULL_BLOCK where none held
    registered: tuple[int, ...]  # per group, table positions already considered for caching
    checkpoint: int = 0  # a position inside the chunk in flight whose state is saved too, or 0
    decoding: bool = False  # it appends sampled tokens: its chunks may verify drafts
    # same-pass (ALLOC-VIS-2): per group, where the positions published for the chunk in
    # flight start (they end at `registered`); () when nothing is published
    published: tuple[int, ...] = ()
    prompt: int = 0  # tokens it was admitted with (RET-SPARSE-1 retains their boundaries)
    junction: int = 0  # RET-JUNCTION-1's length, found when it was admitted
    # `unit U`: (group, position, block) of the copy sources the chunk in flight reads,
    # held until its step ends (ALLOC-UNIT-3)
    sources: tuple[tuple[int, int, int], ...] = ()
    # `unit U`: (group, position, block) of the fresh blocks the keyed state block at that
    # position is copied into before the chunk in flight overwrites it; each takes the key
    # when the step ends (ALLOC-UNIT-4); NULL_BLOCK until _grow hands one out
    keeps: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class State:
    """The whole allocator state."""

    config: PoolConfig  # fixed for the state's life
    blocks: tuple[Block, ...]  # indexed by physical id
    free: tuple[int, ...]  # the free queue, eviction candidate first
    requests: dict[str, Request] = field(default_factory=dict)  # running requests by id
    next_stamp: int = 1  # the stamp the next registration gets
    published_in_step: int = 0  # blocks ALLOC-VIS-2 registered since the last end of step


# --- operations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    """Look a new (or preempted) request up and schedule its first chunk."""

    rid: str
    tokens: tuple[int, ...]
    budget: int  # most tokens to compute in this step
    extras: tuple[Extra, ...] = ()
    lookahead: int = 0  # speculative slots to allocate beyond the chunk
    checkpoint: int = 0  # a block boundary inside the chunk whose state is saved too (CKPT-INNER-1)
    # or, under `unit U`, a multiple of U inside a block (CKPT-INNER-2)


@dataclass(frozen=True)
class Extend:
    """Schedule more tokens of a running request; `appended` are newly sampled tokens."""

    rid: str
    budget: int
    appended: tuple[int, ...] = ()
    lookahead: int = 0
    checkpoint: int = 0  # as Admit.checkpoint


@dataclass(frozen=True)
class EndStep:
    """The step's KV is written."""


@dataclass(frozen=True)
class Finish:
    """The request is done (or aborted): release its blocks."""

    rid: str


@dataclass(frozen=True)
class Preempt:
    """The request is evicted from the batch: release its blocks; it may be admitted again."""

    rid: str


@dataclass(frozen=True)
class ResetCache:
    """Forget every registered key."""


Op = Admit | Extend | EndStep | Finish | Preempt | ResetCache


# --- observations --------------------------------------------------------------------------


Copy = tuple[int, int, int]  # (group, source block, target block): copy before the pass


@dataclass(frozen=True)
class Admitted:
    hit: int  # tokens served from the cache
    scheduled: int  # tokens to compute in this step
    tables: tuple[tuple[int, ...], ...]  # per group, after allocation
    copies: tuple[Copy, ...] = ()  # `unit U`: the hit's tail blocks (ALLOC-UNIT-3)


@dataclass(frozen=True)
class Extended:
    scheduled: int
    tables: tuple[tuple[int, ...], ...]
    copies: tuple[Copy, ...] = ()  # `unit U`: keyed state blocks kept (ALLOC-UNIT-4)


@dataclass(frozen=True)
class Waiting:
    """Not enough free blocks: nothing changed; retry in a later step."""

    needed: int
    free: int


@dataclass(frozen=True)
class StepEnded:
    registered: int  # keys registered during the step (ALLOC-VIS-2's and partial ones too)


@dataclass(frozen=True)
class Released:
    blocks: int  # blocks whose reference count reached 0


@dataclass(frozen=True)
class CacheReset:
    done: bool  # False when a request still holds blocks


Observation = Admitted | Extended | Waiting | StepEnded | Released | CacheReset


def initial_state(config: PoolConfig) -> State:
    """ALLOC-INIT-1: An empty pool has every block but the null one free, in ascending id
    order, and nothing registered.

        num_blocks=5:   null=0   free queue: 1 2 3 4

    pre: config.num_blocks >= 2 and config.eviction is not Eviction.RADIX
    post: __return__.free == tuple(range(1, config.num_blocks))
    """
    _require(
        config.eviction is not Eviction.RADIX,
        "the radix profile is its own state machine (§13): build its state with "
        "kvcert.spec.radix.initial_state, or choose a block-pool eviction profile",
    )
    return State(
        config, tuple(Block() for _ in range(config.num_blocks)), tuple(range(1, config.num_blocks))
    )


# --- lookup ---------------------------------------------------------------------------------


def request_keys(
    layout: Layout, tokens: tuple[int, ...], extras: tuple[Extra, ...]
) -> tuple[tuple[BlockKey, ...], ...]:
    """Per group, the request's block keys (HASH-CHAIN-1, HASH-DRAFT-1)."""
    return tuple(
        block_keys(tokens, g.block_size, extras, key_lookahead(layout, g)) for g in layout.groups
    )


def served_blocks(state: State) -> dict[tuple[int, BlockKey], int]:
    """ALLOC-LOOKUP-1: A key is served by the block registered under it earliest; a key on no
    block is a miss.

        blocks 7 (stamp 3) and 4 (stamp 9) both hold key k of group 0   (0, k) -> block 7
        no block holds key m of group 1                                 (1, m) -> a miss

    Under `unit U` a block's partial key (ALLOC-UNIT-2) is one more key it is served under.

    pre: True
    post: all(slot in dict(state.blocks[b].registrations()) for slot, b in __return__.items())
    """
    earliest: dict[tuple[int, BlockKey], tuple[int, int]] = {}
    for b, block in enumerate(state.blocks):
        for slot, stamp in block.registrations():
            if slot not in earliest or stamp < earliest[slot][0]:
                earliest[slot] = (stamp, b)
    return {slot: b for slot, (_, b) in earliest.items()}


def request_partial_keys(
    layout: Layout, g: int, tokens: tuple[int, ...], extras: tuple[Extra, ...]
) -> dict[int, BlockKey]:
    """Under `unit U`, group g's partial keys of a request (HASH-UNIT-1) by position: every
    multiple of U inside a block that its tokens reach; none for a group that keeps no keys
    (cross attention, state mode none) or without the profile."""
    group = layout.groups[g]
    unit = layout.hit_unit
    if unit is None or isinstance(group, CrossAttention):
        return {}
    if isinstance(group, MambaState) and group.mode is MambaMode.NONE:
        return {}
    lookahead = key_lookahead(layout, group)
    return {
        p: partial_key(tokens, group.block_size, p, extras, lookahead)
        for p in range(unit, len(tokens) - lookahead + 1, unit)
        if p % group.block_size
    }


def lookup(
    state: State, tokens: tuple[int, ...], extras: tuple[Extra, ...]
) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """The hit of a prompt over the registered blocks: length and per-group physical ids.

    The cache view is HASH-MATCH-1 over each group's registered keys; HIT-* decide the hit;
    ALLOC-LOOKUP-1 names the physical block behind each used position, and ALLOC-UNIT-3 the
    copy source of a hit ending inside a block.
    """
    view, keys, served = _cache_view(state, tokens, extras)
    hit = hybrid_hit(view)

    def physical(g: int, j: int | None) -> int:
        if j is NULL:
            return NULL_BLOCK
        if (j + 1) * view.layout.groups[g].block_size > hit.length:
            return tail_source(state, g, tokens, extras, hit.length)  # L ends inside block j
        return served[g, keys[g][j]]

    tables = tuple(
        tuple(physical(g, j) for j in hit.blocks[g]) for g in range(len(view.layout.groups))
    )
    return hit.length, tables


def tail_source(
    state: State, g: int, tokens: tuple[int, ...], extras: tuple[Extra, ...], length: int
) -> int:
    """ALLOC-UNIT-3 (the source): a hit of L tokens ending inside block j = L // B copies
    that block from the one serving the request's longest registered key in it: its whole
    block key (unless its block is in flight, HIT-UNIT-5), else its partial key at the
    largest position, which HIT-UNIT-2 puts at L or beyond; a state group's from the one
    under its partial key at exactly L (HIT-UNIT-3: a whole state block holds the state at
    its end, not at L).

        B=64, U=16, L=80:  blocks 9 (whole key of block 1) and 4 (partial key at 96)
                           -> source 9;   without block 9, or with 9 in flight -> source 4
        state, L=80:       the block keyed at 80, whatever else holds block 1

    pre: length % state.config.layout.groups[g].block_size != 0
    post: __return__ != NULL_BLOCK
    """
    layout = state.config.layout
    served = served_blocks(state)
    size = layout.groups[g].block_size
    j = length // size
    keys = request_keys(layout, tokens, extras)[g]
    partial = request_partial_keys(layout, g, tokens, extras)
    if isinstance(layout.groups[g], MambaState):
        return served[g, partial[length]]
    if (
        j < len(keys)
        and (g, keys[j]) in served
        and served[g, keys[j]] not in blocks_in_flight(state)
    ):
        return served[g, keys[j]]
    reach = max(p for p, key in partial.items() if p // size == j and (g, key) in served)
    return served[g, partial[reach]]


def _cache_view(
    state: State, tokens: tuple[int, ...], extras: tuple[Extra, ...]
) -> tuple[CacheView, tuple[tuple[BlockKey, ...], ...], dict[tuple[int, BlockKey], int]]:
    """The request's cache view over the registered keys, its keys, and who serves them."""
    layout = state.config.layout
    keys = request_keys(layout, tokens, extras)
    served = served_blocks(state)
    cached = tuple(
        matched_blocks(keys[g], frozenset(key for group, key in served if group == g))
        for g in range(len(layout.groups))
    )
    partial: tuple[frozenset[int], ...] = ()  # the block profile's view has none
    in_flight: tuple[frozenset[int], ...] = ()
    if layout.hit_unit is not None:
        partial = tuple(
            frozenset(
                p
                for p, key in request_partial_keys(layout, g, tokens, extras).items()
                if (g, key) in served
            )
            for g in range(len(layout.groups))
        )
        unwritten = blocks_in_flight(state)
        in_flight = tuple(
            frozenset(j for j in cached[g] if served[g, keys[g][j]] in unwritten)
            for g in range(len(layout.groups))
        )
    return CacheView(layout, len(tokens), cached, partial, in_flight), keys, served


def blocks_in_flight(state: State) -> frozenset[int]:
    """The blocks ALLOC-VIS-2 published for chunks whose pass has not run: registered under
    their whole keys, their KV not written yet (HIT-UNIT-5). Empty under step-end."""
    return frozenset(
        request.tables[g][j]
        for request in state.requests.values()
        for g, start in enumerate(request.published)
        for j in range(start, request.registered[g])
    )


# --- table shape -----------------------------------------------------------------------------


def _end(group: Group, request: Request) -> int:
    """Where a group's allocation ends: speculative slots are attention positions only."""
    end = request.computed + request.scheduled
    return end if isinstance(group, MambaState) else end + request.lookahead


def positions_read(
    group: Group, computed: int, end: int, decoding: bool = False, limit: int | None = None
) -> range:
    """ALLOC-HOLD-1: While computing tokens [computed, end) a group keeps the table positions
    its kind can still read (a state group in mode align or none: the state after `computed`
    tokens, at position (computed - 1) // B, and its running state, at the position `end`
    falls in, or with speculative blocks every position up to ALLOC-SPEC-1's last); every
    earlier position may hold the null block.

        B=16, tokens [64, 80):
        full, state all     positions 0..4
        SW W=32             positions 2..4   (token 64's window starts at token 33)
        chunked C=32        positions 4..4   (token 64 opens a chunk)
        state align/none    positions 3..4   (the state at 64 in 3, the running state in 4)
        B=16, tokens [70, 71):
        state align/none    position 4       (the state at 70 is the running state)
        cross               nothing

    pre: 0 <= computed < end
    post: isinstance(group, CrossAttention) or __return__.stop == span(group, end, decoding, limit)
    """
    if isinstance(group, CrossAttention):
        return range(0)
    size = group.block_size
    last = span(group, end, decoding, limit)
    match group:
        case SlidingWindow():
            first = max(0, computed - (group.window - 1)) // size
        case ChunkedLocal():
            first = (computed // group.chunk) * group.chunk // size
        case MambaState() if group.mode is not MambaMode.ALL:
            first = (computed - 1) // size if computed else -(-end // size) - 1
        case _:
            first = 0
    return range(first, last)


def positions_written(
    group: Group, computed: int, end: int, decoding: bool = False, limit: int | None = None
) -> range:
    """ALLOC-WRITE-1: Computing tokens [computed, end) writes the positions those tokens fall
    in, each of which needs a real block; a state group in mode align or none writes only
    its running state, at the position `end` falls in (and ALLOC-SPEC-1's positions after it).

        B=16, tokens [40, 80):   attention, state all: positions 2..4;  align/none: 4

    pre: 0 <= computed < end
    post: isinstance(group, CrossAttention) or __return__.stop == span(group, end, decoding, limit)
    """
    if isinstance(group, CrossAttention):
        return range(0)
    last = -(-end // group.block_size)
    if isinstance(group, MambaState) and group.mode is not MambaMode.ALL:
        return range(last - 1, span(group, end, decoding, limit))
    return range(computed // group.block_size, last)


def span(
    group: AttentionGroup | MambaState, end: int, decoding: bool = False, limit: int | None = None
) -> int:
    """How many table positions a chunk ending at `end` spans: those its tokens fall in, and
    for a decode chunk of a state group with speculative blocks ALLOC-SPEC-1's too (`limit`:
    max_model_len)."""
    if decoding and isinstance(group, MambaState) and group.speculative_blocks:
        # called only then: a case cites the rules it reaches
        return speculative_end(group, end, limit)
    return -(-end // group.block_size)


def speculative_end(group: MambaState, end: int, limit: int | None = None) -> int:
    """ALLOC-SPEC-1: A state group with S speculative blocks also writes, for a decode chunk
    (one appending sampled tokens, as every chunk after a request's first sampled token does)
    ending at `end`, every position a step verifying up to S draft tokens may put its running
    state or a draft's state in: the running position of a chunk ending anywhere in
    [end, end + S] (never past max_model_len) and the S positions after it; none is
    registered, and the next chunk, which reads the accepted draft's state from them, still
    holds them.

        B=16, S=2, decode chunk [39, 40):  running position 2 (ends 40..42), drafts' 3, 4
        B=16, S=2, decode chunk [46, 47):  running position 2 or 3 (ends 47..49), up to 5
        position   0   1   2   3   4   5
        [39, 40)   .   .   w   s   s        w: reads and writes the running state
        [46, 47)   .   .   w   s   s   s    s: a draft's state (or the running state at 49)
        [46, 47), max_model_len 48:  positions 2..4 (no step ends past 48)
        a prefill chunk verifies no drafts: [32, 47) writes position 2 only

    ALLOC-HOLD-1 reads up to the last of them. The engine copies the accepted state to the
    boundary it reached itself, so only ALLOC-COMMIT-1's positions are ever registered,
    each once its step has ended.

    pre: end >= 1 and group.speculative_blocks >= 1 and (limit is None or end <= limit)
    post: __return__ >= -(-end // group.block_size) + group.speculative_blocks
    """
    spare = group.speculative_blocks
    reach = end + spare if limit is None else min(end + spare, limit)
    return -(-reach // group.block_size) + spare


def checkpoint_positions(group: Group, computed: int, end: int, checkpoint: int) -> range:
    """CKPT-INNER-1: A chunk may name one block boundary strictly inside it whose state the
    engine's kernel saves in passing, and a state group in mode align then also writes that
    boundary's position, holds it for the step and registers it when the step ends, as if a
    chunk had ended there.

    So the prompt's last chunk need not stop at the re-send boundary (CKPT-ALIGN-1) to leave
    its checkpoint: one pass fewer. The boundary must lie past the position the chunk reads
    its state from, and be one for every state group in mode align.

        B=16, chunk [32, 80), checkpoint 64:
        position     0   1   2   3   4
        align        .   r   .   c   w    r: reads the state at 32   c: saves the state at 64
                                          w: the running state (at 80: not a boundary yet)
        end of step: position 3 registered as the state at 64

    pre: 0 <= computed < end and checkpoint >= 0
    post: len(__return__) <= 1
    """
    if not checkpoint or not isinstance(group, MambaState) or group.mode is not MambaMode.ALIGN:
        return range(0)
    if checkpoint % group.block_size:  # a multiple of U inside a block (CKPT-INNER-2)
        position = unit_checkpoint_position(group, end)
    else:
        position = checkpoint // group.block_size - 1
    return range(position, position + 1)


def unit_checkpoint_position(group: MambaState, end: int) -> int:
    """CKPT-INNER-2: Under `unit U` a prefill chunk may instead name a multiple of U strictly
    inside it that lies inside a block of a state group in mode align; that group then saves
    the state there into the position before the one its running state is at,
    ceil(end / B) - 2, which must lie past the position the chunk reads its state from, and
    keys it there (its partial key) when the step ends.

    So a prompt computed in one chunk leaves its re-send hit inside a block, as a chunk
    stopping at its tail would (ALLOC-UNIT-2), without the extra pass; and a chunk inside a
    long prompt leaves a state a prompt diverging inside a block hits.

        B=64, U=16, prompt 100 (tail 96), chunk [0, 100) naming 96:
        position     0   1
        align        c   w        c: the state at 96, saved in passing   w: the running state
        end of step: block at position 0 keyed at 96 (its partial key); a re-send hits 96
        chunk [64, 100): reads position 0 -> it cannot name 96 (it would overwrite it)

    pre: end >= 1
    post: __return__ == -(-end // group.block_size) - 2
    """
    return -(-end // group.block_size) - 2


def saved_checkpoint(layout: Layout, g: int, request: Request) -> tuple[int, int] | None:
    """The position inside a block whose state group g's chunk saved in passing, and the
    table position holding it, both keyed when the step ends (CKPT-INNER-2); None if none."""
    group, at = layout.groups[g], request.checkpoint
    if not isinstance(group, MambaState) or group.mode is not MambaMode.ALIGN:
        return None
    if not at % group.block_size:  # none, or a block boundary (CKPT-INNER-1)
        return None
    return at, unit_checkpoint_position(group, request.computed)


def draft_checkpoint_floor(group: MambaState, computed: int) -> int:
    """ALLOC-SPEC-2: In a decode chunk of a state group with speculative blocks the inner
    checkpoint (CKPT-INNER-1) may also be the boundary that ends the block the chunk reads
    its state from, because the step that verified the drafts the chunk appends has copied
    the state at that boundary there, and the chunk takes the accepted state from the block
    of its last accepted draft, never from that one.

        B=16, S=2, decode chunk [46, 50): two accepted drafts and the bonus token after 46
        position    0   1   2   3   4   5
                    .   .   c   w   s   s    c: the state at 48, copied there when the drafts
                                                were verified; registered when this step ends
        lowest checkpoint: 48 (64 without speculative blocks, or in a prefill chunk)

    pre: computed >= 1 and group.speculative_blocks >= 1
    post: __return__ % group.block_size == 0 and 0 < __return__ - computed <= group.block_size
    """
    size = group.block_size
    return ((computed - 1) // size + 1) * size


def checkpoint_problem(
    layout: Layout, computed: int, end: int, checkpoint: object, decoding: bool = False
) -> str | None:
    """Why `checkpoint` cannot be the inner checkpoint of a chunk [computed, end), or None: it
    must be 0 or, for every state group in mode align (one at least), a multiple of its block
    size strictly inside the chunk, at a position after the one the chunk reads its state
    from (that block is read, not overwritten, by the chunk), or in a decode chunk of a group
    with speculative blocks at that position too (ALLOC-SPEC-2); or, under `unit U` in a
    prefill chunk, a multiple of U inside a block, which such a group saves at a position past
    the one read (CKPT-INNER-2)."""
    if checkpoint == 0:
        return None
    if not (isinstance(checkpoint, int) and computed < checkpoint < end):
        return (
            f"checkpoint {checkpoint!r} is not strictly inside the chunk [{computed}, {end}); "
            "name a block boundary inside it, or 0 for none"
        )
    aligned = [
        (g, group)
        for g, group in enumerate(layout.groups)
        if isinstance(group, MambaState) and group.mode is MambaMode.ALIGN
    ]
    if not aligned:
        return "a checkpoint needs a state group in mode align; pass 0"
    unit = layout.hit_unit
    for g, group in aligned:
        size = group.block_size
        if unit and not decoding and checkpoint % size and not checkpoint % unit:
            read = (computed - 1) // size if computed else -1
            if unit_checkpoint_position(group, end) > read:  # called only then: vectors cite it
                continue
            return (
                f"checkpoint {checkpoint} cannot be saved by the chunk [{computed}, {end}) in "
                f"state group {g} (B={size}): the position before its running one, "
                f"{unit_checkpoint_position(group, end)}, holds the state the chunk reads; "
                "pass 0 (stop a chunk there instead)"
            )
        if decoding and group.speculative_blocks:  # called only then: vectors cite its rule
            low = draft_checkpoint_floor(group, computed)
        else:
            low = ((computed - 1) // size + 2) * size if computed else size
        if checkpoint % size or checkpoint < low:
            return (
                f"checkpoint {checkpoint} is not a block boundary of state group {g} "
                f"(B={size}) at or after {low}, the first one past the position the chunk "
                f"[{computed}, {end}) reads its state from; name such a boundary, or 0 for none"
                + (
                    f" (or, in a prefill chunk, a multiple of U={unit} inside a block)"
                    if unit
                    else ""
                )
            )
    return None


def allowed_checkpoints(
    layout: Layout, computed: int, end: int, decoding: bool = False
) -> tuple[int, ...]:
    """Every inner checkpoint a chunk [computed, end) may name (0, none, aside)."""
    return tuple(  # direct callers only: generators and machines pick checkpoints with it
        q
        for q in range(computed + 1, end)
        if checkpoint_problem(layout, computed, end, q, decoding) is None
    )


def _require_checkpoint(
    layout: Layout, computed: int, end: int, checkpoint: object, decoding: bool = False
) -> None:
    problem = checkpoint_problem(layout, computed, end, checkpoint, decoding)
    _require(problem is None, problem or "")


# --- the transition ------------------------------------------------------------------------


def step(state: State, op: Op) -> tuple[State, Observation]:
    """The next-state relation: one operation, one observation."""
    match op:
        case Admit():
            return _admit(state, op)
        case Extend():
            return _extend(state, op)
        case EndStep():
            return end_step(state)
        case Finish() | Preempt():
            return release(state, op.rid)
        case ResetCache():
            return reset_cache(state)
    refuse(InvalidOp, f"unknown operation {op!r}")  # pragma: no cover - Op is closed


def _require(condition: bool, message: str) -> None:
    if not condition:
        refuse(InvalidOp, message)


def _integer(value: object) -> TypeGuard[int]:
    """An int that is not a bool (True is 1 to Python, never a token id or a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require_token_ids(tokens: object, what: str) -> None:
    _require(
        isinstance(tokens, tuple) and all(_integer(t) and 0 <= t < TOKEN_ID_LIMIT for t in tokens),
        f"{what} must be token ids: integers in [0, 2**63), got {tokens!r}",
    )


def _require_budget(budget: object, lookahead: object) -> None:
    _require(
        _integer(budget) and budget >= 1 and _integer(lookahead) and lookahead >= 0,
        f"budget must be an integer >= 1 and lookahead an integer >= 0, "
        f"got {budget!r} and {lookahead!r}",
    )


def check_admission(layout: Layout, running: Collection[str], op: Admit) -> None:
    """Refuse a malformed admission (InvalidOp) before anything is looked up."""
    _require(
        isinstance(op.rid, str) and op.rid != "",
        f"a request id is a non-empty string, got {op.rid!r}",
    )
    _require_token_ids(op.tokens, "a prompt's tokens")
    _require(
        op.rid not in running,
        f"request {op.rid!r} is already running; "
        "Extend it, or Finish/Preempt it before admitting it again",
    )
    _require(len(op.tokens) >= 1, "a request needs at least one token")
    _require_budget(op.budget, op.lookahead)
    limit = layout.max_model_len
    _require(
        limit is None or len(op.tokens) <= limit,
        f"{len(op.tokens)} tokens exceed max_model_len={limit}",
    )
    _require(
        all(e.end is None or e.end <= len(op.tokens) for e in op.extras),
        "a positioned extra (multimodal item, prompt embeddings) lies beyond the prompt; "
        "its span must be within the request's tokens",
    )


class Progress(Protocol):
    """How far a running request is, as both allocators (§6, §13) record it."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def computed(self) -> int: ...

    @property
    def scheduled(self) -> int: ...


def check_extension(layout: Layout, op: Extend, request: Progress | None) -> tuple[int, ...]:
    """Refuse a malformed extension (InvalidOp); otherwise the request's tokens after it.
    `request` is the running request `op.rid` names, None when it is not running."""
    if request is None:
        refuse(InvalidOp, f"unknown request {op.rid!r}; Admit it first")
    _require_token_ids(op.appended, "appended tokens")
    _require(request.scheduled == 0, f"request {op.rid!r} has a chunk in flight; EndStep first")
    _require_budget(op.budget, op.lookahead)
    _require(
        not op.appended or request.computed == len(request.tokens),
        f"request {op.rid!r} still has prompt tokens to compute; append only after them",
    )
    tokens = request.tokens + op.appended
    limit = layout.max_model_len
    _require(
        limit is None or len(tokens) <= limit,
        f"{len(tokens)} tokens exceed max_model_len={limit}; Finish the request",
    )
    _require(
        request.computed < len(tokens),
        f"request {op.rid!r} has no token left to compute; append the sampled token",
    )
    return tokens


def _admit(state: State, op: Admit) -> tuple[State, Observation]:
    layout = state.config.layout
    check_admission(layout, state.requests, op)
    hit, hit_tables = lookup(state, op.tokens, op.extras)
    junction_at = 0
    if state.config.retention is Retention.SPARSE:  # a case cites the rules it reaches
        junction_at = junction(_cache_view(state, op.tokens, op.extras)[0], hit)
    scheduled = min(op.budget, len(op.tokens) - hit)
    _require_checkpoint(layout, hit, hit + scheduled, op.checkpoint)
    tables, sources = split_tails(layout, hit, hit_tables)
    request = Request(
        op.tokens,
        op.extras,
        hit,
        scheduled,
        op.lookahead,
        tables,
        tuple(len(t) for t in tables),
        op.checkpoint,
        prompt=len(op.tokens),
        junction=junction_at,
        sources=sources,
    )
    return admit_with_hit(state, op.rid, request)


def split_tails(
    layout: Layout, hit: int, tables: tuple[tuple[int, ...], ...]
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, int, int], ...]]:
    """ALLOC-UNIT-3: A hit of L tokens ending inside a group's block j takes that block as a
    copy source, not as a table entry: the request's table ends before position j, whose
    fresh block the engine fills with a copy of the source before the step's pass, and the
    source stays held until the step ends, so no allocation of the step can evict it first.

        full B=64, U=16, hit 80 through blocks 3 (whole) and 9 (partial key at 96):
        table [3] + fresh 12 at position 1      copy (group 0, source 9, target 12)
        at the end of the step 9 is released; 12 holds tokens 64..79 and what was computed

    pre: len(tables) == len(layout.groups)
    post: all(len(t) <= -(-hit // g.block_size) for t, g in zip(__return__[0], layout.groups))
    """
    kept = []
    sources = []
    for g, table in enumerate(tables):
        inside = bool(table) and hit % layout.groups[g].block_size != 0
        if inside and table[-1] != NULL_BLOCK:
            sources.append((g, len(table) - 1, table[-1]))
        kept.append(table[:-1] if inside else table)
    return tuple(kept), tuple(sources)


def admit_with_hit(state: State, rid: str, request: Request) -> tuple[State, Observation]:
    """ALLOC-TWO-PHASE-1: An admission first takes every hit block, then allocates new ones,
    so its own allocation can never evict its hits; free hit blocks count against capacity.

        free queue: 5 6 7 8, hits {6, 7} (free), 2 new blocks needed
        need 2 + 2 = 4 <= 4:  take 6 7 -> queue 5 8;  pop 5 8 for the new positions

    Under `unit U` the copy sources of ALLOC-UNIT-3 are taken as hits too.

    pre: rid not in state.requests
    post: isinstance(__return__[1], (Admitted, Waiting))
    """
    hits = {b for table in request.tables for b in table if b != NULL_BLOCK}
    hits |= {b for _, _, b in request.sources}
    reviving = [b for b in hits if state.blocks[b].ref_count == 0]
    blocks = list(state.blocks)
    for b in hits:
        blocks[b] = dataclasses.replace(blocks[b], ref_count=blocks[b].ref_count + 1)
    taken = dataclasses.replace(
        state, blocks=tuple(blocks), free=tuple(b for b in state.free if b not in hits)
    )
    grown = _grow(taken, request, reserved=len(reviving))
    if isinstance(grown, Waiting):
        return state, grown
    new_state, request = grown
    if state.config.visibility is Visibility.SAME_PASS:  # a case cites the rules it reaches
        new_state, request = publish(new_state, request)
    requests = {**new_state.requests, rid: request}
    return (
        dataclasses.replace(new_state, requests=requests),
        Admitted(request.computed, request.scheduled, request.tables, copies(request)),
    )


def copies(request: Request) -> tuple[Copy, ...]:
    """The copies the chunk in flight needs before its pass: (group, source, target)."""
    into_table = tuple((g, b, request.tables[g][j]) for g, j, b in request.sources)
    return into_table + tuple((g, request.tables[g][j], f) for g, j, f in request.keeps)


def _extend(state: State, op: Extend) -> tuple[State, Observation]:
    tokens = check_extension(state.config.layout, op, state.requests.get(op.rid))
    request = state.requests[op.rid]
    scheduled = min(op.budget, len(tokens) - request.computed)
    decoding = request.decoding or bool(op.appended)
    _require_checkpoint(
        state.config.layout,
        request.computed,
        request.computed + scheduled,
        op.checkpoint,
        decoding,
    )
    grown_request = dataclasses.replace(
        request,
        tokens=tokens,
        scheduled=scheduled,
        lookahead=op.lookahead,
        checkpoint=op.checkpoint,
        decoding=decoding,
    )
    released_state, released_request = release_unneeded(state, grown_request)
    if state.config.layout.hit_unit is not None:  # a case cites the rules it reaches
        released_request = keep_checkpoints(released_state, released_request)
    grown = _grow(released_state, released_request, reserved=0)
    if isinstance(grown, Waiting):
        return state, grown
    new_state, new_request = grown
    if state.config.visibility is Visibility.SAME_PASS:  # a case cites the rules it reaches
        new_state, new_request = publish(new_state, new_request)
    requests = {**new_state.requests, op.rid: new_request}
    return (
        dataclasses.replace(new_state, requests=requests),
        Extended(new_request.scheduled, new_request.tables, copies(new_request)),
    )


def keep_checkpoints(state: State, request: Request) -> Request:
    """ALLOC-UNIT-4: A chunk never destroys a checkpoint held under a partial key
    (ALLOC-UNIT-2): where it would overwrite a state block keyed at a tail, the engine first
    copies that block into a fresh one, which takes the key when the step ends and is then
    released, cached; the chunk writes its own block, so a running request's table only
    ever grows (an engine's worker appends to it, never rewrites it).

        state B=64, U=16, prompt 100: step 1 ends at 96, block 7 (position 1) keyed at 96
        Extend [96, 100):  copy (g, 7, 8) before the pass; the chunk writes 7 in place
        end of the step:   8 takes the key at 96 and is released, cached; 7 holds the state
                           at 100, unkeyed
        (attention blocks need no copy: tokens past 96 leave the KV of 64..95 as it was)

    pre: request.scheduled >= 1
    post: __return__.tables == request.tables
    """
    layout = state.config.layout
    keeps = []
    for g, group in enumerate(layout.groups):
        if not isinstance(group, MambaState):
            continue
        end = _end(group, request)
        written = positions_written(
            group, request.computed, end, request.decoding, layout.max_model_len
        )
        table = request.tables[g]
        for j in written:
            b = table[j] if j < len(table) else NULL_BLOCK
            if b != NULL_BLOCK and state.blocks[b].partial is not None:
                keeps.append((g, j, NULL_BLOCK))
    return dataclasses.replace(request, keeps=tuple(keeps))


def move_kept_keys(state: State, request: Request) -> State:
    """ALLOC-UNIT-4 at the end of the step: each keyed block the chunk overwrote hands its
    tail key and the state it names to the copy made before the pass (registered anew, after
    the keys registered before it), which is released."""
    blocks = list(state.blocks)
    stamp = state.next_stamp
    for g, j, fresh in request.keeps:
        old = blocks[request.tables[g][j]]
        blocks[fresh] = dataclasses.replace(
            blocks[fresh],
            content=old.content,
            partial=old.partial,
            partial_at=old.partial_at,
            partial_stamp=stamp,
        )
        stamp += 1
        blocks[request.tables[g][j]] = dataclasses.replace(
            old, content=old.content if old.key else None, partial=None, partial_at=0
        )
    moved = dataclasses.replace(state, blocks=tuple(blocks), next_stamp=stamp)
    return give_back(moved, list(request.keeps))


def release_unneeded(state: State, request: Request) -> tuple[State, Request]:
    """ALLOC-SKIP-1: Before allocating, a request releases the blocks its groups can no longer
    read (ALLOC-HOLD-1) and puts the null block in their place, latest position first.

        SW W=32 B=16, computed 96:  positions 0..3 no longer read -> [0 0 0 0 b4 b5 ...]
        released order: b3 b2 b1 b0 (each to the free queue tail when its count reaches 0)

    pre: request.scheduled >= 1
    post: all(len(t) == len(o) for t, o in zip(__return__[1].tables, request.tables))
    """
    layout = state.config.layout
    released: list[tuple[int, int, int]] = []
    tables = []
    for g, group in enumerate(layout.groups):
        end = _end(group, request)
        held = positions_read(group, request.computed, end, request.decoding, layout.max_model_len)
        table = list(request.tables[g])
        for j in reversed(range(len(table))):
            if table[j] != NULL_BLOCK and j not in held:
                released.append((g, j, table[j]))
                table[j] = NULL_BLOCK
        tables.append(tuple(table))
    cold = state.config.eviction is Eviction.HYBRID
    return give_back(state, released, cold), dataclasses.replace(request, tables=tuple(tables))


def release_order(config: PoolConfig, released: list[tuple[int, int, int]]) -> list[int]:
    """The order (group, position, block) entries join the free queue: as listed under lru
    (ALLOC-FREE-1, ALLOC-SKIP-1), tail first under hybrid (EVICT-ORDER-1)."""
    if config.eviction is Eviction.HYBRID:
        return tail_first(config.layout, released)
    return [block for _, _, block in released]


def _grow(state: State, request: Request, reserved: int) -> tuple[State, Request] | Waiting:
    """Give every position ALLOC-WRITE-1, CKPT-INNER-1 and a copy (ALLOC-UNIT-3) ask for a
    real block, in position order, then each checkpoint copy (ALLOC-UNIT-4) one; `reserved`
    free hit blocks were already taken from the free queue and count as needed too."""
    layout = state.config.layout
    wanted = []
    for g, group in enumerate(layout.groups):
        current = request.tables[g]
        end = _end(group, request)
        written = list(
            positions_written(group, request.computed, end, request.decoding, layout.max_model_len)
        )
        if request.checkpoint:  # called only then: a case cites the rules its ops reach
            written += checkpoint_positions(group, request.computed, end, request.checkpoint)
        written += [j for source_group, j, _ in request.sources if source_group == g]
        wanted.append(sorted({j for j in written if j >= len(current) or current[j] == NULL_BLOCK}))
    count = sum(len(w) for w in wanted) + len(request.keeps)
    if count > len(state.free):
        return Waiting(count + reserved, len(state.free) + reserved)
    state, fresh = evict_for(state, count)
    supply = iter(fresh)
    tables = []
    for g, group in enumerate(layout.groups):
        end = _end(group, request)
        last = positions_read(
            group, request.computed, end, request.decoding, layout.max_model_len
        ).stop
        table = list(request.tables[g]) + [NULL_BLOCK] * max(0, last - len(request.tables[g]))
        for j in wanted[g]:
            table[j] = next(supply)
        tables.append(tuple(table))
    keeps = tuple((g, j, next(supply)) for g, j, _ in request.keeps)  # after the table's
    return state, dataclasses.replace(request, tables=tuple(tables), keeps=keeps)


def evict_for(state: State, count: int) -> tuple[State, tuple[int, ...]]:
    """ALLOC-EVICT-1: Under the lru profile new blocks come from the head of the free queue
    (under hybrid EVICT-HYB-1 picks them); a popped block loses its key and content, so it
    stops being hittable.

        free queue 3 9 4 (9 holds key k)    pop 2 -> blocks 3, 9; k is forgotten; queue 4

    pre: 0 <= count <= len(state.free)
    post: len(__return__[1]) == count
    """
    if state.config.eviction is Eviction.HYBRID:
        taken: list[int] = []
        for _ in range(count):  # one at a time: each eviction can make the next block dead
            cold = frozenset(b for b in state.free if state.blocks[b].cold)
            victim = hybrid_victim(state.free, dead_free_blocks(state), cold)
            state = _hand_out(state, (victim,))
            taken.append(victim)
        return state, tuple(taken)
    victims = state.free[:count]
    return _hand_out(state, victims), victims


def _hand_out(state: State, victims: tuple[int, ...]) -> State:
    """Take `victims` off the free queue, each now held once and holding nothing."""
    blocks = list(state.blocks)
    for victim in victims:
        blocks[victim] = Block(ref_count=1)
    chosen = frozenset(victims)
    free = tuple(b for b in state.free if b not in chosen)
    return dataclasses.replace(state, blocks=tuple(blocks), free=free)


def cached_blocks(state: State) -> tuple[Cached, ...]:
    """Every registered block, as the eviction rules (§11) read it."""
    layout = state.config.layout
    out = []
    for b, block in enumerate(state.blocks):
        if block.key is None or block.content is None:
            continue
        g, tokens, extras = block.content
        position = (len(tokens) - key_lookahead(layout, layout.groups[g])) // layout.groups[
            g
        ].block_size - 1
        out.append(Cached(b, g, position, block.key[1], tokens, extras, block.stamp))
    return tuple(out)


def dead_free_blocks(state: State) -> frozenset[int]:
    """Free blocks holding nothing a lookup could be served: unregistered or EVICT-DEAD-1."""
    dead = provably_dead(state.config.layout, cached_blocks(state))
    return frozenset(b for b in state.free if state.blocks[b].key is None or b in dead)


def _decrement(
    state: State, order: list[int], cold: bool = False, unkeyed_first: bool = False
) -> State:
    blocks = list(state.blocks)
    front: list[int] = []
    freed: list[int] = []
    for b in order:
        blocks[b] = dataclasses.replace(blocks[b], ref_count=blocks[b].ref_count - 1)
        if blocks[b].ref_count == 0:
            blocks[b] = dataclasses.replace(blocks[b], cold=cold)
            (front if unkeyed_first and not blocks[b].registrations() else freed).append(b)
    free = tuple(front) + state.free + tuple(freed)
    return dataclasses.replace(state, blocks=tuple(blocks), free=free)


def give_back(state: State, released: list[tuple[int, int, int]], cold: bool = False) -> State:
    """Release (group, position, block) entries in the order the eviction profile sets."""
    if state.config.eviction is Eviction.LRU_UNKEYED_FIRST:
        return unkeyed_first(state, released)
    return _decrement(state, release_order(state.config, released), cold)


def unkeyed_first(state: State, released: list[tuple[int, int, int]]) -> State:
    """ALLOC-FREE-2: Under the lru-unkeyed-first profile each group's released
    blocks, in ALLOC-FREE-1's order, split on reaching 0: blocks without a key go to the
    queue head (a later group's ahead of an earlier one's), keyed blocks join the tail; so a
    new allocation reuses KV nobody can hit before it evicts KV somebody might.

        queue 7 8;  g0 releases 3 2 1 (1 keyed), then g1 releases 6 5 (5 keyed)
        after g0: 3 2 7 8 1     after g1: 6 3 2 7 8 1 5

    pre: all(state.blocks[b].ref_count > 0 for _, _, b in released)
    post: len(__return__.free) >= len(state.free)
    """
    for g in range(len(state.config.layout.groups)):
        batch = [b for group, _, b in released if group == g]
        state = _decrement(state, batch, unkeyed_first=True)
    return state


def release(state: State, rid: str) -> tuple[State, Observation]:
    """ALLOC-FREE-1: A finished or preempted request releases its blocks group by group in
    layout order, each group's table from the last position to the first; blocks whose count
    reaches 0 join the free queue tail in that order (under lru; hybrid
    reorders them by EVICT-ORDER-1).

        tables  g0: [1 2 3]   g1: [0 5 6]     queue tail gains 3 2 1 6 5
        so group 0's first block is evicted before any of group 1's blocks

    pre: rid in state.requests
    post: rid not in __return__[0].requests
    """
    _require(rid in state.requests, f"unknown request {rid!r}; it is not running")
    if state.requests[rid].published:  # a case cites the rules it reaches
        state = withdraw(state, rid)
    request = state.requests[rid]
    held = [
        (g, j, table[j])
        for g, table in enumerate(request.tables)
        for j in reversed(range(len(table)))
        if table[j] != NULL_BLOCK
    ]
    new_state = give_back(state, [*held, *request.sources, *request.keeps])
    requests = {k: v for k, v in new_state.requests.items() if k != rid}
    freed = len(new_state.free) - len(state.free)
    return dataclasses.replace(new_state, requests=requests), Released(freed)


def committed_positions(layout: Layout, g: int, request: Request, before: int) -> tuple[int, ...]:
    """ALLOC-COMMIT-1: At the end of a step a group registers the table positions whose KV is
    now entirely written; an attention group registers in whole units of the hit
    granularity A (the hit alignment, or U), a block once its request has computed the
    multiple of A at or after its end (no hit can read it before: THM-REG-UNIT); a draft
    group waits until the draft_reach - 1 tokens after the block are computed too (its last
    positions are drafted again until then) and, under exact keying, until its key's tokens
    are known; a state group registers a checkpoint at every boundary (all) or only where
    the step ended and at the chunk's inner checkpoint (align, CKPT-INNER-1), and never in
    mode none; a position already released holds nothing to register.

        B=16, computed 40 -> 64 this step:   full registers positions 2, 3
        full B=16 beside SW B=32 (A=32), computed 0 -> 48:   full registers 0, 1 (2 waits
                                                             for computed 64)
        draft (exact), 64 tokens known:      position 3 waits for token 64
        draft, reach 3, computed 40 -> 64:   position 2 only (3 waits for computed 66)
        state align:                         position 3 (the step ended at 64)
        state align, checkpoint 48:          positions 2, 3

    pre: 0 <= before <= request.computed
    post: all(0 <= j < len(request.tables[g]) for j in __return__)
    """
    group = layout.groups[g]
    size = 1 if isinstance(group, CrossAttention) else group.block_size
    start, stop = request.registered[g], request.computed // size
    if isinstance(group, CrossAttention):
        return ()
    if is_draft(group):
        stop = min(stop, (request.computed - (layout.draft_reach - 1)) // size)
    if key_lookahead(layout, group):
        stop = min(stop, (len(request.tokens) - key_lookahead(layout, group)) // size)
    if not isinstance(group, MambaState):  # whole units of the hit granularity
        unit = hit_alignment(layout)
        stop = min(stop, request.computed // unit * unit // size)
    if isinstance(group, MambaState):
        if group.mode is MambaMode.NONE:
            return ()
        if group.mode is MambaMode.ALIGN:
            inner = (  # a position inside a block takes its partial key (CKPT-INNER-2)
                checkpoint_positions(group, before, request.computed, request.checkpoint)
                if request.checkpoint and not request.checkpoint % size
                else range(0)
            )
            aligned = request.computed % size == 0 and request.computed > before
            ended = range(stop - 1, stop) if aligned else range(0)
            return tuple(j for j in (*inner, *ended) if j >= start)
    return tuple(range(start, max(start, stop)))


def kept_lengths(config: PoolConfig, g: int, request: Request) -> Retained | None:
    """The hit lengths group g keeps `request`'s committed blocks for: a bounded group's
    retained lengths under the profile (RET-DENSE-1, RET-SPARSE-1), else None (every
    committed block: a full-attention hit needs them all)."""
    layout = config.layout
    if not is_bounded(layout.groups[g]):
        return None
    if config.retention is Retention.DENSE:
        return dense_lengths(layout)
    return retained_lengths(layout, request.prompt, request.junction, config.retention_interval)


def _register(
    layout: Layout,
    blocks: list[Block],
    stamp: int,
    *,
    g: int,
    request: Request,
    positions: tuple[int, ...],
    kept: Retained | None = None,
) -> tuple[int, int]:
    """Give group g's blocks at `positions` their keys and contents, in position order,
    leaving out those no hit at a retained length reads (`kept`, RET-SPARSE-2; None keeps
    all); returns (the next stamp, how many were registered)."""
    group = layout.groups[g]
    lookahead = key_lookahead(layout, group)
    keys = block_keys(request.tokens, group.block_size, request.extras, lookahead)
    registered = 0
    for j in positions:
        b = request.tables[g][j]
        if b == NULL_BLOCK:  # released (ALLOC-SKIP-1) before its next token arrived
            continue
        if kept is not None and not keeps(group, kept, j):  # released uncached when let go
            continue
        covered = (j + 1) * group.block_size + lookahead
        blocks[b] = dataclasses.replace(
            blocks[b],
            key=(g, keys[j]),
            stamp=stamp,
            content=(g, request.tokens[:covered], extras_within(request.extras, covered)),
        )
        stamp += 1
        registered += 1
    return stamp, registered


def end_step(state: State) -> tuple[State, Observation]:
    """ALLOC-VIS-1: Under the step-end visibility profile blocks become hittable only at the
    end of the step that wrote them: scheduled tokens are committed, then ALLOC-COMMIT-1's
    positions are registered, never earlier (under same-pass, ALLOC-VIS-2 registered the
    attention positions already, and the state groups' wait for this).

        step 1: a computes tokens 0..63 (B=16); b looks up in step 1 -> hit 0
        end of step 1: a's blocks 0..3 registered;    b looks up in step 2 -> hit 48

    pre: True
    post: all(r.scheduled == 0 for r in __return__[0].requests.values())
    """
    layout = state.config.layout
    for rid in sorted(state.requests):  # ALLOC-UNIT-4: kept checkpoints take their keys
        if state.requests[rid].keeps:  # a case cites the rules it reaches
            state = move_kept_keys(state, state.requests[rid])
    blocks = list(state.blocks)
    stamp = state.next_stamp
    requests = {}
    registered = 0
    for rid in sorted(state.requests):
        old = state.requests[rid]
        request = dataclasses.replace(old, computed=old.computed + old.scheduled, scheduled=0)
        marks = list(request.registered)
        for g in range(len(layout.groups)):
            positions = committed_positions(layout, g, request, old.computed)
            if not positions:
                continue
            stamp, count = _register(
                layout,
                blocks,
                stamp,
                g=g,
                request=request,
                positions=positions,
                kept=kept_lengths(state.config, g, request),
            )
            registered += count
            marks[g] = positions[-1] + 1
        for g, group in enumerate(layout.groups):
            tail = tail_position(layout, g, request, old.computed)
            if tail:  # called only then: a case cites the rules it reaches
                column = tail // group.block_size
                stamp = _register_tail(
                    layout, blocks, stamp, g=g, request=request, position=tail, column=column
                )
                registered += 1
            saved = saved_checkpoint(layout, g, request)
            if saved and keeps_checkpoint(kept_lengths(state.config, g, request), saved[0]):
                at, column = saved
                stamp = _register_tail(
                    layout, blocks, stamp, g=g, request=request, position=at, column=column
                )
                registered += 1
        requests[rid] = dataclasses.replace(
            request, registered=tuple(marks), checkpoint=0, published=(), sources=(), keeps=()
        )
    ended = dataclasses.replace(
        state, blocks=tuple(blocks), requests=requests, next_stamp=stamp, published_in_step=0
    )
    for rid in sorted(state.requests):  # copy sources (ALLOC-UNIT-3): the pass has run
        ended = give_back(ended, list(state.requests[rid].sources))
    return ended, StepEnded(registered + state.published_in_step)


def tail_boundary(unit: int, prompt: int, reach: int = 0) -> int:
    """The longest hit a re-send of a `prompt`-token prompt can take under `unit U`:
    RET-SPARSE-1's re-send hit at U, the last multiple of U at or below prompt - max(1, r)
    (HIT-LEN-1 leaves the last token to compute; a draft key at P covers the r = `reach`
    tokens after P, HASH-DRAFT-1, which the prompt must hold).

        U=16, prompt 100: r 0 or 1 -> 96;  r 2 -> 96;  r 5 -> 80 (a key at 96 covers 96..100)

    pre: unit >= 1 and prompt >= 1 and reach >= 0
    post: 0 <= __return__ < prompt and __return__ % unit == 0
    """
    return max(prompt - max(1, reach), 0) // unit * unit


def tail_position(layout: Layout, g: int, request: Request, before: int) -> int:
    """ALLOC-UNIT-2: Under `unit U` a request keys the block its prompt's tail boundary T
    (the longest hit a re-send of the prompt takes, `tail_boundary`) falls inside, when T is
    inside a block: an attention group at the end of the step that computed token T - 1, a
    draft group (exact keying, HASH-DRAFT-1) once the draft_reach - 1 tokens after T are
    computed too (as ALLOC-COMMIT-1 waits for a whole draft block), a state group in mode
    align or all only at the end of a step that ended exactly at T (its running block then
    holds the state at T, which ALLOC-UNIT-4 keeps); 0 when nothing is keyed.

        B=64, U=16, prompt 100 (T=96), steps [0, 64) [64, 100):
        full      the end of step 2 keys block 1 at 96 (tokens 64..95)
        draft     reach 2: key over tokens 0..97, at the end of step 2 (computed token 96)
                  reach 5: T=80 for every group (a key at 96 would cover tokens past 99)
        state     nothing: step 2 ended at 100;  with steps [0, 96) [96, 100) the end of
                  step 1 keys the state at 96 in block 1
        prompt 128 (T=112) or 65 (T=64, a block boundary: ALLOC-COMMIT-1's): as stated;  nothing

    pre: 0 <= before <= request.computed
    post: __return__ == 0 or __return__ % layout.groups[g].block_size != 0
    """
    group = layout.groups[g]
    unit = layout.hit_unit
    if unit is None or isinstance(group, CrossAttention) or not request.prompt:
        return 0
    tail = tail_boundary(unit, request.prompt, keys_reach(layout))
    if not tail % group.block_size:
        return 0
    if isinstance(group, MambaState):
        ended_there = request.computed == tail and before < tail
        return tail if group.mode is not MambaMode.NONE and ended_there else 0
    needed = tail + max(key_lookahead(layout, group) - 1, 0)  # computed tokens its KV needs
    return tail if before < needed <= request.computed else 0


def _register_tail(
    layout: Layout,
    blocks: list[Block],
    stamp: int,
    *,
    g: int,
    request: Request,
    position: int,
    column: int,
) -> int:
    """Key group g's block at table position `column` under the request's partial key at
    `position` (ALLOC-UNIT-2: the block it falls inside; CKPT-INNER-2: the block the state
    saved in passing went to), keeping a whole-block key and its longer content if it has
    them; returns the next stamp."""
    group = layout.groups[g]
    b = request.tables[g][column]  # written this step: never released
    covered = position + key_lookahead(layout, group)  # a draft key's tokens past it too
    key = partial_key(
        request.tokens, group.block_size, position, request.extras, covered - position
    )
    content = blocks[b].content or (
        g,
        request.tokens[:covered],
        extras_within(request.extras, covered),
    )
    blocks[b] = dataclasses.replace(
        blocks[b], partial=(g, key), partial_at=position, partial_stamp=stamp, content=content
    )
    return stamp + 1


def publish(state: State, request: Request) -> tuple[State, Request]:
    """ALLOC-VIS-2: Under the same-pass visibility profile the attention positions a chunk
    completes (ALLOC-COMMIT-1, as if its step had ended) are registered as soon as the chunk
    is scheduled, so a request looked up later in the same step hits them; a state group's
    checkpoints still wait for the step's end (ALLOC-VIS-1).

        B=16, step 1: a is scheduled tokens 0..63     a's blocks 0..3 registered now
                      b (same 64-token prefix + 8)    looks up in step 1 -> hit 64
        full + state align: the state at 64 is not registered until step 1 ends -> b hits 0

    Why it is sound. The engine runs one forward pass over the step's batch, and in every
    layer it first writes the KV of all the batch's tokens, then runs attention for all of
    them: b's attention in layer l reads a's layer-l KV after a wrote it. A state layer has
    no such order: one kernel reads each request's initial state and writes its
    checkpoints, with no order between requests, so b could read a's state before a wrote
    it. The engine's promise behind this profile: no chunk published here leaves the step
    before its pass runs while another request holds its blocks (ALLOC-VIS-3).

    pre: request.scheduled >= 1 and state.config.visibility is Visibility.SAME_PASS
    post: __return__[1].registered == request.registered or __return__[1].published
    """
    layout = state.config.layout
    done = dataclasses.replace(request, computed=request.computed + request.scheduled)
    blocks = list(state.blocks)
    stamp = state.next_stamp
    marks = list(request.registered)
    count = 0
    for g, group in enumerate(layout.groups):
        if isinstance(group, MambaState):
            continue
        positions = committed_positions(layout, g, done, request.computed)
        if positions:
            kept = kept_lengths(state.config, g, done)
            stamp, added = _register(
                layout, blocks, stamp, g=g, request=done, positions=positions, kept=kept
            )
            count += added
            marks[g] = positions[-1] + 1
    if marks == list(request.registered):
        return state, request
    published = dataclasses.replace(request, registered=tuple(marks), published=request.registered)
    new_state = dataclasses.replace(
        state,
        blocks=tuple(blocks),
        next_stamp=stamp,
        published_in_step=state.published_in_step + count,
    )
    return new_state, published


def withdraw(state: State, rid: str) -> State:
    """ALLOC-VIS-3: Releasing a request whose chunk is in flight withdraws the chunk: the
    blocks ALLOC-VIS-2 published for it lose their keys (the pass that would write them
    will not run for it), and the release is refused while another request holds one of
    them in its table, whose hit would read KV that no pass writes.

    Under `unit U` a block's partial key, registered when an earlier step ended, stays with
    the content it names: a copy source read under it (HIT-UNIT-5) reads KV that was
    written, so it does not refuse the release.

        a scheduled 0..63, blocks 5 6 7 8 published; b took 5 6 7 (a hit of 48)
        Preempt(a) before the step ends:  refused (b holds 5)
        Preempt(a) with no reader:        5 6 7 8 lose their keys, then ALLOC-FREE-1
        unit U: 8 keyed at 56 since step 1, c copies it:  8 keeps that key and tokens 0..55

    pre: rid in state.requests and state.requests[rid].published
    post: __return__.free == state.free
    """
    request = state.requests[rid]
    blocks = list(state.blocks)
    layout = state.config.layout
    for g, start in enumerate(request.published):
        for j in range(start, request.registered[g]):
            b = request.tables[g][j]
            if b == NULL_BLOCK:  # released while waiting for its unit (ALLOC-COMMIT-1): no key
                continue
            readers = sorted(
                r for r, other in state.requests.items() if r != rid and b in other.tables[g]
            )
            _require(
                not readers,
                f"request {rid!r} has a chunk in flight whose block {b} request "
                f"{readers[0] if readers else ''!r} took as a same-pass hit (ALLOC-VIS-2): "
                "releasing it now leaves that KV unwritten; end the step first",
            )
            older = _older(blocks[b], key_lookahead(layout, layout.groups[g]))
            blocks[b] = dataclasses.replace(blocks[b], key=None, content=older)
    return dataclasses.replace(state, blocks=tuple(blocks))


def _older(block: Block, lookahead: int) -> Content | None:
    """What a withdrawn block still holds: the content its partial key names (with the
    `lookahead` tokens a draft key covers past it, HASH-DRAFT-1), or nothing."""
    if block.partial is None or block.content is None:
        return None
    g, tokens, extras = block.content
    covered = block.partial_at + lookahead
    return g, tokens[:covered], extras_within(extras, covered)


def reset_cache(state: State) -> tuple[State, Observation]:
    """ALLOC-RESET-1: Resetting the prefix cache forgets every key, and is refused while any
    request holds blocks (their tables would point at unregistered content).

        no request running:   keys of blocks 1..N-1 cleared, free queue order kept
        a request running:    refused, nothing changes

    pre: True
    post: __return__[1].done == (not state.requests)
    """
    if state.requests:
        return state, CacheReset(False)
    blocks = tuple(
        dataclasses.replace(b, key=None, content=None, partial=None, partial_at=0)
        for b in state.blocks
    )
    return dataclasses.replace(state, blocks=blocks), CacheReset(True)
