"""A naive allocator with the reference's semantics, as a baseline for the benchmarks.

It is what one writes first: a Python list as the free queue (O(n) removal on a hit, O(n)
pop from the front), a hit search that tries every length from the limit down and checks
every needed block of every group, and a separate digest chain per group. It reuses the
reference manager's bookkeeping, so both compute the same answers (the benchmark checks).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from kvcert.reference.block_pool import NULL_BLOCK, Key
from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.coordinator import K, Keys, Served
from kvcert.reference.eviction import FreeQueue, held_entries
from kvcert.reference.groups import first_needed
from kvcert.reference.hashing import Chain, ExtraKey
from kvcert.reference.lookup import Keying
from kvcert.reference.manager import KVCacheManager


class ListBlockPool:
    """Same interface as BlockPool, with a list for the free queue."""

    tracking = False
    events = None  # the naive baseline records no events

    def __init__(self, num_blocks: int, num_groups: int, order: FreeQueue) -> None:
        self.num_blocks = num_blocks
        self.ref_count = array("i", [0]) * num_blocks  # as BlockPool's: the manager reads it
        self.free = list(range(1, num_blocks))
        self.keys: list[tuple[int, bytes] | None] = [None] * num_blocks
        self.holders: list[dict[bytes, list[int]]] = [{} for _ in range(num_groups)]
        self.served: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self.queue = order  # only its release order is used (lru's: ALLOC-FREE-1)
        self.changes = 0  # as BlockPool's: calls that changed a served map

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_registered(self) -> int:
        return sum(len(v) for group in self.holders for v in group.values())

    def free_queue(self) -> Iterable[int]:
        return iter(self.free)

    def lookup(self, group: int, key: bytes) -> int | None:
        return self.served[group].get(key)

    def register(
        self, block: int, group: int, key: bytes, prerequisites: tuple[Key, ...] = ()
    ) -> None:
        self.changes += 1
        self.keys[block] = (group, key)
        holders = self.holders[group].setdefault(key, [])
        holders.append(block)
        self.served[group][key] = holders[0]

    def register_run(self, group: int, blocks: list[int], keys: list[bytes]) -> int:
        given = [(b, k) for b, k in zip(blocks, keys, strict=True) if b != NULL_BLOCK]
        for block, key in given:
            self.register(block, group, key)
        return len(given)

    def key_of(self, block: int) -> Key | None:
        return self.keys[block]

    def take(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            if self.ref_count[block] == 0:
                self.free.remove(block)
            self.ref_count[block] += 1

    def allocate(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            block = self.free.pop(0)
            key = self.keys[block]
            if key is not None:
                self.changes += 1
                group, digest = key
                holders = self.holders[group][digest]
                holders.remove(block)
                if holders:
                    self.served[group][digest] = holders[0]
                else:
                    del self.holders[group][digest], self.served[group][digest]
                self.keys[block] = None
            self.ref_count[block] = 1
            taken.append(block)
        return taken

    def release(self, blocks: Iterable[int], cold: bool = False) -> int:
        freed = 0
        for block in blocks:
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free.append(block)
                freed += 1
        return freed

    def release_request(
        self, groups: Sequence[GroupConfig], tables: Sequence[list[int]], lows: Sequence[int]
    ) -> int:
        held = held_entries(tables, lows)  # in the profile's order, one block at a time
        return sum(self.release(batch) for batch in self.queue.release_batches(groups, held))

    def reset(self) -> None:
        self.changes += 1
        for group in self.holders:
            group.clear()
        for served in self.served:
            served.clear()
        self.keys = [None] * self.num_blocks


def scan_every_length(
    config: CacheConfig, num_tokens: int, keys: Keys[K], served: Served[K], **_: object
) -> tuple[int, list[list[int]]]:
    """The definition run literally: every length from the limit down, every needed block."""

    def find(g: int, j: int) -> int | None:
        return served[g].get(keys[g][j]) if j < len(keys[g]) else None

    def accepts(length: int) -> bool:
        for g, group in enumerate(config.groups):
            if group.kind is Kind.CROSS:
                continue
            if group.kind is Kind.MAMBA and group.mode is MambaMode.NONE and length:
                return False
            if length % group.block_size:
                return False
            for j in range(first_needed(group, length), length // group.block_size):
                if find(g, j) is None:
                    return False
        return True

    common = [n for n in range(num_tokens - 1, -1, -1) if accepts(n)]
    hit = common[0]
    if config.speculative is DraftKeying.DROP and hit:
        hit = common[1]
    tables = []
    for g, group in enumerate(config.groups):
        if group.kind is Kind.CROSS:
            tables.append([])
            continue
        count = hit // group.block_size
        start = first_needed(group, hit) if count else 0
        tables.append(
            [NULL_BLOCK] * start + [find(g, j) or NULL_BLOCK for j in range(start, count)]
        )
    return hit, tables


class NaiveManager(KVCacheManager):
    """The reference's bookkeeping over naive structures and a naive search."""

    search = staticmethod(scan_every_length)

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        groups = len(config.groups)
        self.pool = ListBlockPool(config.num_blocks, groups, self.pool.queue)  # type: ignore[assignment]
        self._lane = None  # the compiled decode lane works on the pool replaced here
        keying = self._keying
        self._keying = NaiveKeying(config, keying.digest, keying.lookahead)


class NaiveKeying(Keying):
    def chains(self, extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        """One chain per group at its own block size: no digest is shared."""
        chains: list[Chain | None] = []
        for group, lookahead in zip(self.config.groups, self.lookahead, strict=True):
            if group.kind is Kind.CROSS:
                chains.append(None)
                continue
            chains.append(Chain(group.block_size, lookahead, extras, self.digest))
        return chains
