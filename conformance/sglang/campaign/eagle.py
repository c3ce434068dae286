"""EAGLE in the SGLang campaign: the server's flags, the KV a position's slot holds, and
the verify pass of a decode step.

Under EAGLE a token slot holds two layers' KV: the target model's, computed from the tokens
up to its position, and the draft layer's, computed from the target's hidden state there and
the token after it. So the slot of position p is reusable only by a request that agrees on
tokens 0..p+1: the spec's `exact` profile with draft reach 1, and why SGLang keys its tree by
bigrams. A request's last position has no such KV yet (its next token is unknown):

    tokens     t0   t1   t2   t3          (a request of 4 tokens)
    position   0    1    2    3
    identity   t0t1 ..t2 ..t3 unseen      (the digest of tokens 0..p+1)

A decode step is SGLang's spec-v2 step: `prepare_for_decode` runs SGLang's own
`eagle_prepare_for_decode` (it keeps `get_alloc_reserve_per_decode` slots allocated past
the committed KV); the verify pass computes the request's last token and DRAFT_TOKENS - 1
drafts, of which the workload accepts a number drawn from the tokens, and SGLang's result
step commits the accepted drafts and the bonus token. The rest of the allocation holds KV
no request may read (RESERVED). A Mamba state is the target model's alone: the loop names
it by the tokens up to it, and the ledger remembers each slot's target part (`targets`), so
a read whose target KV is the reader's and whose draft KV read another next token is told
apart (`stale_drafts`): what a tree keying tokens serves, as SGLang's does beside a Mamba
component. Under overlap (spec v2's default) a pass is launched before the last one's result
is processed: it starts where the device is, past the runs SGLang has not committed yet, and
a request finished meanwhile drops its run. Under the extra buffer a pass whose accepted run
crosses the decode track grid checkpoints the state at the grid point, as the worker's
`commit_mamba_states_after_verify` does. The token arithmetic is engine-free: tests drive
it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang.campaign.ledger import Ledger, Owed, identities
from kvcert.conformance.sglang.campaign.workload import (
    Workload,
    next_token,
    swa_floor,
)

if TYPE_CHECKING:
    from kvcert.conformance.sglang.campaign.loop import Run

# --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4:
# a chain of three drafts, the verify pass computing four positions.
STEPS, TOPK, DRAFT_TOKENS = 3, 1, 4
# The identity of a position whose next token is not known: no slot is ever written with it.
UNSEEN = b"kvcert.sglang.eagle: the draft layer waits for the next token"
# What the slots past a request's verified KV hold, up to its allocation (the decode step's
# reserve): a rejected draft's KV, the draft layer's guesses, or nothing yet. Handed out to
# the request, so no lookup is owed what they held before.
RESERVED = b"kvcert.sglang.eagle: a decode step's reserve"


def server_flags() -> dict[str, object]:
    """The server arguments of an EAGLE deployment (its draft model is never loaded)."""
    return {
        "speculative_algorithm": "EAGLE",
        "speculative_draft_model_path": "dummy",
        "speculative_num_steps": STEPS,
        "speculative_eagle_topk": TOPK,
        "speculative_num_draft_tokens": DRAFT_TOKENS,
    }


def slot_identities(tokens: Sequence[int]) -> list[bytes]:
    """Per position of `tokens`, the identity of the KV its slot must hold: that of the
    tokens up to the next one (the target's and the draft layer's); UNSEEN for the last."""
    return [*identities(tokens)[1:], UNSEEN]


def with_next(tokens: Sequence[int], end: int) -> list[int]:
    """The first `end` tokens and the one after them: the prompt's next token, or the one a
    pass ending at `end` samples (the draft layer's KV at `end - 1` is computed from it)."""
    following = tokens[end] if end < len(tokens) else next_token(list(tokens[:end]))
    return [*tokens[:end], following]


def accepted(tokens: Sequence[int]) -> int:
    """How many of a verify pass's DRAFT_TOKENS - 1 drafts are accepted, for a request of
    these tokens: drawn from them, so a workload replays exactly."""
    digest = hashlib.sha256(repr(tuple(tokens)).encode()).digest()
    return digest[0] % DRAFT_TOKENS


def verified(tokens: Sequence[int]) -> list[int]:
    """The tokens a verify pass commits: the accepted drafts, then the bonus token."""
    run = list(tokens)
    for _ in range(accepted(tokens) + 1):
        run.append(next_token(run))
    return run[len(tokens) :]


def stale_drafts(ledger: Ledger, slots: Sequence[int], targets: Sequence[bytes]) -> bool:
    """Whether every one of these slots a pass read unsoundly holds the target model's KV of
    the reader's prefix (`targets`, pairwise) and only the draft layer's KV was computed from
    another next token: what a tree keying tokens, not bigrams, hands a request at the end
    of a prefix it shares with the tree."""
    held = [ledger.targets.get(ledger.content.get(slot, b"")) for slot in slots]
    return bool(slots) and held == list(targets)


def capped(run: Run, tokens: Sequence[int], *, early: bool = False) -> Owed:
    """The most SGLang's match can serve a request of these tokens: the spec's hit for its
    first n - 1 tokens, as SGLang caps the lookup at n - 1 raw tokens, which hold n - 2
    bigrams (one page short where n - 1 is a page multiple; under a sliding window, back to
    where the window before that end is held). `early`: over every pass launched so far,
    whose results overlap scheduling may not have processed (SGLang publishes and serves
    those early, soundly: the judge's view of what it could reach)."""
    step = run.step + 1 if early else run.step
    return run.ledger.owed(slot_identities(tokens[:-1]), step, window=run.window)


def reserve() -> int:
    """The slots a decode step keeps allocated past a request's committed KV: SGLang's
    `get_alloc_reserve_per_decode` for these flags (twice a step's drafts or verified
    positions, whichever is more)."""
    return 2 * max(STEPS * TOPK, DRAFT_TOKENS)


def check_reserve() -> None:
    """An EngineError where SGLang's own reserve for the published flags
    (`get_alloc_reserve_per_decode`) is not `reserve()`, which sized the workload's pool."""
    sizing = importlib.import_module("sglang.srt.mem_cache.allocation_sizing")
    theirs = int(sizing.get_alloc_reserve_per_decode())
    if theirs != reserve():
        raise EngineError(
            f"SGLang reserves {theirs} slots a decode step under these EAGLE flags; the "
            f"campaign sized its pools for {reserve()} (campaign.eagle.reserve)"
        )


def served_with_eagle(workload: Workload) -> Workload:
    """The workload under EAGLE: the same requests, a pool larger by a decode step's
    reserve (rounded to pages), so that the longest request still fits alone, and for an
    SWA model at least the SWA floor with the reserve kept."""
    if workload.lazy:
        raise ValueError(
            "--eagle with --lazy: the lazy strategy plans a verify pass's checkpoints "
            "(mamba_lazy_spec_prepare), which the campaign does not play"
        )
    if workload.mixed:
        raise ValueError(
            "--eagle with --mixed-chunk: SGLang turns mixed chunked prefill off under "
            "speculative decoding (arg_groups/speculative_hook.py)"
        )
    page = workload.page
    pool = workload.pool_tokens + -(-reserve() // page) * page
    if workload.window is not None:
        pool = max(pool, swa_floor(workload.window, workload.swa_interval, page, reserve()))
    return dataclasses.replace(workload, eagle=True, pool_tokens=pool)


def verify(run: Run, batch: Any) -> None:
    """A decode step's verify pass: per request, its last token and the drafts, computed
    into the slots SGLang's `eagle_prepare_for_decode` allocated. The accepted positions
    hold their KV, the rest of the allocation RESERVED; the committed run waits for the
    result step (`commit`). Under overlap the pass starts where the device is: past the
    runs of passes whose results SGLang has not processed (its `kv_committed_len` lags by
    them, and the reserve, twice a step's positions, covers both)."""
    if run.extra_buffer:  # the worker's prepare_for_verify: the track slots, from the reqs
        spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
        spec_utils.prepare_mamba_track_for_verify(batch)
    for i, req in enumerate(batch.reqs):
        tokens = run.tokens_of(req)
        start = len(tokens) - 1  # the last token's KV is computed by this pass
        lag = sum(run.pending_runs.get(id(req), ()))
        if int(req.kv.kv_committed_len) + lag != start:
            raise RuntimeError(
                f"the loop lost track of {req.rid}: {len(tokens)} tokens, SGLang's committed "
                f"KV {int(req.kv.kv_committed_len)}, {lag} tokens in passes not processed"
            )
        run_ = verified(tokens)
        end = start + len(run_)
        run.read_and_write(req, start, end, tokens + run_)
        slots = run.row(req, int(req.kv.kv_allocated_len))[end:]
        run.ledger.write(slots, [RESERVED] * len(slots), run.write_step())
        if run.window is not None:
            swa = run.swa_slots(slots)
            run.window.ledger.write(swa, [RESERVED] * len(swa), run.write_step())
        run.sampled.setdefault(id(req), []).extend(run_)
        run.pending_runs.setdefault(id(req), []).append(len(run_))
        if run.extra_buffer:
            _track_crossing(run, batch, i, range(start, end))


def _track_crossing(run: Run, batch: Any, i: int, run_span: range) -> None:
    """The extra buffer's checkpoint of a verify pass (commit_mamba_states_after_verify):
    where the accepted run crosses the track grid, the state at the last grid point it
    reaches goes into the track slot SGLang set for the request (none where it is -1).

        decode grid 256 (lcm of the checkpoint grid and mamba_track_interval 256),
        committed 254, a run of 3 accepted: positions 254..256 computed, 256 crossed:
        the state after 256 tokens goes into the track slot
    """
    grid = run.sg.mamba_track_grid(run.workload.page)
    start, end = run_span.start, run_span.stop
    logical = batch.mamba_track_indices[i]
    if start // grid != end // grid and int(logical) >= 0:
        point = end // grid * grid
        if run.mutant == "track-final-state":  # the twin: the run's last state instead
            point = end
        run.track(batch.reqs[i], point, logical)


def _take_run(run: Run, req: Any) -> list[int]:
    """The oldest verified run launched for the request, taken off its queues."""
    count = run.pending_runs[id(req)].pop(0)
    if not run.pending_runs[id(req)]:
        del run.pending_runs[id(req)]
    queue = run.sampled[id(req)]
    taken, rest = queue[:count], queue[count:]
    if rest:
        run.sampled[id(req)] = rest
    else:
        del run.sampled[id(req)]
    return taken


def commit(run: Run, batch: Any) -> None:
    """process_batch_result_decode under spec v2: `_resolve_spec_v2_tokens` commits each
    request's verified run to its KV, then SGLang's own per-request step (the release of a
    finished request) runs. Under overlap a request finished or retracted since the pass
    was launched commits nothing (its run is dropped; the release frees that KV)."""
    runs = [_take_run(run, req) for req in batch.reqs]
    outcome = types.SimpleNamespace(
        num_correct_drafts_per_req_cpu=[len(r) - 1 for r in runs],
        num_non_draft_tokens_per_req=1,  # EAGLE's bonus token
        grammar_retained_tokens=None,
    )
    for i, (req, run_) in enumerate(zip(batch.reqs, runs, strict=True)):
        if run.overlap and (req.finished() or req.is_retracted):
            run.findings.dropped += len(run_)
            continue
        req.kv.kv_committed_len += len(run_)
        req.output_ids.extend(run_)
        req.update_finish_state(len(run_))
        finished = req.finished()
        shared = run.row(req, req.kv.cache_protected_len) if finished else []
        last = last_owned(run, req) if finished else []
        past = overshoot(run, req) if finished else ([], None)
        run.results._handle_finish_state_updated_req(req, batch, outcome, i, None)
        run.note_adopted()
        if finished:
            note_dropped(run, last)
            run.published.overshoot_kv.update(past[0])
            if past[1] is not None:
                run.published.overshoot_states.add(past[1])
            run.released(req, shared)


def overshoot(run: Run, req: Any) -> tuple[list[bytes], int | None]:
    """What a finishing request computed past its stop: a verify pass commits a whole
    accepted run, which can pass `max_new_tokens`; SGLang's release frees that KV as
    over-allocated and keys the tree at `owned_kv_len` ("the client never sees those
    tokens, so nothing matches"), so no state after them is cached either. The KV
    identities of those positions (under overlap also those a pass launched since then
    computed), and the running state when it lies past the stop."""
    owned = int(req.owned_kv_len())
    computed = len(run.tokens_of(req)) - 1  # under overlap: with a pass launched since
    if computed <= owned:
        return [], None
    content = run.ledger.content
    kv = [content[slot] for slot in run.row(req, computed)[owned:] if slot in content]
    state = int(run.states.values()[run.states.slot(req)]) if run.hybrid else None
    return kv, state


def last_owned(run: Run, req: Any) -> list[tuple[int, bytes]]:
    """The slots and KV of a finishing request's last owned page (`owned_kv_len`, partial
    or whole): the release's insert keys the bigrams of the owned tokens, a position fewer,
    so at a page multiple it leaves that whole page out."""
    owned, page = int(req.owned_kv_len()), run.workload.page
    first = max(0, owned - 1) // page * page
    row = run.row(req, owned)
    content = run.ledger.content
    return [(slot, content[slot]) for slot in row[first:owned] if slot in content]


def note_dropped(run: Run, last: list[tuple[int, bytes]]) -> None:
    """After the release: the last owned page's KV the tree did not take."""
    in_tree = set(run.tree.all_values_flatten().tolist())
    run.published.bigram_dropped.update(ident for slot, ident in last if slot not in in_tree)
