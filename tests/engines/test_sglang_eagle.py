"""The SGLang campaign under EAGLE, its engine-free pieces: what a slot holds, the verify
pass's tokens, the workloads, the causes of a hit served short."""

from __future__ import annotations

import dataclasses
import types

import pytest

from kvcert.conformance.sglang.campaign import command, eagle, places
from kvcert.conformance.sglang.campaign.ledger import Ledger, identities
from kvcert.conformance.sglang.campaign.workload import generate, next_token, swa_floor

TOKENS = [5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_a_slot_holds_the_kv_of_its_position_and_the_token_after_it():
    """The draft layer's KV at p is computed from token p + 1: a position's identity is the
    plain identity of the next one, and the last position's is not known yet."""
    ids = eagle.slot_identities(TOKENS)
    assert ids[:-1] == identities(TOKENS)[1:]
    assert ids[-1] == eagle.UNSEEN
    other = eagle.slot_identities([*TOKENS[:4], 99, *TOKENS[5:]])
    assert other[:3] == ids[:3]
    assert other[3] != ids[3]  # position 3 agrees on its tokens, not on the next one


def test_a_pass_reads_the_token_after_its_end_from_the_prompt_or_its_sample():
    assert eagle.with_next(TOKENS, 4) == TOKENS[:5]  # a middle chunk: the prompt goes on
    end = len(TOKENS)
    assert eagle.with_next(TOKENS, end) == [*TOKENS, next_token(TOKENS)]  # its own sample


def test_a_verify_pass_commits_the_accepted_drafts_and_a_bonus_token():
    counts = set()
    for first in range(200):
        tokens = [first, *TOKENS]
        run = eagle.verified(tokens)
        counts.add(len(run) - 1)
        assert len(run) == eagle.accepted(tokens) + 1
        assert run == [next_token([*tokens, *run[:i]]) for i in range(len(run))]
    assert counts == set(range(eagle.DRAFT_TOKENS))  # none to every draft accepted


def test_a_request_is_owed_a_position_only_with_the_token_after_it():
    ledger = Ledger(page=2)
    ledger.write(range(10, 18), eagle.slot_identities([*TOKENS[:8], TOKENS[8]])[:8], step=0)
    assert ledger.owed(eagle.slot_identities(TOKENS), step=1).length == 8
    changed = [*TOKENS[:5], 99, *TOKENS[6:]]
    # position 4's KV read token 5, which the new request does not have: pages 0 and 1
    assert ledger.owed(eagle.slot_identities(changed), step=1).length == 4


def test_sglangs_match_reaches_the_spec_hit_for_the_first_n_minus_1_tokens():
    ledger = Ledger(page=2)
    ledger.write(range(10, 18), eagle.slot_identities(TOKENS)[:8], step=0)
    run = types.SimpleNamespace(ledger=ledger, step=1, window=None)
    assert ledger.owed(eagle.slot_identities(TOKENS), step=1).length == 8
    assert eagle.capped(run, TOKENS).length == 6  # 8 tokens: positions 0..6, page-floored
    assert eagle.capped(run, TOKENS[:8]).length == 6


def test_the_early_cap_also_sees_passes_whose_results_are_not_processed():
    """Under overlap a pass launched in step s writes for the end of step s + 1; SGLang may
    serve it in step s + 1 already (sound, early), so the cap it could reach counts it."""
    ledger = Ledger(page=2)
    ledger.write(range(10, 14), eagle.slot_identities(TOKENS)[:4], step=0)
    ledger.write(range(14, 18), eagle.slot_identities(TOKENS)[4:8], step=2)  # launched in 1
    run = types.SimpleNamespace(ledger=ledger, step=2, window=None)
    assert eagle.capped(run, TOKENS).length == 4
    assert eagle.capped(run, TOKENS, early=True).length == 6


def test_the_page_an_insert_left_out_is_the_bigram_insert():
    holders = places.Holders(in_tree={2, 3}, rows=[], free_pages={4, 5})
    holders.rows = [places.Row(slots=[2, 3, 6, 7, 12, 13], prompt=4, branched=False, protected=2)]
    assert holders.page(3, 2) == places.PROMPT  # no bigram keys: a prompt never published
    holders.bigram_keys = True
    assert holders.page(3, 2) == places.BIGRAM_INSERT  # the page just past the insert
    assert holders.page(4, 2) == places.DROPPED
    holders.content = {8: b"last", 10: b"evicted"}
    holders.published = places.Published(kv={b"evicted"}, bigram_dropped={b"last", b"evicted"})
    assert holders.page(4, 2) == places.BIGRAM_INSERT  # a finished request's last page
    assert holders.page(5, 2) == places.FREED  # the tree held it: evicted since


@pytest.mark.parametrize("model", ["full", "swa"])
def test_an_eagle_workload_is_the_same_requests_in_a_pool_with_a_decode_reserve(model):
    for seed in range(20):
        plain = generate(seed, model)
        served = eagle.served_with_eagle(plain)
        pool = plain.pool_tokens + -(-eagle.reserve() // plain.page) * plain.page
        if plain.window is not None:  # the SWA pool keeps a running request's reserve too
            floor = swa_floor(plain.window, plain.swa_interval, plain.page, eagle.reserve())
            assert floor == swa_floor(plain.window, plain.swa_interval, plain.page) + 16
            pool = max(pool, floor)
        assert served == dataclasses.replace(plain, eagle=True, pool_tokens=pool)
    assert eagle.reserve() == 8  # 2 x max(3 steps x top-k 1, 4 draft tokens)


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--model", "mamba-paged"], ""),  # the extra buffer: played
        (["--model", "mamba"], ""),  # no buffer at page 1, synchronously: played
        (["--model", "swa-mamba"], ""),
        (["--overlap"], ""),  # spec v2 overlapped, the server's default: played
        (["--overlap", "--model", "mamba"], ""),  # overlapped: the extra buffer
        (["--overlap", "--model", "mamba", "--lazy"], "the lazy strategy plans"),
        (["--mixed-chunk"], "turns mixed chunked prefill off"),
        (["--mutant", "eagle-plain-keys"], None),
    ],
)
def test_eagle_runs_what_the_campaign_drives_and_refuses_the_rest(argv, refusal, capsys):
    if refusal is None:
        assert command._arguments([*argv, "--eagle"]).eagle
        with pytest.raises(SystemExit):
            command._arguments(argv)
        assert "breaks EAGLE's keys: add --eagle" in capsys.readouterr().err
        return
    if not refusal:
        assert command._arguments([*argv, "--eagle"]).eagle
        return
    with pytest.raises(SystemExit) as exit_:
        command._arguments([*argv, "--eagle"])
    assert exit_.value.code == 2
    assert refusal in capsys.readouterr().err


