"""A minimal fix for vLLM's preempt-in-flight bug, as a Scheduler subclass (vllm#43569).

vLLM registers a block's hash when it allocates the block (`allocate_slots`), before the
forward pass writes its KV. When the scheduler preempts a request it already scheduled in the
same step, the blocks of that unwritten chunk go back to the pool still registered, and a
later lookup (often the victim's own resume) is served KV no pass wrote. The fix: when a
request is preempted, take out of the prefix cache every block of it that holds a position
at or beyond its committed tokens (`num_computed_tokens` is not yet advanced for this step's
chunk while the scheduler is still scheduling). The campaign checks it with the ledger:
`kvcert fuzz --fix` must find nothing where the unmodified scheduler fails.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def fixed(base: type) -> type:
    """`base` (vLLM's Scheduler or AsyncScheduler) with the fix."""

    class UncacheUnwrittenOnPreempt(base):  # type: ignore[misc]
        def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
            committed = request.num_computed_tokens
            groups = self.kv_cache_config.kv_cache_groups
            blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks
            unwritten = {
                block.block_id
                for group, table in zip(groups, blocks, strict=True)
                for block in table[committed // group.kv_cache_spec.block_size :]
                if block.block_hash is not None
            }
            if unwritten:
                self.kv_cache_manager.block_pool.evict_blocks(unwritten)
            super()._preempt_request(request, *args, **kwargs)

    UncacheUnwrittenOnPreempt.__name__ = f"UncacheUnwrittenOnPreempt{base.__name__}"
    return UncacheUnwrittenOnPreempt
