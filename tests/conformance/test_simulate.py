"""`kvcert simulate`: the seed 001 scenario, traces, policies, the report, bad input."""

from __future__ import annotations

import json

import pytest

from kvcert.conformance.cli import main
from kvcert.conformance.tools.simulate import traces
from kvcert.conformance.tools.simulate.model import Policy, compare, replay, unbounded_blocks
from kvcert.reference.config import (
    BLOCK_POOL_EVICTIONS,
    CacheConfig,
    Eviction,
    GroupConfig,
    Kind,
    MambaMode,
)
from kvcert.reference.scheduling import Placement


def test_seed_001_resend_keeps_its_prefix_under_hybrid_and_loses_it_under_lru(capsys, tmp_path):
    """DeepSeek-V4-Flash, A A B A, chunked prefill of 2048 tokens, a pool of two working sets:
    the re-sent A gets all of its cacheable prefix under hybrid, none of it under lru."""
    out = tmp_path / "seed.json"
    code = main(
        [
            "simulate", "deepseek-v4-flash", "--trace", "resend", "--prompt-tokens", "8192",
            "--budget", "2048", "--pool-requests", "2", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    runs = {r["policy"]: r for r in report["runs"]}
    third = report["requests"].index("A-third")
    cacheable = runs["hybrid"]["cacheable"][third]
    assert cacheable == 7936  # the default plan's 256-token hit alignment below 8192 tokens
    assert runs["hybrid"]["hits"][third] == cacheable
    assert runs["lru"]["hits"][third] == 0
    assert runs["lru"]["cacheable"][third] == cacheable
    text = capsys.readouterr().out
    assert "| A-third | 8,192 | 0 (7,936) | 7,936 (7,936) |" in text
    assert "pool: 3,985 blocks" in text


def test_seed_001_under_the_capacity_objective_hits_multiples_of_2048(capsys):
    code = main(
        [
            "simulate", "deepseek-v4-flash", "--trace", "resend", "--budget", "2048",
            "--pool-requests", "2", "--objective", "capacity",
        ]
    )  # fmt: skip
    assert code == 0
    assert "| A-third | 8,192 | 0 (6,144) | 6,144 (6,144) |" in capsys.readouterr().out


def test_compare_plans_reports_each_objectives_hits(capsys, tmp_path):
    out = tmp_path / "plans.json"
    code = main(
        [
            "simulate", "deepseek-v4-flash", "--trace", "resend", "--eviction", "hybrid",
            "--compare-plans", "capacity,balanced,alignment", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    runs = {r["objective"]: r for r in json.loads(out.read_text())["runs"]}
    # an unbounded-enough pool: only the alignment decides; A-again and A-third hit
    # 8191 rounded down to the alignment
    for objective, alignment in (("capacity", 2048), ("balanced", 256), ("alignment", 128)):
        assert runs[objective]["hit_alignment"] == alignment
        assert runs[objective]["hit_tokens"] == 2 * (8191 // alignment * alignment)
    text = capsys.readouterr().out
    assert (
        "| capacity | 2048 | 815,911 | hybrid | 37.5% | 12,288 | 20,480 | 3,840 | 0 | 0 |" in text
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compare-plans", "capacity"], "two or more different objectives"),
        (["--compare-plans", "capacity,capacity"], "two or more different objectives"),
        (["--compare-plans", "capacity,fastest"], "'fastest' is not one of"),
        (["--compare-plans", "capacity,balanced", "--pool-requests", "2"], "one memory size"),
    ],
)
def test_compare_plans_refuses_bad_arguments(extra, message, capsys):
    assert main(["simulate", "gpt-oss-20b", *extra]) == 2
    assert message in capsys.readouterr().err


FULL_SW = CacheConfig(
    (
        GroupConfig(Kind.FULL, 16, name="full"),
        GroupConfig(Kind.SLIDING_WINDOW, 16, window=64, name="sw"),
    ),
    num_blocks=2,
)
QWEN_LIKE = CacheConfig(
    (
        GroupConfig(Kind.FULL, 64, name="full"),
        GroupConfig(Kind.MAMBA, 64, mode=MambaMode.ALIGN, name="gdn"),
    ),
    num_blocks=2,
)


def test_an_unbounded_pool_never_evicts():
    trace = traces.agentic(2, turns=3, system=300, tool_output=200, output=20)
    for eviction in BLOCK_POOL_EVICTIONS:
        run = replay(
            FULL_SW,
            trace,
            Policy(eviction, Placement.ALL, False),
            unbounded_blocks(FULL_SW, trace),
            128,
        )
        assert sum(run.evictions) == 0
        assert run.skipped == []
        assert run.hits[2] > 0  # session 0, turn 1 re-sends turn 0's context


def test_branch_placement_serves_a_shared_prompt_align_does_not():
    """Qwen3.5-like full + GDN (align): only a checkpoint at the branch point lets the third
    user reuse the system prompt the first two share."""
    trace = traces.shared_prefix(users=4, system=1000, question=100, output=0)
    policies = [Policy(Eviction.HYBRID, p) for p in (Placement.ALIGN, Placement.BRANCH)]
    result = compare(QWEN_LIKE, trace, policies, pool_requests=8, budget=4096)
    align, branch = result.runs
    assert align.hits == [0, 0, 0, 0]
    assert branch.hits == [0, 0, 960, 960]  # user 1 checkpoints at 960; users 2, 3 hit it
    all_run = compare(QWEN_LIKE, trace, [Policy(Eviction.HYBRID, Placement.ALL)], budget=4096)
    assert all_run.unbounded[0].hits == [0, 960, 960, 960]


def test_the_operations_rerun_on_the_spec_engine_give_the_same_hits(capsys):
    code = main(
        [
            "simulate", "llama-3.1-8b", "--trace", "resend", "--prompt-tokens", "200",
            "--blocks", "40", "--budget", "64", "--engine", "spec",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "spec: lru: same hits" in out
    assert "spec: hybrid: same hits" in out


def test_plot_and_saved_trace(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the sim extra: '.[sim]'")
    png, saved = tmp_path / "sim.png", tmp_path / "trace.jsonl"
    code = main(
        [
            "simulate", "gpt-oss-20b", "--trace", "shared-prefix", "--users", "3",
            "--prompt-tokens", "600", "--question-tokens", "50", "--output-tokens", "5",
            "--pool-requests", "2", "--plot", str(png), "--save-trace", str(saved),
        ]
    )  # fmt: skip
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = traces.read_jsonl(saved)
    assert [r.rid for r in again] == ["user0", "user1", "user2"]
    capsys.readouterr()
    assert main(["simulate", "gpt-oss-20b", "--trace", str(saved), "--pool-requests", "2"]) == 0
    assert "3 requests" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"id": "a", "prompt": []}', "at least one token"),
        ('{"id": "a", "prompt": [1, -2]}', "token ids"),
        ('{"id": "a", "prompt": [1], "extra": 1}', "unknown fields"),
        ('{"prompt": [1]}', "'id'"),
        ('{"id": "a", "prompt": [1], "cache_salt": 5}', "cache_salt"),
        ("not json", "not JSON"),
    ],
)
def test_bad_trace_lines_are_refused_by_name(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(traces.TraceError, match=message):
        traces.read_jsonl(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "gpt-oss-20b", "--trace", "nope"], "neither a generator"),
        (["simulate", "gpt-oss-20b", "--eviction", "fifo"], "not one of"),
        (["simulate", "gpt-oss-20b", "--budget", "0"], "--budget: must be an integer >= 1"),
        (
            ["simulate", "gpt-oss-20b", "--pool-requests", "0"],
            "--pool-requests: must be a positive",
        ),
        (
            ["simulate", "gpt-oss-20b", "--output-tokens", "-1"],
            "--output-tokens: must be an integer >= 0",
        ),
        (["simulate", "gpt-oss-20b", "--blocks", "3", "--pool-requests", "2"], "not allowed with"),
        (["simulate", "gpt-oss-20b", "--placement", "bogus"], "'bogus' is not one of all, align"),
        (["simulate", "qwen3.5-0.8b", "--placement", "bogus"], "'bogus' is not one of all, align"),
        (["simulate"], "give a MODEL"),
        (["simulate", "--plan", "missing.json"], "kvcert plan --json"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--plot", "/no/such/folder/seed.png"], "--plot: cannot write /no/such/folder/seed.png"),
        (["--plot", "/"], "is a folder"),
        (["--json", "/no/such/folder/r.json"], "--json: cannot write"),
        (["--save-trace", "/etc/hostname/trace.jsonl"], "no folder /etc/hostname"),
        (["--engine", "no-such-engine"], "no engine named 'no-such-engine'"),
        (["--engine", "spec", "--engine-timeout", "0"], "--engine-timeout: must be a positive"),
    ],
)
def test_arguments_are_refused_before_the_replay_starts(monkeypatch, capsys, extra, message):
    """Once --plot and --engine were checked only after the whole run."""
    import kvcert.conformance.tools.simulate.cli as cli_module

    def no_replay(*args, **kwargs):
        raise AssertionError("the replay started before the arguments were checked")

    monkeypatch.setattr(cli_module, "compare", no_replay)
    assert main(["simulate", "gpt-oss-20b", *extra]) == 2
    assert message in capsys.readouterr().err


def test_an_engine_rerun_that_exceeds_its_time_is_reported_not_waited_for(capsys):
    code = main(
        [
            "simulate", "llama-3.1-8b", "--trace", "resend", "--prompt-tokens", "4096",
            "--engine", "spec", "--engine-timeout", "0.2",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "spec: lru: not checked, no answer within 0.2 s" in out
    assert "--engine-timeout" in out
    assert "spec: hybrid" not in out  # the unfinished replay stops the check


def test_a_placement_on_a_model_without_state_groups_is_noted(capsys, tmp_path):
    argv = ["simulate", "gpt-oss-20b", "--prompt-tokens", "64", "--placement", "align"]
    assert main(argv) == 0
    assert "--placement chooses where state checkpoints go" in capsys.readouterr().err
