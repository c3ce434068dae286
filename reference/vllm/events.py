"""The allocator's events as vLLM's KV events: BlockStored when blocks become hittable (the
end of the step that wrote them), BlockRemoved when one is evicted, AllBlocksCleared on a
reset. A run of blocks one request registered in one group at once is one BlockStored (its
hashes in order, the tokens concatenated), as vLLM announces a request's newly cached blocks,
with its group's kind and window. Block hashes are kvcert's keys (bytes; the parent is the
previous block's key in the same group).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm.distributed import kv_events
from vllm.v1 import kv_cache_interface as specs

from kvcert.reference.events import Event, Removed, Stored

# per request: (LoRA adapter id, LoRA name, session id), what its BlockStored events name
Publishing = tuple[int | None, str | None, str | None]
UNNAMED: Publishing = (None, None, None)


def convert(
    events: Sequence[Event], publishing: Callable[[str], Publishing], groups: Sequence[Any]
) -> list[Any]:
    """vLLM's events for the allocator's `events`, in order; `groups` are vLLM's KV-cache
    groups (their specs name the kind and window)."""
    converted: list[Any] = []
    last: Stored | None = None
    for event in events:
        if isinstance(event, Stored):
            if (
                last is not None
                and (event.rid, event.group, event.parent) == (last.rid, last.group, last.key)
                and event.start == last.start + len(last.tokens)
            ):
                converted[-1].block_hashes.append(event.key)
                converted[-1].token_ids.extend(event.tokens)
                last = event
                continue
            lora_id, lora_name, session = publishing(event.rid)
            spec = groups[event.group].kv_cache_spec
            converted.append(
                kv_events.BlockStored(
                    block_hashes=[event.key],
                    parent_block_hash=event.parent,
                    token_ids=list(event.tokens),
                    block_size=len(event.tokens),
                    lora_id=lora_id,
                    medium=kv_events.MEDIUM_GPU,
                    lora_name=lora_name,
                    group_idx=event.group,
                    kv_cache_spec_kind=specs.get_kv_cache_spec_kind(spec).value,
                    kv_cache_spec_sliding_window=specs.get_kv_cache_spec_sliding_window(spec),
                    session_id=session,
                )
            )
            last = event
            continue
        last = None
        if isinstance(event, Removed):
            converted.append(
                kv_events.BlockRemoved(
                    block_hashes=[event.key], medium=kv_events.MEDIUM_GPU, group_idx=event.group
                )
            )
        else:
            converted.append(kv_events.AllBlocksCleared())
    return converted
