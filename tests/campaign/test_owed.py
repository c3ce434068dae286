"""The completeness oracle without vLLM: a scripted scheduler serves hits the oracle must
hold to what the ledger saw written, under each declared profile. Each test has its twin:
the same script with the hit served, or the block made unavailable, gives no lost hit."""

from __future__ import annotations

import pytest

from kvcert.conformance.vllm.campaign.ledger import Group, Ledger
from kvcert.conformance.vllm.campaign.owed import Oracle, Profiles
from kvcert.spec.alloc import Visibility
from kvcert.spec.errors import InvalidOp
from kvcert.spec.retention import Retention
from tests.campaign.fakes import FakeScheduler

BLOCK = 4
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # blocks 0 and 1 full, token 8 in block 2


def _run(groups, profiles, modules=1):
    ledger = Ledger(groups, modules=modules, spec_tokens=modules if modules > 1 else 0)
    return FakeScheduler(), ledger, Oracle(groups, profiles, modules)


def _step(s, ledger, oracle, output, step, applied=True):
    """schedule() gave `output`: judge it, run the pass, take its output at once (sync)."""
    lost = oracle.judge(s, output, step, ledger.slots)
    ledger.forward(s, output, step)
    if applied:
        oracle.applied = step
    return lost


def _writer(groups=None):
    groups = groups or [Group(BLOCK, "full")]
    s, ledger, oracle = _run(groups, Profiles(Visibility.STEP_END))
    s.add("a", list(PROMPT), *[[1, 2, 3] for _ in groups])
    _step(s, ledger, oracle, s.schedule("a", 9, new=True), 0)
    return s, ledger, oracle


def test_a_resend_served_less_than_the_written_blocks_is_a_lost_hit():
    s, ledger, oracle = _writer()
    s.add("b", list(PROMPT), [4, 5, 6])
    (lost,) = _step(s, ledger, oracle, s.schedule("b", 9, new=True), 1)
    assert (lost.owed, lost.served) == (8, 0)
    assert "group 0 (full) blocks 0..1 held as 1, 2" in lost.text
    # its twin: the same re-send served the blocks
    s.add("c", list(PROMPT), [1, 2, 7], hit=8)
    assert _step(s, ledger, oracle, s.schedule("c", 1, new=True), 2) == []
    assert (oracle.owed_tokens, oracle.served_tokens) == (16, 8)


def test_step_end_owes_nothing_the_step_in_flight_writes_and_same_pass_owes_it():
    for visibility, owed in ((Visibility.STEP_END, 0), (Visibility.SAME_PASS, 8)):
        s, ledger, oracle = _run([Group(BLOCK, "full")], Profiles(visibility))
        s.add("a", list(PROMPT), [1, 2, 3])
        s.add("b", list(PROMPT), [4, 5, 6])
        output = s.step({"a": 9, "b": 9}, new=("a", "b"))
        lost = _step(s, ledger, oracle, output, 0)
        assert oracle.owed_tokens == owed
        assert [x.owed for x in lost] == ([8] if owed else [])


def test_a_block_handed_out_for_other_tokens_is_evicted_in_every_group():
    groups = [Group(BLOCK, "full"), Group(BLOCK, "sliding_window", window=4)]
    s, ledger, oracle = _writer(groups=groups)
    # d takes block 2 of group 1 (group 0's copy of block 1 of a's prompt) for other tokens
    s.add("d", [50, 51, 52], [9], [2])
    _step(s, ledger, oracle, s.schedule("d", 3, new=True), 1)
    s.add("b", list(PROMPT), [4, 5, 6], [7, 8, 10])
    (lost,) = _step(s, ledger, oracle, s.schedule("b", 9, new=True), 2)
    assert lost.owed == 4  # block 1 of group 0 is gone with block 2: only 0..3 is owed
    # its twin: nothing handed out, both blocks owed
    s, ledger, oracle = _writer(groups=groups)
    s.add("b", list(PROMPT), [4, 5, 6], [7, 8, 10])
    (lost,) = _step(s, ledger, oracle, s.schedule("b", 9, new=True), 1)
    assert lost.owed == 8


