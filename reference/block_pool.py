"""The block pool: reference counts, the free queue under an eviction profile, the key map.

Implements ALLOC-INIT-1, ALLOC-LOOKUP-1, ALLOC-EVICT-1 and the queue side of ALLOC-FREE-1
and ALLOC-TWO-PHASE-1 of the spec, under the `lru` profile, and EVICT-DEAD-1 / EVICT-HYB-1
under the `hybrid` profile.

lru: the free queue is an intrusive doubly linked list over arrays (`_prev`, `_next`,
sentinel at index `num_blocks`), so taking a cached block out of the middle of the queue on
a hit is O(1), as are popping the head and appending at the tail.

hybrid: the queue order is a join counter per free block, and three heaps (dead, cold, warm)
hold (counter, block) entries; an entry is current while the block is free, joined at that
counter and still of that class, stale entries are skipped when popped. O(log n) per
operation. Cold blocks are those a running request released mid-way (spec EVICT-HYB-1).

The hybrid profile tracks EVICT-DEAD-1 (lru only when the manager passes prerequisite keys,
to count dead evictions; without them lru counts only shadowed blocks as dead): a registered
block is dead when it is not the first holder of its key or when one of its prerequisite keys
(the full-attention keys every hit through it needs) is held by no block. Per key, the blocks
depending on it are indexed, so a key appearing or disappearing reclassifies exactly its
dependents: O(1) per pool operation plus O(d) for the d dependents of that key.

The key map keeps, per key, an insertion-ordered dict of the blocks registered under it: the
first one is the earliest registered (the spec's choice among duplicates).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

from kvcert.reference.config import Eviction

NULL_BLOCK = 0
DEAD, COLD, WARM = 0, 1, 2  # hybrid victim classes, taken in this order

Key = tuple[int, bytes]  # (group index, digest)


class BlockPool:
    """`num_blocks` physical blocks; block 0 is the null block and is never handed out."""

    __slots__ = (
        "_cold",
        "_dependents",
        "_heaps",
        "_joined",
        "_keys",
        "_map",
        "_missing",
        "_next",
        "_prereqs",
        "_prev",
        "_sentinel",
        "_ticks",
        "dead_evictions",
        "eviction",
        "evictions",
        "num_blocks",
        "num_free",
        "ref_count",
    )

    def __init__(
        self, num_blocks: int, eviction: Eviction = Eviction.LRU, num_groups: int = 1
    ) -> None:
        self.num_blocks = num_blocks
        self.eviction = eviction
        self.ref_count = [0] * num_blocks
        self._keys: list[Key | None] = [None] * num_blocks
        self._map: dict[Key, dict[int, None]] = {}
        self._prereqs: list[tuple[Key, ...]] = [()] * num_blocks
        self._missing = [0] * num_blocks
        self._dependents: dict[Key, set[int]] = {}
        self.evictions = [0] * num_groups  # registered blocks reused, per group
        self.dead_evictions = [0] * num_groups  # of which dead (see the module docstring)
        sentinel = num_blocks
        self._sentinel = sentinel
        order = [sentinel, *range(1, num_blocks), sentinel]
        self._next = [0] * (num_blocks + 1)
        self._prev = [0] * (num_blocks + 1)
        for left, right in itertools.pairwise(order):
            self._next[left] = right
            self._prev[right] = left
        self.num_free = num_blocks - 1
        self._ticks = itertools.count(num_blocks)
        self._joined = list(range(num_blocks))  # hybrid: queue position of each free block
        self._cold = [False] * num_blocks  # hybrid: freed mid-request
        # hybrid: per class (DEAD, COLD, WARM) the free blocks' (joined, block); empty ones dead
        self._heaps: tuple[list[tuple[int, int]], ...] = (
            [(b, b) for b in range(1, num_blocks)],
            [],
            [],
        )

    # -- liveness (EVICT-DEAD-1) ------------------------------------------------------------

    def is_dead(self, block: int) -> bool:
        """Nothing a lookup could be served: unregistered, shadowed or missing a prerequisite."""
        key = self._keys[block]
        if key is None or self._missing[block]:
            return True
        return next(iter(self._map[key])) != block

    def _class(self, block: int) -> int:
        """EVICT-HYB-1's order: 0 dead, 1 cold, 2 the rest."""
        return DEAD if self.is_dead(block) else COLD if self._cold[block] else WARM

    def _reclassify(self, block: int) -> None:
        """A free block's class may have changed: file it under its current one."""
        if self.eviction is Eviction.HYBRID and self.ref_count[block] == 0 and block:
            heapq.heappush(self._heaps[self._class(block)], (self._joined[block], block))

    def _key_appeared(self, key: Key) -> None:
        for block in self._dependents.get(key, ()):
            self._missing[block] -= 1
            self._reclassify(block)

    def _key_vanished(self, key: Key) -> None:
        for block in self._dependents.get(key, ()):
            self._missing[block] += 1
            self._reclassify(block)

    # -- free queue -------------------------------------------------------------------------

    def _unlink(self, block: int) -> None:
        self.num_free -= 1
        if self.eviction is Eviction.HYBRID:
            return  # heap entries go stale once the block is held
        prev, nxt = self._prev[block], self._next[block]
        self._next[prev] = nxt
        self._prev[nxt] = prev

    def _append(self, block: int) -> None:
        self.num_free += 1
        if self.eviction is Eviction.HYBRID:
            self._joined[block] = next(self._ticks)
            self._reclassify(block)
            return
        last = self._prev[self._sentinel]
        self._next[last] = block
        self._prev[block] = last
        self._next[block] = self._sentinel
        self._prev[self._sentinel] = block

    def _current(self, entry: tuple[int, int], kind: int) -> bool:
        joined, block = entry
        return (
            self.ref_count[block] == 0
            and self._joined[block] == joined
            and self._class(block) == kind
        )

    def _pop_victim(self) -> int:
        """EVICT-HYB-1: the earliest-joined dead free block, else cold, else any."""
        for kind, heap in enumerate(self._heaps):
            while heap:
                entry = heapq.heappop(heap)
                if self._current(entry, kind):
                    return entry[1]
        raise RuntimeError("no free block although num_free > 0")  # pragma: no cover

    def free_queue(self) -> Iterator[int]:
        """The free queue in joining order, from the oldest to the most recently freed block
        (under lru also the eviction order)."""
        if self.eviction is Eviction.HYBRID:
            free = [b for b in range(1, self.num_blocks) if self.ref_count[b] == 0]
            yield from sorted(free, key=self._joined.__getitem__)
            return
        block = self._next[self._sentinel]
        while block != self._sentinel:
            yield block
            block = self._next[block]

    # -- keys ---------------------------------------------------------------------------------

    def lookup(self, key: Key) -> int | None:
        """The earliest registered block holding `key`, or None."""
        holders = self._map.get(key)
        return next(iter(holders)) if holders else None

    def register(self, block: int, key: Key, prerequisites: tuple[Key, ...] = ()) -> None:
        """Make `block` hittable under `key` (a block carries at most one key); it stays
        useful only while every prerequisite key is held somewhere (EVICT-DEAD-1)."""
        self._keys[block] = key
        holders = self._map.get(key)
        if holders is None:
            self._map[key] = {block: None}
            self._key_appeared(key)
        else:
            holders[block] = None
        self._prereqs[block] = prerequisites
        self._missing[block] = sum(1 for p in prerequisites if p not in self._map)
        for p in prerequisites:
            self._dependents.setdefault(p, set()).add(block)

    def key_of(self, block: int) -> Key | None:
        """The key `block` is registered under, if any."""
        return self._keys[block]

    def _forget(self, block: int) -> None:
        key = self._keys[block]
        if key is None:
            return
        group = key[0]
        self.evictions[group] += 1
        if self.is_dead(block):
            self.dead_evictions[group] += 1
        for p in self._prereqs[block]:
            dependents = self._dependents[p]
            dependents.discard(block)
            if not dependents:
                del self._dependents[p]
        self._prereqs[block] = ()
        self._missing[block] = 0
        self._keys[block] = None
        holders = self._map[key]
        first = next(iter(holders))
        del holders[block]
        if not holders:
            del self._map[key]
            self._key_vanished(key)
        elif first == block:
            self._reclassify(next(iter(holders)))  # the next copy is served now

    @property
    def num_registered(self) -> int:
        """Blocks currently hittable."""
        return sum(len(h) for h in self._map.values())

    # -- reference counts -------------------------------------------------------------------

    def take(self, blocks: Iterable[int]) -> None:
        """Hold blocks found by a lookup; a free one leaves the queue (still registered)."""
        ref = self.ref_count
        for block in blocks:
            if ref[block] == 0:
                self._unlink(block)
            ref[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks as the profile orders them, forgetting their keys; the caller
        has checked `count <= num_free`."""
        taken = []
        hybrid = self.eviction is Eviction.HYBRID
        for _ in range(count):
            block = self._pop_victim() if hybrid else self._next[self._sentinel]
            self._unlink(block)
            self._forget(block)
            self._cold[block] = False
            self.ref_count[block] = 1
            taken.append(block)
        if hybrid and sum(len(h) for h in self._heaps) > 4 * self.num_blocks:
            self._rebuild_heaps()
        return taken

    def release(self, blocks: Iterable[int], cold: bool = False) -> int:
        """Drop one reference per listed block; blocks reaching 0 join the queue tail in the
        given order (`cold`: released mid-request, for the hybrid profile). Under
        lru-unkeyed-first the unregistered ones go to the head instead, as one run in the given
        order (spec ALLOC-FREE-2: one call per group). Returns how many reached 0."""
        ref = self.ref_count
        front: list[int] = []
        unkeyed_first = self.eviction is Eviction.LRU_UNKEYED_FIRST
        freed = 0
        for block in blocks:
            ref[block] -= 1
            if ref[block] == 0:
                freed += 1
                if unkeyed_first and self._keys[block] is None:
                    front.append(block)
                    continue
                self._cold[block] = cold
                self._append(block)
        self._prepend_run(front)
        return freed

    def _prepend_run(self, blocks: list[int]) -> None:
        """Put `blocks` at the head of the (linked-list) queue, keeping their order."""
        after = self._next[self._sentinel]
        previous = self._sentinel
        for block in blocks:
            self._next[previous] = block
            self._prev[block] = previous
            previous = block
        self._next[previous] = after
        self._prev[after] = previous
        self.num_free += len(blocks)

    def _rebuild_heaps(self) -> None:
        """Drop stale entries (they pile up when free blocks change class often)."""
        heaps: tuple[list[tuple[int, int]], ...] = ([], [], [])
        for block in range(1, self.num_blocks):
            if self.ref_count[block] == 0:
                heaps[self._class(block)].append((self._joined[block], block))
        for heap in heaps:
            heapq.heapify(heap)
        self._heaps = heaps

    def reset(self) -> None:
        """Forget every key (the caller has checked that nothing is held)."""
        self._map.clear()
        self._dependents.clear()
        self._keys = [None] * self.num_blocks
        self._prereqs = [()] * self.num_blocks
        self._missing = [0] * self.num_blocks
        if self.eviction is Eviction.HYBRID:
            self._rebuild_heaps()
