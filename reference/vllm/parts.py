"""The parts of vLLM's KVCacheManager its scheduler and tests read, over kvcert's state.

vLLM's scheduler reads a few attributes of the manager's coordinator, its per-group managers
and its block pool; vLLM's tests read more. Each is a read-only view computed from the
reference allocator's state (no second bookkeeping) with vLLM's meaning, so a test that reads
it judges kvcert's tables, checkpoints and hits. What has no kvcert meaning is absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvcert.reference.config import Kind, Retention, hit_alignment
from kvcert.reference.retention import BOUNDED
from kvcert.reference.vllm.blocks import CachedHashesView, FreeQueueView
from kvcert.reference.vllm.extras import request_extras
from kvcert.reference.vllm.layout import IntegrationError

if TYPE_CHECKING:
    from kvcert.reference.vllm.manager import KVCacheManager


class TablesView(Mapping[str, list[Any]]):
    """One group's `req_to_blocks` as vLLM's tests read it, computed from kvcert's tables: a
    running request's table as vLLM's block objects (the null block where kvcert holds none);
    a request that holds nothing reads as an empty table, as vLLM's defaultdict does."""

    def __init__(self, owner: KVCacheManager, group: int) -> None:
        self._owner = owner
        self._group = group

    def __getitem__(self, rid: str) -> list[Any]:
        core = self._owner.core
        if not core.is_running(rid):
            return []
        blocks = self._owner.blocks
        return [blocks[b] for b in core.block_tables(rid)[self._group]]

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._owner.core.is_running(rid)

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner.core.running())

    def __len__(self) -> int:
        return len(self._owner.core.running())


class CheckpointsView(Mapping[str, tuple[int, int]]):
    """A state group's `_checkpoints` as vLLM's tests read it: per request whose latest
    scheduled chunk reserves an inner checkpoint (CKPT-INNER-1, -2), its position and the
    table column holding it. vLLM keeps an entry until the request's next allocation; kvcert's
    ends with the step that writes the checkpoint."""

    def __init__(self, owner: KVCacheManager, group: int) -> None:
        self._owner = owner
        self._group = group

    def _latest(self, rid: object) -> int:
        return self._owner.reserved_inner_checkpoint(rid) if isinstance(rid, str) else 0

    def __getitem__(self, rid: str) -> tuple[int, int]:
        position = self._latest(rid)
        if not position:
            raise KeyError(rid)
        return position, self._owner.core.checkpoint_position(rid, self._group, position)

    def __iter__(self) -> Iterator[str]:
        return (rid for rid in self._owner.core.running() if self._latest(rid))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class CachedCountView(Mapping[str, int]):
    """One group's `num_cached_block` as vLLM's tests read it: per running request that has
    had any, how many leading blocks of its table were considered for caching (registered,
    or passed over by retention), computed from kvcert's request state."""

    def __init__(self, owner: KVCacheManager, group: int) -> None:
        self._owner = owner
        self._group = group

    def _count(self, rid: object) -> int:
        core = self._owner.core
        if not isinstance(rid, str) or not core.is_running(rid):
            return 0
        return core.considered_positions(rid, self._group)

    def __getitem__(self, rid: str) -> int:
        count = self._count(rid)
        if not count:
            raise KeyError(rid)
        return count

    def __iter__(self) -> Iterator[str]:
        return (rid for rid in self._owner.core.running() if self._count(rid))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class GroupView:
    """What vLLM's scheduler and tests read of a per-group manager: its block size and spec,
    and read-only views of kvcert's state under vLLM's names (the hit alignment, the tables,
    the blocks considered for caching, a state group's reserved inner checkpoints)."""

    retains_longer_hit = False

    def __init__(self, owner: KVCacheManager, index: int, group: Any) -> None:
        self._owner = owner
        self.kv_cache_group_id = index
        self.kv_cache_spec = group.kv_cache_spec
        self.block_size = group.kv_cache_spec.block_size
        self.req_to_blocks = TablesView(owner, index)
        self.num_cached_block = CachedCountView(owner, index)
        self._null_block = owner.blocks[0]  # the object tables hold where nothing is held
        if owner.core.config.groups[index].kind is Kind.MAMBA:
            self._checkpoints = CheckpointsView(owner, index)

    @property
    def cache_hit_alignment_tokens(self) -> int:
        """Every hit is a multiple of this many tokens (kvcert hits whole blocks of every
        group, HIT-HYB-1: the lcm of the block sizes)."""
        return self._owner.core.config.alignment


