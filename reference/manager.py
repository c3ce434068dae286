"""The request-level allocator an engine calls: admit, extend, end_step, finish, preempt.

Implements the spec's allocator (§6, kvcert.spec.alloc) under every eviction profile (the
free queue and the release order are the profile's, kvcert.reference.eviction):
ALLOC-TWO-PHASE-1 (hits are taken before anything is allocated), ALLOC-HOLD-1/WRITE-1/SKIP-1
(what each kind keeps, writes and releases), ALLOC-COMMIT-1/VIS-1 (blocks are registered at
the end of the step that wrote them), ALLOC-RESET-1; kvcert.reference.rules lists which
method implements which rule. tests/differential runs it against the spec step by step.

Cost per call: a prompt is validated and encoded once in C and digested once per block
boundary (kvcert.reference.hashing), except for the whole blocks it shares with a recent
prompt, whose digests the memo gives back after a byte comparison; a lookup scans keys in C;
an extension touches only the positions it adds or releases (each group remembers the first
position it still holds), and returns only the blocks it added, as an engine's allocator
does; `block_tables(rid)` gives a whole table on request. Engines that hash prompts as they
arrive pass a `Prompt`.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from kvcert.reference.block_pool import NULL_BLOCK, BlockPool, Key
from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    GroupConfig,
    Kind,
    MambaMode,
)
from kvcert.reference.coordinator import find_hit
from kvcert.reference.errors import (
    ConfigError,
    MaxLengthError,
    RequestStateError,
    UnknownRequestError,
)
from kvcert.reference.events import Event, Stored
from kvcert.reference.groups import first_read, first_release, first_written, table_end
from kvcert.reference.hashing import Chain, DigestMemo, ExtraKey, encode_tokens, hasher
from kvcert.reference.keyindex import ServedMap

TOKEN_LIMIT = 2**63
LIST_OR_TUPLE = (list, tuple)
SIGN_BYTE = 7 if sys.byteorder == "little" else 0  # of an int64 in native order
SHORT = 16  # token lists this short are checked id by id (packing costs more)
NO_POSITIONS: list[int] = []  # shared, never mutated: a group that needs no new block


@dataclass(frozen=True, slots=True)
class Scheduled:
    """An admission or extension that fits.

    `hit` tokens came from the cache (0 on extend); `new_blocks` holds, per group, the blocks
    this call allocated, in table order; `tables` holds each group's whole table after an
    admission (None after an extension: ask `block_tables(rid)`)."""

    hit: int
    scheduled: int
    new_blocks: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """Not enough free blocks; nothing changed. Retry in a later step, unless `never` says
    why no later step can serve it (the request would hold more blocks at once than the pool
    has); `never` takes no part in comparisons."""

    needed: int
    free: int
    never: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Stats:
    """Counters an operator reads to see why the hit rate is what it is."""

    num_blocks: int
    free_blocks: int
    registered_blocks: int
    running_requests: int
    admissions: int  # admit() calls that scheduled the request (a Waiting one is retried)
    admitted_tokens: int  # their prompt tokens
    hit_tokens: int  # of which served from the cache: hit rate = hit_tokens / admitted_tokens
    probes: int  # lookup() and branch_point() calls, which take nothing and count no hits


def token_ids(tokens: object, what: str) -> array[int]:
    """`tokens` as an int64 array of ids in [0, 2**63); RequestStateError naming the first bad
    one. Packing checks types and the upper bound in C; a negative id is one whose most
    significant byte has its top bit set (not ASCII), also checked in C. A bool packs as 0 or
    1, so those two ids are looked up in the packed bytes and checked for bools there. A 1-D
    integer array with `tolist()` (numpy, torch) is read through it."""
    if (  # a step's sampled tokens: checked one by one, packing costs more
        type(tokens) is list
        and len(tokens) <= SHORT
        and all(type(t) is int and 0 <= t < TOKEN_LIMIT for t in tokens)
    ):
        return array("q", tokens)
    if not isinstance(tokens, str | bytes | Sequence | array) and hasattr(tokens, "tolist"):
        tokens = _listed(tokens, what)
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | array):
        raise RequestStateError(
            f"{what} must be a sequence of token ids (integers), got {type(tokens).__name__}"
        )
    packed = b""
    try:
        if isinstance(tokens, array):
            checked = array("q", tokens)
        else:  # struct checks types and range in C, several times faster than array(list)
            packed = struct.pack(f"{len(tokens)}q", *tokens)
            checked = array("q")
            checked.frombytes(packed)
    except (TypeError, OverflowError, struct.error):
        checked = None
    if (
        checked is None
        or not checked.tobytes()[SIGN_BYTE::8].isascii()
        or (packed and _bool_at(tokens, packed) is not None)
    ):
        bad = next(
            (i, t)
            for i, t in enumerate(tokens)
            if type(t) is bool or not isinstance(t, int) or not 0 <= t < TOKEN_LIMIT
        )
        raise RequestStateError(
            f"{what}: position {bad[0]} holds {bad[1]!r}, not a token id (an integer in [0, 2**63))"
        )
    return checked


def _listed(tokens: Any, what: str) -> list[Any]:
    """A 1-D array's elements (numpy, torch); anything else is refused with the fix."""
    listed = tokens.tolist()
    if not isinstance(listed, list):
        raise RequestStateError(
            f"{what} must be a 1-D sequence of token ids, got a 0-D {type(tokens).__name__}"
        )
    if listed and isinstance(listed[0], list):
        raise RequestStateError(
            f"{what} must be 1-D, got a {type(tokens).__name__} of shape "
            f"{getattr(tokens, 'shape', '?')}; pass one request's tokens, e.g. tokens[0]"
        )
    return listed


