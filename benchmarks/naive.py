"""A naive allocator with the reference's semantics, as a baseline for the benchmarks.

It is what one writes first: a Python list as the free queue (O(n) removal on a hit, O(n)
pop from the front), a hit search that tries every length from the limit down and checks
every needed block of every group, and a separate digest chain per group. It reuses the
reference manager's bookkeeping, so both compute the same answers (the benchmark checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvcert.reference.block_pool import NULL_BLOCK, Key
from kvcert.reference.config import CacheConfig, DraftKeying, Kind, MambaMode
from kvcert.reference.groups import first_needed
from kvcert.reference.hashing import Chain, ExtraKey
from kvcert.reference.manager import KVCacheManager


class ListBlockPool:
    """Same interface as BlockPool, with a list for the free queue."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        self.queue = list(range(1, num_blocks))
        self.keys: list[Key | None] = [None] * num_blocks
        self.map: dict[Key, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self.queue)

    @property
    def num_registered(self) -> int:
        return sum(len(v) for v in self.map.values())

    def free_queue(self) -> Iterable[int]:
        return iter(self.queue)

    def lookup(self, key: Key) -> int | None:
        holders = self.map.get(key)
        return holders[0] if holders else None

    def register(self, block: int, key: Key, prerequisites: tuple[Key, ...] = ()) -> None:
        self.keys[block] = key
        self.map.setdefault(key, []).append(block)

    def key_of(self, block: int) -> Key | None:
        return self.keys[block]

    def take(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            if self.ref_count[block] == 0:
                self.queue.remove(block)
            self.ref_count[block] += 1

    def allocate(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            block = self.queue.pop(0)
            key = self.keys[block]
            if key is not None:
                self.map[key].remove(block)
                if not self.map[key]:
                    del self.map[key]
                self.keys[block] = None
            self.ref_count[block] = 1
            taken.append(block)
        return taken

    def release(self, blocks: Iterable[int], cold: bool = False) -> int:
        freed = 0
        for block in blocks:
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.queue.append(block)
                freed += 1
        return freed

    def reset(self) -> None:
        self.map.clear()
        self.keys = [None] * self.num_blocks


def scan_every_length(
    config: CacheConfig, num_tokens: int, find: Callable[[int, int], int | None]
) -> tuple[int, list[list[int]]]:
    """The definition run literally: every length from the limit down, every needed block."""

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
        self.pool = ListBlockPool(config.num_blocks)  # type: ignore[assignment]

    def _chains(self, tokens: Sequence[int], extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        chains: list[Chain | None] = []
        for group, shifted in zip(self.config.groups, self._shifted, strict=True):
            if group.kind is Kind.CROSS:
                chains.append(None)
                continue
            chain = Chain(group.block_size, 1 if shifted else 0, extras, self._digest)
            chain.extend(tokens)
            chains.append(chain)
        return chains
