"""The SGLang campaign's engine-free pieces: the slot ledger, its oracle and the workloads."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from kvcert.conformance.sglang.campaign import command, loop, places, variants
from kvcert.conformance.sglang.campaign.ledger import Ledger, identities
from kvcert.conformance.sglang.campaign.workload import (
    MODELS,
    PRIORITIES,
    PRIORITY_ROWS,
    ROWS,
    generate,
    next_token,
    outputs,
)


def test_a_page_written_by_an_ended_step_is_owed_up_to_the_last_whole_page():
    ledger = Ledger(page=2)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    ledger.write([2, 3, 4, 5, 6, 7], identities(prompt[:6]), step=0)
    assert ledger.owed(identities(prompt), step=0).length == 0  # ALLOC-VIS-1: step-end
    owed = ledger.owed(identities(prompt), step=1)
    assert (owed.length, owed.pages) == (6, (1, 2, 3))
    # a request of exactly 6 tokens computes its last one: 4 are owed (the hit is below n)
    assert ledger.owed(identities(prompt[:6]), step=1).length == 4


def test_an_overwritten_or_misaligned_run_holds_nothing():
    ledger = Ledger(page=2)
    tokens = [1, 2, 3, 4, 5]
    ledger.write([3, 4], identities(tokens[:2]), step=0)  # slots 3, 4 straddle two pages
    assert ledger.owed(identities(tokens), step=1).length == 0
    ledger.write([4, 5, 6, 7], identities(tokens[:4]), step=0)
    assert ledger.owed(identities(tokens), step=1).length == 4
    ledger.write([6], identities([9]), step=1)  # slot 6 now holds another prefix's KV
    assert ledger.owed(identities(tokens), step=2).length == 2


def test_a_read_of_a_slot_holding_another_prefix_is_unsound():
    ledger = Ledger(page=1)
    ledger.write([1, 2, 3], identities([4, 5, 6]), step=0)
    assert ledger.unsound([1, 2, 3], identities([4, 5, 6])) == []
    assert ledger.unsound([1, 2, 3], identities([4, 7, 6])) == [1, 2]
    assert ledger.unsound([1, 9], identities([4, 5])) == [1]  # never written


def test_workloads_are_data_drawn_from_their_seed():
    first = generate(7)
    assert generate(7) == first
    for seed in range(50):
        w = generate(seed)
        assert w.pool_tokens % w.page == 0
        assert w.chunk % w.page == 0
        assert w.pool_tokens > max(len(a.prompt) + a.max_tokens for a in w.arrivals)
        assert [a.step for a in w.arrivals] == sorted(a.step for a in w.arrivals)


def test_a_model_fixes_the_page_and_the_extra_buffer_draws_long_prompts():
    for seed in range(30):
        assert generate(seed, "mamba").page == 1  # no buffer: page 1 only
        assert generate(seed, "swa-mamba").page == 1
        paged = generate(seed, "mamba-paged")
        assert paged.page in (2, 4)
        assert max(len(a.prompt) for a in paged.arrivals) >= 64  # past the state grid
    assert generate(3, "full") == generate(3)
    with pytest.raises(ValueError, match="unknown model"):
        generate(0, "mamba2")


def test_the_model_answers_a_prefix_the_same_way_every_time():
    said = outputs((3, 4, 5), 4)
    assert said[:2] == outputs((3, 4, 5), 2)
    assert said[1] == next_token((3, 4, 5, said[0]))
    assert all(1 <= t <= 900 for t in said)


def test_a_broken_twin_or_a_fix_is_named_from_its_list():
    assert variants.chosen("mutant", "no-checkpoint", variants.MUTANTS) == "no-checkpoint"
    assert variants.chosen("fix", None, variants.FIXES) is None
    with pytest.raises(ValueError, match="unknown mutant 'no-checkpoints'; choose one of"):
        variants.chosen("mutant", "no-checkpoints", variants.MUTANTS)
    with pytest.raises(ValueError, match="unknown fix"):
        variants.chosen("fix", "swa-headroom", variants.FIXES)


def test_only_the_documented_causes_explain_a_lost_hit():
    assert set(command.EXPLAINED) == {
        places.DECODED,
        places.FREED,
        places.RUNNING_STATE,
        places.FREED_STATE,
        places.SWA_DECODED,
        places.SWA_FREED,
        places.BRANCHED,
        places.RETRACTED,
        places.RETRACTED_STATE,
        places.BIGRAM_CAP,
        places.BIGRAM_INSERT,
        places.OVERSHOOT,
        places.OVERSHOOT_STATE,
    }
    for unexplained in (places.MATCH, places.PROMPT, places.STATE_MATCH, places.SWA_MATCH,
                        places.SWA_PROMPT, places.DROPPED, places.DROPPED_STATE,
                        places.PROMPT_STATE):  # fmt: skip
        assert unexplained not in command.EXPLAINED
    with pytest.raises(SystemExit):
        command.main(["--runs", "0"])


def test_ci_plays_every_broken_twin_on_a_model_it_breaks():
    from pathlib import Path

    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    lines = [" ".join(x.split()) for x in ci.replace("\\\n", " ").splitlines()]
    line = next(x for x in lines if x.startswith("for sglang_twin in"))
    played = dict(t.split(":") for t in line.split(" in ", 1)[1].split(";")[0].split())
    # a twin that needs a flag (a preemption needs --priority) is played on a line of its own
    alone = [re.search(r"--mutant ([a-z-]+) --model (\S+)", x) for x in lines]
    played.update(m.groups() for m in alone if m and ("--priority" in m.string or
                                                       "--eagle" in m.string))  # fmt: skip
    assert set(played) == set(variants.MUTANTS)
    assert played["preempt-frees-prefix"] == "full"  # any model preempts
    assert played["eagle-plain-keys"] in ("full", "swa")  # the models EAGLE runs on
    assert set(played.values()) <= set(MODELS)
    assert played["no-state-copy"] in ("mamba", "mamba-paged")  # a state to copy
    assert played["track-final-state"] == "mamba-paged"  # only the extra buffer tracks
    assert played["swa-window-short"] == "swa"  # only a sliding window releases a window
    assert played["swa-branch-ignores-state"] == "swa-mamba"  # a branch point and a state
    models = next(x for x in lines if x.startswith("for model in"))
    assert set(models.split(" in ", 1)[1].split(";")[0].split()) == set(MODELS)


def test_a_hybrid_is_owed_a_hit_only_where_a_state_is_held():
    """HIT-GROUP-1 over a Mamba group of block 1 (mode all): the hit ends at a held state."""
    ledger = Ledger(page=1)
    tokens = [3, 1, 4, 1, 5, 9]
    idents = identities(tokens)
    ledger.write(range(1, 6), idents[:5], step=0)
    at = {ledger.state_id(idents[1]), ledger.state_id(idents[3])}  # states after 2 and 4
    assert ledger.owed(idents, step=1, state_held=at.__contains__).length == 4
    assert ledger.owed(idents, step=1, state_held=set().__contains__).length == 0
    assert ledger.owed(idents, step=1).length == 5  # attention alone: up to n - 1
    assert ledger.state_id(idents[1]) != ledger.state_id(idents[3])
    assert ledger.state_id(idents[1]) > 0  # 0 is a cleared state


def test_the_command_says_where_sglang_is_missing(capsys, monkeypatch):
    """Without SGLang importable (made so here, whatever this process's path holds: another
    test may have put the engine venv's packages on it), the command says how to get it."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "sglang" else found(name, *rest),
    )
    assert command.main(["--runs", "1"]) == 2
    assert "engine-venv.sh sglang 0.5.23" in capsys.readouterr().err


