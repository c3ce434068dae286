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
(ALLOC-LOOKUP-1's choice among duplicates); later holders wait in registration order, and
the next serves the key when the served one goes. Keys, holders and that map live in a
KeyIndex (kvcert.reference.keyindex: compiled flat arrays, or dicts as the fallback); the
other per-block fields are arrays, so a pool of a million blocks costs about 59 bytes per
cached block (benchmarks/vs_vllm.py's memory row).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence

from kvcert.reference.config import Eviction, GroupConfig, as_choice
from kvcert.reference.errors import ConfigError
from kvcert.reference.events import Cleared, Event, Removed
from kvcert.reference.eviction import QUEUES, held_entries, per_block
from kvcert.reference.keyindex import KeyIndex
from kvcert.reference.refcounts import drop, hold, set_one

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
        "_dependents",
        "_missing",
        "_prereqs",
        "dead_evictions",
        "events",
        "evictions",
        "keys",
        "num_blocks",
        "num_free",
        "num_registered",
        "queue",
        "ref_count",
        "served",
        "tails",
        "tracking",
    )

    def __init__(
        self,
        num_blocks: int,
        eviction: Eviction = Eviction.LRU,
        num_groups: int = 1,
        *,
        track_liveness: bool = False,
        record_events: bool = False,
        tail_keys: bool = False,
    ) -> None:
        """Implements ALLOC-INIT-1: every block but the null one free, in ascending order."""
        check_pool_fits(num_blocks)
        eviction = as_choice(Eviction, eviction, "eviction")
        if eviction not in QUEUES:
            raise ConfigError(
                f"eviction {eviction.value!r} is the radix profile, SGLang's tree (spec §13), "
                "not a block pool's: build a kvcert.reference.radix.RadixCacheManager, or "
                "choose lru, hybrid or lru-unkeyed-first"
            )
        self.num_blocks = num_blocks
        # per block its count when held (1 or more), 0 or less when free: under lru the free
        # queue keeps there each free block's predecessor, negated (kvcert.reference.refcounts)
        self.ref_count = per_block("i", num_blocks)
        self.keys = KeyIndex(num_blocks, num_groups)  # per block its key, per group key -> block
        self.served = self.keys.served  # per group, read-only: key -> the block a lookup gets
        # `unit U` (kvcert.reference.tails): each block's tail key, a second key index
        self.tails = KeyIndex(num_blocks, num_groups) if tail_keys else None
        self.num_registered = 0
        self.evictions = [0] * num_groups  # registered blocks reused, per group
        self.dead_evictions = [0] * num_groups  # of which dead (see the module docstring)
        self.num_free = num_blocks - 1
        self.queue = QUEUES[eviction](self)
        self.tracking = track_liveness or self.queue.tracks_liveness
        # EVICT-DEAD-1, when tracked: each block's prerequisite keys, how many are missing,
        # and per key the blocks depending on it
        self._prereqs: list[tuple[Key, ...]] = [()] * num_blocks if self.tracking else []
        self._missing = per_block("i", num_blocks) if self.tracking else array("i")
        self._dependents: dict[Key, set[int]] = {}
        # evictions and resets, when recorded (the manager records registrations)
        self.events: list[Event] | None = [] if record_events else None

    @property
    def eviction(self) -> Eviction:
        """The eviction profile this pool's free queue follows."""
        return self.queue.profile

    @property
    def changes(self) -> int:
        """The key index's count of calls that could have changed a served map: while it
        stands still, so does every lookup's answer (kvcert.reference.hit_queries)."""
        return self.keys.changes

    # -- liveness (EVICT-DEAD-1) ------------------------------------------------------------

    def is_dead(self, block: int) -> bool:
        """Nothing a lookup could be served: unregistered, shadowed or missing a prerequisite.

        Implements EVICT-DEAD-1, a sound under-approximation of the blocks EVICT-LIVE-1 calls
        useless (tests/spec/test_eviction.py checks the spec's version of that claim)."""
        if self.tracking and self._missing[block]:
            return True
        return not self.keys.is_served(block)  # unregistered, or shadowed by an earlier copy

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
        return self.served[group].get(key, NULL_BLOCK) or None

    def register(
        self, block: int, group: int, key: bytes, prerequisites: tuple[Key, ...] = ()
    ) -> bool:
        """Make `block` hittable under `key` in `group` (a block carries at most one key); it
        stays useful only while every prerequisite key is held somewhere (EVICT-DEAD-1).
        Returns False when it was registered already."""
        holder = self.keys.bind(block, group, key)
        if holder < 0:
            return False
        self.num_registered += 1
        if not holder and self.tracking:  # a key appeared (else a copy: its holder serves)
            self._key_appeared((group, key))
        if self.tracking:
            self._prereqs[block] = prerequisites
            self._missing[block] = sum(1 for g, k in prerequisites if k not in self.served[g])
            for p in prerequisites:
                self._dependents.setdefault(p, set()).add(block)
        return True

    def register_run(self, group: int, blocks: Sequence[int], keys: Sequence[bytes]) -> int:
        """`register` for consecutive blocks of one group without prerequisites (the pool
        does not track liveness); NULL_BLOCK entries are skipped. Returns how many were
        given."""
        if self.tracking:
            raise ValueError("register_run is for pools that do not track liveness")
        self.num_registered += self.keys.bind_run(group, blocks, keys)
        return len(blocks) - blocks.count(NULL_BLOCK)

    def is_keyed(self, block: int) -> bool:
        """Whether `block` holds a key (a block key, or under `unit U` a tail key)."""
        return self.keys.key_of(block) is not None or (
            self.tails is not None and self.tails.key_of(block) is not None
        )

    def key_of(self, block: int) -> Key | None:
        """(group, key) `block` is registered under, if any."""
        key, group = self.keys.key_of(block), self.keys.group_of(block)
        return None if key is None or group is None else (group, key)

    def withdraw(self, block: int) -> None:
        """Take `block`'s key away without evicting it: the chunk that was to write its KV
        will not run (spec ALLOC-VIS-3); the caller has checked no other request holds it."""
        self._forget(block, evicted=False)

    def _forget(self, block: int, evicted: bool = True) -> None:
        keys = self.keys
        key, group = keys.key_of(block), keys.group_of(block)
        if key is None or group is None:
            return
        self.evictions[group] += evicted
        if self.events is not None:
            self.events.append(Removed(group, block, key))
        if self.tracking:
            if evicted and self.is_dead(block):
                self.dead_evictions[group] += 1
            for p in self._prereqs[block]:
                dependents = self._dependents[p]
                dependents.discard(block)
                if not dependents:
                    del self._dependents[p]
            self._prereqs[block] = ()
            self._missing[block] = 0
        served = keys.is_served(block)
        if evicted and not served and not self.tracking:
            self.dead_evictions[group] += 1  # a shadowed copy: dead without tracking too
        successor = keys.unbind(block)  # the next holder, if any, serves the key now
        self.num_registered -= 1
        if successor:
            self.queue.changed(successor)
        elif served and self.tracking:
            self._key_vanished((group, key))

    # -- reference counts -------------------------------------------------------------------

    def take(self, blocks: Iterable[int]) -> None:
        """Hold blocks found by a lookup; a free one leaves the queue (still registered)."""
        links = self.queue.links
        revived = hold(self.ref_count, blocks, links)  # with links: unlinked in the same pass
        if links is None:
            for block in revived:
                self.queue.remove(block)
        self.num_free -= len(revived)

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks as the profile orders them, forgetting their keys; the caller
        has checked `count <= num_free`."""
        ref = self.ref_count
        if self.queue.tracks_liveness:  # a forgotten key may change the next victim
            taken = []
            for _ in range(count):
                block = self.queue.pop()
                self._forget(block)
                ref[block] = 1  # held before the next pop, which must not see it free
                taken.append(block)
        else:  # the victims do not depend on keys: one run off the queue, then forget
            taken = self.queue.pop_many(count)
            if self.tracking or self.events is not None:
                for block in taken:
                    self._forget(block)
            else:  # nothing tracked: _forget for the whole run in one call
                self.num_registered -= self.keys.forget_run(
                    taken, self.evictions, self.dead_evictions
                )
            set_one(ref, taken)
        if self.tails is not None:  # a block handed out holds nothing: its tail key goes too
            self.tails.forget_run(taken, [0] * len(self.served), [0] * len(self.served))
        self.num_free -= count
        self.queue.compact()
        return taken

    def release(self, blocks: Iterable[int], cold: bool = False) -> int:
        """Drop one reference per listed block; blocks reaching 0 join the free queue as the
        profile places them (`cold`: released mid-request). Returns how many reached 0."""
        freed = drop(self.ref_count, blocks)
        self.num_free += len(freed)
        self.queue.add(freed, cold)
        return len(freed)

    def release_request(
        self, groups: Sequence[GroupConfig], tables: Sequence[list[int]], lows: Sequence[int]
    ) -> int:
        """`release` of a whole request (table g holds blocks from position lows[g] on) in
        the order its profile lists them (ALLOC-FREE-1, ALLOC-FREE-2, EVICT-ORDER-1); under
        lru in one pass. Returns how many reached 0."""
        freed = self.queue.release_in_table_order(tables, lows)
        if freed is None:
            batches = self.queue.release_batches(groups, held_entries(tables, lows))
            return sum(self.release(batch) for batch in batches)
        self.num_free += freed
        return freed

    def count(self, block: int) -> int:
        """How many hold `block` (0: it is free, or the null block)."""
        return max(self.ref_count[block], 0)

    def free_queue(self) -> Iterator[int]:
        """The free queue in joining order, from the oldest to the most recently freed block
        (under lru also the eviction order)."""
        return iter(self.queue)

    def reset(self) -> None:
        """Forget every key (the caller has checked that nothing is held)."""
        self.keys.clear()
        if self.tails is not None:
            self.tails.clear()
        if self.events is not None:
            self.events.append(Cleared())
        self._dependents.clear()
        self.num_registered = 0
        if self.tracking:
            self._prereqs = [()] * self.num_blocks
            self._missing = per_block("i", self.num_blocks)
        self.queue.reset()
