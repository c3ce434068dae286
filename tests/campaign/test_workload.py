"""The campaign's engine-free parts: workloads, shrinking, shards, reports, refusals."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from kvcert.conformance.campaign import command
from kvcert.conformance.campaign.workload import (
    CHECKPOINTING_MODELS,
    DRAFT_MODELS,
    MODELS,
    MTP_MODELS,
    OTHER_MODELS,
    SPEC_KEYINGS,
    STATE_MODELS,
    VOCAB,
    Arrival,
    Workload,
    generate,
    request_lengths,
    shrink,
    smaller,
    state_block_size,
)
from kvcert.conformance.cli import main
from tests.tiers import tiered


def test_a_seed_is_a_workload_and_round_trips_through_json():
    for seed in range(tiered(50, 500)):
        workload = generate(seed)
        assert generate(seed) == workload
        assert Workload.from_json(json.loads(json.dumps(workload.to_json()))) == workload
        rids = [a.rid for a in workload.arrivals]
        assert len(set(rids)) == len(rids)
        assert {rid for _, rid in workload.aborts} <= set(rids)
        assert [a.step for a in workload.arrivals] == sorted(a.step for a in workload.arrivals)


def test_generated_workloads_cover_what_the_campaign_promises():
    seen = [generate(seed) for seed in range(300)]
    assert {w.policy for w in seen} == {"fcfs", "priority"}
    assert {w.async_scheduling for w in seen} == {True, False}
    assert {w.model for w in seen} == {*MODELS, *OTHER_MODELS, *DRAFT_MODELS, *STATE_MODELS}
    served = {w.model for w in seen if w.spec_tokens}
    assert served == set(DRAFT_MODELS)
    assert {w.spec_tokens for w in seen} == {0, 1, 2, 3}
    assert {w.spec_keying for w in seen if w.spec_tokens} == set(SPEC_KEYINGS)
    assert any(w.aborts for w in seen)
    assert any(w.resets for w in seen)
    # shared prefixes: some pair of requests starts with the same 16 tokens
    assert any(
        len({a.prompt[:16] for a in w.arrivals if len(a.prompt) >= 16})
        < len([a for a in w.arrivals if len(a.prompt) >= 16])
        for w in seen
    )


def _vllm_hybrid_block(model: str) -> int:
    """vLLM's platform rule, restated from the model file alone: 16 x cdiv(state page,
    16 x attention bytes per token), the state page being the sum of its tensors' bytes."""
    path = Path(__file__).resolve().parents[2] / "conformance/tools/models" / f"{model}.json"
    types = json.loads(path.read_text(encoding="utf-8"))["layer_types"].values()
    size = {"bf16": 2, "fp16": 2, "fp32": 4}
    state = max(sum(math.prod(t["shape"]) * size[t["dtype"]] for t in kind["tensors"])
                for kind in types if kind["kind"] == "mamba")  # fmt: skip
    attention = max(k["num_kv_heads"] * (k["head_size_k"] + k["head_size_v"]) * 2
                    for k in types if k["kind"] == "full")  # fmt: skip
    return 16 * -(-state // (16 * attention))


def test_state_hybrids_are_served_at_vllms_block_size_and_drawn_in_its_units():
    # 544 tokens: the block vLLM serves Qwen3.5-0.8B with (LMCache's documented figure)
    assert state_block_size("qwen3.5-0.8b") == 544
    for model in STATE_MODELS:
        assert state_block_size(model) == _vllm_hybrid_block(model), model
    stateful = [w for w in map(generate, range(300)) if w.model in STATE_MODELS]
    assert {w.model for w in stateful} == set(STATE_MODELS)
    for w in stateful:
        block = state_block_size(w.model)
        unit = block // 16
        assert all(len(a.prompt) % unit == 0 for a in w.arrivals)
        assert w.budget % unit == 0
        assert w.long_prefill % unit == 0
        longest = max(len(a.prompt) + a.max_tokens for a in w.arrivals)
        assert w.usable_blocks * block >= longest  # the pool holds the longest request
        assert max(len(a.prompt) for a in w.arrivals) > block  # prompts span whole blocks


def test_checkpointing_backends_are_drawn_only_when_asked_and_change_nothing_else():
    """`kvcert fuzz --kvcert` serves most Qwen3.5 seeds with a backend that saves state
    inside a prefill; the same seed without the option is the workload it always was, and
    a workload without checkpoints writes the JSON it wrote before the option existed."""
    import dataclasses

    drawn = 0
    for seed in range(tiered(300, 3000)):
        plain, saving = generate(seed), generate(seed, state_checkpoints=True)
        assert not plain.state_checkpoints
        assert "state_checkpoints" not in plain.to_json()
        assert dataclasses.replace(saving, state_checkpoints=False) == plain
        if saving.state_checkpoints:
            drawn += 1
            assert saving.model in CHECKPOINTING_MODELS
            assert Workload.from_json(json.loads(json.dumps(saving.to_json()))) == saving
            assert dataclasses.replace(saving, state_checkpoints=False) in set(smaller(saving))
    assert drawn >= tiered(15, 150)


def test_drafting_state_workloads_decode_across_state_block_boundaries():
    """With drafts on a state hybrid (`--state-drafts`, always on with `--kvcert`) some
    requests decode a few tokens past the state block boundary after their prompt, where a
    step verifying drafts crosses it (ALLOC-SPEC-2; drawn outputs alone rarely reach a
    544-token boundary). Prompts are the drawn ones, outputs only grow, the pool keeps its drawn
    margin beyond the longest request, and every other seed is the workload it always was."""
    import dataclasses

    drafting = crossing = 0
    for seed in range(tiered(300, 3000)):
        plain, drafted = generate(seed), generate(seed, state_drafts=True)
        if not drafted.spec_tokens or drafted.model not in STATE_MODELS:
            assert drafted == plain
            continue
        drafting += 1
        block = state_block_size(drafted.model)
        pairs = list(zip(plain.arrivals, drafted.arrivals, strict=True))
        assert all(p.prompt == d.prompt and p.max_tokens <= d.max_tokens for p, d in pairs)
        spans = [
            -(-max(len(a.prompt) + a.max_tokens for a in w.arrivals) // block)
            for w in (plain, drafted)
        ]  # blocks the longest request spans: the pool keeps its drawn margin beyond it
        assert drafted.usable_blocks - spans[1] == plain.usable_blocks - spans[0] >= 1
        assert (
            dataclasses.replace(
                drafted,
                arrivals=plain.arrivals,
                usable_blocks=plain.usable_blocks,
                spec_tokens=0,
                spec_keying=plain.spec_keying,
            )
            == plain
        )
        crossing += any(
            (len(a.prompt) // block + 1) * block < len(a.prompt) + a.max_tokens
            for a in drafted.arrivals
        )
    assert drafting >= tiered(5, 50)
    assert crossing >= drafting // 4, (crossing, drafting)


def test_mtp_drafters_are_drawn_only_when_asked_and_change_only_drafted_seeds():
    """`--mtp` (always on with `--kvcert`) serves half the drafted attention-only seeds with a
    multi-module MTP drafter of 2-3 modules on a model that declares no drafter of its own,
    some requests a near miss of an earlier one (the same tokens up to a block boundary and
    the modules - 1 after it, then another: only the last module tells the blocks apart).
    Every other seed is the workload it always was, and an EAGLE workload writes the JSON it
    wrote before the option existed."""
    import dataclasses

    drawn = near = 0
    for seed in range(tiered(300, 3000)):
        plain, mtp = generate(seed), generate(seed, mtp=True)
        assert plain.drafter == "eagle"
        assert "drafter" not in plain.to_json()
        if mtp.drafter == "eagle":
            assert mtp == plain
            continue
        drawn += 1
        assert plain.spec_tokens
        assert mtp.model in MTP_MODELS
        assert 2 <= mtp.spec_tokens <= 3
        pairs = list(zip(plain.arrivals, mtp.arrivals, strict=True))
        assert all(m.prompt[-len(p.prompt) :] == p.prompt for p, m in pairs)  # only a prefix
        back = dataclasses.replace(
            mtp,
            model=plain.model,
            spec_tokens=plain.spec_tokens,
            drafter="eagle",
            arrivals=plain.arrivals,
            usable_blocks=plain.usable_blocks,
        )
        assert back == plain
        assert Workload.from_json(json.loads(json.dumps(mtp.to_json()))) == mtp
        assert all(w.size < mtp.size for w in smaller(mtp))
        shared = mtp.spec_tokens - 1
        for i, arrival in enumerate(mtp.arrivals):
            if arrival == pairs[i][0]:
                continue
            near += 1
            cut = len(arrival.prompt) - len(pairs[i][0].prompt) - 1  # where it differs
            assert cut % 16 == shared
            assert any(
                len(other.prompt) > cut
                and other.prompt[:cut] == arrival.prompt[:cut]
                and other.prompt[cut] != arrival.prompt[cut]
                for other in mtp.arrivals[:i]
            )
    assert drawn >= tiered(20, 200)
    assert near >= drawn // 2, (near, drawn)


def _family(arrival, others, block):
    """Which lost-hit family `arrival` is of, judged against the other arrivals (None: of
    none)."""
    p = arrival.prompt
    if arrival.follows is not None:
        return "multi-turn" if arrival.follows in {o.rid for o in others} else None
    for other in others:
        q = other.prompt
        if p == q:
            return "re-send"
        if len(p) > len(q) and p[: len(q)] == q:
            return "extension"
        if len(p) < len(q) and q[: len(p)] == p and len(p) % block in (0, 1, block - 1):
            return "aligned"
        cut = next((i for i, (x, y) in enumerate(zip(p, q, strict=False)) if x != y), None)
        if cut is not None and cut % block in (0, 1, block - 1) and p[cut] == (q[cut] + 1) % VOCAB:
            return "sibling"
    return None


def test_lost_hit_families_are_drawn_only_when_asked_and_each_has_its_shape():
    """`--families` (always on with `--kvcert`) rewrites about half the later requests of a
    seed from an earlier one's prompt: re-sends, extensions, multi-turn follow-ups (sent
    after the request they follow, with its answer), siblings diverging one token before, at
    or after a block boundary, prefixes of exactly k blocks +- 1; and about a third of the
    seeds whose model has a sliding-window or state layer ask for sparse retention with an
    interval of 0-3 alignment units. The rest of the workload is the one drawn without it,
    the pool keeps its margin over the longest conversation (on a quarter of the seeds, the
    smallest: one block), and every family is drawn."""
    seen, units, tight = set(), set(), 0
    for seed in range(tiered(200, 2000)):
        plain, families = generate(seed), generate(seed, families=True)
        assert generate(seed, families=False) == plain
        assert plain.retention_units is None
        units.add(families.retention_units)
        block = state_block_size(plain.model) if plain.model in STATE_MODELS else 16
        before = {a.rid: a for a in plain.arrivals}
        assert {a.rid for a in families.arrivals} == set(before)
        assert [a.step for a in families.arrivals] == sorted(a.step for a in families.arrivals)
        lengths = request_lengths(families.arrivals)
        for arrival in families.arrivals:
            if arrival.follows is not None:
                source = next(a for a in families.arrivals if a.rid == arrival.follows)
                assert source.step <= arrival.step
                assert lengths[arrival.rid] == (
                    lengths[source.rid] + len(arrival.prompt) + arrival.max_tokens
                )
        assert families.usable_blocks * block >= max(lengths.values())
        tight += families.usable_blocks == -(-max(lengths.values()) // block) + 1
        assert families.max_model_len >= max(lengths.values())
        for arrival in families.arrivals:
            drawn = before[arrival.rid]
            if arrival == drawn:
                continue
            assert (arrival.priority, arrival.max_tokens) == (drawn.priority, drawn.max_tokens)
            others = [a for a in families.arrivals if a.rid != arrival.rid]
            family = _family(arrival, others, block)
            assert family is not None, (seed, arrival.rid)
            seen.add(family)
        assert Workload.from_json(json.loads(json.dumps(families.to_json()))) == families
    assert seen == {"re-send", "extension", "multi-turn", "sibling", "aligned"}
    assert units == {None, 0, 1, 2, 3}
    assert tiered(200, 2000) // 8 < tight < tiered(200, 2000) // 2


def test_a_follow_up_names_a_request_before_it_and_shrinking_sends_it_alone():
    """A follow-up must follow a request listed before it (a ValueError says which, not a
    hang in the loop); removing the request it follows while shrinking sends the turn alone,
    and dropping the link is itself a simplification."""
    first = Arrival(0, "r0", (1, 2, 3), 0, 4)
    turn = Arrival(1, "r1", (9,), 0, 2, follows="r0")
    workload = Workload(1, "llama-3.1-8b", "fcfs", False, 4, 32, 0, (first, turn))
    assert request_lengths(workload.arrivals) == {"r0": 7, "r1": 10}
    with pytest.raises(ValueError, match="'r1' follows 'r0', which is not a request listed"):
        dataclasses.replace(workload, arrivals=(turn, first))
    candidates = list(smaller(workload))
    alone = [w for w in candidates if [a.rid for a in w.arrivals] == ["r1"]]
    assert alone
    assert all(w.arrivals[0].follows is None for w in alone)
    assert any(w.arrivals[1:] == (dataclasses.replace(turn, follows=None),) for w in candidates)
    assert all(w.size < workload.size for w in candidates)
    assert Workload.from_json(json.loads(json.dumps(workload.to_json()))) == workload
    assert "follows" not in json.dumps(workload.to_json()["arrivals"][0])


def test_every_workload_is_served_with_a_max_model_len_vllm_accepts():
    """max_model_len holds the longest request and is never below the long-prefill threshold:
    vLLM refuses a threshold above it, which left seed 2723 (a 450-token Qwen3.5 workload,
    threshold 544) unplayed before 2026-11-25."""
    assert generate(2723).max_model_len == 768
    for seed in range(tiered(300, 3000)):
        for workload in (generate(seed), generate(seed, state_drafts=True)):
            longest = max(len(a.prompt) + a.max_tokens for a in workload.arrivals)
            assert workload.max_model_len % 256 == 0
            assert workload.max_model_len >= max(longest, workload.long_prefill, 256)
            assert workload.max_model_len < max(longest, workload.long_prefill, 256) + 256


def test_every_smaller_workload_is_smaller_and_well_formed():
    for seed in range(tiered(20, 200)):
        workload = generate(seed)
        for candidate in smaller(workload):
            assert candidate.size < workload.size
            assert candidate.arrivals
            assert {rid for _, rid in candidate.aborts} <= {a.rid for a in candidate.arrivals}


def test_shrinking_finds_a_small_failing_workload():
    """A synthetic failure: any request with at least 10 prompt tokens and 3 max tokens."""

    def fails(w: Workload) -> bool:
        return any(len(a.prompt) >= 10 and a.max_tokens >= 3 for a in w.arrivals)

    start = next(generate(s) for s in range(100) if fails(generate(s)))
    small = shrink(start, fails, budget=5000)
    assert fails(small)
    assert len(small.arrivals) == 1
    assert len(small.arrivals[0].prompt) == 10
    assert small.arrivals[0].max_tokens == 3
    assert (small.aborts, small.resets, small.policy) == ((), (), "fcfs")


def _report(seeds, violations=(), fix=False):
    return {"format": command.REPORT_FORMAT, "engine": "vllm 0.33.0", "fix": fix,
            "seeds": seeds, "runs": len(seeds), "preemptions": 2, "hit_tokens": 16,
            "stalled": [], "violations": list(violations), "seconds": 1.5}  # fmt: skip


def test_shards_partition_the_seeds_and_merge_back(tmp_path, capsys):
    runs, n = 50, 4
    shards = [[s for s in range(runs) if s % n == k - 1] for k in range(1, n + 1)]
    assert sorted(s for shard in shards for s in shard) == list(range(runs))
    violation = {"seed": 7, "found_after_runs": 2, "found_after_seconds": 0.1, "violation": "x",
                 "shrunk": {"violation": "x", "workload": generate(7).to_json()}}  # fmt: skip
    files = []
    for k, shard in enumerate(shards):
        path = tmp_path / f"s{k}.json"
        path.write_text(json.dumps(_report(shard, [violation] if 7 in shard else [])))
        files.append(str(path))
    assert main(["fuzz", "--merge", *files]) == 1
    out = capsys.readouterr().out
    assert "50 workloads, 50 seeds (0..49)" in out
    assert "seed 7 (found after 2 workloads" in out
    assert main(["fuzz", "--merge", files[0], files[0]]) == 2
    assert "same seed" in capsys.readouterr().err
    other = tmp_path / "fixed.json"
    other.write_text(json.dumps(_report([99], fix=True)))
    assert main(["fuzz", "--merge", files[0], str(other)]) == 2
    assert "one engine, fix and mutant setting" in capsys.readouterr().err


def test_a_mutant_report_merges_only_with_its_own(tmp_path, capsys):
    broken = {**_report([1]), "mutant": "no-eagle-drop"}
    plain = _report([2])
    files = []
    for name, body in (("broken", broken), ("plain", plain)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(body))
    assert main(["fuzz", "--merge", *map(str, files)]) == 2
    assert "one engine, fix and mutant setting" in capsys.readouterr().err
    assert main(["fuzz", "--merge", str(files[0])]) == 0
    assert "mutant no-eagle-drop (a broken twin" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fuzz", "--shard", "0/4"], "1 <= K <= N"),
        (["fuzz", "--shard", "two"], "expected K/N"),
    ],
)
def test_bad_shards_are_refused(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_without_vllm_the_campaign_says_where_to_run_it(capsys):
    pytest.importorskip("kvcert")
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    assert main(["fuzz", "--runs", "1"]) == 2
    assert "engine-venv.sh vllm" in capsys.readouterr().err


def test_every_broken_twin_says_what_it_breaks_and_ci_plays_it():
    from pathlib import Path

    from kvcert.conformance.vllm.campaign.mutants import CAUGHT_AS, KVCERT_MUTANTS, MUTANTS

    assert CAUGHT_AS.keys() == MUTANTS.keys() | KVCERT_MUTANTS.keys()
    assert not MUTANTS.keys() & KVCERT_MUTANTS.keys()
    assert set(CAUGHT_AS.values()) <= {"target", "state", "draft", "lost"}
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    lines = [" ".join(x.split()) for x in ci.replace("\\\n", " ").splitlines()]
    line = next(x for x in lines if x.startswith("for mutant in"))
    assert set(line.split(" in ", 1)[1].split(";")[0].split()) == set(MUTANTS)
    twins = next(x for x in lines if x.startswith("for twin in"))
    assert set(twins.split(" in ", 1)[1].split(";")[0].split()) == set(KVCERT_MUTANTS)
    assert '--kvcert --mutant "$twin"' in ci
    assert ".fuzz/kvcert-mutant-$twin.json" in ci  # what check.py --kvcert reads