class CoordinatorView:
    """The part of vLLM's coordinator its scheduler reads directly, and the retention
    interval vLLM's tests read and set."""

    eagle_group_ids: tuple[int, ...] = ()

    def __init__(self, owner: KVCacheManager, groups: Sequence[Any]) -> None:
        self._owner = owner
        self.single_type_managers = [GroupView(owner, i, g) for i, g in enumerate(groups)]
        config = owner.kv_cache_config  # the interval vLLM was given, where it changes nothing
        self._given = getattr(config, "prefix_cache_retention_interval", None)

    @property
    def enable_partial_hash_hits(self) -> bool:
        """Whether hits may end inside a block (`unit U`): vLLM's scheduler then ends a
        prefill chunk at the prompt's last unit boundary, where ALLOC-UNIT-2 keys a state
        group's tail."""
        return self._owner.core.config.hit_unit is not None

    @property
    def scheduler_block_size(self) -> int:
        """The lcm of the groups' block sizes: where vLLM's scheduler ends a state group's
        chunks, and every whole-block hit ends (HIT-HYB-1)."""
        return hit_alignment(self._owner.core.config.groups)

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Every hit is a multiple of this many tokens: the lcm above, or U under `unit U`
        (HIT-UNIT-1); what vLLM's workers place state checkpoints on."""
        return self._owner.core.config.alignment

    @property
    def retention_interval(self) -> int | None:
        """The retention profile in vLLM's terms: None dense, else sparse retention's
        interval (0: only the blocks a replay or a junction needs). Without a window,
        chunked local or state group both profiles keep every block, and the interval reads
        back as vLLM was given it (vLLM ignores it there too)."""
        config = self._owner.core.config
        if not any(g.kind in BOUNDED for g in config.groups):
            return self._given
        return None if config.retention is Retention.DENSE else config.retention_interval

    @retention_interval.setter
    def retention_interval(self, interval: int | None) -> None:
        self._owner.set_retention_interval(interval)
        self._given = interval

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, **_: Any) -> int:
        """Free blocks the running request still needs to hold `num_tokens` tokens (the
        scheduler's reservation for in-flight prefills)."""
        core = self._owner.core
        return core.blocks_to_reach(request_id, num_tokens) if core.is_running(request_id) else 0


class UnitaryKVCacheCoordinator(CoordinatorView):
    """The view of a model with one KV-cache group, under vLLM's name for its coordinator."""


class HybridKVCacheCoordinator(CoordinatorView):
    """The view of a model with several KV-cache groups, under vLLM's name for its
    coordinator."""


class KVCacheCoordinatorNoPrefixCache(CoordinatorView):
    """The view with prefix caching off, under vLLM's name for its coordinator."""


def coordinator_view(owner: KVCacheManager, groups: Sequence[Any]) -> CoordinatorView:
    """The coordinator view, of the class vLLM would build for the same model and caching
    flag (tests read the class's name to see which coordinator runs)."""
    if not owner.enable_caching:
        return KVCacheCoordinatorNoPrefixCache(owner, groups)
    if len(groups) == 1:
        return UnitaryKVCacheCoordinator(owner, groups)
    return HybridKVCacheCoordinator(owner, groups)


