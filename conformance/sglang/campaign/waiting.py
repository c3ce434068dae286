"""The scheduler's waiting queue in the campaign's loop: its admission gate, SGLang's own
`SchedulePolicy` played every round as `_get_new_batch_prefill_raw` plays it, and under
--enable-priority-scheduling its preemption (`PrefillAdder.preempt_to_schedule`, on by
default with priority scheduling).

`calc_priority` runs under FCFS too: it orders the queue by priority when priority
scheduling is on, and every 32nd call it refreshes the tree's LRU stamps along the waiting
requests' prefixes (`_touch_waiting_prefixes`, SGLANG_ENABLE_WAITING_PREFIX_REFRESH, on by
default), which moves what the tree evicts next.

A preempted request is released as a retracted one is (`release_req`: its KV past the
tree's prefix freed, nothing inserted) and queued again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcert.conformance.sglang import unified
from kvcert.conformance.sglang.campaign import variants

if TYPE_CHECKING:
    from kvcert.conformance.sglang.campaign.loop import Run

SCHEDULE_POLICY = "fcfs"  # the server's default --schedule-policy (priority takes fcfs or lof)


def policy(run: Run) -> Any:
    """The scheduler's SchedulePolicy, built once as its constructor builds it (no
    hierarchical cache; larger priority values first, the server's default)."""
    return run.sg.SchedulePolicy(SCHEDULE_POLICY, run.tree, False, run.workload.priority, False)


def admission_shut(run: Run) -> bool:
    """The checks before a round's adder: no round while the batch is full or nothing
    waits (and no chunk continues), or while no request row is free (unless a chunk
    continues or priority scheduling may preempt)."""
    running = run.running
    if running.is_empty() or run.window is not None or run.workload.priority:
        # an empty batch has no request left to leave; a hybrid SWA model, or one that
        # may preempt, tries admission with a fresh adder every round (`is_hybrid_swa`,
        # `enable_priority_preemption`)
        running.batch_is_full = False
    if (running.batch_is_full or not run.waiting) and run.chunked is None:
        return True
    no_row = run.requests.available_size() <= 0 and run.chunked is None
    if no_row and not run.workload.priority:
        running.batch_is_full = True
        return True
    return False


def enqueue(run: Run, req: Any) -> None:
    """Scheduler._add_request_to_queue: the request joins the waiting queue, its entry time
    stamped (priority ties and preemption order read it)."""
    run.waiting.append(req)
    req.time_stats.set_wait_queue_entry_time()


def preempt(run: Run, adder: Any, req: Any) -> bool:
    """PrefillAdder.preempt_to_schedule for `req`, which the full batch would turn away:
    whether it preempted running requests of lower priority to make room. What each one
    held past the tree's prefix is remembered as a retraction's is (freed, never published)."""
    if not run.workload.priority:
        return False
    before = len(adder.preempt_list)
    unpublished = {id(r): run.unpublished(r) for r in run.running.reqs}
    order = {id(r): i for i, r in enumerate(run.running.reqs)}
    if run.mutant == "preempt-frees-prefix":
        variants.free_prefix_on_preempt(run.running, run.allocator, unified.api().torch)
    preempted = adder.preempt_to_schedule(req)
    vars(run.running).pop("release_req", None)  # a twin's release lasts one preemption
    if not preempted:
        return False
    # SGLang extends preempt_list from a set of requests, in address order, which is the
    # order they re-enter the queue: any order is SGLang's; the running batch's is pinned
    # so that a workload replays identically in every process
    adder.preempt_list[before:] = sorted(adder.preempt_list[before:], key=lambda r: order[id(r)])
    for preempted in adder.preempt_list[before:]:
        kv, state = unpublished[id(preempted)]
        run.published.retracted_kv |= kv
        run.published.retracted_states |= state
        run.judged.discard(id(preempted))
        run.findings.preempted += 1
    return True


def one_in_flight(run: Run, adder: Any) -> None:
    """SGLang tracks one request left mid-prefill (`chunked_req`) and asserts, before it
    adopts a new one, that none continues (`_get_new_batch_prefill_raw`); raised here as it
    raises there. The round's first chunked request usually spends the chunk budget, so the
    loop stops; a continuing chunk cut short by memory leaves budget, and a request a
    preemption makes room for is then chunked beside it (sglang-chunked-single-flight)."""
    if run.chunked is not None:
        raise AssertionError(
            f"SGLang's scheduler: assert self.chunked_req is None ({run.chunked.rid} still "
            f"mid-prefill when {adder.new_chunked_req.rid} was chunked)"
        )


def requeue(run: Run, adder: Any) -> None:
    """The round's preempted requests back in the waiting queue, whether or not the round
    admitted anyone (`_get_new_batch_prefill_raw`)."""
    for req in adder.preempt_list:
        enqueue(run, req)
