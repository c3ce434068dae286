"""The allocator's side of the hit-granularity profile `unit U`: prompt tails and their copies.

Implements the spec's ALLOC-UNIT-1..4 for the KVCacheManager:

- ALLOC-UNIT-1 (`unit_refusal`): the profile is served with dense retention, lru or
  lru-unkeyed-first eviction and draft layers keyed exactly (if any), like the spec; and,
  where the reference has a feature the spec does not cover, without KV events and without
  counting dead evictions (both read one key per block).
- ALLOC-UNIT-2 (`Tails.register`): a prompt's tail boundary T, the last multiple of U at or
  below its length less max(1, r) (r: the tokens a draft key covers past its end), is keyed
  when it lies inside a block: an attention group's block once a step has computed token
  T - 1, a draft group's (exact keying) once a step has computed the r - 1 after T too, a
  state group's only when a step ended exactly at T.
- CKPT-INNER-2 (`Tails.register`): a state a prefill chunk saved in passing at a multiple of U
  inside a block (its inner checkpoint) is keyed there, in the block before the running one.
- ALLOC-UNIT-3 (`Tails.split`): a hit ending inside a block copies that block into a fresh
  one; the source is held until the step ends.
- ALLOC-UNIT-4 (`Tails.keep`, `Tails.move_kept`): a state block keyed inside a block is copied
  out into a fresh block before its writer's chunk overwrites it; the copy takes the key when
  the step ends, so the writer's table (which vLLM's worker only appends to) never changes.

Keys. One digest chain at granularity U serves every group but the draft groups, which get
one each at U covering their lookahead (kvcert.reference.lookup): the
digest after P tokens certifies exactly the tokens [0, P), so a block's key (P a block end)
and a tail key (P inside a block) are digests of different lengths and never collide. A
block holds at most one tail key besides its block key: tail keys live in a second key
index of the pool (`BlockPool.tails`), with the same earliest-holder rule (ALLOC-LOOKUP-1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Sequence

from kvcert.reference.block_pool import NULL_BLOCK, BlockPool
from kvcert.reference.commit import Registrar
from kvcert.reference.config import CacheConfig, DraftKeying, Eviction, Kind, MambaMode
from kvcert.reference.errors import RequestStateError
from kvcert.reference.groups import checkpoint_position, tail_boundary
from kvcert.reference.keyindex import ServedMap
from kvcert.reference.lookup import Layered
from kvcert.reference.requests import Request
from kvcert.reference.retention import keeps_checkpoint, lengths_kept

Copy = tuple[int, int, int]  # (group, source block, target block)
Source = tuple[int, int, int]  # (group, table position, source block)
Maps = tuple[Sequence[ServedMap[bytes]], Container[int]]  # served maps, blocks in flight


def unit_refusal(config: CacheConfig) -> str | None:
    """Why a KVCacheManager cannot serve `config`'s `unit U`, or None (ALLOC-UNIT-1)."""
    unit = f"hit_unit={config.hit_unit}"
    if config.eviction is Eviction.HYBRID:
        return f"{unit} needs eviction 'lru' or 'lru-unkeyed-first': hybrid reads block keys only"
    if config.speculative is DraftKeying.DROP and any(g.draft for g in config.groups):
        return (
            f"{unit} with draft groups under the drop profile is not specified (how the drop "
            "meets a prompt's tail key, HIT-SPEC-2): use speculative='exact' or leave "
            "hit_unit unset"
        )
    if config.record_events or config.count_dead_evictions:
        return (
            f"{unit} without record_events and count_dead_evictions: KV events and liveness "
            "name one key per block, and a tail key is a second one"
        )
    return None