def test_a_sliding_window_is_owed_only_where_its_window_is_held():
    """HIT-SW-1 over the SWA ledger: the hit needs the W - 1 positions before it held."""
    full, swa = Ledger(page=1), Ledger(page=1)
    tokens = [2, 7, 1, 8, 2, 8]
    idents = identities(tokens)
    full.write(range(1, 6), idents[:5], step=0)
    window = loop.Window(3, swa)  # W = 3: a hit at L reads positions L - 2, L - 1
    assert full.owed(idents, step=1, window=window).length == 0  # no SWA held
    swa.write([11, 12], idents[2:4], step=0)  # positions 2, 3
    owed = full.owed(idents, step=1, window=window)
    assert (owed.length, owed.window_pages) == (4, {2: 11, 3: 12})
    swa.write([13], idents[4:5], step=0)  # position 4 too: a hit at 5 reads 3, 4
    assert full.owed(idents, step=1, window=window).length == 5


def test_swa_workloads_draw_a_window_and_an_interval_the_pool_holds():
    for seed, model in zip(range(30), ("swa", "swa-mamba") * 15, strict=True):
        w = generate(seed, model)
        assert w.window in (1, 2, 3, 4, 7, 8)
        assert w.swa_interval in (1, 4, 16)
        # SGLang's SWA pool is a share (0.8 by default) of the full one: above half of it,
        # what a lone running request keeps (window, interval, a page) and a page to admit
        assert w.pool_tokens // 2 > w.window + w.swa_interval + w.page
        assert generate(seed, "full").window is None
    full = generate(5, "full")
    assert (full.arrivals, full.page) == (generate(5, "swa").arrivals, generate(5, "swa").page)


