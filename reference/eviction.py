"""Eviction profiles: the free queue and the order released blocks join it, one class each.

The pool calls its queue for every free-queue operation, a whole request's release
included (in what order its blocks join), so adding a profile touches this file only.

    lru                 ALLOC-EVICT-1, ALLOC-FREE-1: the head of the queue is evicted first;
                        a request releases group by group in layout order, each table from its
                        last position; an intrusive doubly linked ring with block 0 (the null
                        block, never free) as its sentinel, so a hit takes a block out of the
                        middle in O(1): successors in an int32 array, and each free block's
                        predecessor, negated, in its entry of the pool's counts (a free block
                        has no count; see kvcert.reference.refcounts)
    lru-unkeyed-first   ALLOC-FREE-2: lru, but each group's released blocks without a key go to
                        the head of the queue as one run
    hybrid              EVICT-HYB-1, EVICT-ORDER-1: provably dead blocks first, then cold ones
                        (freed mid-request), then the head; a request releases tail first. The
                        queue order is a join counter per free block and three heaps (dead,
                        cold, warm) of counter << 32 | block; an entry is current while it is
                        free, joined at that counter and still of that class, stale entries are
                        skipped when popped: O(log n) per operation
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from kvcert.reference.config import Eviction, GroupConfig, Kind
from kvcert.reference.refcounts import link, release_tables, unlink_head

if TYPE_CHECKING:
    from kvcert.reference.block_pool import BlockPool

Held = tuple[int, int, int]  # (group, table position, block)
DEAD, COLD, WARM = 0, 1, 2  # hybrid victim classes, taken in this order


def per_block(typecode: str, count: int, values: range | None = None) -> array[int]:
    """An array of exactly `count` items, zeros or `values`: one built from bytes or a range
    over-allocates by a sixteenth, and a pool's bookkeeping arrays hold one item per block."""
    made = array(typecode, [0]) * count
    if values is not None:
        made[:] = array(typecode, values)  # same length: filled in place, no regrowth
    return made


def held_entries(tables: Sequence[list[int]], lows: Sequence[int]) -> list[Held]:
    """A request's held blocks as (group, position, block), group by group in layout order,
    each table from its last position (ALLOC-FREE-1's listing)."""
    return [
        (g, j, table[j])
        for g, (table, low) in enumerate(zip(tables, lows, strict=True))
        for j in range(len(table) - 1, low - 1, -1)
        if table[j]
    ]


class FreeQueue:
    """The lru profile: a linked list in joining order; the head is the next victim.

    The ring runs 0, head, ..., tail, 0: `links[b]` is b's successor, and the pool's
    `ref_count[b]` of a free block b is minus its predecessor (so the head's is 0, and the
    sentinel's entry, -tail, is where the ring closes)."""

    profile = Eviction.LRU
    tracks_liveness = False  # whether the pool must keep EVICT-DEAD-1 up to date for it

    __slots__ = ("links", "pool")

    def __init__(self, pool: BlockPool) -> None:
        """Every block but the null one free, in ascending order (ALLOC-INIT-1)."""
        self.pool = pool
        count = pool.num_blocks
        self.links: array[int] | None = per_block("i", count, range(1, count + 1))
        self.links[count - 1] = 0
        pool.ref_count[:] = per_block("i", count, range(1, 1 - count, -1))
        pool.ref_count[0] = 1 - count  # the sentinel's predecessor: the tail, block count - 1

    def release_batches(self, groups: Sequence[GroupConfig], held: list[Held]) -> list[list[int]]:
        """Implements ALLOC-FREE-1: one batch, in the order the manager listed (group by group
        in layout order, each table from its last position)."""
        return [[block for _, _, block in held]]

    def release_in_table_order(
        self, tables: Sequence[list[int]], lows: Sequence[int]
    ) -> int | None:
        """ALLOC-FREE-1's release of a whole request (table g holds blocks from position
        lows[g] on) in one pass, when this queue releases in that listing and links as lru
        does (`release_tables`): how many blocks became free, or None (its own order)."""
        kind = type(self)
        if kind.release_batches is not FreeQueue.release_batches or kind.add is not FreeQueue.add:
            return None
        return release_tables(self.pool.ref_count, self._links(), tables, lows)

    def remove(self, block: int) -> None:
        """A free block leaves the queue (a hit's revived blocks leave it inside `hold`)."""
        links, counts = self._links(), self.pool.ref_count
        before, after = -counts[block], links[block]
        links[before] = after
        counts[after] = -before

    def add(self, blocks: list[int], cold: bool) -> None:
        """Blocks whose count reached 0 join the tail, in order (linked as one run)."""
        link(self.pool.ref_count, self._links(), blocks)

    def pop(self) -> int:
        """The head of the queue. Implements ALLOC-EVICT-1 (the pool forgets its key)."""
        block = self._links()[0]
        self.remove(block)
        return block

    def pop_many(self, count: int) -> list[int]:
        """`count` pops at once: the first `count` blocks, unlinked as one run (the caller
        has checked that the queue holds them, and counts them held next)."""
        return unlink_head(self.pool.ref_count, self._links(), count)

    def _links(self) -> array[int]:
        links = self.links
        if links is None:  # pragma: no cover - a profile without the ring overrides these
            raise TypeError(f"the {self.profile.value} queue keeps no linked list")
        return links

    def changed(self, block: int) -> None:
        """A free block's liveness may have changed (nothing to do under lru)."""

    def reset(self) -> None:
        """Every key was forgotten (the order stays)."""

    def compact(self) -> None:
        """After an allocation: drop bookkeeping that went stale (nothing under lru)."""

    def __iter__(self) -> Iterator[int]:
        links = self._links()
        block = links[0]
        while block:
            yield block
            block = links[block]

    def _prepend(self, blocks: list[int]) -> None:
        links, counts = self._links(), self.pool.ref_count
        after, previous = links[0], 0
        for block in blocks:
            links[previous] = block
            counts[block] = -previous
            previous = block
        links[previous] = after
        counts[after] = -previous


