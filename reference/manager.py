"""The request-level allocator an engine calls: admit, extend, end_step, finish, preempt.

Implements the spec's allocator (§6, kvcert.spec.alloc) under the `lru` eviction profile:
ALLOC-TWO-PHASE-1 (hits are taken before anything is allocated), ALLOC-HOLD-1/WRITE-1/SKIP-1
(what each kind keeps, writes and releases), ALLOC-COMMIT-1/VIS-1 (blocks are registered at
the end of the step that wrote them), ALLOC-FREE-1 (release order), ALLOC-RESET-1.
tests/differential runs it against the spec step by step.

Cost per call: O(blocks touched) for allocation and release, O(1) per pool operation, and for
admission one digest per new block of prompt plus the coordinator's lookups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcert.reference.block_pool import NULL_BLOCK, BlockPool
from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    Eviction,
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
from kvcert.reference.groups import cdiv, first_read, first_written
from kvcert.reference.hashing import Chain, ExtraKey, hasher


@dataclass(frozen=True, slots=True)
class Scheduled:
    """An admission or extension that fits: `hit` tokens came from the cache (0 on extend)."""

    hit: int
    scheduled: int
    tables: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    """Not enough free blocks; nothing changed. Retry in a later step."""

    needed: int
    free: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Counters an operator reads to see why the hit rate is what it is."""

    num_blocks: int
    free_blocks: int
    registered_blocks: int
    running_requests: int
    lookups: int
    lookup_tokens: int
    hit_tokens: int


class _Request:
    __slots__ = (
        "chains",
        "computed",
        "extras",
        "lookahead",
        "registered",
        "scheduled",
        "tables",
        "tokens",
    )

    def __init__(
        self, tokens: list[int], extras: tuple[ExtraKey, ...], chains: list[Chain | None]
    ) -> None:
        self.tokens = tokens
        self.extras = extras
        self.chains = chains
        self.computed = 0
        self.scheduled = 0
        self.lookahead = 0
        self.tables: list[list[int]] = []
        self.registered: list[int] = []