def test_a_row_names_where_its_page_lies():
    row = places.Row(slots=[4, 5, 6, 7], prompt=3, branched=False, protected=1)
    assert row.holding(2, places.DECODED, places.PROMPT) == places.PROMPT
    assert row.holding(4, places.DECODED, places.PROMPT) == places.DECODED
    branched = places.Row(slots=[4, 5, 6, 7], prompt=3, branched=True, protected=1)
    assert branched.holding(2, places.DECODED, places.PROMPT) == places.BRANCHED


def test_a_free_page_is_blamed_on_eviction_only_if_the_tree_held_its_kv():
    """FREED (node eviction) only for KV the tree once held; KV a retraction freed
    unpublished is RETRACTED; anything else free was never published: DROPPED."""
    holders = places.Holders(in_tree=set(), rows=[], free_pages={3, 4, 5})
    holders.content = {6: b"evicted", 8: b"retracted", 10: b"never"}
    holders.published = places.Published(kv={b"evicted"}, retracted_kv={b"retracted"})
    assert holders.page(3, 2) == places.FREED
    assert holders.page(4, 2) == places.RETRACTED
    assert holders.page(5, 2) == places.DROPPED
    assert holders.page(7, 2) == places.MATCH  # neither free nor in a row


def test_a_state_is_placed_by_who_held_it():
    """A state in a running slot is decode-publish only past its request's prompt; a freed
    state is eviction only if the tree held it, else a retraction's, else DROPPED."""
    holders = places.Holders(in_tree=set(), rows=[], free_pages=set())
    holders.states = [0, 11, 12, 13, 14, 15]
    holders.running_states, holders.prompt_states = {1, 2}, {12}
    holders.free_states = {3, 4, 5}
    holders.published = places.Published(states={13}, retracted_states={14})
    assert holders.state(11) == places.RUNNING_STATE
    assert holders.state(12) == places.PROMPT_STATE
    assert holders.state(13) == places.FREED_STATE
    assert holders.state(14) == places.RETRACTED_STATE
    assert holders.state(15) == places.DROPPED_STATE
    assert holders.state(99) == places.STATE_MATCH
    # under the extra buffer a running state is never owed: a copy of it in a free slot is
    # where the owed state was (the running slot may be one just handed out, stale)
    holders.states = [0, 13, 12, 13, 14, 15]
    assert holders.state(13) == places.RUNNING_STATE
    assert holders.state(13, running_owed=False) == places.FREED_STATE


