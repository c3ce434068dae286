"""`kvcert explain`, `examples`, `rules`: what they print and how they refuse bad input."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from hypothesis import given, settings

from kvcert.conformance.cli import main
from kvcert.conformance.tools.explain import explain, format_block_list, format_indices, render
from kvcert.conformance.tools.scenario import example_names, parse_scenario
from tests.strategies import views
from tests.tiers import tiered

# Hit lengths derived in tests/spec/test_worked_examples.py from the rules and the reports.
EXPECTED_HITS = {
    "gpt-oss-eagle": 976,
    "gemma4-dflash": 896,
    "gemma4-dflash-exact": 960,
    "deepseek-v4-flash-warm": 373_760,  # observed by the vLLM #42948 reporter
    "deepseek-v4-flash-after-b": 0,
    "qwen35-gdn-align": 0,
    "qwen35-gdn-all": 768,
    "eagle-block-aligned": 16,
}


def test_every_bundled_example_has_an_expectation():
    assert set(example_names()) == set(EXPECTED_HITS)


@pytest.mark.parametrize("name", sorted(EXPECTED_HITS))
def test_explain_prints_the_hit_per_group_and_a_diagram(name, capsys):
    assert main(["explain", "--example", name]) == 0
    out = capsys.readouterr().out
    assert f"HYBRID HIT: {EXPECTED_HITS[name]} tokens" in out
    scenario = json.loads(
        resources.files("kvcert.conformance.tools").joinpath(f"examples/{name}.json").read_text()
    )
    groups = scenario["layout"]["groups"]
    for index, group in enumerate(groups):
        assert re.search(rf"^  {index} {re.escape(group['name'])}: ", out, re.M)
        assert re.search(rf"^{index} {re.escape(group['name'])} +\S", out, re.M), "diagram line"
    assert len(re.findall(r"alone \d+; stops at \d+: .* \[[A-Z-]+\d\]", out)) == len(groups)


def test_explain_names_the_rule_that_blocks_the_hit(capsys):
    """DeepSeek-V4 after B: full attention lost block 0, which HIT-FULL-1 needs."""
    main(["explain", "--example", "deepseek-v4-flash-after-b"])
    out = capsys.readouterr().out
    assert (
        "group 0 (mla_full) refuses: needs block(s) 0 (tokens 0-255), not cached [HIT-FULL-1]"
        in out
    )


def test_explain_reports_the_speculative_drop(capsys):
    main(["explain", "--example", "gpt-oss-eagle"])
    assert (
        "every group accepts 992; the speculative drop (HIT-SPEC-2) steps down once to 976"
        in capsys.readouterr().out
    )


def test_explain_reads_a_scenario_file(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "layout": {
                    "groups": [
                        {"kind": "full", "block_size": 4},
                        {"kind": "chunked_local", "block_size": 4, "chunk": 8},
                        {"kind": "cross", "block_size": 4},
                        {"kind": "mamba", "block_size": 4, "mode": "none"},
                    ]
                },
                "request": {"num_tokens": 20},
                "cached": [["0-2", 4], "all", "none", "none"],
            }
        )
    )
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "HYBRID HIT: 0 tokens" in out
    assert "mode none keeps no state checkpoints [HIT-MAMBA-2]" in out


def test_mamba_refusal_names_the_checkpoint(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "layout": {
                    "groups": [
                        {"kind": "full", "block_size": 4},
                        {"kind": "mamba", "block_size": 4},
                    ]
                },
                "request": {"num_tokens": 20},
                "cached": ["all", [1]],
            }
        )
    )
    main(["explain", str(path)])
    assert (
        "needs the state checkpoint at token 12 (block 2), not cached [HIT-MAMBA-1]"
        in capsys.readouterr().out
    )


def scenario(**overrides):
    base = {
        "layout": {"groups": [{"kind": "full", "block_size": 16}]},
        "request": {"num_tokens": 40},
        "cached": ["all"],
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps([1]), "expected a JSON object"),
        (
            json.dumps(scenario(layout={"groups": [{"kind": "paged", "block_size": 16}]})),
            "unknown kind 'paged'",
        ),
        (
            json.dumps(scenario(layout={"groups": [{"kind": "sliding_window", "block_size": 16}]})),
            r"missing field\(s\) \['window'\]",
        ),
        (
            json.dumps(
                scenario(layout={"groups": [{"kind": "full", "block_size": 16, "windw": 3}]})
            ),
            "unknown field",
        ),
        (json.dumps(scenario(layout={"groups": []})), "non-empty list of groups"),
        (
            json.dumps(scenario(layout={"groups": [{"kind": "full", "block_size": 0}]})),
            r"groups\[0\].*block_size must be >= 1",
        ),
        (
            json.dumps(
                scenario(layout={"groups": [{"kind": "mamba", "block_size": 4, "mode": "some"}]})
            ),
            "mode must be one of",
        ),
        (
            json.dumps(
                scenario(
                    layout={"groups": [{"kind": "full", "block_size": 4}], "speculative": "eagle"}
                )
            ),
            "speculative",
        ),
        (json.dumps(scenario(cached=[["0-x"]])), "neither a block index nor a range"),
        (json.dumps(scenario(cached=[3])), 'expected "all", "none" or a list'),
        (json.dumps(scenario(cached=["all", "all"])), "one entry per group"),
        (json.dumps(scenario(cached=[[5]])), "not a keyed block"),
        (json.dumps(scenario(request={"num_tokens": "many"})), "expected an integer"),
        (json.dumps(scenario(request={"num_tokens": 0})), "num_tokens must be >= 1"),
        (json.dumps(scenario(request={})), r"missing field\(s\) \['num_tokens'\]"),
        (
            json.dumps(
                scenario(layout={"groups": [{"kind": "cross", "block_size": 4}]}, cached=["none"])
            ),
            "no prefix to reuse",
        ),
    ],
)
def test_bad_scenarios_exit_2_with_a_message(tmp_path, capsys, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["explain", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcert: error: ")
    assert re.search(fragment, err), err


def test_missing_file_and_bad_arguments(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["explain"]) == 2
    assert main(["explain", "x.json", "--example", "gpt-oss-eagle"]) == 2
    assert main(["explain", "--example", "nope"]) == 2
    assert "no bundled example 'nope'" in capsys.readouterr().err


def test_rules_and_examples_commands(capsys):
    assert main(["rules"]) == 0
    shipped = resources.files("kvcert.spec").joinpath("RULES.md").read_text(encoding="utf-8")
    assert capsys.readouterr().out == shipped
    assert main(["examples"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in EXPECTED_HITS)


def test_run_length_formatting():
    assert format_indices([1, 2, 3, 7]) == "1-3, 7"
    assert format_block_list([None, None, 2, 3, None, 5]) == "[null x2, 2-3, null, 5]"
    assert format_block_list([]) == "[]"


# --- explain: linear search, bounded spec cross-check --------------------------------------


@settings(max_examples=tiered(150, 3000))
@given(views())
def test_explain_agrees_with_the_spec_definition(view):
    """The reference's search gives the lengths; the spec's definition must give the same:
    the hit, and each group's longest hit alone (the maximum of its accepted lengths)."""
    from kvcert.spec import group_accepts, hybrid_hit, max_hit_length

    explanation = explain(view, spec_check_tokens=0)  # the fast path alone
    assert not explanation.spec_checked
    assert explanation.hit == hybrid_hit(view)
    limit = max_hit_length(view.num_tokens)
    for report in explanation.groups:
        accepted = [
            n for n in range(limit + 1) if group_accepts(report.group, view.cached[report.index], n)
        ]
        assert report.alone == accepted[-1]