class KVCacheManager:
    """A hybrid KV-cache allocator with prefix caching over one shared block pool."""

    search = staticmethod(find_hit)  # the hybrid hit search (a benchmark baseline swaps it)

    def __init__(self, config: CacheConfig) -> None:
        if all(g.kind is Kind.CROSS for g in config.groups):
            raise ConfigError("every group is cross attention: there is no prefix to cache")
        self.config = config
        self.pool = BlockPool(config.num_blocks, config.eviction, len(config.groups))
        self._digest = hasher(config.hash_algorithm)
        self._requests: dict[str, _Request] = {}
        self._in_flight: set[str] = set()
        exact = config.speculative is DraftKeying.EXACT
        self._shifted = [exact and g.draft for g in config.groups]
        base = [
            g.block_size
            for g, s in zip(config.groups, self._shifted, strict=True)
            if not s and g.kind is not Kind.CROSS
        ]
        self._base_size = math.gcd(*base) if base else 0
        self._lookups = self._lookup_tokens = self._hit_tokens = 0
        self._full_groups = [f for f, g in enumerate(config.groups) if g.kind is Kind.FULL]
        self._hybrid = config.eviction is Eviction.HYBRID
        self._track = self._hybrid or config.count_dead_evictions

    # -- keys -------------------------------------------------------------------------------

    def _chains(self, tokens: Sequence[int], extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        base = Chain(self._base_size, 0, extras, self._digest) if self._base_size else None
        chains: list[Chain | None] = []
        for group, shifted in zip(self.config.groups, self._shifted, strict=True):
            if group.kind is Kind.CROSS:
                chains.append(None)
            elif shifted:
                chains.append(Chain(group.block_size, 1, extras, self._digest))
            else:
                chains.append(base)
        for chain in {id(c): c for c in chains if c is not None}.values():
            chain.extend(tokens)
        return chains

    def _key(self, chains: list[Chain | None], g: int, j: int) -> tuple[int, bytes] | None:
        chain = chains[g]
        digest = chain.key(self.config.groups[g].block_size, j) if chain else None
        return (g, digest) if digest is not None else None

    # -- lookup -----------------------------------------------------------------------------

    def lookup(
        self, tokens: Sequence[int], extras: Sequence[ExtraKey] = ()
    ) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The hit a prompt would get now, without taking anything."""
        chains = self._chains(tokens, tuple(extras))
        hit, tables = self._find(tokens, chains)
        return hit, tuple(tuple(t) for t in tables)

    def branch_point(self, tokens: Sequence[int], extras: Sequence[ExtraKey] = ()) -> int:
        """Where the attention groups' cached prefix of `tokens` ends, aligned for every group
        (spec BRANCH-1): the length a `branch` placement checkpoints state at."""
        chains = self._chains(tokens, tuple(extras))
        return find_hit(self.config, len(tokens), self._finder(chains), ignore_state=True)[0]

    def _finder(self, chains: list[Chain | None]) -> Callable[[int, int], int | None]:
        def find(g: int, j: int) -> int | None:
            key = self._key(chains, g, j)
            return self.pool.lookup(key) if key is not None else None

        return find

    def _find(
        self, tokens: Sequence[int], chains: list[Chain | None]
    ) -> tuple[int, list[list[int]]]:
        return self.search(self.config, len(tokens), self._finder(chains))

    # -- allocation -------------------------------------------------------------------------

    def _end(self, group: GroupConfig, request: _Request) -> int:
        end = request.computed + request.scheduled
        return end if group.kind is Kind.MAMBA else end + request.lookahead

    def _wanted(self, request: _Request) -> list[list[int]]:
        wanted: list[list[int]] = []
        for g, group in enumerate(self.config.groups):
            if group.kind is Kind.CROSS:
                wanted.append([])
                continue
            table = request.tables[g]
            end = self._end(group, request)
            wanted.append(
                [
                    j
                    for j in range(
                        first_written(group, request.computed, end), cdiv(end, group.block_size)
                    )
                    if j >= len(table) or table[j] == NULL_BLOCK
                ]
            )
        return wanted

    def _fill(self, request: _Request, wanted: list[list[int]]) -> None:
        fresh = iter(self.pool.allocate(sum(len(w) for w in wanted)))
        for g, group in enumerate(self.config.groups):
            if group.kind is Kind.CROSS:
                continue
            table = request.tables[g]
            last = cdiv(self._end(group, request), group.block_size)
            table.extend([NULL_BLOCK] * (last - len(table)))
            for j in wanted[g]:
                table[j] = next(fresh)

    def _check_budget(self, budget: int, lookahead: int) -> None:
        if budget < 1 or lookahead < 0:
            raise RequestStateError("budget must be >= 1 and lookahead >= 0")

    def admit(
        self,
        rid: str,
        tokens: Sequence[int],
        budget: int,
        extras: Sequence[ExtraKey] = (),
        lookahead: int = 0,
    ) -> Scheduled | Waiting:
        """Look a new request up, take its hit, allocate for its first chunk."""
        if rid in self._requests:
            raise RequestStateError(
                f"request {rid!r} is already running; extend it, or "
                "finish/preempt it before admitting it again"
            )
        if not tokens:
            raise RequestStateError("a request needs at least one token")
        self._check_budget(budget, lookahead)
        limit = self.config.max_model_len
        if limit is not None and len(tokens) > limit:
            raise MaxLengthError(f"{len(tokens)} tokens exceed max_model_len={limit}")
        if any(e.end is not None and e.end > len(tokens) for e in extras):
            raise RequestStateError(
                "a positioned extra (multimodal item, prompt embeddings) "
                "lies beyond the prompt; its span must be within the tokens"
            )
        request = _Request(list(tokens), tuple(extras), self._chains(tokens, tuple(extras)))
        hit, tables = self._find(tokens, request.chains)
        request.computed = hit
        request.scheduled = min(budget, len(tokens) - hit)
        request.lookahead = lookahead
        request.tables = tables
        request.registered = [len(t) for t in tables]
        hits = {b for t in tables for b in t if b != NULL_BLOCK}
        reviving = sum(1 for b in hits if self.pool.ref_count[b] == 0)
        wanted = self._wanted(request)
        count = sum(len(w) for w in wanted)
        if count > self.pool.num_free - reviving:
            return Waiting(count + reviving, self.pool.num_free)
        self.pool.take(hits)
        self._fill(request, wanted)
        self._requests[rid] = request
        self._in_flight.add(rid)
        self._lookups += 1
        self._lookup_tokens += len(tokens)
        self._hit_tokens += hit
        return Scheduled(hit, request.scheduled, tuple(tuple(t) for t in request.tables))

    def _running(self, rid: str) -> _Request:
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequestError(f"unknown request {rid!r}; it is not running")
        return request

    def extend(
        self, rid: str, budget: int, appended: Sequence[int] = (), lookahead: int = 0
    ) -> Scheduled | Waiting:
        """Schedule the next chunk (prefill) or token (decode, with the sampled `appended`)."""
        request = self._running(rid)
        if request.scheduled:
            raise RequestStateError(f"request {rid!r} has a chunk in flight; end the step first")
        self._check_budget(budget, lookahead)
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
        before = (request.scheduled, request.lookahead)
        request.scheduled = min(budget, length - request.computed)
        request.lookahead = lookahead
        released = self._unneeded(request)
        freed = len({b for _, _, b in released if self.pool.ref_count[b] == 1})
        wanted = self._wanted(request)  # written positions are never released ones
        count = sum(len(w) for w in wanted)
        if count > self.pool.num_free + freed:
            request.scheduled, request.lookahead = before
            return Waiting(count, self.pool.num_free + freed)
        for g, j, _ in released:
            request.tables[g][j] = NULL_BLOCK
        self._give_back(released, cold=self._hybrid)
        self._fill(request, wanted)
        if appended:
            request.tokens.extend(appended)
            for chain in {id(c): c for c in request.chains if c is not None}.values():
                chain.extend(request.tokens)
        self._in_flight.add(rid)
        return Scheduled(0, request.scheduled, tuple(tuple(t) for t in request.tables))

    def _unneeded(self, request: _Request) -> list[tuple[int, int, int]]:
        """(group, position, block) the request stops holding, in release order."""
        out = []
        for g, group in enumerate(self.config.groups):
            if group.kind is Kind.CROSS:
                continue
            end = self._end(group, request)
            first, last = first_read(group, request.computed, end), cdiv(end, group.block_size)
            table = request.tables[g]
            for j in range(len(table) - 1, -1, -1):
                if table[j] != NULL_BLOCK and not first <= j < last:
                    out.append((g, j, table[j]))
        return out

    # -- commit and release -----------------------------------------------------------------

    def end_step(self) -> int:
        """The step's KV is written: commit scheduled tokens, register full blocks.

        Returns how many blocks became hittable."""
        registered = 0
        for rid in sorted(self._in_flight):
            request = self._requests.get(rid)
            if request is None:
                continue
            before = request.computed
            request.computed += request.scheduled
            request.scheduled = 0
            for g, group in enumerate(self.config.groups):
                positions = self._committed(g, group, request, before)
                for j in positions:
                    block = request.tables[g][j]
                    if block == NULL_BLOCK:  # released before its next token arrived
                        continue
                    key = self._key(request.chains, g, j)
                    if key is None:  # pragma: no cover - committed tokens are always digested
                        raise RuntimeError(f"no digest for committed block {j} of group {g}")
                    needs = self._prerequisites(request, g, j) if self._track else ()
                    self.pool.register(block, key, needs)
                    registered += 1
                if positions:
                    request.registered[g] = positions.stop
        self._in_flight.clear()
        return registered

    def _prerequisites(self, request: _Request, g: int, j: int) -> tuple[tuple[int, bytes], ...]:
        """EVICT-DEAD-1: per full-attention group, the last key that every hit through block
        j of group g needs and that the block's tokens fix (its own key excluded)."""
        groups = self.config.groups
        span = (j + 1) * groups[g].block_size
        covered = span + self._shifted[g]
        needs = []
        for f in self._full_groups:
            size = groups[f].block_size
            last = min((covered - self._shifted[f]) // size, span // size) - 1
            if f == g and last == j:
                last -= 1
            if last >= 0:
                key = self._key(request.chains, f, last)
                if key is not None:
                    needs.append(key)
        return tuple(needs)

    def _committed(self, g: int, group: GroupConfig, request: _Request, before: int) -> range:
        if group.kind is Kind.CROSS:
            return range(0)
        size = group.block_size
        start, stop = request.registered[g], request.computed // size
        if self._shifted[g]:
            stop = min(stop, (len(request.tokens) - 1) // size)
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
        self._in_flight.discard(rid)
        held = [
            (g, j, table[j])
            for g, table in enumerate(request.tables)
            for j in range(len(table) - 1, -1, -1)
            if table[j] != NULL_BLOCK
        ]
        return self._give_back(held)

    def _give_back(self, held: list[tuple[int, int, int]], cold: bool = False) -> int:
        """Release (group, position, block) entries; lru-unkeyed-first releases group by
        group, as vLLM's managers each free their own blocks (spec ALLOC-FREE-2)."""
        if self.config.eviction is not Eviction.LRU_UNKEYED_FIRST:
            return self.pool.release(self._release_order(held), cold=cold)
        return sum(
            self.pool.release([b for group, _, b in held if group == g])
            for g in range(len(self.config.groups))
        )

    def _release_order(self, held: list[tuple[int, int, int]]) -> list[int]:
        """(group, position, block) as listed under lru; tail first under hybrid
        (EVICT-ORDER-1: latest last token first, full attention last at equal ends)."""
        if self._hybrid:
            groups = self.config.groups

            def end(item: tuple[int, int, int]) -> tuple[int, bool, int]:
                g, j, _ = item
                return (-(j + 1) * groups[g].block_size, groups[g].kind is Kind.FULL, g)

            held = sorted(held, key=end)
        return [b for _, _, b in held]

    def finish(self, rid: str) -> int:
        """Release a finished or aborted request; returns how many blocks became free."""
        return self._release(rid)

    def preempt(self, rid: str) -> int:
        """Release a preempted request; it may be admitted again under the same id."""
        return self._release(rid)

    def reset_prefix_cache(self) -> bool:
        """Forget every key; refused (False) while any request holds blocks."""
        if self._requests:
            return False
        self.pool.reset()
        return True

    # -- inspection -------------------------------------------------------------------------

    def block_tables(self, rid: str) -> tuple[tuple[int, ...], ...]:
        """The request's block table per group (NULL_BLOCK = 0 where nothing is held)."""
        return tuple(tuple(t) for t in self._running(rid).tables)

    def stats(self) -> Stats:
        """Pool and hit counters."""
        return Stats(
            self.config.num_blocks,
            self.pool.num_free,
            self.pool.num_registered,
            len(self._requests),
            self._lookups,
            self._lookup_tokens,
            self._hit_tokens,
        )