class Tails:
    """Per cache configuration under `unit U`: the tail keys and the copies they need."""

    def __init__(self, config: CacheConfig, pool: BlockPool, lookahead: Sequence[int]) -> None:
        unit = config.hit_unit
        if unit is None:  # the manager builds one only under the profile
            raise ValueError("Tails serves the `unit U` profile: config.hit_unit is None")
        self.unit = unit
        self.config = config
        self.groups = config.groups
        self.lookahead = lookahead  # per group, the draft tokens its keys cover (HASH-DRAFT-1)
        self.pool = pool
        tails = pool.tails
        if tails is None:
            raise ValueError("the pool keeps no tail keys: build it with tail_keys=True")
        self.index = tails
        # per group, what the hit search reads: block keys, then tail keys
        self.served = [
            Layered(whole, part) for whole, part in zip(pool.served, tails.served, strict=True)
        ]
        # same-pass: the blocks published (ALLOC-VIS-2) for a pass that has not run; a hit
        # may name them in a table, never copy them (HIT-UNIT-5)
        self.flying: set[int] = set()

    @staticmethod
    def sourced(requests: Iterable[Request]) -> Counter[int]:
        """How many copy sources of chunks in flight hold each block: they read it under a
        tail key an earlier step registered, so withdrawing its block key spares them."""
        return Counter(b for r in requests for _, _, b in r.sources)

    def land(self, pool: BlockPool, in_flight: list[Request]) -> None:
        """A step ended: only the chunks still in flight (`in_flight`) keep blocks unwritten.
        Blocks of a chunk released while dispatched land with the first step that ends.
        Implements HIT-UNIT-5's side of the bookkeeping (find_unit_hit reads `flying`)."""
        self.flying = {b for r in in_flight for b in Registrar.withdrawn(pool, r)}

    @staticmethod
    def refuse(call: str) -> None:
        """What the profile does not define for the manager's pipelining calls: raise."""
        raise RequestStateError(
            f"{call} under `unit U`: ALLOC-UNIT-3/-4 define the copies of one chunk in flight "
            "per request, ended by end_step; chunks scheduled behind it (reserve) and drafts "
            "accepted without a chunk (accept) are not defined: schedule synchronously"
        )

    def split(self, hit: int, tables: list[list[int]]) -> tuple[list[list[int]], list[Source]]:
        """ALLOC-UNIT-3: the hit's block lists without the blocks it ends inside, which become
        copy sources (group, position, block)."""
        sources: list[Source] = []
        for g, table in enumerate(tables):
            if table and hit % self.groups[g].block_size:
                source = table.pop()
                if source != NULL_BLOCK:
                    sources.append((g, len(table), source))
        return tables, sources

    def keep(self, request: Request) -> list[Source]:
        """ALLOC-UNIT-4: the state blocks keyed at a tail that the chunk scheduled for
        `request` would overwrite (its running block, when the chunk stays in it or the
        group writes every block)."""
        tails = self.index
        computed = request.computed
        end = computed + request.scheduled
        sources: list[Source] = []
        for g, group in enumerate(self.groups):
            size = group.block_size
            if group.kind is not Kind.MAMBA or not computed % size:
                continue
            j = (computed - 1) // size
            table = request.tables[g]
            block = table[j] if j < len(table) else NULL_BLOCK
            if block == NULL_BLOCK or tails.key_of(block) is None:
                continue
            if group.mode is MambaMode.ALL or -(-end // size) - 1 == j:
                sources.append((g, j, block))
        return sources

    def move_kept(self, requests: Iterable[Request]) -> list[Source]:
        """ALLOC-UNIT-4 when the step ends: each kept block's tail key moves to its copy
        (registered anew); returns the copies, for the caller to release (cached)."""
        moved: list[Source] = []
        tails = self.index
        for request in requests:
            for g, j, fresh in request.keeps:
                block = request.tables[g][j]
                key = tails.key_of(block)
                if key is not None:
                    tails.unbind(block)
                    tails.bind(fresh, g, key)
            moved += request.keeps
            request.keeps = []
        return moved

    def moving(self, chunks: Iterable[Request]) -> dict[int, tuple[int, bytes] | None]:
        """ALLOC-UNIT-4's moves when the `chunks` in flight end: each kept block loses its
        tail key (None) and its copy gains it ((group, key))."""
        moves: dict[int, tuple[int, bytes] | None] = {}
        for request in chunks:
            for g, j, fresh in request.keeps:
                block = request.tables[g][j]
                key = self.index.key_of(block)
                if key is not None:
                    moves[block], moves[fresh] = None, (g, key)
        return moves

    def served_after(
        self, blocks: Sequence[ServedMap[bytes]], chunks: Iterable[Request]
    ) -> list[ServedMap[bytes]]:
        """Per group, what the hit search reads once the `chunks` in flight have ended: the
        block keys `blocks` (with theirs), over the tail keys ALLOC-UNIT-4 moves to copies,
        over the tail keys, over the tail keys those chunks will register (`register`'s
        choice, made early); no block is in flight then."""
        chunks = list(chunks)
        pending = self.pending(chunks)
        moved: list[dict[bytes, int]] = [{} for _ in self.groups]
        for block, held in self.moving(chunks).items():
            if held is not None:
                moved[held[0]][held[1]] = block
        layered: list[ServedMap[bytes]] = []
        for whole, part, extra, copies in zip(
            blocks, self.index.served, pending, moved, strict=True
        ):
            tails: ServedMap[bytes] = Layered(part, extra) if extra else part
            layered.append(Layered(whole, Layered(copies, tails) if copies else tails))
        return layered

    def pending(self, chunks: Iterable[Request]) -> list[dict[bytes, int]]:
        """Per group, the tail keys the `chunks` in flight register when their steps end
        (`register`'s choice, made early): key -> block."""
        pending: list[dict[bytes, int]] = [{} for _ in self.groups]
        for request in chunks:
            end = request.computed + request.scheduled
            for g, position, column in self._tails_of(request, request.computed, end):
                chain = request.chains[g]
                if chain is not None:
                    block = request.tables[g][column]
                    pending[g].setdefault(chain.digests[position // chain.size - 1], block)
        return pending

    def _tails_of(self, request: Request, before: int, after: int) -> list[tuple[int, int, int]]:
        """(group, position, table position) of the keys inside a block that `request`
        registers once its computed count moves from `before` to `after`: its prompt's tail
        (ALLOC-UNIT-2, in the block it falls inside) and the states its chunk saved in
        passing (CKPT-INNER-2, in the position before the chunk's running one) where the
        retention keeps them (RET-SPARSE-3)."""
        tail = tail_boundary(self.unit, request.prompt_length, max(self.lookahead))
        found = []
        for g, group in enumerate(self.groups):
            size = group.block_size
            if group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN:
                saved = [q for q in request.checkpoints if before < q < after and q % size]
                if saved:  # RET-SPARSE-3
                    lengths = lengths_kept(self.config, group, request)
                    saved = [q for q in saved if keeps_checkpoint(lengths, q)]
                found += [(g, q, checkpoint_position(size, q, after)) for q in saved]
            if not tail or group.kind is Kind.CROSS or not tail % size:
                continue
            if group.kind is Kind.MAMBA:
                if group.mode is not MambaMode.NONE and before < tail == after:
                    found.append((g, tail, tail // size))
                continue
            needed = tail + max(self.lookahead[g] - 1, 0)  # a draft key's KV: reach - 1 more
            if before < needed <= after:
                found.append((g, tail, tail // size))
        return found

    def register(self, request: Request, before: int) -> int:
        """ALLOC-UNIT-2 and CKPT-INNER-2 for a request whose computed count moved from
        `before`: key the block its prompt's tail falls inside and the blocks holding the
        states its chunk saved in passing; returns how many keys were registered."""
        registered = 0
        for g, position, column in self._tails_of(request, before, request.computed):
            if self.groups[g].kind is Kind.MAMBA and position == request.computed:  # at T
                request.quiet_end = 0  # the next chunk must pass `keep` (ALLOC-UNIT-4)
            chain = request.chains[g]
            if chain is None:  # cross attention only, never a tail
                continue
            key = chain.digests[position // chain.size - 1]
            registered += self.index.bind(request.tables[g][column], g, key) >= 0
        return registered


def with_targets(wanted: list[Sequence[int]], sources: Sequence[Source]) -> list[Sequence[int]]:
    """Per group, the positions to allocate, the copies' targets among them (ALLOC-UNIT-3's
    target may be a position the chunk only reads: a state group's checkpoint)."""
    if not sources:
        return wanted
    extra: dict[int, set[int]] = {}
    for g, j, _ in sources:
        extra.setdefault(g, set()).add(j)
    return [
        sorted({*positions, *extra[g]}) if g in extra else positions
        for g, positions in enumerate(wanted)
    ]


def copies(request: Request) -> tuple[Copy, ...]:
    """The copies the chunk in flight needs before its pass: (group, source, target)."""
    into_table = tuple((g, block, request.tables[g][j]) for g, j, block in request.sources)
    return into_table + tuple((g, request.tables[g][j], f) for g, j, f in request.keeps)