def _bool_at(tokens: Sequence[Any], packed: bytes) -> int | None:
    """The first position of a bool in `tokens`, given them packed as int64: a bool packs as
    0 or 1, so only the 8-byte-aligned occurrences of those two ids are looked at (memchr
    fast; a prompt's few 0s and 1s cost a type check each)."""
    for value in (0, 1):
        pattern = value.to_bytes(8, sys.byteorder)
        at = packed.find(pattern)
        while at >= 0:
            if at % 8 == 0 and type(tokens[at // 8]) is bool:
                return at // 8
            at = packed.find(pattern, at + 1)
    return None


class _Positions(Sequence[int]):
    """Table positions: some scattered ones, then a run, without listing the run (a request
    asking for far more blocks than the pool holds is counted, then refused, in O(1))."""

    __slots__ = ("_run", "_scattered")

    def __init__(self, scattered: list[int], run: Sequence[int]) -> None:
        self._scattered, self._run = scattered, run

    def __len__(self) -> int:
        return len(self._scattered) + len(self._run)

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        count = len(self)
        if not -count <= index < count:
            raise IndexError(index)
        index %= count
        first = len(self._scattered)
        return self._scattered[index] if index < first else self._run[index - first]

    def __iter__(self) -> Iterator[int]:
        yield from self._scattered
        yield from self._run


def _one_token(tokens: Sequence[int]) -> bool:
    """Whether `tokens` is a list or tuple of one valid token id (a decode step's)."""
    return (
        type(tokens) in LIST_OR_TUPLE
        and len(tokens) == 1
        and type(tokens[0]) is int
        and 0 <= tokens[0] < TOKEN_LIMIT
    )


def _counts(**values: object) -> None:
    """Each value None or an integer >= 0, else RequestStateError naming it."""
    for name, value in values.items():
        if value is not None and (type(value) is not int or value < 0):
            raise RequestStateError(f"{name} must be an integer >= 0, got {value!r}")


def _position(value: object, what: str) -> None:
    if type(value) is not int or value < 0:
        raise RequestStateError(f"{what} must be a table position, an integer >= 0, got {value!r}")


def _request_id(rid: object) -> str:
    if not isinstance(rid, str) or not rid:
        raise RequestStateError(f"a request id is a non-empty string, got {rid!r}")
    return rid


class Prompt:
    """A prompt validated and digested for one manager: pass it to `admit` or `lookup` to
    skip the hashing (an engine hashes a prompt once, as it arrives)."""

    __slots__ = ("_owner", "chains", "encoded", "extras", "tokens")

    def __init__(
        self,
        owner: KVCacheManager,
        tokens: array[int],
        extras: tuple[ExtraKey, ...],
        chains: list[Chain | None],
    ) -> None:
        self._owner = owner
        self.tokens = tokens
        self.extras = extras
        self.chains = chains

    def __len__(self) -> int:
        return len(self.tokens)


class _Request:
    __slots__ = (
        "chains",
        "checkpoints",
        "commit_at",
        "computed",
        "decoding",
        "extras",
        "held_from",
        "lookahead",
        "pipelined",
        "quiet_end",
        "quiet_slots",
        "quiet_slots_floor",
        "quiet_state",
        "registered",
        "scheduled",
        "tables",
        "tokens",
        "unique_chains",
    )

    def __init__(self, prompt: Prompt) -> None:
        self.tokens = array("q", prompt.tokens)  # a copy: decoding appends to it
        self.extras = prompt.extras
        copies: dict[int, Chain] = {}
        self.chains = [
            None if c is None else copies.setdefault(id(c), c.copy()) for c in prompt.chains
        ]
        self.unique_chains = list(copies.values())  # each extended once per new token
        self.computed = 0
        self.scheduled = 0
        self.lookahead = 0
        self.pipelined = 0  # where chunks scheduled behind the one in flight end (`reserve`)
        # inner checkpoints (CKPT-INNER-1) of the chunks scheduled and not yet ended
        self.checkpoints: list[int] = []
        self.tables: list[list[int]] = []
        self.registered: list[int] = []  # per group, positions already considered for caching
        self.held_from: list[int] = []  # per group, every earlier position holds the null block
        # a decode step [c, e) holding slots up to e + L changes no table while
        # e <= quiet_end, pipelined <= quiet_state and quiet_slots_floor <= e + L <= quiet_slots
        self.quiet_end = self.quiet_state = 0
        self.quiet_slots = self.quiet_slots_floor = 0
        self.commit_at = 0  # no block is committed before `computed` reaches this
        self.decoding = False  # it appends sampled tokens: its chunks may verify drafts


class KVCacheManager:
    """A hybrid KV-cache allocator with prefix caching over one shared block pool."""

    search = staticmethod(find_hit)  # the hybrid hit search (a benchmark baseline swaps it)

    def __init__(self, config: CacheConfig) -> None:
        if all(g.kind is Kind.CROSS for g in config.groups):
            raise ConfigError("every group is cross attention: there is no prefix to cache")
        self.config = config
        self.pool = BlockPool(
            config.num_blocks,
            config.eviction,
            len(config.groups),
            track_liveness=config.count_dead_evictions,
            record_events=config.record_events,
        )
        self._digest = hasher(config.hash_algorithm)
        budget = config.digest_memo_bytes
        self._memo = DigestMemo(budget) if budget else None
        self._requests: dict[str, _Request] = {}
        # running requests with a chunk in flight -> the step it was scheduled in
        self._in_flight: dict[str, int] = {}
        # the served maps once the steps in flight end, with what they were made for: the
        # admissions so far and (rid, computed, scheduled) of each chunk in flight
        self._after_steps: tuple[_ChunksInFlight, list[ServedMap[bytes]] | None] | None = None
        self._step = 0  # the step being scheduled (start_step); 0 until an engine pipelines
        exact = config.speculative is DraftKeying.EXACT
        # per group, the tokens past a block its keys cover (HASH-DRAFT-1) and the computed
        # tokens past a block it waits for before registering it (ALLOC-COMMIT-1)
        self._lookahead = [config.draft_reach if exact and g.draft else 0 for g in config.groups]
        self._commit_delay = [config.draft_reach - 1 if g.draft else 0 for g in config.groups]
        base = [
            g.block_size
            for g, s in zip(config.groups, self._lookahead, strict=True)
            if not s and g.kind is not Kind.CROSS
        ]
        self._base_size = math.gcd(*base) if base else 0
        self._admissions = self._admitted_tokens = self._hit_tokens = self._probes = 0
        self._full_groups = [f for f, g in enumerate(config.groups) if g.kind is Kind.FULL]
        # state groups that hold ALLOC-SPEC-1's positions for decode chunks
        self._drafting_states = any(g.speculative_blocks for g in config.groups)
        self._sizes = [g.block_size for g in config.groups]
        self._no_blocks: tuple[tuple[int, ...], ...] = ((),) * len(config.groups)
        self._decode_step = Scheduled(0, 1, self._no_blocks)  # immutable, so shared
        # _changes' view of the groups: (index, group or None for cross attention, block size,
        # whether it holds state, whether it keeps every position)
        self._change_groups = [
            (
                g,
                None if group.kind is Kind.CROSS else group,
                group.block_size,
                group.kind is Kind.MAMBA,
                group.kind is Kind.FULL,
            )
            for g, group in enumerate(config.groups)
        ]
        # _plan_quiet's view of the groups: (index, group, block size, whether it releases,
        # whether it holds state, speculative blocks)
        self._quiet_groups = [
            (
                g,
                group,
                group.block_size,
                first_release(group, 0) is not None,
                group.kind is Kind.MAMBA,
                group.speculative_blocks,
            )
            for g, group in enumerate(config.groups)
            if group.kind is not Kind.CROSS
        ]
        self._quiet_steps = {1: self._decode_step}  # what a quiet step of n tokens returns

    # -- keys -------------------------------------------------------------------------------

    def prompt(self, tokens: Sequence[int], extras: Sequence[ExtraKey] = ()) -> Prompt:
        """Validate and digest a prompt for this manager, once (see `Prompt`)."""
        checked = token_ids(tokens, "a prompt's tokens")
        if isinstance(extras, str | bytes | ExtraKey) or not isinstance(extras, Sequence):
            raise RequestStateError(
                f"extras must be a sequence of ExtraKey, got {type(extras).__name__} "
                f"{extras!r}; e.g. [ExtraKey(ExtraKind.CACHE_SALT, 'tenant-7')]"
            )
        extras = tuple(extras)
        if not all(isinstance(e, ExtraKey) for e in extras):
            raise RequestStateError(
                f"extras must be ExtraKey values (kvcert.reference.hashing), got {extras!r}; "
                "e.g. [ExtraKey(ExtraKind.CACHE_SALT, 'tenant-7')]"
            )
        chains = self._chains(extras)
        encoded = encode_tokens(checked)
        for chain in {id(c): c for c in chains if c is not None}.values():
            chain.extend(checked, encoded, self._memo)
        return Prompt(self, checked, extras, chains)

    def _prepared(self, tokens: Sequence[int] | Prompt, extras: Sequence[ExtraKey]) -> Prompt:
        if not isinstance(tokens, Prompt):
            return self.prompt(tokens, extras)
        if tokens._owner is not self:
            raise RequestStateError("this Prompt was prepared by another KVCacheManager")
        if extras:
            raise RequestStateError("a Prompt carries its extras: pass none beside it")
        return tokens

    def _chains(self, extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        """Per group, the digest chain keying its blocks. Implements HASH-DRAFT-1: a draft
        group under exact keying gets its own chain covering draft_reach tokens past each block;
        every other group shares one chain at the gcd of their block sizes."""
        base = Chain(self._base_size, 0, extras, self._digest) if self._base_size else None
        chains: list[Chain | None] = []
        for group, lookahead in zip(self.config.groups, self._lookahead, strict=True):
            if group.kind is Kind.CROSS:
                chains.append(None)
            elif lookahead:
                chains.append(Chain(group.block_size, lookahead, extras, self._digest))
            else:
                chains.append(base)
        return chains

    def _keys(self, chains: Sequence[Chain | None]) -> list[list[bytes]]:
        """Implements HASH-MATCH-1 with the pool's map: per group the request's key of each
        block, looked up in that group's served keys (block j is cached when it is there)."""
        return [
            [] if c is None else c.keys(size) for c, size in zip(chains, self._sizes, strict=True)
        ]

    # -- lookup -----------------------------------------------------------------------------

    def lookup(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The hit a prompt would get now, without taking anything; `max_hit` caps it (see
        `admit`)."""
        prompt = self._prepared(tokens, extras)
        _counts(max_hit=max_hit)
        self._probes += 1
        hit, tables = self._hit(prompt, max_hit)
        return hit, tuple(tuple(t) for t in tables)

    def _hit(self, prompt: Prompt, max_hit: int | None) -> tuple[int, list[list[int]]]:
        """The hybrid hit of `prompt`, at most `max_hit` tokens: the largest length below
        the cap that every group accepts when the hit exceeds it (find_hit's `limit`)."""
        keys = self._keys(prompt.chains)
        hit, tables = self.search(self.config, len(prompt), keys, self.pool.served)
        if max_hit is not None and hit > max_hit:
            hit, tables = self.search(
                self.config, len(prompt), keys, self.pool.served, limit=max_hit
            )
        return hit, tables

    def lookup_after_steps(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> int:
        """The hit `tokens` would get once every step in flight has ended: the blocks their
        chunks complete join the cache then (ALLOC-COMMIT-1) and count here already. An
        engine that would rather hold a request back a step than admit it without them asks
        this; `lookup` keeps them out until then (ALLOC-VIS-1)."""
        prompt = self._prepared(tokens, extras)
        _counts(max_hit=max_hit)
        served = self._served_after_steps()
        if served is None:
            return self._hit(prompt, max_hit)[0]
        keys = self._keys(prompt.chains)
        hit = self.search(self.config, len(prompt), keys, served)[0]
        if max_hit is not None and hit > max_hit:
            hit = self.search(self.config, len(prompt), keys, served, limit=max_hit)[0]
        return hit

    def _served_after_steps(self) -> list[ServedMap[bytes]] | None:
        """The served maps as they will be once every step in flight has ended (None when
        those steps complete no block)."""
        chunks = []
        for rid in self._in_flight:
            request = self._requests.get(rid)
            if request is not None and request.scheduled:
                chunks.append((rid, request.computed, request.scheduled, request))
        state = (self._admissions, tuple(chunk[:3] for chunk in chunks))
        if self._after_steps is not None and self._after_steps[0] == state:
            return self._after_steps[1]  # a step's admissions ask this once each
        pending: list[dict[bytes, int]] = [{} for _ in self.config.groups]
        for *_, request in chunks:
            self._completed_by_chunk(request, pending)
        served: list[ServedMap[bytes]] | None = None
        if any(pending):
            served = [
                _WithPending(now, extra) if extra else now
                for now, extra in zip(self.pool.served, pending, strict=True)
            ]
        self._after_steps = (state, served)
        return served

    def _completed_by_chunk(self, request: _Request, pending: list[dict[bytes, int]]) -> None:
        """Add to `pending` (per group, key -> block) what `request`'s chunk in flight will
        register when its step ends (what _register_committed will do then)."""
        for unique in request.unique_chains:
            unique.extend(request.tokens)  # the digests end_step computes, computed early
        before = request.computed
        request.computed = before + request.scheduled
        try:
            inner = [q for q in request.checkpoints if before < q <= request.computed]
            for g, group in enumerate(self.config.groups):
                chain, table = request.chains[g], request.tables[g]
                if chain is None:
                    continue
                positions = list(self._committed(g, group, request, before))
                if inner and group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN:
                    positions += [q // group.block_size - 1 for q in inner]
                for j in positions:
                    key = chain.key(group.block_size, j)
                    if table[j] != NULL_BLOCK and key is not None:
                        pending[g].setdefault(key, table[j])
        finally:
            request.computed = before

    def branch_point(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        *,
        after_steps: bool = False,
    ) -> int:
        """Where the attention groups' cached prefix of `tokens` ends, aligned for every group:
        the length a `branch` placement checkpoints state at. Implements BRANCH-1.
        `after_steps`: as the cache will be once the steps in flight have ended (a prefix
        another request is writing now is where this one will leave it too)."""
        prompt = self._prepared(tokens, extras)
        self._probes += 1
        keys = self._keys(prompt.chains)
        served = self._served_after_steps() if after_steps else None
        return find_hit(
            self.config, len(prompt), keys, served or self.pool.served, ignore_state=True
        )[0]

    # -- allocation -------------------------------------------------------------------------

    def _changes(self, request: _Request) -> tuple[list[tuple[int, int, int]], list[Sequence[int]]]:
        """What computing the scheduled tokens changes in the tables: the (group, position,
        block) entries released, latest position first (ALLOC-SKIP-1), and per group the
        positions written that hold no block yet (ALLOC-WRITE-1).

        Implements ALLOC-HOLD-1, ALLOC-SKIP-1 and ALLOC-WRITE-1 (with groups.first_read and
        groups.first_written), and CKPT-INNER-1 (a chunk's inner checkpoint is written too).
        Only positions that can change are visited: past the new end (a shrunk lookahead),
        from the first position still held up to the first one still read, and the written
        range: a decode step visits one or two positions per group."""
        released: list[tuple[int, int, int]] = []
        # positions as ranges where they run on: a request grown by far more than the pool
        # holds is then counted (and refused Waiting) without a list of its positions
        wanted: list[Sequence[int]] = []
        computed = request.computed
        in_flight = computed + request.scheduled
        attention_end = in_flight + request.lookahead
        # a chunk scheduled behind the one in flight moves the running state further
        state_end = max(in_flight, request.pipelined)
        limit = self.config.max_model_len
        for g, group, block_size, state, keeps_all in self._change_groups:
            if group is None:  # cross attention
                wanted.append(NO_POSITIONS)
                continue
            end = state_end if state else attention_end
            last = (
                table_end(group, end, request.decoding, limit) if state else -(-end // block_size)
            )
            table = request.tables[g]
            size, low = len(table), request.held_from[g]
            # the blocks of inner checkpoints not registered yet (a chunk in flight or
            # scheduled behind it saves them) stay held until their step ends
            saving = (
                {q // block_size - 1 for q in request.checkpoints}
                if request.checkpoints and state and group.mode is MambaMode.ALIGN
                else ()
            )
            if size > last or (low < last and not keeps_all):
                # a state group reads where the chunk in flight starts, whatever follows it
                first = first_read(group, computed, in_flight if state else end)
                for j in range(size - 1, max(last, low) - 1, -1):
                    if table[j] != NULL_BLOCK and j not in saving:
                        released.append((g, j, table[j]))
                for j in range(min(first, last, size) - 1, low - 1, -1):
                    if table[j] != NULL_BLOCK and j not in saving:
                        released.append((g, j, table[j]))
            first = first_written(group, computed, end)
            held = min(last, size)
            if first >= held:
                wanted.append(range(first, last) if first < last else NO_POSITIONS)
            else:
                gaps = [j for j in range(first, held) if table[j] == NULL_BLOCK]
                growth = range(held, last) if held < last else NO_POSITIONS
                wanted.append(_Positions(gaps, growth) if gaps and growth else gaps or growth)
            if saving:
                new = [j for j in saving if j >= size or table[j] == NULL_BLOCK]
                if new:
                    wanted[-1] = sorted({*wanted[-1], *new})
        return released, wanted

    def _fill(self, request: _Request, wanted: list[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
        """Give every wanted position a new block; returns the new blocks per group."""
        count = sum(map(len, wanted))
        if not count:
            return self._no_blocks
        fresh = self.pool.allocate(count)
        added: list[tuple[int, ...]] = []
        used = 0
        for g, positions in enumerate(wanted):
            if not positions:
                added.append(())
                continue
            blocks = fresh[used : used + len(positions)]
            used += len(positions)
            added.append(tuple(blocks))
            table = request.tables[g]
            if len(table) <= positions[-1]:
                table.extend([NULL_BLOCK] * (positions[-1] + 1 - len(table)))
            for j, block in zip(positions, blocks, strict=True):
                table[j] = block
            request.held_from[g] = min(request.held_from[g], positions[0])
        return tuple(added)

    def _check_budget(self, budget: int, lookahead: int) -> None:
        if not (type(budget) is int and budget >= 1) or not (
            type(lookahead) is int and lookahead >= 0
        ):
            raise RequestStateError(
                f"budget must be an integer >= 1 and lookahead an integer >= 0, "
                f"got {budget!r} and {lookahead!r}"
            )

    def admit(
        self,
        rid: str,
        tokens: Sequence[int] | Prompt,
        budget: int,
        extras: Sequence[ExtraKey] = (),
        lookahead: int = 0,
        *,
        max_hit: int | None = None,
        keep_free: int = 0,
        fit_tokens: int | None = None,
        fit_keep_free: int = 0,
        checkpoint: int = 0,
    ) -> Scheduled | Waiting:
        """Look a new request up, take its hit, allocate for its first chunk.

        Implements ALLOC-TWO-PHASE-1: the hit blocks are taken before anything is allocated,
        and free hit blocks count against the capacity.

        An engine's admission policy may ask for less or more than the allocator needs:
        `max_hit` caps the hit (the largest length up to it that every group accepts, when
        the hit is longer); `keep_free` blocks must stay free after this call's allocation;
        `fit_tokens` admits only if, beside `fit_keep_free` blocks, the blocks the request
        holds at once while computing its first `fit_tokens` tokens in chunks of `budget` fit
        now (vLLM's whole-prompt admission gate; windows recycle their blocks). `checkpoint`:
        a block boundary inside the first chunk whose state the engine's kernel saves in
        passing (CKPT-INNER-1), or 0."""
        _request_id(rid)
        prompt = self._prepared(tokens, extras)
        if rid in self._requests:
            raise RequestStateError(
                f"request {rid!r} is already running; extend it, or "
                "finish/preempt it before admitting it again"
            )
        if not len(prompt):
            raise RequestStateError("a request needs at least one token")
        self._check_budget(budget, lookahead)
        _counts(max_hit=max_hit, keep_free=keep_free, fit_keep_free=fit_keep_free)
        limit = self.config.max_model_len
        if limit is not None and len(prompt) > limit:
            raise MaxLengthError(f"{len(prompt)} tokens exceed max_model_len={limit}")
        if any(e.end is not None and e.end > len(prompt) for e in prompt.extras):
            raise RequestStateError(
                "a positioned extra (multimodal item, prompt embeddings) "
                "lies beyond the prompt; its span must be within the tokens"
            )
        hit, tables = self._hit(prompt, max_hit)
        # distinct: a block is registered in one group under one key
        hits = [b for t in tables for b in t if b != NULL_BLOCK]
        reviving = list(map(self.pool.ref_count.__getitem__, hits)).count(0)  # free hit blocks
        request = _Request(prompt)
        request.computed = hit
        request.scheduled = min(budget, len(prompt) - hit)
        request.lookahead = lookahead
        if checkpoint:
            self._check_checkpoint(hit, hit + request.scheduled, checkpoint)
            request.checkpoints = [checkpoint]
        request.tables = tables
        request.registered = [len(t) for t in tables]
        request.commit_at = self._commit_at(request)
        request.held_from = [self._held_from(t) for t in tables]
        _, wanted = self._changes(request)  # a lookup table holds nothing to release
        count = sum(map(len, wanted))
        if fit_tokens is not None:
            whole = self._to_hold(request, fit_tokens) + fit_keep_free
            if whole > self.pool.num_free - reviving:
                return self._waiting(whole + reviving, self.pool.num_free, whole + len(set(hits)))
        if count + keep_free > self.pool.num_free - reviving:
            needed = count + keep_free + reviving
            return self._waiting(needed, self.pool.num_free, count + len(set(hits)))
        added = self._take_then_fill(hits, request, wanted)
        self._plan_quiet(request)
        self._requests[rid] = request
        self._in_flight[rid] = self._step
        self._admissions += 1
        self._admitted_tokens += len(prompt)
        self._hit_tokens += hit
        return Scheduled(hit, request.scheduled, added, tuple(tuple(t) for t in request.tables))

    def _waiting(self, needed: int, free: int, held: int) -> Waiting:
        """Waiting, saying so when the request would hold `held` blocks at once, more than
        the pool's usable blocks: then no later step can serve it as asked."""
        usable = self.config.num_blocks - 1
        if held <= usable:
            return Waiting(needed, free)
        return Waiting(
            needed,
            free,
            f"can never fit: the request would hold {held} blocks at once and the pool has "
            f"{usable}; raise num_blocks or schedule fewer tokens per step",
        )

    @staticmethod
    def _held_after(request: _Request, released: list[tuple[int, int, int]], added: int) -> int:
        """Blocks `request` would hold after a step that releases `released` and adds `added`."""
        held = {b for t in request.tables for b in t if b != NULL_BLOCK}
        return len(held - {block for _, _, block in released}) + added

    def _to_reach(self, request: _Request, tokens: int) -> int:
        """How many new blocks `request` takes to have its first `tokens` tokens computed in
        one step from where it is (ALLOC-WRITE-1's positions, nothing allocated)."""
        if type(tokens) is not int or tokens < 0:
            raise RequestStateError(f"a token count must be an integer >= 0, got {tokens!r}")
        before = (request.scheduled, request.lookahead)
        request.scheduled = max(0, min(tokens, len(request.tokens)) - request.computed)
        request.lookahead = max(0, tokens - request.computed - request.scheduled)
        try:
            return sum(map(len, self._changes(request)[1]))
        finally:
            request.scheduled, request.lookahead = before

    def _to_hold(self, request: _Request, tokens: int) -> int:
        """How many new blocks `request` holds at once when it has computed its first
        `tokens` tokens in steps of its current chunk: every position its last step keeps
        (ALLOC-HOLD-1) that holds no block now. A window has released the earlier ones by
        then, so a long prompt fits where its whole table would not."""
        if type(tokens) is not int or tokens < 0:
            raise RequestStateError(f"a token count must be an integer >= 0, got {tokens!r}")
        start = max(request.computed, tokens - max(request.scheduled, 1))
        count = 0
        limit = self.config.max_model_len
        for g, group, _, _, _ in self._change_groups:
            if group is None:  # cross attention
                continue
            table = request.tables[g]
            low = first_read(group, start, tokens)
            high = table_end(group, tokens, request.decoding, limit)
            held = min(high, len(table))
            count += max(0, high - max(low, held)) + table[low:held].count(NULL_BLOCK)
        return count

    def blocks_to_reach(self, rid: str, tokens: int) -> int:
        """How many free blocks running request `rid` still needs to hold its first `tokens`
        tokens (beyond the known ones: lookahead slots); 0 when it holds them."""
        return self._to_reach(self._running(rid), tokens)

    def is_running(self, rid: str) -> bool:
        """Whether `rid` holds blocks (admitted and not yet finished or preempted)."""
        return rid in self._requests

    def in_flight(self, rid: str) -> bool:
        """Whether running request `rid` has a chunk scheduled whose step has not ended."""
        return self._running(rid).scheduled > 0

    def rename(self, rid: str, new_rid: str) -> None:
        """Keep running request `rid`'s blocks under `new_rid`, so that `rid` can be admitted
        again while they wait for a deferred release (an engine frees a request's blocks
        only once the step that may still write them has ended)."""
        _request_id(new_rid)
        request = self._running(rid)
        if new_rid in self._requests:
            raise RequestStateError(f"request {new_rid!r} is already running")
        self._requests[new_rid] = request
        del self._requests[rid]
        if rid in self._in_flight:
            self._in_flight[new_rid] = self._in_flight.pop(rid)

    def reserve(
        self, rid: str, tokens: int, chunk_end: int = 0, checkpoint: int = 0
    ) -> Scheduled | Waiting:
        """Hold slots for the first `tokens` tokens of running request `rid` while its chunk
        is in flight: lookahead beyond that chunk, allocated now (ALLOC-WRITE-1's positions),
        never shrunk. An engine that schedules the next step before the current one's output
        arrives gives that step its blocks this way, and `extend`s it once the step in flight
        has ended, with the same slots; nothing is computed or registered here. `chunk_end`:
        where the chunk so scheduled will end its computation, so that a state group holds
        the running state's position there too (its table's ALLOC-WRITE-1 position); state
        groups hold no slots for lookahead. `checkpoint`: that chunk's inner checkpoint
        (CKPT-INNER-1; it starts where the chunks before it end), held from now on."""
        request = self._running(rid)
        for name, value in (("token count", tokens), ("chunk end", chunk_end)):
            if type(value) is not int or value < 0:
                raise RequestStateError(f"a {name} must be an integer >= 0, got {value!r}")
        lookahead = max(request.lookahead, tokens - request.computed - request.scheduled)
        pipelined = max(request.pipelined, chunk_end)
        start = max(request.computed + request.scheduled, request.pipelined)
        # a chunk that starts past every known token appends sampled ones: a decode chunk,
        # whose state groups hold ALLOC-SPEC-1's positions from now on
        decoding = request.decoding or (
            self._drafting_states and chunk_end > start >= len(request.tokens)
        )
        if checkpoint:
            self._check_checkpoint(start, chunk_end, checkpoint, decoding)
        adding = bool(checkpoint) and checkpoint not in request.checkpoints
        if decoding != request.decoding or adding:
            before = (request.decoding, list(request.checkpoints))
            request.decoding = decoding
            if adding:
                request.checkpoints.append(checkpoint)
            result = self._reserve_slow(request, lookahead, pipelined)
            if isinstance(result, Waiting):
                request.decoding, request.checkpoints = before
            return result
        if lookahead == request.lookahead and pipelined == request.pipelined:
            return Scheduled(0, 0, self._no_blocks)
        if self._holds_slots(request, request.computed + request.scheduled + lookahead, pipelined):
            # releases nothing, changes no table: the quiet bounds stand
            request.lookahead, request.pipelined = lookahead, pipelined
            return Scheduled(0, 0, self._no_blocks)
        return self._reserve_slow(request, lookahead, pipelined)

    def _reserve_slow(
        self, request: _Request, lookahead: int, pipelined: int
    ) -> Scheduled | Waiting:
        """`reserve`'s allocation: release what the new slots no longer need, fill the rest."""
        before = (request.lookahead, request.pipelined)
        request.lookahead, request.pipelined = lookahead, pipelined
        released, wanted = self._changes(request)
        count = sum(map(len, wanted))
        if count > self.pool.num_free + self._freed_by(released):
            held = self._held_after(request, released, count)
            request.lookahead, request.pipelined = before
            return self._waiting(count, self.pool.num_free + self._freed_by(released), held)
        self._drop(request, released)
        added = self._fill(request, wanted)
        self._plan_quiet(request)
        return Scheduled(0, 0, added)

    def _holds_slots(self, request: _Request, end: int, pipelined: int) -> bool:
        """Whether every group already holds a block at each position ALLOC-WRITE-1 would ask
        for: attention groups up to `end` tokens, state groups at the running state of a
        chunk ending at `pipelined` (when that lies past the chunk in flight). A table's held
        positions from the first one still read are contiguous (windows release a prefix, a
        shrunk lookahead a suffix, and allocation fills gaps), so the last needed position
        holding a block is enough."""
        in_flight = request.computed + request.scheduled
        limit = self.config.max_model_len
        for g, group, _, state, _ in self._change_groups:
            if group is None or (state and pipelined <= in_flight):  # cross attention
                continue
            table = request.tables[g]
            last = table_end(group, pipelined if state else end, request.decoding, limit) - 1
            if last >= len(table) or table[last] == NULL_BLOCK:
                return False
        return True

    def progress(self, rid: str) -> tuple[int, int]:
        """(tokens computed, tokens known) of running request `rid`."""
        request = self._running(rid)
        return request.computed + request.scheduled, len(request.tokens)

    def _take_then_fill(
        self, hits: list[int], request: _Request, wanted: list[Sequence[int]]
    ) -> tuple[tuple[int, ...], ...]:
        """ALLOC-TWO-PHASE-1's order: hold the hit blocks, only then allocate."""
        self.pool.take(hits)
        return self._fill(request, wanted)

    @staticmethod
    def _held_from(table: list[int]) -> int:
        """The first position of a lookup table that holds a block: a hit's table is null
        blocks, then blocks (find_hit), so that is how many null blocks it has."""
        return table.count(NULL_BLOCK)

    def _running(self, rid: str) -> _Request:
        request = self._requests.get(rid) if isinstance(rid, str) else None
        if request is None:
            raise UnknownRequestError(f"unknown request {rid!r}; it is not running")
        return request

    def extend(
        self,
        rid: str,
        budget: int,
        appended: Sequence[int] = (),
        lookahead: int = 0,
        *,
        step: int | None = None,
        checkpoint: int = 0,
    ) -> Scheduled | Waiting:
        """Schedule the next chunk (prefill) or token (decode, with the sampled `appended`).
        `step`: the step the chunk runs in, when it is not the one being scheduled (a chunk
        an engine scheduled while the request's previous one ran; see `reserve`).
        `checkpoint`: a block boundary inside the chunk whose state the engine's kernel
        saves in passing (CKPT-INNER-1), or 0."""
        request = self._requests.get(rid) if type(rid) is str else None
        if (
            request is not None  # the decode fast path: sampled tokens that change no table
            and (computed := request.computed) == len(request.tokens)  # nothing in flight
            and type(appended) in LIST_OR_TUPLE
            and (end := computed + (count := len(appended))) <= request.quiet_end
            and request.pipelined <= request.quiet_state  # a chunk reserved may end later
            and type(budget) is int
            and 0 < count <= budget
            and type(lookahead) is int
            and (
                request.quiet_slots_floor <= end  # quiet_end bounds end + 0 from above
                if not lookahead
                else lookahead > 0
                and request.quiet_slots_floor <= end + lookahead <= request.quiet_slots
            )
            and (step is None or (type(step) is int and 0 <= step <= self._step))
            and not checkpoint
            and (
                (type(token := appended[0]) is int and 0 <= token < TOKEN_LIMIT)
                if count == 1
                else all(type(t) is int and 0 <= t < TOKEN_LIMIT for t in appended)
            )
        ):
            if count == 1:
                request.tokens.append(token)
            else:
                request.tokens.extend(appended)
            request.scheduled = count
            request.lookahead = lookahead
            request.decoding = True  # as the general path sets it; the bounds assumed it
            self._in_flight[rid] = self._step if step is None else step
            return self._decode_step if count == 1 else self._quiet_step(count)
        request = self._running(rid)
        if not (type(appended) in LIST_OR_TUPLE and (not appended or _one_token(appended))):
            appended = token_ids(appended, "appended tokens")  # one token is checked just there
        if request.scheduled:
            raise RequestStateError(f"request {rid!r} has a chunk in flight; end the step first")
        self._check_budget(budget, lookahead)
        self._check_step(step)
        if appended and request.computed != len(request.tokens):
            raise RequestStateError(
                f"request {rid!r} still has prompt tokens to compute; "
                "append sampled tokens only after them"
            )
        length = len(request.tokens) + len(appended)
        limit = self.config.max_model_len
        if limit is not None and length > limit:
            raise MaxLengthError(
                f"{length} tokens exceed max_model_len={limit}; finish the request"
            )
        if request.computed >= length:
            raise RequestStateError(
                f"request {rid!r} has no token left to compute; append the sampled token"
            )
        before = (request.scheduled, request.lookahead, request.checkpoints, request.decoding)
        request.scheduled = min(budget, length - request.computed)
        request.lookahead = lookahead
        request.decoding = request.decoding or bool(appended)
        if checkpoint:
            try:
                self._check_checkpoint(
                    request.computed,
                    request.computed + request.scheduled,
                    checkpoint,
                    request.decoding,
                )
            except RequestStateError:
                request.scheduled, request.lookahead, _, request.decoding = before
                raise
            if checkpoint not in request.checkpoints:
                request.checkpoints = [*request.checkpoints, checkpoint]
        released, wanted = self._changes(request)  # written positions are never released
        count = sum(map(len, wanted))
        freed = self._freed_by(released)
        if count > self.pool.num_free + freed:
            held = self._held_after(request, released, count)
            request.scheduled, request.lookahead, request.checkpoints, request.decoding = before
            return self._waiting(count, self.pool.num_free + freed, held)
        self._drop(request, released)
        added = self._fill(request, wanted)
        if appended:
            request.tokens.extend(appended)  # digested when a block of them commits
        self._plan_quiet(request)
        self._in_flight[rid] = self._step if step is None else step
        return Scheduled(0, request.scheduled, added)

    def _check_checkpoint(
        self, computed: int, end: int, checkpoint: object, decoding: bool = False
    ) -> None:
        """CKPT-INNER-1's placement: a block boundary of every state group in mode align (one
        at least) strictly inside the chunk [computed, end), past the position the chunk
        reads its state from, or in a decode chunk of a group with speculative blocks at
        that position too (ALLOC-SPEC-2: the drafts' verification copied the state there)."""
        if type(checkpoint) is not int or not computed < checkpoint < end:
            raise RequestStateError(
                f"checkpoint {checkpoint!r} is not strictly inside the chunk "
                f"[{computed}, {end}); name a block boundary inside it, or 0 for none"
            )
        aligned = [
            (g, group.block_size, decoding and group.speculative_blocks > 0)
            for g, group in enumerate(self.config.groups)
            if group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN
        ]
        if not aligned:
            raise RequestStateError("a checkpoint needs a state group in mode align; pass 0")
        for g, size, copied in aligned:
            if copied:
                low = ((computed - 1) // size + 1) * size
            else:
                low = ((computed - 1) // size + 2) * size if computed else size
            if checkpoint % size or checkpoint < low:
                raise RequestStateError(
                    f"checkpoint {checkpoint} is not a block boundary of state group {g} "
                    f"(B={size}) at or after {low}, the first one past the position the chunk "
                    f"[{computed}, {end}) reads its state from; name such a boundary, or 0"
                )

    def _freed_by(self, released: list[tuple[int, int, int]]) -> int:
        """How many blocks releasing `released` returns to the free queue."""
        if not released:
            return 0
        ref = self.pool.ref_count
        return len({b for _, _, b in released if ref[b] == 1})

    def _drop(self, request: _Request, released: list[tuple[int, int, int]]) -> None:
        """Release `released` table entries mid-request (ALLOC-SKIP-1, a shrunk lookahead)."""
        if not released:
            return
        tables, held_from = request.tables, request.held_from
        for g, j, _ in released:
            tables[g][j] = NULL_BLOCK
        for g in {g for g, _, _ in released}:
            table = tables[g]
            while held_from[g] < len(table) and table[held_from[g]] == NULL_BLOCK:
                held_from[g] += 1
        self._give_back(released, cold=True)

    def _plan_quiet(self, request: _Request) -> None:
        """Set the bounds within which a decode step changes no table, so that `extend` only
        appends its tokens. A step computing [c, e) with slots up to e + L (lookahead) keeps
        the tables as they are when, per group: every position ALLOC-WRITE-1 asks for holds a
        block already, below the first position from c on that holds none (an attention
        group's up to e + L; a state group's up to its chunk's end, the later of e and where a
        chunk reserved earlier ends, `pipelined`, taken as decoding for ALLOC-SPEC-1, whose
        max_model_len cap only lowers it); an attention group holds no position past them (a
        shrunk lookahead would release it; a state group's positions only grow with its end);
        and c is below the first `computed` whose step no longer reads the first held position
        (ALLOC-HOLD-1, ALLOC-SKIP-1; asked of e > c, so that one bound covers it). And e stays
        within max_model_len. The bounds depend on neither the lookahead nor `pipelined`, so a
        `reserve` that changes no table keeps them. An open inner checkpoint's block is held
        already and neither path drops it."""
        slots = state_end = TOKEN_LIMIT
        end, slots_floor = self.config.max_model_len or TOKEN_LIMIT, 0
        computed = request.computed + request.scheduled
        tables, lows = request.tables, request.held_from
        for g, group, size, releases, state, spare in self._quiet_groups:
            table = tables[g]
            held = len(table)
            p = computed // size  # the first position from c on that holds no block
            while p < held and table[p] != NULL_BLOCK:
                p += 1
            if not state:  # an attention group holds up to cdiv(e + L, B) positions
                top = held
                while top and table[top - 1] == NULL_BLOCK:  # past the last one held
                    top -= 1
                slots = min(slots, p * size)
                slots_floor = max(slots_floor, (top - 1) * size + 1)
            else:  # cdiv(e + S, B) + S positions, or cdiv(e, B) without speculative blocks
                state_end = min(state_end, (p - spare) * size - spare if spare else p * size)
            if releases and lows[g] < held:
                release = first_release(group, lows[g])
                if release is not None:
                    end = min(end, release)
        request.quiet_end = min(end, slots, state_end)  # e is at most its slots' end
        request.quiet_state = state_end
        request.quiet_slots, request.quiet_slots_floor = slots, slots_floor

    def _quiet_step(self, count: int) -> Scheduled:
        """What a decode step of `count` tokens that changes no table returns (shared)."""
        scheduled = self._quiet_steps.get(count)
        if scheduled is None:
            scheduled = self._quiet_steps[count] = Scheduled(0, count, self._no_blocks)
        return scheduled

    # -- commit and release -----------------------------------------------------------------

    def _check_step(self, step: object) -> None:
        if step is not None and (type(step) is not int or not 0 <= step <= self._step):
            raise RequestStateError(
                f"step must be a number start_step returned (0..{self._step}), got {step!r}"
            )

    def start_step(self) -> int:
        """Begin scheduling a new step while earlier ones may still run (an engine that
        schedules step N+1 before step N's output arrives); returns its number, for
        `end_step`. Chunks scheduled from now on belong to it. A synchronous engine never
        calls this: all its chunks belong to the one step `end_step()` ends."""
        self._step += 1
        return self._step

    @property
    def step(self) -> int:
        """The number of the step being scheduled (0 before any `start_step`)."""
        return self._step

    def end_step(self, step: int | None = None) -> int:
        """The step's KV is written: commit scheduled tokens, register full blocks.

        Implements ALLOC-VIS-1: nothing is registered before this call. `step` (a number
        from `start_step`) ends the chunks scheduled in that step and earlier ones, and
        leaves later steps' chunks in flight; None ends every chunk in flight. Returns how
        many blocks became hittable."""
        self._check_step(step)
        registered = 0
        committing = []
        if step is None or step == self._step:  # every chunk in flight ends
            ending, self._in_flight = list(self._in_flight), {}
        else:
            ending = [rid for rid, s in self._in_flight.items() if s <= step]
            for rid in ending:
                del self._in_flight[rid]
        for rid in ending:
            request = self._requests.get(rid)
            if request is None:
                continue
            before = request.computed
            request.computed += request.scheduled
            request.scheduled = 0
            if request.computed >= request.commit_at:  # else no group completes a block
                committing.append((rid, request, before))
        for rid, request, before in sorted(committing, key=itemgetter(0)):
            registered += self._register_committed(rid, request, before)
        return registered

    def accept(self, rid: str, tokens: Sequence[int]) -> int:
        """`tokens` come right after running request `rid`'s known tokens, and a step that
        has ended computed them into slots the request holds (draft tokens it verified and
        accepted): they count as computed now, and the blocks they complete are registered
        (ALLOC-COMMIT-1), as if the chunk had held them. Returns how many blocks became
        hittable. Only with no chunk in flight and every known token computed."""
        request = self._running(rid)
        checked = token_ids(tokens, "accepted tokens")
        if any(g.kind is Kind.MAMBA for g in self.config.groups):
            raise RequestStateError(
                "accept is for attention groups: a state group checkpoints only where a "
                "step's chunk ends, so accepted drafts are counted by the next step"
            )
        if request.scheduled or request.computed != len(request.tokens):
            raise RequestStateError(
                f"request {rid!r} has tokens in flight or not computed yet; accept drafts only "
                "after the step that verified them has ended"
            )
        end = request.computed + len(checked)
        limit = self.config.max_model_len
        if limit is not None and end > limit:
            raise MaxLengthError(f"{end} tokens exceed max_model_len={limit}")
        for g, group, size, _, _ in self._change_groups:
            if group is not None and len(request.tables[g]) * size < end:
                raise RequestStateError(
                    f"request {rid!r} holds no slot for token {end - 1} in group {g}: "
                    "accepted tokens must have been computed into the request's slots"
                )
        if not checked:
            return 0
        before = request.computed
        request.tokens.extend(checked)
        request.computed = end
        registered = self._register_committed(rid, request, before)
        self._plan_quiet(request)
        return registered

    def _register_committed(self, rid: str, request: _Request, before: int) -> int:
        """Register the blocks `request` completed when its computed count moved from
        `before` to `computed` (ALLOC-COMMIT-1); returns how many."""
        registered = 0
        track = self.pool.tracking
        events = self.pool.events
        for unique in request.unique_chains:
            unique.extend(request.tokens)
        inner = self._inner_done(request, before) if request.checkpoints else ()
        for g, group in enumerate(self.config.groups):
            if inner and group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN:
                registered += self._register_inner(rid, request, g, group, inner)
            positions = self._committed(g, group, request, before)
            if not positions:
                continue
            chain = request.chains[g]
            table = request.tables[g]
            if not track and events is None and chain is not None:
                keys = chain.keys_between(group.block_size, positions.start, positions.stop)
                if len(keys) < len(positions):  # pragma: no cover - as below
                    raise RuntimeError(f"no digest for a committed block of group {g}")
                blocks = table[positions.start : positions.stop]
                registered += self.pool.register_run(g, blocks, keys)
                request.registered[g] = positions.stop
                continue
            for j in positions:
                block = table[j]
                if block == NULL_BLOCK:  # released before its next token arrived
                    continue
                key = chain.key(group.block_size, j) if chain else None
                if key is None:  # pragma: no cover - committed tokens are always digested
                    raise RuntimeError(f"no digest for committed block {j} of group {g}")
                needs = self._prerequisites(request, g, j) if track else ()
                if self.pool.register(block, g, key, needs) and events is not None:
                    events.append(self._stored(rid, request, g, j))
                registered += 1
            request.registered[g] = positions.stop
        request.commit_at = self._commit_at(request)
        return registered

    @staticmethod
    def _inner_done(request: _Request, before: int) -> tuple[int, ...]:
        """The inner checkpoints (CKPT-INNER-1) the computation from `before` to `computed`
        has passed, now taken off the request's list."""
        done = tuple(q for q in request.checkpoints if before < q <= request.computed)
        if done:
            request.checkpoints = [q for q in request.checkpoints if q not in done]
        return done

    def _register_inner(
        self, rid: str, request: _Request, g: int, group: GroupConfig, inner: tuple[int, ...]
    ) -> int:
        """Register the state group's positions of the inner checkpoints passed: each holds
        the state at its boundary, as if a chunk had ended there. Implements CKPT-INNER-1."""
        registered = 0
        chain, table = request.chains[g], request.tables[g]
        track, events = self.pool.tracking, self.pool.events
        for q in inner:
            j = q // group.block_size - 1
            if j < request.registered[g] or j >= len(table) or table[j] == NULL_BLOCK:
                continue
            key = chain.key(group.block_size, j) if chain else None
            if key is None:  # pragma: no cover - committed tokens are always digested
                raise RuntimeError(f"no digest for committed block {j} of group {g}")
            needs = self._prerequisites(request, g, j) if track else ()
            if self.pool.register(table[j], g, key, needs) and events is not None:
                events.append(self._stored(rid, request, g, j))
            registered += 1
            request.registered[g] = j + 1
        return registered

    def _stored(self, rid: str, request: _Request, g: int, j: int) -> Stored:
        """The event of block j of group g becoming hittable (its chain digested it)."""
        size, chain = self._sizes[g], request.chains[g]
        key = chain.key(size, j) if chain is not None else None
        if key is None:  # pragma: no cover - end_step registered it under this key
            raise RuntimeError(f"no digest for registered block {j} of group {g}")
        parent = chain.key(size, j - 1) if j and chain is not None else None
        tokens = tuple(request.tokens[j * size : (j + 1) * size])
        return Stored(rid, g, request.tables[g][j], key, parent, j * size, tokens)

    def take_events(self) -> list[Event]:
        """What became hittable, was evicted or cleared since the last call, in order (empty
        unless `CacheConfig.record_events`)."""
        events = self.pool.events
        if not events:
            return []
        self.pool.events = []
        return events

    def _prerequisites(self, request: _Request, g: int, j: int) -> tuple[Key, ...]:
        """Implements EVICT-DEAD-1's prerequisites: per full-attention group, the last key that
        every hit through block j of group g needs and that the block's tokens fix (its own
        key excluded)."""
        sizes = self._sizes
        span = (j + 1) * sizes[g]
        covered = span + self._lookahead[g]
        needs = []
        for f in self._full_groups:
            size = sizes[f]
            last = min((covered - self._lookahead[f]) // size, span // size) - 1
            if f == g and last == j:
                last -= 1
            chain = request.chains[f]
            key = chain.key(size, last) if last >= 0 and chain else None
            if key is not None:
                needs.append((f, key))
        return tuple(needs)

    def _commit_at(self, request: _Request) -> int:
        """A lower bound on the `computed` at which `_committed` is next non-empty: every kind
        commits block j only once (j + 1) * block_size tokens are computed."""
        return min(
            (
                (registered + 1) * group.block_size
                for group, registered in zip(self.config.groups, request.registered, strict=True)
                if group.kind is not Kind.CROSS
                and not (group.kind is Kind.MAMBA and group.mode is MambaMode.NONE)
            ),
            default=TOKEN_LIMIT,
        )

    def _committed(self, g: int, group: GroupConfig, request: _Request, before: int) -> range:
        """The table positions of group g whose KV is now entirely written. Implements
        ALLOC-COMMIT-1: draft blocks wait for draft_reach - 1 more computed tokens and exact
        draft keys for their tokens, state groups checkpoint at every boundary (all) or where
        the step ended (align), never in mode none."""
        if group.kind is Kind.CROSS:
            return range(0)
        size = group.block_size
        start, stop = request.registered[g], (request.computed - self._commit_delay[g]) // size
        if self._lookahead[g]:
            stop = min(stop, (len(request.tokens) - self._lookahead[g]) // size)
        if group.kind is Kind.MAMBA:
            if group.mode is MambaMode.NONE:
                return range(0)
            if group.mode is MambaMode.ALIGN:
                aligned = request.computed % size == 0 and request.computed > before
                return range(stop - 1, stop) if aligned and stop - 1 >= start else range(0)
        return range(start, max(start, stop))

    def _release(self, rid: str) -> int:
        request = self._running(rid)
        del self._requests[rid]
        self._in_flight.pop(rid, None)
        pool = self.pool
        batches = pool.queue.request_batches(self.config.groups, request.tables, request.held_from)
        return sum(pool.release(batch) for batch in batches)

    def _give_back(self, held: list[tuple[int, int, int]], cold: bool = False) -> int:
        """Release (group, position, block) entries in the order the eviction profile sets
        (ALLOC-FREE-1, ALLOC-FREE-2, EVICT-ORDER-1); `cold`: released mid-request."""
        pool, freed = self.pool, 0
        for batch in pool.queue.release_batches(self.config.groups, held):
            freed += pool.release(batch, cold)
        return freed

    def finish(self, rid: str) -> int:
        """Release a finished or aborted request; returns how many blocks became free."""
        return self._release(rid)

    def preempt(self, rid: str) -> int:
        """Release a preempted request; it may be admitted again under the same id."""
        return self._release(rid)

    def reset_prefix_cache(self) -> bool:
        """Forget every key; refused (False) while any request holds blocks (ALLOC-RESET-1)."""
        if self._requests:
            return False
        self.pool.reset()
        return True

    # -- inspection -------------------------------------------------------------------------

    def block_tables(self, rid: str) -> tuple[tuple[int, ...], ...]:
        """The request's block table per group (NULL_BLOCK = 0 where nothing is held)."""
        return tuple(tuple(t) for t in self._running(rid).tables)

    def block_at(self, rid: str, group: int, position: int) -> int:
        """The block running request `rid` holds at `position` of group `group`'s table
        (NULL_BLOCK where it holds none, or past the table's end)."""
        table = self._table(rid, group)
        _position(position, "position")
        return table[position] if position < len(table) else NULL_BLOCK

    def holds(self, rid: str, group: int, start: int, stop: int) -> bool:
        """Whether running request `rid` holds a block at every position in [start, stop) of
        group `group`'s table."""
        table = self._table(rid, group)
        _position(start, "start")
        _position(stop, "stop")
        return stop <= len(table) and NULL_BLOCK not in table[start:stop]

    def _table(self, rid: str, group: int) -> list[int]:
        request = self._running(rid)
        count = len(request.tables)
        if type(group) is not int or not 0 <= group < count:
            raise RequestStateError(
                f"group must be a group index in [0, {count}) (the order of "
                f"CacheConfig.groups), got {group!r}"
            )
        return request.tables[group]

    def stats(self) -> Stats:
        """Pool and hit counters."""
        return Stats(
            self.config.num_blocks,
            self.pool.num_free,
            self.pool.num_registered,
            len(self._requests),
            self._admissions,
            self._admitted_tokens,
            self._hit_tokens,
            self._probes,
        )


_ChunksInFlight = tuple[int, tuple[tuple[str, int, int], ...]]


class _WithPending:
    """One group's served map with the keys steps in flight will register added (the cached
    block wins a key both hold: it was registered first)."""

    __slots__ = ("_now", "_pending")

    def __init__(self, now: ServedMap[bytes], pending: dict[bytes, int]) -> None:
        self._now, self._pending = now, pending

    def get(self, key: bytes, default: int, /) -> int:
        block = self._now.get(key, NULL_BLOCK)
        return block if block != NULL_BLOCK else self._pending.get(key, default)

    def __getitem__(self, key: bytes, /) -> int:
        block = self.get(key, NULL_BLOCK)
        if block == NULL_BLOCK:
            raise KeyError(key)
        return block

    def __contains__(self, key: object, /) -> bool:
        return key in self._now or key in self._pending

    def __len__(self) -> int:
        return len(self._now) + sum(1 for key in self._pending if key not in self._now)

    def items(self) -> Iterable[tuple[bytes, int]]:
        yield from self._now.items()
        yield from ((k, b) for k, b in self._pending.items() if k not in self._now)