def test_the_headroom_fix_charges_each_running_request_its_decode_reservation():
    """variants.keep_decode_headroom adds SGLang's own estimate per running request."""
    from types import SimpleNamespace

    budget = SimpleNamespace(swa_offset=3, swa_tokens=lambda extend, new: extend + min(new, 8) + 2)
    remaining = {"a": 5, "b": 20}
    adder = SimpleNamespace(memory_budget=budget, _swa_new_tokens=lambda r: remaining[r])
    variants.keep_decode_headroom(adder, SimpleNamespace(reqs=["a", "b"]))
    assert budget.swa_offset == 3 + (5 + 2) + (8 + 2)
    variants.keep_decode_headroom(adder, SimpleNamespace(reqs=[]))
    assert budget.swa_offset == 20
    # under EAGLE a decode step's reserve is allocated at once, past the window's cap
    variants.keep_decode_headroom(adder, SimpleNamespace(reqs=["b"]), reserve=8)
    assert budget.swa_offset == 20 + (8 + 2) + 8


def test_an_abort_is_explained_only_by_a_replay_of_a_window_model_without_a_fix():
    """Where no replay can explain an abort the cause is None (the run fails on it)."""
    from argparse import Namespace

    aborted, none = loop.Findings(aborted=1), loop.Findings()
    swa, full = generate(1011, "swa"), generate(1011)
    plain = Namespace(fix=None, mutant=None)
    fixed = Namespace(fix="swa-decode-headroom", mutant=None)
    assert command._abort_cause(swa, none, plain) is None  # nothing to explain
    assert command._abort_cause(full, aborted, plain) is None  # no SWA budget to fix
    assert command._abort_cause(swa, aborted, fixed) is None  # the fix played and aborted


def test_the_page_fix_keeps_a_cut_chunk_on_the_page_unless_that_empties_it():
    """variants.align_cut_chunks: SGLang's Mamba-grid floor first, then the page below."""
    from types import SimpleNamespace

    adder = SimpleNamespace(floor_chunked_tokens=lambda cut, remaining: cut)  # grid kept it
    variants.align_cut_chunks(adder, 4)
    assert adder.floor_chunked_tokens(63, 240) == 60  # a cut: onto the page
    assert adder.floor_chunked_tokens(63, 63) == 63  # the last chunk may end anywhere
    assert adder.floor_chunked_tokens(3, 240) == 3  # below a page: kept, to make progress


def test_an_unsound_read_is_explained_only_by_a_replay_of_a_mixed_workload_without_a_fix():
    from argparse import Namespace

    unsound, none = loop.Findings(unsound=["step 1: ..."]), loop.Findings()
    mixed = generate(95, "mamba-paged", mixed=True)
    plain = Namespace(fix=None, mutant=None)
    fixed = Namespace(fix="mixed-chunk-page-align", mutant=None)
    assert command._unsound_cause(mixed, none, plain) is None  # nothing to explain
    assert command._unsound_cause(generate(95, "mamba-paged"), unsound, plain) is None
    assert command._unsound_cause(mixed, unsound, fixed) is None  # the fix played


def test_overlap_draws_mamba_workloads_on_the_extra_buffers_units():
    """Under overlap SGLang's `auto` strategy runs Mamba with the extra buffer (page 1
    too), so `mamba` draws long prompts as `mamba-paged` does; other models are unchanged."""
    for seed, model in itertools.product(range(20), ("mamba", "swa-mamba")):
        sync, overlapped = generate(seed, model), generate(seed, model, overlap=True)
        assert overlapped.overlap
        assert not sync.overlap
        assert overlapped.page == sync.page == 1
        assert max(len(a.prompt) for a in overlapped.arrivals) >= 64  # past the state grid
        full = generate(seed, "full", overlap=True)
        assert dataclasses.replace(full, overlap=False) == generate(seed, "full")


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["--model", "full", "--lazy"], "never (no Mamba state)"),
        (["--model", "mamba", "--lazy"], "only under --overlap"),  # sync at page 1: no buffer
        (["--model", "swa", "--overlap", "--lazy"], "never (no Mamba state)"),
    ],
)
def test_the_lazy_variant_needs_a_model_that_runs_the_extra_buffer(argv, where, capsys):
    with pytest.raises(SystemExit) as exit_:
        command._arguments(["--runs", "1", *argv])
    assert exit_.value.code == 2
    message = f"--lazy varies the extra buffer, which --model {argv[1]} runs {where}"
    assert message in capsys.readouterr().err


