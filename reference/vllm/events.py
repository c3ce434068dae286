"""The allocator's events as vLLM's KV events: BlockStored when blocks become hittable (the
end of the step that wrote them), BlockRemoved when one is evicted, AllBlocksCleared on a
reset. A run of blocks one request registered in one group at once is one BlockStored (its
hashes in order, the tokens concatenated), as vLLM announces a request's newly cached blocks,
with its group's kind and window.

The hashes are vLLM's own block hashes of the request (its `block_hashes` at the group's
block size, with vLLM's extra keys and lookahead tokens beside them), so a consumer that
rebuilds vLLM's hashes from token ids (a KV-aware router) matches what this cache holds; a
BlockRemoved names the hash its BlockStored announced. A block vLLM has no hash for yet (its
hash reads lookahead tokens not sampled yet, or the request carries no hasher) is not
announced, nor its removal: no consumer could have asked for it by that hash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from vllm.distributed import kv_events
from vllm.v1 import kv_cache_interface as specs
from vllm.v1.core import kv_cache_utils as hashes

from kvcert.reference.events import Event, Removed, Stored


class Publishing(NamedTuple):
    """What a request's BlockStored events name: its LoRA adapter, session and vLLM's own
    request (whose block hashes, extra keys and tokens the events carry)."""

    lora_id: int | None = None
    lora_name: str | None = None
    session: str | None = None
    request: Any = None


UNNAMED = Publishing()


class Announcer:
    """Converts the allocator's events; remembers the hash each announced block was named
    by, so its removal names the same one."""

    def __init__(self, hash_block_size: int, lookahead: int) -> None:
        self._hash_block_size = hash_block_size
        self._lookahead = lookahead  # tokens past a block vLLM's hash of it reads
        self._announced: dict[tuple[int, bytes], Any] = {}  # (group, kvcert key) -> vLLM hash

    def convert(
        self,
        events: Sequence[Event],
        publishing: Callable[[str], Publishing],
        groups: Sequence[Any],
    ) -> list[Any]:
        """vLLM's events for the allocator's `events`, in order; `groups` are vLLM's KV-cache
        groups (their specs name the kind and window)."""
        converted: list[Any] = []
        last: Stored | None = None
        for event in events:
            if isinstance(event, Stored):
                last = self._stored(event, last, publishing(event.rid), groups, converted)
                continue
            last = None
            if isinstance(event, Removed):
                named = self._announced.pop((event.group, event.key), None)
                if named is not None:
                    converted.append(
                        kv_events.BlockRemoved(
                            block_hashes=[named], medium=kv_events.MEDIUM_GPU, group_idx=event.group
                        )
                    )
            else:
                self._announced.clear()
                converted.append(kv_events.AllBlocksCleared())
        return converted

    def _stored(
        self,
        event: Stored,
        last: Stored | None,
        publishing: Publishing,
        groups: Sequence[Any],
        converted: list[Any],
    ) -> Stored | None:
        """Announces `event` (appended to the run `last` began when it continues it); the
        event to continue from, None where nothing was announced."""
        request = publishing.request
        size = len(event.tokens)
        index = event.start // size
        named = self._vllm_hashes(request, size, index)
        if named is None:
            return None
        parent, own = named
        end = event.start + size
        extra = self._extra_keys(request, event.start, end)
        ahead = list(request.all_token_ids[end : end + self._lookahead])
        stored = converted[-1] if converted else None
        if (
            last is not None
            and (event.rid, event.group, event.parent) == (last.rid, last.group, last.key)
            and event.start == last.start + len(last.tokens)
            and isinstance(stored, kv_events.BlockStored)
        ):
            stored.block_hashes.append(own)
            stored.token_ids.extend(event.tokens)
            if stored.extra_keys is not None:
                stored.extra_keys.append(extra)
            if stored.lookahead_token_ids is not None:
                stored.lookahead_token_ids.append(ahead)
        else:
            spec = groups[event.group].kv_cache_spec
            converted.append(
                kv_events.BlockStored(
                    block_hashes=[own],
                    parent_block_hash=parent,
                    token_ids=list(event.tokens),
                    block_size=size,
                    lora_id=publishing.lora_id,
                    medium=kv_events.MEDIUM_GPU,
                    lora_name=publishing.lora_name,
                    extra_keys=[extra],
                    group_idx=event.group,
                    kv_cache_spec_kind=specs.get_kv_cache_spec_kind(spec).value,
                    kv_cache_spec_sliding_window=specs.get_kv_cache_spec_sliding_window(spec),
                    session_id=publishing.session,
                    lookahead_token_ids=[ahead] if self._lookahead else None,
                )
            )
        self._announced[(event.group, event.key)] = own
        return event

    def _vllm_hashes(self, request: Any, size: int, index: int) -> tuple[Any, Any] | None:
        """vLLM's hashes of the request's blocks `index - 1` (None at 0) and `index` of `size`
        tokens, as its events publish them; None when it has not hashed block `index`."""
        own = getattr(request, "block_hashes", None)
        if not own or size % self._hash_block_size:
            return None
        at_size = hashes.resolve_block_hashes(own, self._hash_block_size, size)
        if len(at_size) <= index:
            return None
        parent = hashes.maybe_convert_block_hash(at_size[index - 1]) if index else None
        return parent, hashes.maybe_convert_block_hash(at_size[index])

    def _extra_keys(self, request: Any, start: int, end: int) -> Any:
        """The extra keys vLLM's hash of tokens [start, end) reads, as its events publish them
        (the same window as the hash, lookahead included)."""
        if self._lookahead:
            keys, _ = hashes.generate_lookahead_block_hash_extra_keys(
                request, start, end, end + self._lookahead, 0
            )
        else:
            keys, _ = hashes.generate_block_hash_extra_keys(request, start, end, 0)
        converted = hashes.to_event_extra_keys([keys])
        return converted[0] if converted else None
