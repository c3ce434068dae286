"""The block pool: reference counts, an O(1) free queue, and the key -> block map.

Implements ALLOC-INIT-1, ALLOC-LOOKUP-1, ALLOC-EVICT-1 and the queue side of ALLOC-FREE-1
and ALLOC-TWO-PHASE-1 of the spec, under the `lru` profile.

The free queue is an intrusive doubly linked list over arrays (`_prev`, `_next`, sentinel at
index `num_blocks`), so taking a cached block out of the middle of the queue on a hit is
O(1), as are popping the head and appending at the tail. The key map keeps, per key, an
insertion-ordered dict of the blocks registered under it: the first one is the earliest
registered (the spec's choice among duplicates), and evicting any copy is O(1).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

NULL_BLOCK = 0

Key = tuple[int, bytes]  # (group index, digest)


class BlockPool:
    """`num_blocks` physical blocks; block 0 is the null block and is never handed out."""

    __slots__ = (
        "_keys",
        "_map",
        "_next",
        "_prev",
        "_sentinel",
        "num_blocks",
        "num_free",
        "ref_count",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        self._keys: list[Key | None] = [None] * num_blocks
        self._map: dict[Key, dict[int, None]] = {}
        sentinel = num_blocks
        self._sentinel = sentinel
        order = [sentinel, *range(1, num_blocks), sentinel]
        self._next = [0] * (num_blocks + 1)
        self._prev = [0] * (num_blocks + 1)
        for left, right in itertools.pairwise(order):
            self._next[left] = right
            self._prev[right] = left
        self.num_free = num_blocks - 1

    # -- free queue -------------------------------------------------------------------------

    def _unlink(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        self._next[prev] = nxt
        self._prev[nxt] = prev
        self.num_free -= 1

    def _append(self, block: int) -> None:
        last = self._prev[self._sentinel]
        self._next[last] = block
        self._prev[block] = last
        self._next[block] = self._sentinel
        self._prev[self._sentinel] = block
        self.num_free += 1

    def free_queue(self) -> Iterator[int]:
        """The free queue from the next eviction victim to the most recently freed block."""
        block = self._next[self._sentinel]
        while block != self._sentinel:
            yield block
            block = self._next[block]

    # -- keys ---------------------------------------------------------------------------------

    def lookup(self, key: Key) -> int | None:
        """The earliest registered block holding `key`, or None."""
        holders = self._map.get(key)
        return next(iter(holders)) if holders else None

    def register(self, block: int, key: Key) -> None:
        """Make `block` hittable under `key` (a block carries at most one key)."""
        self._keys[block] = key
        self._map.setdefault(key, {})[block] = None

    def key_of(self, block: int) -> Key | None:
        """The key `block` is registered under, if any."""
        return self._keys[block]

    def _forget(self, block: int) -> None:
        key = self._keys[block]
        if key is not None:
            holders = self._map[key]
            del holders[block]
            if not holders:
                del self._map[key]
            self._keys[block] = None

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
        """Pop `count` blocks from the queue head, forgetting their keys; the caller has
        checked `count <= num_free`."""
        taken = []
        for _ in range(count):
            block = self._next[self._sentinel]
            self._unlink(block)
            self._forget(block)
            self.ref_count[block] = 1
            taken.append(block)
        return taken

    def release(self, blocks: Iterable[int]) -> int:
        """Drop one reference per listed block; blocks reaching 0 join the queue tail in the
        given order. Returns how many did."""
        ref = self.ref_count
        freed = 0
        for block in blocks:
            ref[block] -= 1
            if ref[block] == 0:
                self._append(block)
                freed += 1
        return freed

    def reset(self) -> None:
        """Forget every key (the caller has checked that nothing is held)."""
        self._map.clear()
        self._keys = [None] * self.num_blocks
