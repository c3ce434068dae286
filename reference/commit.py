"""Commit and registration: which blocks a computation completed, and making them hittable.

A block becomes hittable when the step that wrote its KV ends (ALLOC-VIS-1): the manager
calls `register` then, and asks `pending_keys` what the steps still in flight will
register. Implements ALLOC-COMMIT-1 (`committed`), CKPT-INNER-1's registration
(`register_inner`), EVICT-DEAD-1's prerequisites and the KV events of what was stored.
"""

from __future__ import annotations

from kvcert.reference.block_pool import NULL_BLOCK, BlockPool, Key
from kvcert.reference.config import CacheConfig, GroupConfig, Kind, MambaMode
from kvcert.reference.coordinator import Keys
from kvcert.reference.events import Stored
from kvcert.reference.inputs import TOKEN_LIMIT
from kvcert.reference.keyindex import ServedMap
from kvcert.reference.lookup import Layered
from kvcert.reference.requests import Request
from kvcert.reference.retention import Kept, keeps_less, lengths_kept, periodic_mask


class Registrar:
    """Per cache configuration: when each group commits a block, under which key, and what
    its registration needs (the pool is the caller's, passed per call)."""

    def __init__(self, config: CacheConfig, lookahead: list[int], commit_delay: list[int]) -> None:
        self.config = config
        # per group, the tokens past a block its keys cover (HASH-DRAFT-1) and the computed
        # tokens past a block it waits for before registering it (ALLOC-COMMIT-1)
        self.lookahead = lookahead
        self.commit_delay = commit_delay
        self._sizes = [g.block_size for g in config.groups]
        self._unit = config.alignment  # attention registers in whole units (ALLOC-COMMIT-1)
        self._keeps_less = [keeps_less(config, g) for g in config.groups]  # RET-SPARSE-2
        self._masks: dict[tuple[int, int, int], tuple[bool, ...] | None] = {}  # per period
        self._full_groups = [f for f, g in enumerate(config.groups) if g.kind is Kind.FULL]
        # (group, block size) of the groups that commit blocks: not cross, not mode none
        self._committing = [
            (g, group.block_size)
            for g, group in enumerate(config.groups)
            if group.kind is not Kind.CROSS
            and not (group.kind is Kind.MAMBA and group.mode is MambaMode.NONE)
        ]
        # the groups ALLOC-VIS-2 publishes: attention kinds (a cross group registers nothing)
        self._attention_groups = [
            g for g, group in enumerate(config.groups) if group.kind is not Kind.MAMBA
        ]

    @property
    def keeps_every_block(self) -> bool:
        """Whether every committed block of every group is registered (no RET-SPARSE-2 or
        RET-DENSE-1 mask leaves one uncached)."""
        return not any(self._keeps_less)

    def register(self, pool: BlockPool, rid: str, request: Request, before: int) -> int:
        """Register the blocks `request` completed when its computed count moved from
        `before` to `computed` (ALLOC-COMMIT-1); returns how many."""
        registered = 0
        for unique in request.unique_chains:
            unique.extend(request.tokens)
        inner = self.inner_done(request, before) if request.checkpoints else ()
        for g, group in enumerate(self.config.groups):
            if inner and group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN:
                registered += self.register_inner(pool, rid, request, g, inner)
            positions = self.committed(g, group, request, before)
            if positions:
                registered += self._register_run(pool, rid, request, g, positions)
        request.commit_at = self.commit_at(request)
        return registered

    def publish(self, pool: BlockPool, rid: str, request: Request) -> int:
        """Register at once the attention positions the chunk just scheduled completes, as
        `register` will when its step ends, and remember where they start, for `withdraw`.
        Implements ALLOC-VIS-2 (state groups wait for the step's end); returns how many."""
        before = request.computed
        marks = list(request.registered)
        registered = 0
        request.computed = before + request.scheduled
        try:
            for unique in request.unique_chains:
                unique.extend(request.tokens)
            for g in self._attention_groups:
                positions = self.committed(g, self.config.groups[g], request, before)
                if positions:
                    registered += self._register_run(pool, rid, request, g, positions)
        finally:
            request.computed = before
        if marks != request.registered:
            request.published = marks
            request.commit_at = self.commit_at(request)
        return registered

    @staticmethod
    def withdrawn(pool: BlockPool, request: Request) -> list[int]:
        """The blocks published for `request`'s chunk in flight (ALLOC-VIS-2) that still
        carry their keys."""
        published = request.published
        if published is None:
            return []
        return [
            block
            for g, start in enumerate(published)
            for block in request.tables[g][start : request.registered[g]]
            if block != NULL_BLOCK and pool.key_of(block) is not None
        ]

    def kept(self, g: int, request: Request) -> Kept | None:
        """The committed positions of group g that `request`'s retained lengths read (`j in
        kept`), or None: every committed one (RET-DENSE-1 where every block is read, or a
        group whose hit needs them all). Implements RET-SPARSE-2."""
        if not self._keeps_less[g]:
            return None
        group = self.config.groups[g]
        lengths = lengths_kept(self.config, group, request)
        if lengths is None:
            return None
        period = (g, lengths.every, lengths.below)
        if period not in self._masks:
            self._masks[period] = periodic_mask(group, lengths.every, lengths.below)
        return Kept(group, lengths, self._masks[period])

    def _register_run(
        self, pool: BlockPool, rid: str, request: Request, g: int, positions: range
    ) -> int:
        """Register group g's blocks at `positions` (in order) under the request's keys,
        those sparse retention keeps (`kept`)."""
        group = self.config.groups[g]
        chain = request.chains[g]
        table = request.tables[g]
        registered = 0
        kept = self.kept(g, request)
        if not pool.tracking and pool.events is None and chain is not None:
            keys = chain.keys_between(group.block_size, positions.start, positions.stop)
            if len(keys) < len(positions):  # pragma: no cover - as below
                raise RuntimeError(f"no digest for a committed block of group {g}")
            blocks = table[positions.start : positions.stop]
            if kept is not None:  # the run less the positions no retained length reads
                chosen = [i for i, j in enumerate(positions) if j in kept]
                blocks, keys = [blocks[i] for i in chosen], [keys[i] for i in chosen]
            registered = pool.register_run(g, blocks, keys)
            request.registered[g] = positions.stop
            return registered
        for j in positions:
            block = table[j]
            if block == NULL_BLOCK:  # released before its next token arrived
                continue
            if kept is not None and j not in kept:  # released uncached when let go
                continue
            key = chain.key(group.block_size, j) if chain else None
            if key is None:  # pragma: no cover - committed tokens are always digested
                raise RuntimeError(f"no digest for committed block {j} of group {g}")
            needs = self.prerequisites(request, g, j) if pool.tracking else ()
            if pool.register(block, g, key, needs) and pool.events is not None:
                pool.events.append(self.stored(rid, request, g, j))
            registered += 1
        request.registered[g] = positions.stop
        return registered

    def pending_keys(self, request: Request, pending: list[dict[bytes, int]]) -> None:
        """Add to `pending` (per group, key -> block) what `request`'s chunk in flight will
        register when its step ends (what `register` will do then)."""
        if request.computed + request.scheduled < request.commit_at:
            return  # `committed` is empty below commit_at: end_step skips it as well
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
                positions = list(self.committed(g, group, request, before))
                if inner and group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN:
                    # a position inside a block takes its tail key (CKPT-INNER-2: Tails)
                    size = group.block_size
                    positions += [q // size - 1 for q in inner if not q % size]
                kept = self.kept(g, request)
                if kept is not None:
                    positions = [j for j in positions if j in kept]
                for j in positions:
                    key = chain.key(group.block_size, j)
                    if table[j] != NULL_BLOCK and key is not None:
                        pending[g].setdefault(key, table[j])
        finally:
            request.computed = before

    @staticmethod
    def inner_done(request: Request, before: int) -> tuple[int, ...]:
        """The inner checkpoints (CKPT-INNER-1) the computation from `before` to `computed`
        has passed, now taken off the request's list."""
        done = tuple(q for q in request.checkpoints if before < q <= request.computed)
        if done:
            request.checkpoints = [q for q in request.checkpoints if q not in done]
        return done

    def register_inner(
        self, pool: BlockPool, rid: str, request: Request, g: int, inner: tuple[int, ...]
    ) -> int:
        """Register the state group's positions of the inner checkpoints passed: each holds
        the state at its boundary, as if a chunk had ended there. Implements CKPT-INNER-1."""
        registered = 0
        group, chain, table = self.config.groups[g], request.chains[g], request.tables[g]
        track, events = pool.tracking, pool.events
        kept = self.kept(g, request)
        for q in inner:
            if q % group.block_size:  # inside a block: Tails keys it (CKPT-INNER-2)
                continue
            j = q // group.block_size - 1
            if j < request.registered[g] or j >= len(table) or table[j] == NULL_BLOCK:
                continue
            if kept is not None and j not in kept:
                request.registered[g] = j + 1
                continue
            key = chain.key(group.block_size, j) if chain else None
            if key is None:  # pragma: no cover - committed tokens are always digested
                raise RuntimeError(f"no digest for committed block {j} of group {g}")
            needs = self.prerequisites(request, g, j) if track else ()
            if pool.register(table[j], g, key, needs) and events is not None:
                events.append(self.stored(rid, request, g, j))
            registered += 1
            request.registered[g] = j + 1
        return registered

    def stored(self, rid: str, request: Request, g: int, j: int) -> Stored:
        """The event of block j of group g becoming hittable (its chain digested it)."""
        size, chain = self._sizes[g], request.chains[g]
        key = chain.key(size, j) if chain is not None else None
        if key is None:  # pragma: no cover - end_step registered it under this key
            raise RuntimeError(f"no digest for registered block {j} of group {g}")
        parent = chain.key(size, j - 1) if j and chain is not None else None
        tokens = tuple(request.tokens[j * size : (j + 1) * size])
        return Stored(rid, g, request.tables[g][j], key, parent, j * size, tokens)

    def prerequisites(self, request: Request, g: int, j: int) -> tuple[Key, ...]:
        """Implements EVICT-DEAD-1's prerequisites: per full-attention group, the last key that
        every hit through block j of group g needs and that the block's tokens fix (its own
        key excluded)."""
        sizes = self._sizes
        span = (j + 1) * sizes[g]
        covered = span + self.lookahead[g]
        needs = []
        for f in self._full_groups:
            size = sizes[f]
            last = min((covered - self.lookahead[f]) // size, span // size) - 1
            if f == g and last == j:
                last -= 1
            chain = request.chains[f]
            key = chain.key(size, last) if last >= 0 and chain else None
            if key is not None:
                needs.append((f, key))
        return tuple(needs)

    def commit_at(self, request: Request) -> int:
        """A lower bound on the `computed` at which `committed` is next non-empty: every kind
        commits block j only once (j + 1) * block_size tokens are computed."""
        marks = request.registered
        return min([(marks[g] + 1) * size for g, size in self._committing], default=TOKEN_LIMIT)

    def committed(self, g: int, group: GroupConfig, request: Request, before: int) -> range:
        """The table positions of group g whose KV is now entirely written. Implements
        ALLOC-COMMIT-1: attention blocks in whole units of the hit granularity, draft blocks
        wait for draft_reach - 1 more computed tokens and exact draft keys for their tokens,
        state groups checkpoint at every boundary (all) or where the step ended (align),
        never in mode none."""
        if group.kind is Kind.CROSS:
            return range(0)
        size = group.block_size
        start, stop = request.registered[g], (request.computed - self.commit_delay[g]) // size
        if self.lookahead[g]:
            stop = min(stop, (len(request.tokens) - self.lookahead[g]) // size)
        if group.kind is not Kind.MAMBA:  # whole units of the hit granularity
            stop = min(stop, request.computed // self._unit * self._unit // size)
        if group.kind is Kind.MAMBA:
            if group.mode is MambaMode.NONE:
                return range(0)
            if group.mode is MambaMode.ALIGN:
                aligned = request.computed % size == 0 and request.computed > before
                return range(stop - 1, stop) if aligned and stop - 1 >= start else range(0)
        return range(start, max(start, stop))


# a chunk in flight as the keys it will register depend on it: the request (the object: a
# request admitted again is another chunk) and the chunk's bounds (computed, scheduled); a
# reserve while it is in flight holds slots past it and moves none of its blocks
ChunkInFlight = tuple[Request, int, int]


def _touches(pending: list[dict[bytes, int]], keys: Keys[bytes]) -> bool:
    """Whether some group's pending keys include one of the request's keys of that group.
    A chunk in flight adds a few keys per group, a prompt has one per block: each group's
    pending keys are looked up among the request's, made a set once per key list (groups
    sharing a chain share one)."""
    sets: dict[int, set[bytes]] = {}
    for extra, mine in zip(pending, keys, strict=True):
        if not extra:
            continue
        if len(extra) >= len(mine):
            if not extra.keys().isdisjoint(mine):
                return True
            continue
        among = sets.get(id(mine))
        if among is None:
            among = sets[id(mine)] = set(mine)
        if not among.isdisjoint(extra):
            return True
    return False


class MapsAfterSteps:
    """The served maps once every step in flight has ended: the pool's, with the keys the
    chunks in flight will register (`Registrar.pending_keys`). Each of a step's admissions
    asks with one chunk more in flight than the one before: the keys of the chunks asked
    about before are kept and only the new chunks' are added (all are rebuilt when an
    earlier chunk changed)."""

    __slots__ = ("_commits", "_known", "_pending", "_served")

    def __init__(self, commits: Registrar) -> None:
        self._commits = commits
        self._known: list[ChunkInFlight] = []
        self._pending: list[dict[bytes, int]] = [{} for _ in commits.config.groups]
        self._served: list[ServedMap[bytes]] | None = None

    def served(
        self, pool: BlockPool, chunks: list[ChunkInFlight], keys: Keys[bytes] | None = None
    ) -> list[ServedMap[bytes]] | None:
        """Per group, the map once `chunks` (in the order they were scheduled) have ended;
        None when they register nothing, or, given a request's `keys` per group, none of
        those. A search reads a map only at the request's keys, so where the chunks add none
        of them the pool's maps answer it alone (and through the compiled index)."""
        served = self._after(pool, chunks)
        if served is None or keys is None:
            return served
        return served if _touches(self._pending, keys) else None

    def _after(self, pool: BlockPool, chunks: list[ChunkInFlight]) -> list[ServedMap[bytes]] | None:
        """`served` for every key: the pool's maps layered with the chunks' pending keys."""
        if chunks == self._known:
            return self._served
        if chunks[: len(self._known)] != self._known:
            self._known, self._pending = [], [{} for _ in self._pending]
        for chunk in chunks[len(self._known) :]:
            self._commits.pending_keys(chunk[0], self._pending)
        self._known = chunks
        self._served = None
        if any(self._pending):
            self._served = [
                Layered(now, extra) if extra else now
                for now, extra in zip(pool.served, self._pending, strict=True)
            ]
        return self._served
