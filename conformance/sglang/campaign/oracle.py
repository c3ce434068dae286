"""The campaign's oracle, at each admission: what the request was owed before its lookup,
who held what, and the cause of a hit served short (kvcert.conformance.sglang.campaign.places
names the causes; under EAGLE also eagle.BIGRAM_CAP)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcert.conformance.sglang import unified
from kvcert.conformance.sglang.campaign import eagle
from kvcert.conformance.sglang.campaign.ledger import Owed, identities
from kvcert.conformance.sglang.campaign.places import (
    BIGRAM_CAP,
    MATCH,
    STATE_MATCH,
    Holders,
    Row,
)

if TYPE_CHECKING:
    from kvcert.conformance.sglang.campaign.loop import Run


def request_identities(run: Run, tokens: Sequence[int]) -> list[bytes]:
    """The KV identity each position of a request's tokens asks its slot for."""
    return eagle.slot_identities(tokens) if run.workload.eagle else identities(tokens)


def owed(run: Run, req: Any, holders: Holders, taken: set[int]) -> Owed:
    """What the request is owed before its lookup (which may take a state slot). The
    state slots the round's earlier matches `taken` were handed out for other content:
    what they held is evicted, whatever the round-start view says."""
    tokens = list(req.origin_input_ids) + list(req.output_ids)
    if not run.hybrid:
        return run.ledger.owed(request_identities(run, tokens), run.step, window=run.window)
    handed = set(taken)
    if run.extra_buffer:
        # the extra buffer's profile: only the states it checkpoints (into its track
        # slots) are cached; a request's running state is not one, running or freed
        handed |= holders.running_states | holders.track_slots
    present = {v for i, v in enumerate(holders.states) if i not in handed}
    if run.extra_buffer:
        present &= run.checkpointed
    return run.ledger.owed(
        request_identities(run, tokens), run.step, present.__contains__, window=run.window,
        state_idents=identities(tokens),
    )  # fmt: skip


def state_slots(run: Run, requests: list[Any]) -> set[int]:
    """The physical state slots these requests hold (none without a state pool)."""
    if not run.hybrid:
        return set()
    return {run.states.slot(r) for r in requests if r.kv.mamba_pool_idx is not None}


def who_holds(run: Run, scheduled: list[Any]) -> Holders:
    """Who holds which slots: the running requests, the chunked one and those already
    `scheduled` this round (a chunked request whose last chunk was just added, and after
    a preemption the requests admitted before it)."""
    rows = []
    running_states: set[int] = set()
    prompt_states: set[int] = set()
    track_slots: set[int] = set()
    states = run.states.values().tolist() if run.hybrid else []
    chunked = [run.chunked] if run.chunked is not None else []
    extended = {id(r) for r in run.running.reqs + chunked}
    for req in {id(r): r for r in run.running.reqs + chunked + scheduled}.values():
        if req.kv.req_pool_idx is not None:
            # a request admitted this round holds its match only until its extend is
            # prepared; its row past that is what the row's last owner left
            length = len(req.origin_input_ids) + len(req.output_ids)
            row = run.row(req, length if id(req) in extended else unified.matched_length(req))
            branched = id(req) in run.branched
            rows.append(Row(row, len(req.origin_input_ids), branched, req.kv.cache_protected_len))
            if run.extra_buffer:
                track_slots |= run.states.physical(run.track_buffer[req.kv.req_pool_idx])
        if run.hybrid and req.kv.mamba_pool_idx is not None:
            slot = run.states.slot(req)
            running_states.add(slot)
            prompt = identities(list(req.origin_input_ids))
            if states[slot] in {run.ledger.state_id(i) for i in prompt}:
                prompt_states.add(states[slot])
    # the allocator's free pages (token slots at page 1), and those freed but not merged
    free = [run.allocator.free_pages, getattr(run.allocator, "release_pages", None)]
    free_pages = {int(x) for pages in free if pages is not None for x in pages.tolist()}
    holders = Holders({int(x) for x in run.tree.all_values_flatten().tolist()}, rows, free_pages)
    holders.content = run.ledger.content
    holders.published = run.published
    holders.bigram_keys = run.bigram_keys
    if run.window is not None:
        swa = run.allocator.swa_attn_allocator
        free = [swa.free_pages, getattr(swa, "release_pages", None)]
        holders.window_rows = [dataclasses.replace(r, slots=run.swa_slots(r.slots)) for r in rows]
        holders.window_free = {
            int(x) for pages in free if pages is not None for x in pages.tolist()
        }
    if run.hybrid:
        holders.states = states
        holders.running_states = running_states
        holders.prompt_states = prompt_states
        holders.free_states = run.states.physical(run.requests.mamba_allocator.free_slots)
        # a running request's track slots the tree has not adopted await its
        # checkpoints: handed out, whatever they held before
        holders.track_slots = track_slots - run.states.physical(run.tree.all_mamba_values_flatten())
    return holders


def judge(run: Run, req: Any, owed: Any, holders: Holders) -> None:
    """Compare the match an admitted request was served with what it was owed."""
    if id(req) in run.judged:
        return
    run.judged.add(id(req))
    served = unified.matched_length(req)
    count = len(req.origin_input_ids) + len(req.output_ids)
    f = run.findings
    f.admissions += 1
    f.owed_tokens += owed.length
    f.served_tokens += min(served, owed.length)
    # under overlap SGLang publishes a middle chunk at the next scheduling, before its
    # step's result is processed: sound (the stream runs passes in order), not owed
    f.served_early += max(0, served - owed.length)
    if served >= owed.length:
        return
    page = run.workload.page
    tokens = list(req.origin_input_ids) + list(req.output_ids)
    cause = STATE_MATCH
    if run.bigram_keys and not run.hybrid:
        # SGLang's match reaches at most the spec's hit for the first n - 1 tokens: the cap
        # explains a loss down to that hit; a loss below it is judged against it (0.5.23
        # keys bigrams beside no Mamba component, so the cap is defined without states)
        capped = eagle.capped(run, tokens)
        # under overlap SGLang may reach past `capped` through passes whose results are
        # not processed yet (served early): then the cap is judged over that view
        early = run.overlap and served == eagle.capped(run, tokens, early=True).length
        if served == capped.length or early:
            cause = BIGRAM_CAP
        elif served < capped.length:
            owed = capped
    lost_pages = owed.pages[served // page :]
    if run.hybrid:  # the hit ends at its state: where that state is comes first
        owed_state = run.ledger.state_id(identities(tokens[: owed.length])[-1])
        cause = holders.state(owed_state, running_owed=not run.extra_buffer)
    if cause == STATE_MATCH:
        cause = holders.page(lost_pages[0], page) if lost_pages else cause
    if cause in (MATCH, STATE_MATCH) and run.window is not None:
        # the full prefix is in the tree: the window the owed hit reads is where it lacks
        cause = holders.window(owed.window_pages.values(), page)
    f.lost_causes[cause] = f.lost_causes.get(cause, 0) + 1
    f.lost.append(
        f"step {run.step}: {req.rid} ({count} tokens) lost a hit: owed {owed.length} "
        f"tokens, served {served}; page {served // page} is held as physical page "
        f"{lost_pages[0] if lost_pages else '-'}, {cause}"
    )
