"""The campaign's ledger (the stand-in model runner) without vLLM: a scripted scheduler serves
KV the ledger must accept or flag, so the oracle itself is checked, including the speculative
parts (draft KV keyed on the next token, rejections, padding rows, async drafts in flight)."""

from __future__ import annotations

from types import SimpleNamespace

from kvcert.conformance.vllm.campaign.ledger import UNKNOWN, Group, Ledger
from tests.campaign.fakes import FakeScheduler

BLOCK = 4


def _ledger(spec_tokens: int = 0, seed: int = 3) -> Ledger:
    return Ledger([Group(BLOCK, "full", target=True, draft=True)], seed, spec_tokens)


def test_a_hit_whose_next_token_differs_is_unsound_for_the_draft_layers_only():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5, 6], [1, 2])
    assert ledger.forward(s, s.schedule("a", 6, new=True), 0)[1] is None
    # b shares block 1 (tokens 1..4) and differs at token 5: a's draft KV at position 3 was
    # computed from token 5, b's needs token 9
    s.add("b", [1, 2, 3, 4, 9, 9], [1, 3], hit=4)
    _, violation = ledger.forward(s, s.schedule("b", 2, new=True), 1)
    assert violation is not None
    assert violation.role == "draft"
    assert "position 3 of group 0 (draft layers, block 1)" in violation.text
    # the same hit with the same next token is sound
    s.add("c", [1, 2, 3, 4, 5, 7], [1, 4], hit=4)
    assert ledger.forward(s, s.schedule("c", 2, new=True), 2)[1] is None


def test_a_block_of_other_tokens_is_unsound_for_the_target_layers():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5], [1, 2])
    ledger.forward(s, s.schedule("a", 5, new=True), 0)
    s.add("b", [1, 2, 3, 8, 5], [1, 3], hit=4)
    _, violation = ledger.forward(s, s.schedule("b", 1, new=True), 1)
    assert violation is not None
    assert violation.role == "target"
    assert "position 3 of group 0 (full, block 1)" in violation.text


def test_rejected_drafts_leave_garbage_the_next_pass_must_recompute():
    outcomes = set()
    for seed in range(12):
        s, ledger = FakeScheduler(), _ledger(spec_tokens=2, seed=seed)
        s.add("a", [1, 2, 3], [1, 2, 3])
        sampled, _ = ledger.forward(s, s.schedule("a", 3, new=True), 0)
        s.requests["a"].all_token_ids += sampled[0]  # the scheduler applies the output
        ledger.applied(SimpleNamespace(req_ids=["a"], sampled_token_ids=sampled))
        drafts = ledger.proposed["a"]
        sampled, _ = ledger.forward(s, s.schedule("a", 3, tuple(drafts)), 1)
        accepted = len(sampled[0]) - 1
        assert sampled[0][:accepted] == drafts[:accepted]
        assert accepted == 2 or sampled[0][accepted] != drafts[accepted]
        rejected = len(drafts) - accepted
        s.requests["a"].all_token_ids += sampled[0]
        ledger.applied(SimpleNamespace(req_ids=["a"], sampled_token_ids=sampled))
        # a scheduler that forgot the rejection (counted every draft as computed) makes the
        # next pass read the rejected positions' KV
        known = len(s.requests["a"].all_token_ids)
        s.requests["a"].num_computed_tokens = known - 1 + rejected
        _, violation = ledger.forward(s, s.schedule("a", 1), 2)
        assert (violation is not None) == (rejected > 0)
        outcomes.add(rejected > 0)
    assert outcomes == {True, False}  # both paths were taken


def test_padding_rows_are_never_accepted():
    s, ledger = FakeScheduler(), _ledger(spec_tokens=3)
    for step in range(20):
        rid = f"r{step}"
        s.add(rid, [5, 6, 7, 8, 9], [1, 2], hit=4)
        s.tables[rid] = ([step + 1, step + 100],)
        ledger.slots.clear()
        sampled, _ = ledger.forward(s, s.schedule(rid, 4, (-1, -1, -1), new=True), step)
        assert len(sampled[0]) == 1  # the bonus token only
        assert UNKNOWN not in sampled[0]


def test_async_drafts_in_flight_move_the_runners_start_back():
    """The scheduler counts placeholders as accepted until the output returns; the runner
    computes from its own count, as vLLM's GPU runner does."""
    rejections = set()
    for seed in range(12):
        s, ledger = FakeScheduler(), _ledger(spec_tokens=2, seed=seed)
        s.add("a", [1, 2, 3], [1, 2, 3])
        first, _ = ledger.forward(s, s.schedule("a", 3, new=True), 0)
        # step 1 is scheduled before step 0's output is applied: 2 draft placeholders
        second, _ = ledger.forward(s, s.schedule("a", 3, (-1, -1)), 1)
        rejected = 2 - (len(second[0]) - 1)
        # step 2, still before step 1's output is applied: the scheduler's start is 6, the
        # runner's is 6 - rejected, right after the tokens it knows
        output = s.schedule("a", 3, (-1, -1))
        s.requests["a"].all_token_ids += first[0]
        ledger.applied(SimpleNamespace(req_ids=["a"], sampled_token_ids=first))
        known = ledger.tokens(s.requests["a"])
        assert known == [1, 2, 3, *first[0], *second[0]]
        assert ledger._optimism("a") == rejected
        assert s.requests["a"].num_computed_tokens - 3 - rejected == len(known) - 1
        assert ledger.forward(s, output, 2)[1] is None
        rejections.add(rejected)
    assert len(rejections) > 1


