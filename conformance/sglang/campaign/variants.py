"""What the campaign may play instead of SGLang as it ships: broken twins it must catch
(`--mutant`) and candidate fixes of the SGLang bugs it found (`--fix`).

A twin shows the campaign can fail: each puts back a bug, and CI requires every twin to be
caught. A fix is the change a finding proposes upstream, played through the same loop: the
finding stands only if the fix removes what it explains, and the campaign uses that replay
to tell an abort the finding explains from any other.
"""

from __future__ import annotations

from typing import Any

MUTANTS = (
    "free-shared-prefix",
    "no-checkpoint",
    "no-state-copy",
    "track-final-state",
    "swa-window-short",
    "swa-branch-ignores-state",
    "preempt-frees-prefix",
    "eagle-plain-keys",
)
# sglang-swa-decode-headroom (checks.swa_decode_abort): the SWA prefill budget keeps each
# running request's decode headroom, as the full-attention budget does;
# sglang-mixed-chunk-offpage-state (checks.mixed_offpage_state): a cut chunk ends on a page
# sglang-chunked-single-flight (checks.single_flight): a request is never chunked while
# another continues mid-prefill (the guard SGLang keeps for shortest-prefill-first only)
FIXES = ("swa-decode-headroom", "mixed-chunk-page-align", "single-chunked-request")


def chosen(kind: str, name: str | None, names: tuple[str, ...]) -> str | None:
    """`name` when it is one of `names` (or None), else a ValueError saying which are."""
    if name is not None and name not in names:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(names)}")
    return name


def shorten_windows(tree: Any, page: int) -> None:
    """The twin swa-window-short: a running request's window release frees one page too
    many, so the next pass's window reaches a page already given back."""
    release = tree.evict_sliding_windows

    def short(req: Any, pre_len: int, **options: Any) -> Any:
        return release(req, pre_len + page, **options)

    tree.evict_sliding_windows = short


def branch_without_state(tree: Any, swa_component: Any) -> None:
    """The twin swa-branch-ignores-state (sglang#38815, before sglang#37584): the SWA
    component picks the insert length at its branch point even beside a Mamba state, so the
    state a prefill ends at is attached to the shorter branch key."""
    prepare = swa_component.prepare_for_caching_req

    def ignoring_state(*args: Any, **kwargs: Any) -> Any:
        tree.is_mamba_enabled = False
        try:
            return prepare(*args, **kwargs)
        finally:
            tree.is_mamba_enabled = True

    swa_component.prepare_for_caching_req = ignoring_state


def keep_decode_headroom(adder: Any, running: Any, reserve: int = 0) -> None:
    """The fix swa-decode-headroom: charge the round's SWA budget with what SGLang reserves
    for a request's remaining decode when it admits one (`swa_tokens(0, remaining)`, the
    headroom `_chunk_cap` uses too) for every running request. SGLang charges the
    full-attention budget with its running requests (`total_offset`) but starts the SWA
    offset at 0, so a prefill may take the slots their next decode steps need. Under
    speculative decoding a step allocates `reserve` slots past the committed KV at once,
    beyond what the window keeps, so the headroom holds them as well, and the estimate of
    a request being admitted charges them too: its first decode step allocates the reserve
    while its prompt's SWA is still held (no window is released at a request's first
    decode, `maybe_evict_swa`)."""
    budget = adder.memory_budget
    for req in running.reqs:
        budget.swa_offset += budget.swa_tokens(0, adder._swa_new_tokens(req)) + reserve
    if reserve:
        estimate = budget.swa_tokens

        def with_reserve(*args: Any, **kwargs: Any) -> int:
            return int(estimate(*args, **kwargs)) + reserve

        budget.swa_tokens = with_reserve


def refuse_second_chunk(adder: Any, refused: Any) -> None:
    """The fix single-chunked-request: a waiting request that would be chunked while a
    chunked request continues this round is refused (`refused`, AddReqResult.OTHER) and
    keeps its place in the queue. SGLang already refuses it so under its
    shortest-prefill-first policy ("Only one unfinished chunked request can be tracked"),
    and sglang#34554 proposed the same guard for its chunk cap; under every other policy the
    round relies on the first chunked request spending the chunk budget."""
    select = adder._select_prefill_admission

    def one_in_flight(req: Any, **options: Any) -> Any:
        admission = select(req, **options)
        chunked = getattr(admission, "is_chunked", False)
        return refused if chunked and options.get("has_chunked_req") else admission

    adder._select_prefill_admission = one_in_flight


def align_cut_chunks(adder: Any, page: int) -> None:
    """The fix mixed-chunk-page-align: a continuing chunk that is cut short ends on a page.

    `add_chunked_req` floors a cut chunk to the Mamba kernel's grid, but keeps the cut as it
    is when flooring would empty it (`floor_chunked_tokens`), which mixed chunks do once the
    running requests' decode tokens leave less than the grid. Such a chunk ends off the
    page; the next chunk's checkpoint is then tracked off the page too (relative to that
    prefix), and the tree keys it at the page below, holding a state that ran further. The
    fix keeps the fallback on the page grid."""
    floor = adder.floor_chunked_tokens

    def on_pages(trunc_len: int, remaining: int) -> int:
        kept: int = floor(trunc_len, remaining)
        if kept >= remaining:
            return kept
        return kept // page * page or kept

    adder.floor_chunked_tokens = on_pages


def free_prefix_on_preempt(batch: Any, allocator: Any, torch: Any) -> None:
    """The twin preempt-frees-prefix (played under priority scheduling): a preemption frees
    the request's whole row, the prefix the tree lent it too, so the tree keeps slots the
    allocator hands out again (the double free `preempt_to_schedule` guards against)."""
    release = batch.release_req

    def freeing_prefix(idx: int, remaining: int, **options: Any) -> Any:
        req = batch.reqs[idx]
        pool = batch.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        lent = pool[: req.kv.cache_protected_len].to(torch.int64).clone()
        released = release(idx, remaining, **options)
        if len(lent):
            allocator.free(lent)
        return released

    batch.release_req = freeing_prefix