def test_the_lazy_variant_runs_where_the_extra_buffer_does():
    assert command._arguments(["--model", "mamba-paged", "--lazy"]).lazy
    assert command._arguments(["--model", "swa-mamba", "--overlap", "--lazy"]).lazy


@pytest.mark.parametrize("model", MODELS)
def test_a_priority_workload_is_the_same_requests_with_priorities_in_fewer_rows(model):
    for seed in range(20):
        plain = generate(seed, model)
        ranked = generate(seed, model, priority=True)
        assert ranked.priority
        assert not plain.priority
        assert ranked.rows in PRIORITY_ROWS
        assert plain.rows == ROWS
        assert [dataclasses.replace(a, priority=0) for a in ranked.arrivals] == list(plain.arrivals)
        assert {a.priority for a in ranked.arrivals} <= set(PRIORITIES)
    drawn = {a.priority for s in range(20) for a in generate(s, model, priority=True).arrivals}
    # both sides of SGLang's default threshold (10): a preempting gap and one within it
    assert {0, 5, 50} <= drawn


def test_the_preemption_twin_needs_priority_scheduling(capsys):
    with pytest.raises(SystemExit) as exit_:
        command._arguments(["--mutant", "preempt-frees-prefix"])
    assert exit_.value.code == 2
    assert "breaks a preemption: add --priority" in capsys.readouterr().err
    args = command._arguments(["--mutant", "preempt-frees-prefix", "--priority"])
    assert args.priority
    assert args.mutant == "preempt-frees-prefix"


def test_the_single_flight_fix_refuses_only_a_second_chunked_request():
    """variants.refuse_second_chunk: a chunked admission is refused while another chunked
    request continues this round; an unchunked one, or one with none continuing, passes."""
    from types import SimpleNamespace

    chunked, whole = SimpleNamespace(is_chunked=True), SimpleNamespace(is_chunked=False)
    answers = iter([chunked, chunked, whole, "NO_TOKEN"])
    adder = SimpleNamespace(_select_prefill_admission=lambda req, **options: next(answers))
    variants.refuse_second_chunk(adder, "OTHER")
    select = adder._select_prefill_admission
    assert select("r", has_chunked_req=True) == "OTHER"
    assert select("r", has_chunked_req=False) is chunked
    assert select("r", has_chunked_req=True) is whole
    assert select("r", has_chunked_req=True) == "NO_TOKEN"  # a verdict passes through


def test_a_crash_is_explained_only_by_the_single_flight_assertion_without_a_fix():
    """Where no replay can explain a crash the cause is None (the run fails on it)."""
    from argparse import Namespace

    plain, fixed = (
        Namespace(fix=None, mutant=None),
        Namespace(fix="swa-decode-headroom", mutant=None),
    )
    other = loop.Findings(crashed="step 3: IndexError: list index out of range")
    asserted = loop.Findings(crashed="step 3: AssertionError: assert self.chunked_req is None")
    workload = generate(934, "swa", priority=True)
    assert command._crash_cause(workload, loop.Findings(), plain) is None  # nothing crashed
    assert command._crash_cause(workload, other, plain) is None  # another crash
    assert command._crash_cause(workload, asserted, fixed) is None  # a fix played
    assert "single-chunked-request" in variants.FIXES