def _mtp(modules: int = 3, seed: int = 3) -> Ledger:
    """A multi-module MTP drafter: one module per draft token."""
    return Ledger([Group(BLOCK, "full", target=True, draft=True)], seed, modules, modules=modules)


def test_mtp_module_s_keys_the_s_plus_one_tokens_after_a_position():
    """Module s's KV at position p reads token p + 1 + s: a hit whose token three after the
    block differs is sound for an EAGLE head and one module, not for three."""
    for modules, sound in ((1, True), (2, True), (3, False)):
        s = FakeScheduler()
        ledger = _mtp(modules) if modules > 1 else _ledger(spec_tokens=1)
        s.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3])
        assert ledger.forward(s, s.schedule("a", 9, new=True), 0)[1] is None
        s.add("b", [1, 2, 3, 4, 5, 6, 99, 8, 9], [1, 4, 5], hit=4)  # token 6 differs
        _, violation = ledger.forward(s, s.schedule("b", 5, new=True), 1)
        assert (violation is None) == sound, modules
        if not sound:
            assert violation is not None
            assert violation.role == "draft"
            assert "MTP module 2" in violation.text
            assert "position 3 of group 0 (draft layers, block 1)" in violation.text


def _draft_kv_is_final(ledger: Ledger, s: FakeScheduler, rid: str, upto: int) -> bool:
    """Every module's KV at every position p < upto holds what it computes from the known
    tokens (module s at p reads tokens up to p + 1 + s)."""
    from kvcert.conformance.vllm.campaign.ledger import identities

    known = ledger.tokens(s.requests[rid])
    ident = identities(known, len(known))
    table = s.tables[rid][0]
    return all(
        ledger.slots.get((0, f"d{m}", table[p // BLOCK], p % BLOCK)) == ident[p + 1 + m]
        for m in range(ledger.modules)
        for p in range(upto)
    )


def test_mtp_positions_drafted_past_a_rejection_are_re_prefilled():
    """After a pass rejecting r drafts, the last module's KV at the r - 1 positions before
    the pass was computed from a rejected draft; the drafter re-prefills them, so every
    module's KV below the new count - modules + 1 is final."""
    rejections = set()
    for seed in range(16):
        s, ledger = FakeScheduler(), _mtp(seed=seed)
        s.add("a", [1, 2, 3, 4, 5], [1, 2, 3, 4])
        sampled, _ = ledger.forward(s, s.schedule("a", 5, new=True), 0)
        s.requests["a"].all_token_ids += sampled[0]
        ledger.applied(SimpleNamespace(req_ids=["a"], sampled_token_ids=sampled))
        drafts = ledger.proposed["a"]
        sampled, violation = ledger.forward(s, s.schedule("a", 4, tuple(drafts)), 1)
        assert violation is None
        rejected = 3 - (len(sampled[0]) - 1)
        s.requests["a"].all_token_ids += sampled[0]
        s.requests["a"].num_computed_tokens -= rejected
        ledger.applied(SimpleNamespace(req_ids=["a"], sampled_token_ids=sampled))
        computed = s.requests["a"].num_computed_tokens
        assert _draft_kv_is_final(ledger, s, "a", computed - 3 + 1)
        rejections.add(rejected)
    assert {0, 2, 3} <= rejections  # no re-prefill, and re-prefills of 1 and 2 positions


def test_mtp_re_prefill_without_the_requests_own_inputs_writes_garbage_below_its_start():
    """A request new to the runner whose first pass rejects drafts (padding rows) re-prefills
    from a row of cached inputs it never wrote: a later hit on those blocks is unsound."""
    s, ledger = FakeScheduler(), _mtp()
    s.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3])
    ledger.forward(s, s.schedule("a", 9, new=True), 0)
    s.add("b", [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 4], hit=8)
    _, violation = ledger.forward(s, s.schedule("b", 4, (-1, -1, -1), new=True), 1)
    assert violation is None  # b's modules read positions 0..5, then rewrite 6 and 7
    s.add("c", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13], [1, 2, 5], hit=8)
    _, violation = ledger.forward(s, s.schedule("c", 3, new=True), 2)
    assert violation is not None
    assert violation.role == "draft"
    assert "position 6 of group 0 (draft layers, block 2)" in violation.text


def test_mtp_reads_after_the_output_that_finishes_the_request_are_not_checked():
    """A drafter run after a pass whose output finishes the request proposes drafts no pass
    verifies: near max_tokens the scheduler schedules fewer drafts than the modules proposed
    (or, under async scheduling, runs a pass after the finishing output), so the last
    modules may read KV computed from a draft never scheduled (here module 2 at position 4
    read draft token 7). Not a finding when the request ends there (prompt 5 + max_tokens 1),
    and the same read is one when the request goes on (its twin)."""
    for limit, flagged in ((1, False), (None, True)):
        s, ledger = FakeScheduler(), _mtp()
        s.add("a", [1, 2, 3, 4, 5], [1, 2, 3])
        s.requests["a"].num_prompt_tokens, s.requests["a"].max_tokens = 5, limit
        ledger.forward(s, s.schedule("a", 5, new=True), 0)  # samples token 5, drafts 6, 7, 8
        _, violation = ledger.forward(s, s.schedule("a", 1), 1)  # no drafts scheduled
        assert (violation is not None) == flagged, limit
        if flagged:
            assert "MTP module" in violation.text