def test_a_million_token_request_never_runs_the_quadratic_definition(monkeypatch, capsys):
    """Once quadratic: 200k tokens took 46 s and 10^7 never returned."""
    import kvcert.conformance.tools.explain as module

    def forbidden(view):
        raise AssertionError("the spec's every-length definition ran above the bound")

    monkeypatch.setattr(module, "hybrid_hit", forbidden)
    scenario = {
        "layout": {
            "groups": [
                {"kind": "full", "block_size": 16, "draft": True},
                {"kind": "sliding_window", "block_size": 16, "window": 128},
                {"kind": "mamba", "block_size": 64, "mode": "all"},
            ],
            "speculative": "drop",
        },
        "request": {"num_tokens": 1_000_000},
        "cached": ["all", ["0-62000"], "all"],
    }
    explanation = explain(parse_scenario(scenario).view)
    assert explanation.hit.length == 991_936  # 62001 SW blocks = 992016 tokens, then the drop
    assert explanation.hit.plain_length == 992_000
    assert not explanation.spec_checked
    assert "cross-check against kvcert.spec's definition" in render(explanation)


def test_a_search_that_disagrees_with_the_spec_is_an_internal_error(monkeypatch, capsys):
    import kvcert.conformance.tools.explain as module

    monkeypatch.setattr(module, "find_hit", lambda *args, **kwargs: (0, []))
    assert main(["explain", "--example", "gpt-oss-eagle"]) == 3
    assert "internal error, please report" in capsys.readouterr().err


def test_explain_refuses_a_unit_view_and_reports_give_the_specs_hit():
    """`kvcert explain` breaks the block profile down only: a `unit U` view is refused with
    what to do, and a failure report shows the spec's answer for it instead."""
    from kvcert.conformance.certify.report import hit_diagram
    from kvcert.conformance.contract.codec import InputError
    from kvcert.spec import CacheView, FullAttention, Layout, MambaMode, MambaState

    layout = Layout((FullAttention(4), MambaState(8, MambaMode.ALIGN)), hit_unit=2)
    cached = (frozenset({0, 1, 2}), frozenset({0}))
    view = CacheView(layout, 12, cached, (frozenset(), frozenset({10})))
    with pytest.raises(InputError, match="hit_unit"):
        explain(view)
    case = {
        "id": "hit.unit.x",
        "comment": "why",
        "input": {
            "suite": "hit",
            "layout": {"groups": [{"kind": "full", "block_size": 4},
                                  {"kind": "mamba", "block_size": 8, "mode": "align"}],
                       "hit_unit": 2},
            "num_tokens": 12,
            "cached": [[[0, 3]], [[0, 1]]],
            "partial": [[], [10]],
        },
    }  # fmt: skip
    text = hit_diagram(case)
    assert "the spec's hit is 10" in text
    assert text.endswith("why")