def test_a_draft_block_commits_once_the_drafters_reach_is_computed():
    """ALLOC-COMMIT-1: with 2 MTP modules a draft block waits for 1 more computed token."""
    groups = [Group(BLOCK, "full", target=True, draft=True)]
    profiles = Profiles(Visibility.STEP_END, speculative="exact")
    s, ledger, oracle = _run(groups, profiles, modules=2)
    prompt = list(range(1, 13))  # the key of block 1 covers tokens 0..9
    s.add("a", prompt, [1, 2, 3])
    _step(s, ledger, oracle, s.schedule("a", 8, new=True), 0)  # blocks 0, 1 written
    s.add("b", prompt, [4, 5, 6])
    _step(s, ledger, oracle, s.schedule("b", 1, new=True), 1)
    assert oracle.owed_tokens == 4  # block 1 waits for token 8 to be computed
    s.add("c", prompt, [7, 8, 9])
    _step(s, ledger, oracle, s.schedule("a", 1), 2)  # token 8 computed
    _step(s, ledger, oracle, s.schedule("c", 1, new=True), 3)
    assert oracle.owed_tokens == 4 + 8


def test_sparse_retention_owes_only_what_the_writers_retained_lengths_need():
    """RET-SPARSE-2: a 17-token prompt (window 4) retains the blocks a hit at 16 needs."""
    groups = [Group(BLOCK, "full"), Group(BLOCK, "sliding_window", window=4)]
    prompt = list(range(1, 18))
    for retention, owed in ((Retention.DENSE, 8), (Retention.SPARSE, 0)):
        s, ledger, oracle = _run(groups, Profiles(Visibility.STEP_END, retention))
        s.add("a", prompt, [1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
        _step(s, ledger, oracle, s.schedule("a", 17, new=True), 0)
        # a sibling sharing 9 tokens: a hit at 8 needs window block 1, which only dense keeps
        s.add("b", [*prompt[:9], 99, 98], [11, 12, 13], [14, 15, 16])
        _step(s, ledger, oracle, s.schedule("b", 11, new=True), 1)
        assert oracle.owed_tokens == owed, retention


def test_a_pass_whose_request_was_released_in_flight_commits_nothing_under_step_end():
    s, ledger, oracle = _run([Group(BLOCK, "full")], Profiles(Visibility.STEP_END))
    s.add("a", list(PROMPT), [1, 2, 3])
    _step(s, ledger, oracle, s.schedule("a", 9, new=True), 0, applied=False)  # in flight
    s.add("b", [70], [4])
    output = s.schedule("b", 1, new=True)
    output.preempted_req_ids = {"a"}  # released while step 0 runs
    _step(s, ledger, oracle, output, 1)
    s.add("c", list(PROMPT), [5, 6, 7])
    assert _step(s, ledger, oracle, s.schedule("c", 9, new=True), 2) == []
    assert oracle.owed_tokens == 0


def test_profiles_take_the_enum_or_its_value_and_refuse_anything_else():
    assert Profiles("same-pass", "sparse", 0, "drop").retention is Retention.SPARSE
    with pytest.raises(InvalidOp, match="visibility must be one of"):
        Profiles("same_pass")


def test_reset_forgets_everything_written():
    s, ledger, oracle = _writer()
    oracle.reset()
    s.add("b", list(PROMPT), [4, 5, 6])
    assert _step(s, ledger, oracle, s.schedule("b", 9, new=True), 1) == []
    assert oracle.owed_tokens == 0


def test_under_async_a_block_completed_by_a_token_in_flight_commits_once_it_is_taken():
    """Async scheduling: a's decode pass of position 7 is scheduled while the pass that
    sampled token 7 still runs, and completes block 1, which the engine can key once that
    output is taken. b, admitted after a finished, is owed both blocks. Its twin: judged on
    the scheduler's tokens alone (no runner's), the pass reaches only position 6 and the
    block is not owed; and b admitted while that pass's output is not taken yet is owed
    block 0 only."""
    prompt = [1, 2, 3, 4, 5, 6, 7]
    for runner, taken, owed in ((True, True, 8), (False, True, 4), (True, False, 4)):
        s, ledger, oracle = _run([Group(BLOCK, "full")], Profiles(Visibility.SAME_PASS))
        tokens = ledger.tokens if runner else None
        s.add("a", list(prompt), [1, 2])
        output = s.schedule("a", 7, new=True)
        oracle.judge(s, output, 0, ledger.slots, tokens)
        (sampled,), _ = ledger.forward(s, output, 0)
        output = s.schedule("a", 1)  # position 7, whose token the runner alone knows yet
        oracle.judge(s, output, 1, ledger.slots, tokens)
        ledger.forward(s, output, 1)
        s.requests["a"].all_token_ids += sampled  # step 0's output taken
        ledger.unapplied["a"].pop(0)
        oracle.applied = 1 if taken else 0
        s.add("b", [*prompt, *sampled, 60, 61], [3, 4, 5])
        _step(s, ledger, oracle, s.schedule("b", 11, new=True), 2, applied=False)
        assert oracle.owed_tokens == owed, (runner, taken)