class PoolView:
    """The part of vLLM's block pool its scheduler reads directly (free counts, the deferred
    release of blocks `pop_blocks_for_free` handed out) and what vLLM's tests read: the
    block objects, the free queue, the cached keys, the KV events not taken yet, the cached
    blocks for one of vLLM's block hashes (kvcert.reference.vllm.blocks)."""

    def __init__(self, owner: KVCacheManager) -> None:
        self._owner = owner
        self.num_gpu_blocks = owner.core.config.num_blocks
        self.hash_block_size = owner.hash_block_size
        self.null_block = owner.blocks[0]
        self.enable_caching = owner.enable_caching
        self.blocks = owner.blocks
        self.free_block_queue = FreeQueueView(owner)
        self.cached_block_hash_to_block = CachedHashesView(owner)

    @property
    def kv_event_queue(self) -> tuple[Any, ...]:
        """The KV events `take_events` has not handed out yet (read-only)."""
        return tuple(self._owner.pending_events())

    def get_num_free_blocks(self) -> int:
        return self._owner.core.pool.num_free

    def get_usage(self) -> float:
        usable = self.num_gpu_blocks - 1  # the null block is never handed out
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0

    def get_cached_block(
        self, block_hash: Any, kv_cache_group_ids: Sequence[int]
    ) -> list[Any] | None:
        """Per group, the block kvcert's cache serves for the tokens vLLM's `block_hash`
        names, or None when any group has none (vLLM's meaning); needs
        `Settings.vllm_hash_view`, which remembers what each hash names."""
        view = self._owner.hash_view
        if view is None:
            raise IntegrationError(
                "get_cached_block reads vLLM's block hashes, which kvcert does not key by: "
                "turn KVCERT_VLLM_HASH_VIEW=on (Settings.vllm_hash_view) to let the manager "
                "remember what each hash names"
            )
        return view.blocks(self._owner, block_hash, kv_cache_group_ids)

    def free_blocks(self, blocks: Iterable[Any]) -> None:
        """Release what `pop_blocks_for_free` handed out (and nothing else)."""
        self._owner.release_popped(block.block_id for block in blocks)


class HashView:
    """What each of vLLM's block hashes names (the request it was computed for and the
    tokens it covers), so that `get_cached_block` can answer with kvcert's cache, which does
    not key by vLLM's hashes. Costs a dict entry per hashed block and keeps those requests
    alive: turned on for vLLM's tests (`Settings.vllm_hash_view`), off in production."""

    def __init__(self, hash_block_size: int) -> None:
        self._size = hash_block_size
        self._named: dict[Any, tuple[Any, int]] = {}
        # kvcert's digest after P tokens -> (vLLM's hash of those tokens, P), for the block
        # fields (`PoolBlock`); per request object (held, so that its id stays its own), how
        # many of its hashes were indexed
        self._digests: dict[bytes, tuple[Any, int]] = {}
        self._indexed: dict[int, tuple[Any, int]] = {}

    def remember(self, request: Any, owner: KVCacheManager) -> None:
        size = self._size
        hashes = list(getattr(request, "block_hashes", ()))
        for i, block_hash in enumerate(hashes):
            self._named.setdefault(block_hash, (request, (i + 1) * size))
        if len(hashes) <= self._indexed.get(id(request), (request, 0))[1]:
            return
        self._indexed[id(request)] = (request, len(hashes))
        prompt = owner.core.prompt(request.all_token_ids, request_extras(request))
        for chain in {id(c): c for c in prompt.chains if c is not None}.values():
            for k, digest in enumerate(chain.digests):
                end = (k + 1) * chain.size  # a draft chain's digest also covers its lookahead
                if end % size == 0 and end // size <= len(hashes):
                    self._digests.setdefault(digest, (hashes[end // size - 1], end))

    def named(self, digest: bytes) -> tuple[Any, int] | None:
        """vLLM's hash of the tokens kvcert's `digest` certifies, and how many they are; None
        for a digest of no request the manager allocated for."""
        return self._digests.get(digest)

    def blocks(
        self, owner: KVCacheManager, block_hash: Any, group_ids: Sequence[int]
    ) -> list[Any] | None:
        """Per group, the block kvcert serves for the tokens `block_hash` covers, or None
        when any group serves none. A hash no request allocated through the manager carried
        names tokens kvcert never cached: None."""
        named = self._named.get(block_hash)
        if named is None:
            return None
        request, end = named
        # all its tokens: a draft group's key also covers the tokens after the block
        prompt = owner.core.prompt(request.all_token_ids, request_extras(request))
        found = []
        for group in group_ids:
            block = owner.core.cached_block(prompt, group, end, after_steps=True)
            if block is None:
                return None
            found.append(owner.blocks[block])
        return found