class UnkeyedFirstQueue(FreeQueue):
    """The lru-unkeyed-first profile."""

    profile = Eviction.LRU_UNKEYED_FIRST

    __slots__ = ()

    def release_batches(self, groups: Sequence[GroupConfig], held: list[Held]) -> list[list[int]]:
        """Implements ALLOC-FREE-2 (with add): one batch per group, as each group's manager
        frees its own blocks."""
        return [[b for group, _, b in held if group == g] for g in range(len(groups))]

    def add(self, blocks: list[int], cold: bool) -> None:
        """Keyed blocks join the tail; unkeyed ones go to the head as one run, in order."""
        keyed = self.pool.is_keyed
        unkeyed = [b for b in blocks if not keyed(b)]
        super().add([b for b in blocks if keyed(b)], cold)
        self._prepend(unkeyed)


class HybridQueue(FreeQueue):
    """The hybrid profile (see the module docstring for the heaps)."""

    profile = Eviction.HYBRID
    tracks_liveness = True

    __slots__ = ("_cold", "_heaps", "_joined", "_ticks")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.links = None  # no linked list: a free block's count reads 0
        self._ticks = itertools.count(pool.num_blocks)
        # the queue position of each free block
        self._joined = per_block("q", pool.num_blocks, range(pool.num_blocks))
        self._cold = bytearray(pool.num_blocks)  # 1: freed mid-request
        # per class (DEAD, COLD, WARM) the free blocks' entries joined << 32 | block (one int
        # each, ordered as (joined, block) would be); every empty block starts dead
        self._heaps: tuple[list[int], ...] = (
            [(b << 32) | b for b in range(1, pool.num_blocks)],
            [],
            [],
        )

    def release_batches(self, groups: Sequence[GroupConfig], held: list[Held]) -> list[list[int]]:
        """Implements EVICT-ORDER-1: latest last token first, full attention last at equal
        ends."""

        def end(item: Held) -> tuple[int, bool, int]:
            g, j, _ = item
            return (-(j + 1) * groups[g].block_size, groups[g].kind is Kind.FULL, g)

        return [[block for _, _, block in sorted(held, key=end)]]

    def _class(self, block: int) -> int:
        """EVICT-HYB-1's order: dead, cold, the rest."""
        return DEAD if self.pool.is_dead(block) else COLD if self._cold[block] else WARM

    def remove(self, block: int) -> None:
        """Nothing to unlink: the block's heap entry goes stale once it is held."""

    def add(self, blocks: list[int], cold: bool) -> None:
        for block in blocks:
            self._cold[block] = cold
            self._joined[block] = next(self._ticks)
            self.changed(block)

    def changed(self, block: int) -> None:
        """File a free block under its current class (older entries go stale)."""
        if self.pool.ref_count[block] == 0 and block:
            entry = (self._joined[block] << 32) | block
            heapq.heappush(self._heaps[self._class(block)], entry)

    def _current(self, entry: int, kind: int) -> bool:
        block = entry & 0xFFFFFFFF
        return (
            self.pool.ref_count[block] == 0
            and self._joined[block] == entry >> 32
            and self._class(block) == kind
        )

    def pop(self) -> int:
        """The earliest-joined dead free block, else cold, else any. Implements EVICT-HYB-1."""
        for kind, heap in enumerate(self._heaps):
            while heap:
                entry = heapq.heappop(heap)
                if self._current(entry, kind):
                    block = entry & 0xFFFFFFFF
                    self._cold[block] = False
                    return block
        raise RuntimeError("no free block although num_free > 0")  # pragma: no cover

    def reset(self) -> None:
        self._rebuild()

    def compact(self) -> None:
        if sum(len(h) for h in self._heaps) > 4 * self.pool.num_blocks:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop stale entries (they pile up when free blocks change class often)."""
        heaps: tuple[list[int], ...] = ([], [], [])
        for block in range(1, self.pool.num_blocks):
            if self.pool.ref_count[block] == 0:
                heaps[self._class(block)].append((self._joined[block] << 32) | block)
        for heap in heaps:
            heapq.heapify(heap)
        self._heaps = heaps

    def __iter__(self) -> Iterator[int]:
        pool = self.pool
        free = [b for b in range(1, pool.num_blocks) if pool.ref_count[b] == 0]
        yield from sorted(free, key=self._joined.__getitem__)


QUEUES: dict[Eviction, type[FreeQueue]] = {
    q.profile: q for q in (FreeQueue, UnkeyedFirstQueue, HybridQueue)
}
