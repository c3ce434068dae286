"""Why a campaign run stopped moving, when SGLang's own state says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcert.conformance.sglang.campaign.loop import Run


def swa_livelock(run: Run) -> str | None:
    """Why an idle scheduler never admits the head of its queue, when it is SGLang's
    SWA admission livelock (sglang-swa-admission-livelock), else None.

    Nothing runs and nothing is chunked, so the pools no longer change. The head's SWA
    reservation B (SWAPrefillBudget.swa_tokens) is below the SWA pool C, so SGLang
    counts the shortfall as transient pressure and waits (no chunk-cap escape), but it
    is at least what admission can ever find free, R: the SWA its own matched prefix
    pins, locked during admission, is never evictable then. Only when the idle pool is
    whole (free or evictable): SWA held by nobody would be a leak, not this livelock.
    """
    if run.window is None or not run.waiting or run.chunked or run.running_now():
        return None
    head = run.waiting[0]
    adder = run.prefill_adder()
    head.init_next_round_input(run.tree)
    budget = adder.memory_budget
    extend = budget.ceil_paged_tokens(len(head.full_untruncated_fill_ids) - head.prefix_len)
    wanted = budget.swa_tokens(
        extend, adder._swa_new_tokens(head), chunk_limit=adder.rem_chunk_tokens
    )
    pool = run.allocator.size_swa
    idle = int(budget.remaining_swa)  # all of the pool, unless SGLang leaked slots
    with adder._lock_node(head.last_node):
        free = int(budget.remaining_swa)
    if idle != pool or not free <= wanted < pool:
        return None
    return (
        f"{head.rid} waits for {wanted} SWA slots, below the pool's {pool} (so SGLang "
        f"waits: no chunk cap), while at most {free} are ever free to it: its matched "
        f"prefix ({head.prefix_len} tokens) pins {pool - free}"
    )
