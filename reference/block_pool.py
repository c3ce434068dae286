"""The block pool: reference counts, the key map, liveness, and a free queue per profile.

Implements ALLOC-INIT-1, ALLOC-LOOKUP-1 and the pool side of ALLOC-TWO-PHASE-1 and
EVICT-DEAD-1; which free block an allocation takes, and where released blocks go, is the
eviction profile's (kvcert.reference.eviction, one class per profile).

Liveness (EVICT-DEAD-1) is tracked when the profile needs it (hybrid) or when asked (the
manager passes prerequisite keys to count dead evictions under lru): a registered block is
dead when it is not the first holder of its key or when one of its prerequisite keys (the
full-attention keys every hit through it needs) is held by no block. Per key, the blocks
depending on it are indexed, so a key appearing or disappearing reclassifies exactly its
dependents: O(1) per pool operation plus O(d) for the d dependents of that key.

Per group, `served` maps each key to the block a lookup gets: the earliest registered holder
(ALLOC-LOOKUP-1's choice among duplicates); later holders wait in `_copies`, in registration
order, and the next is promoted when the served one goes. Per-block fields are arrays, so a
pool of a million blocks costs a few bytes per block plus its registered keys.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence

from kvcert.reference.config import Eviction
from kvcert.reference.errors import ConfigError
from kvcert.reference.eviction import QUEUES

NULL_BLOCK = 0

Key = tuple[int, bytes]  # (group index, digest): how liveness names a key
# Bookkeeping a new pool allocates per block, measured with tracemalloc (tests/reference keep
# it an upper bound); registered keys add more as the cache fills.
BYTES_PER_BLOCK = 240


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 when the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_pool_fits(num_blocks: int) -> None:
    """Refuse, before allocating anything, a pool whose bookkeeping exceeds this machine's RAM
    (a MemoryError after seconds of swapping helps nobody)."""
    needed, available = num_blocks * BYTES_PER_BLOCK, physical_memory()
    if available and needed > available:
        raise ConfigError(
            f"num_blocks={num_blocks:,} needs about {needed / 2**30:,.1f} GiB of pool "
            f"bookkeeping ({BYTES_PER_BLOCK} B per block) but this machine has "
            f"{available / 2**30:,.1f} GiB; use the num_blocks of the engine's KV-cache plan"
        )


class BlockPool:
    """`num_blocks` physical blocks; block 0 is the null block and is never handed out."""

    __slots__ = (
        "_copies",
        "_dependents",
        "_group",
        "_key",
        "_missing",
        "_prereqs",
        "dead_evictions",
        "evictions",
        "num_blocks",
        "num_free",
        "num_registered",
        "queue",
        "ref_count",
        "served",
        "tracking",
    )

    def __init__(
        self,
        num_blocks: int,
        eviction: Eviction = Eviction.LRU,
        num_groups: int = 1,
        *,
        track_liveness: bool = False,
    ) -> None:
        """Implements ALLOC-INIT-1: every block but the null one free, in ascending order."""
        check_pool_fits(num_blocks)
        self.num_blocks = num_blocks
        self.ref_count = array("i", bytes(4 * num_blocks))
        self._key: list[bytes | None] = [None] * num_blocks  # the digest a block is under
        self._group = array("H", bytes(2 * num_blocks))  # and its group
        self.served: list[dict[bytes, int]] = [{} for _ in range(num_groups)]  # key -> block
        self._copies: dict[Key, list[int]] = {}  # later holders of a served key, in order
        self.num_registered = 0
        self.evictions = [0] * num_groups  # registered blocks reused, per group
        self.dead_evictions = [0] * num_groups  # of which dead (see the module docstring)
        self.num_free = num_blocks - 1
        self.queue = QUEUES[eviction](self)
        self.tracking = track_liveness or self.queue.tracks_liveness
        # EVICT-DEAD-1, when tracked: each block's prerequisite keys, how many are missing,
        # and per key the blocks depending on it
        self._prereqs: list[tuple[Key, ...]] = [()] * num_blocks if self.tracking else []
        self._missing = array("i", bytes(4 * num_blocks)) if self.tracking else array("i")
        self._dependents: dict[Key, set[int]] = {}

    @property
    def eviction(self) -> Eviction:
        """The eviction profile this pool's free queue follows."""
        return self.queue.profile

    # -- liveness (EVICT-DEAD-1) ------------------------------------------------------------

    def is_dead(self, block: int) -> bool:
        """Nothing a lookup could be served: unregistered, shadowed or missing a prerequisite.

        Implements EVICT-DEAD-1, a sound under-approximation of the blocks EVICT-LIVE-1 calls
        useless (tests/spec/test_eviction.py checks the spec's version of that claim)."""
        key = self._key[block]
        if key is None or (self.tracking and self._missing[block]):
            return True
        return self.served[self._group[block]][key] != block

    def _key_appeared(self, key: Key) -> None:
        for block in self._dependents.get(key, ()):
            self._missing[block] -= 1
            self.queue.changed(block)

    def _key_vanished(self, key: Key) -> None:
        for block in self._dependents.get(key, ()):
            self._missing[block] += 1
            self.queue.changed(block)

    # -- keys ---------------------------------------------------------------------------------

    def lookup(self, group: int, key: bytes) -> int | None:
        """The earliest registered block holding `key` in `group`, or None. Implements
        ALLOC-LOOKUP-1."""
        return self.served[group].get(key)

    def register(
        self, block: int, group: int, key: bytes, prerequisites: tuple[Key, ...] = ()
    ) -> None:
        """Make `block` hittable under `key` in `group` (a block carries at most one key); it
        stays useful only while every prerequisite key is held somewhere (EVICT-DEAD-1)."""
        if self._key[block] == key and self._group[block] == group:
            return  # registered already
        self._key[block] = key
        self._group[block] = group
        self.num_registered += 1
        served = self.served[group]
        if key in served:
            self._copies.setdefault((group, key), []).append(block)
        else:
            served[key] = block
            if self.tracking:
                self._key_appeared((group, key))
        if self.tracking:
            self._prereqs[block] = prerequisites
            self._missing[block] = sum(1 for g, k in prerequisites if k not in self.served[g])
            for p in prerequisites:
                self._dependents.setdefault(p, set()).add(block)

    def register_run(self, group: int, blocks: Sequence[int], keys: Sequence[bytes]) -> int:
        """`register` for consecutive blocks of one group without prerequisites (the pool
        does not track liveness); NULL_BLOCK entries are skipped. Returns how many were
        given."""
        if self.tracking:
            raise ValueError("register_run is for pools that do not track liveness")
        served = self.served[group]
        block_key, block_group = self._key, self._group
        nulls = fresh = 0
        for block, key in zip(blocks, keys, strict=True):
            if block == NULL_BLOCK:
                nulls += 1
            elif block_key[block] != key or block_group[block] != group:  # else registered
                block_key[block] = key
                block_group[block] = group
                fresh += 1
                if key in served:  # served by an earlier holder
                    self._copies.setdefault((group, key), []).append(block)
                else:
                    served[key] = block
        self.num_registered += fresh
        return len(blocks) - nulls

    def key_of(self, block: int) -> Key | None:
        """(group, key) `block` is registered under, if any."""
        key = self._key[block]
        return None if key is None else (self._group[block], key)

    def _forget(self, block: int) -> None:
        key = self._key[block]
        if key is None:
            return
        group = self._group[block]
        self.evictions[group] += 1
        if self.tracking:
            if self.is_dead(block):
                self.dead_evictions[group] += 1
            for p in self._prereqs[block]:
                dependents = self._dependents[p]
                dependents.discard(block)
                if not dependents:
                    del self._dependents[p]
            self._prereqs[block] = ()
            self._missing[block] = 0
        elif self.served[group][key] != block:
            self.dead_evictions[group] += 1  # a shadowed copy: dead without tracking too
        self._key[block] = None
        self.num_registered -= 1
        served = self.served[group]
        copies = self._copies.get((group, key))
        if served[key] != block:  # a later copy goes (so it is listed)
            copies = self._copies[(group, key)]
            copies.remove(block)
            if not copies:
                del self._copies[(group, key)]
        elif copies:  # the next copy is served now
            served[key] = copies.pop(0)
            if not copies:
                del self._copies[(group, key)]
            self.queue.changed(served[key])
        else:
            del served[key]
            if self.tracking:
                self._key_vanished((group, key))

    # -- reference counts -------------------------------------------------------------------

    def take(self, blocks: Iterable[int]) -> None:
        """Hold blocks found by a lookup; a free one leaves the queue (still registered)."""
        ref = self.ref_count
        for block in blocks:
            if ref[block] == 0:
                self.queue.remove(block)
                self.num_free -= 1
            ref[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks as the profile orders them, forgetting their keys; the caller
        has checked `count <= num_free`."""
        keys, ref = self._key, self.ref_count
        if self.queue.tracks_liveness:  # a forgotten key may change the next victim
            taken = []
            for _ in range(count):
                block = self.queue.pop()
                self._forget(block)
                ref[block] = 1  # held before the next pop, which must not see it free
                taken.append(block)
        else:  # the victims do not depend on keys: one run off the queue, then forget
            taken = self.queue.pop_many(count)
            if self.tracking or self._copies:
                for block in taken:
                    self._forget(block)
            else:  # _forget's common case inlined: one holder per key, nothing tracked
                served, groups, evictions = self.served, self._group, self.evictions
                for block in taken:
                    key = keys[block]
                    if key is not None:
                        group = groups[block]
                        del served[group][key]
                        evictions[group] += 1
                        keys[block] = None
                        self.num_registered -= 1
            for block in taken:
                ref[block] = 1
        self.num_free -= count
        self.queue.compact()
        return taken

    def release(self, blocks: Iterable[int], cold: bool = False) -> int:
        """Drop one reference per listed block; blocks reaching 0 join the free queue as the
        profile places them (`cold`: released mid-request). Returns how many reached 0."""
        ref = self.ref_count
        freed = []
        for block in blocks:
            count = ref[block] - 1
            ref[block] = count
            if not count:
                freed.append(block)
        self.num_free += len(freed)
        self.queue.add(freed, cold)
        return len(freed)

    def free_queue(self) -> Iterator[int]:
        """The free queue in joining order, from the oldest to the most recently freed block
        (under lru also the eviction order)."""
        return iter(self.queue)

    def reset(self) -> None:
        """Forget every key (the caller has checked that nothing is held)."""
        for served in self.served:
            served.clear()
        self._copies.clear()
        self._dependents.clear()
        self._key = [None] * self.num_blocks
        self.num_registered = 0
        if self.tracking:
            self._prereqs = [()] * self.num_blocks
            self._missing = array("i", bytes(4 * self.num_blocks))
        self.queue.reset()