def test_overlapped_verify_runs_commit_oldest_first_and_a_finished_request_drops_its_own():
    """Under overlap a request may have two verify passes launched and one result
    processed: each result takes its own pass's run off the request's queue, the oldest
    first; a request finished since the launch commits nothing and its run is dropped."""
    req = types.SimpleNamespace(rid="r", finished=lambda: True, is_retracted=False)
    run = types.SimpleNamespace(
        sampled={id(req): [1, 2, 3, 4]},  # two passes' runs: 3 tokens, then 1
        pending_runs={id(req): [3, 1]},
        overlap=True,
        findings=types.SimpleNamespace(dropped=0),
    )
    batch = types.SimpleNamespace(reqs=[req])
    eagle.commit(run, batch)  # the first run: its request finished since, so dropped
    assert run.sampled == {id(req): [4]}
    assert run.pending_runs == {id(req): [1]}
    assert run.findings.dropped == 3
    eagle.commit(run, batch)
    assert run.sampled == {}
    assert run.pending_runs == {}
    assert run.findings.dropped == 4


def test_a_stale_draft_read_is_one_whose_target_kv_is_the_readers():
    """A slot holding the target's KV of the reader's prefix, and the draft layer's of
    another next token, is a stale draft; any other content is unsound outright."""
    ledger = Ledger(page=1)
    writer = [*TOKENS[:4], 99]
    ids = eagle.slot_identities(writer)
    ledger.write([1, 2, 3, 4], ids[:4], step=0)
    ledger.targets.update(zip(ids[:4], identities(writer)[:4], strict=True))
    reader = eagle.slot_identities(TOKENS)
    plain = identities(TOKENS)
    assert ledger.unsound([1, 2, 3, 4], reader[:4]) == [3]  # position 3 read token 99
    assert eagle.stale_drafts(ledger, [4], [plain[3]])
    assert not eagle.stale_drafts(ledger, [4], [plain[2]])  # the target KV is not the reader's
    assert not eagle.stale_drafts(ledger, [7], [plain[3]])  # never written
    assert not eagle.stale_drafts(ledger, [], [])


@pytest.mark.parametrize(("model", "explained"), [("mamba", True), ("full", False)])
def test_stale_draft_reads_are_the_finding_only_beside_a_mamba_component(model, explained):
    """SGLang keys tokens under EAGLE only beside a Mamba component; on a model whose tree
    keys bigrams (the twin eagle-plain-keys) the same reads fail the run."""
    from kvcert.conformance.sglang.campaign.loop import Findings

    tally = command.Tally()
    workload = generate(0, model)
    read = "step 3: r1 read position 4 from slot 9"
    tally.add(0, workload, Findings(draft_stale=[read], finished=len(workload.arrivals)))
    assert bool(tally.stale_draft) == explained
    assert bool(tally.unsound) != explained
    assert tally.failed() != explained


def test_what_a_verify_committed_past_the_stop_is_the_overshoot():
    """KV and states past a finished request's stop, freed by its release, are OVERSHOOT;
    what the tree once held stays an eviction."""
    holders = places.Holders(in_tree=set(), rows=[], free_pages={4, 5})
    holders.content = {4: b"past", 5: b"evicted"}
    holders.published = places.Published(kv={b"evicted"}, overshoot_kv={b"past", b"evicted"})
    assert holders.page(4, 1) == places.OVERSHOOT
    assert holders.page(5, 1) == places.FREED
    holders.states = [7, 8]
    holders.free_states = {0, 1}
    holders.published.overshoot_states = {7}
    assert holders.state(7) == places.OVERSHOOT_STATE
    assert holders.state(8) == places.DROPPED_STATE
