"""vLLM's block objects over kvcert's pool, and the free queue and hash map vLLM's tests read.

vLLM's tests read fields of the `KVCacheBlock` objects a manager hands out (its reference
count, its block hash, how many tokens that hash covers, its neighbours in the free queue)
and two structures of vLLM's block pool (the free queue, the hash-to-block map). Here each is
computed from the reference allocator's state when read, never stored beside it, so a test
reading one judges kvcert's pool. Block hashes are vLLM's (`BlockHashWithGroupId`), which
kvcert does not key by: only the hash view (`Settings.vllm_hash_view`) names them, so without
it reading one is refused with a typed error rather than answered with a kvcert key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id

from kvcert.reference.vllm.layout import IntegrationError

if TYPE_CHECKING:
    from kvcert.reference.vllm.manager import KVCacheManager


def _held_key(owner: KVCacheManager, block: int) -> tuple[int, bytes] | None:
    """(group, digest) `block` is registered under once the steps in flight end (vLLM keys
    and moves keys as it schedules a chunk, so its fields show them already): the key its
    chunk registers then or a tail key moving to it (ALLOC-UNIT-4; None for the block it
    leaves), else its block key, else (`unit U`) its tail key; None when it holds none."""
    after = owner.core.keys_after_steps()
    if block in after:
        return after[block]
    pool = owner.core.pool
    found = pool.key_of(block)
    if found is None and pool.tails is not None:
        key, group = pool.tails.key_of(block), pool.tails.group_of(block)
        found = None if key is None or group is None else (group, key)
    return found


class PoolBlock(KVCacheBlock):  # type: ignore[misc]
    """One of vLLM's block objects whose fields read kvcert's pool: `ref_cnt` the table
    entries and copies holding it (INV-REF-1), `block_hash` vLLM's hash (with group) of the
    tokens its key certifies and `block_hash_num_tokens` how many (a whole block, or under
    `unit U` a tail; a key the block's chunk in flight registers counts), None for an
    unkeyed block; `prev_free_block` / `next_free_block` its
    neighbours in the free queue (None while held). Read-only: vLLM's own pool sets these,
    kvcert's never does."""

    __slots__ = ("_owner",)

    def __init__(self, owner: KVCacheManager, block_id: int) -> None:
        self._owner = owner
        # vLLM's own fields (slots of KVCacheBlock, which mypy sees as Any here)
        self.block_id = block_id  # type: ignore[misc]
        self.pool = None  # type: ignore[misc]
        self.is_null = block_id == 0  # type: ignore[misc]

    @property
    def ref_cnt(self) -> int:
        return self._owner.core.pool.count(self.block_id)

    def _named(self) -> tuple[Any, int] | None:
        held = _held_key(self._owner, self.block_id)
        if held is None:
            return None
        view = self._owner.hash_view
        if view is None:
            raise IntegrationError(
                "a block's block_hash is vLLM's hash, which kvcert does not key by: turn "
                "KVCERT_VLLM_HASH_VIEW=on (Settings.vllm_hash_view) to let the manager name it"
            )
        group, digest = held
        named = view.named(digest)
        if named is None:
            raise IntegrationError(
                f"block {self.block_id} is cached under a key no request allocated through "
                "this manager names, so vLLM's hash for it is unknown"
            )
        block_hash, tokens = named
        return make_block_hash_with_group_id(block_hash, group), tokens

    @property
    def _block_hash(self) -> Any:
        named = self._named()
        return None if named is None else named[0]

    @property
    def _block_hash_num_tokens(self) -> int | None:
        named = self._named()
        return None if named is None else named[1]

    @property
    def prev_free_block(self) -> Any:
        return self._owner.block_pool.free_block_queue.neighbour(self.block_id, -1)

    @property
    def next_free_block(self) -> Any:
        return self._owner.block_pool.free_block_queue.neighbour(self.block_id, 1)

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = None  # type: ignore[assignment]  # as vLLM's: blocks are mutable

    def __repr__(self) -> str:
        return f"PoolBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class _End:
    """A free-list sentinel of vLLM's queue: the head's next is the first free block, the
    tail's previous the last."""

    def __init__(self, queue: FreeQueueView, head: bool) -> None:
        self._queue = queue
        self._head = head

    @property
    def next_free_block(self) -> Any:
        return self._queue.end(first=True) if self._head else None

    @property
    def prev_free_block(self) -> Any:
        return None if self._head else self._queue.end(first=False)


class FreeQueueView:
    """vLLM's `free_block_queue` over kvcert's free queue: its count, its blocks in queue
    order (the order blocks are taken in under lru and lru-unkeyed-first; under hybrid
    EVICT-HYB-1 picks within it) and its two sentinels."""

    def __init__(self, owner: KVCacheManager) -> None:
        self._owner = owner
        self.fake_free_list_head = _End(self, head=True)
        self.fake_free_list_tail = _End(self, head=False)

    @property
    def num_free_blocks(self) -> int:
        return int(self._owner.core.pool.num_free)

    def _order(self) -> list[int]:
        return list(self._owner.core.pool.free_queue())

    def get_all_free_blocks(self) -> list[Any]:
        blocks = self._owner.blocks
        return [blocks[b] for b in self._order()]

    def end(self, first: bool) -> Any:
        order = self._order()
        if not order:
            return self.fake_free_list_tail if first else self.fake_free_list_head
        return self._owner.blocks[order[0] if first else order[-1]]

    def neighbour(self, block: int, step: int) -> Any:
        """The free block before (step -1) or after (+1) `block` in the queue, a sentinel at
        either end; None when `block` is not free."""
        order = self._order()
        if block not in order:
            return None
        i = order.index(block) + step
        if i < 0:
            return self.fake_free_list_head
        if i >= len(order):
            return self.fake_free_list_tail
        return self._owner.blocks[order[i]]


class CachedHashesView:
    """vLLM's `cached_block_hash_to_block` as its tests read it: how many (hash, group) keys
    are cached (kvcert's served keys, tail keys included), and whether any is."""

    def __init__(self, owner: KVCacheManager) -> None:
        self._owner = owner

    def __len__(self) -> int:
        pool = self._owner.core.pool
        maps = [*pool.served, *(pool.tails.served if pool.tails is not None else ())]
        return sum(len(m) for m in maps)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Any]:
        raise IntegrationError(
            "cached_block_hash_to_block lists vLLM's hashes, which kvcert does not key by; "
            "its length and truth are kvcert's cached keys (use get_cached_block for one hash)"
        )
