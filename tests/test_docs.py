"""What the README and docs/ state, checked: the example runs, every number is recomputed,
the layout is the tree's and the results table is the committed results'."""

from __future__ import annotations

import math
import re

from tests.docs import README, ROOT, doc, words


def test_reference_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README shows a Python example"
    namespace = {"prompt_token_ids": list(range(300)), "sampled_token": 7}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert "Stats(" in capsys.readouterr().out


# --- numbers the code can produce: each README claim is recomputed here --------------------

WORDS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def claim(pattern: str, name: str) -> int:
    """The number doc `name` states where `pattern` (one group) matches, exactly once."""
    found = re.findall(pattern, words(name))
    assert len(found) == 1, f"{name}: {pattern!r} matched {len(found)} times"
    text = found[0].replace(",", "")
    return WORDS[text.lower()] if text.lower() in WORDS else int(text)


def vector_cases():
    from kvcert.conformance.certify.vector_files import iter_cases

    return [case for _, case, _ in iter_cases() if case is not None]


def test_the_vector_counts_are_the_committed_ones():
    cases = vector_cases()
    assert claim(r"([\d,]+) vectors in three suites", "certifying") == len(cases)
    profiles = [c["input"].get("eviction") for c in cases if c["input"]["suite"] == "alloc"]
    hybrid = profiles.count("hybrid")
    assert claim(r"(\d+) of them under the hybrid eviction profile", "certifying") == hybrid
    unkeyed = profiles.count("lru-unkeyed-first")
    assert claim(r"(\d+) under vLLM 0\.25\+'s free order", "certifying") == unkeyed


def test_the_broken_engine_and_seeded_bug_counts():
    from kvcert.conformance.engines.mutants import BROKEN

    assert claim(r"(\w+) deliberately broken engines", "certifying") == len(BROKEN)
    mutants = (ROOT / "tests" / "differential" / "test_mutants.py").read_text()
    seeded = claim(r"each of the (\d+) bugs seeded into the reference", "allocator")
    assert seeded == mutants.count("\ndef test_")


def test_the_model_check_counts():
    import pytest

    pytest.importorskip("z3")
    from kvcert.conformance.checks import check
    from kvcert.conformance.checks.proofs import MANIFEST, tier

    assert claim(
        r"\(`kvcert\.conformance\.checks\.proofs`\): (\d+) obligations", "model-checking"
    ) == len(MANIFEST)
    assert claim(r"obligations, (\d+) of them in the pr tier", "model-checking") == len(tier("pr"))
    assert len(tier("long")) == len(MANIFEST)
    assert claim(
        r"each contract explores a fixed number of paths \((\d+) in pr", "model-checking"
    ) == (check.TIERS["pr"].crosshair_paths)
    assert (
        claim(r"paths \(100 in pr, ([\d,]+) in long", "model-checking")
        == check.TIERS["long"].crosshair_paths
    )
    assert (
        claim(r"`group_size` (\d+), below the path", "model-checking")
        == check.PATH_CAPS["kvcert.spec.plan.group_size"]
    )
    assert claim(r"contracts of (\d+) functions", "model-checking") == len(check.CONTRACT_TARGETS)
    crosshair = len(check.GOLDEN) + len(check.CONTRACT_TARGETS) + len(check.DIFF_TARGETS)
    machines = 2 + len(check.BROKEN)
    assert (
        claim(r"The whole pr tier \((\d+) verdicts\)", "model-checking")
        == len(tier("pr")) + crosshair + machines
    )


# --- the plan-objective tables: every row re-run ------------------------------------------------

OBJECTIVE_ROWS = {
    "resend": ["--trace", "resend"],
    "shared-prefix": ["--trace", "shared-prefix"],
    "agentic": ["--trace", "agentic"],
    "agentic, 300-token tool outputs": ["--trace", "agentic", "--tool-tokens", "300"],
    "agentic, 1.5 GiB": ["--trace", "agentic", "--memory", "1.5"],
    "agentic, 1 GiB": ["--trace", "agentic", "--memory", "1"],
}
OBJECTIVE_MODELS = {"DeepSeek-V4-Flash": "deepseek-v4-flash", "Qwen3.5-35B-A3B": "qwen3.5-35b-a3b"}


def objective_tables() -> list[tuple[str, str, list[str]]]:
    """(model, row label, hit rates) for every row after the objective-tables marker."""
    text = doc("plan").split("<!-- objective-tables", 1)[1]
    rows, model = [], None
    for line in text.splitlines()[1:]:
        if not line.startswith("|"):
            if line.strip():  # the first paragraph after the tables ends them
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].endswith(", trace"):
            model = cells[0].removesuffix(", trace")
        elif not cells[0].startswith("---"):
            rows.append((model, cells[0], cells[1:]))
    return rows


def test_the_objective_tables_are_measured(tmp_path):
    """Every row in the long tier; the fast tier re-runs the rows of the short traces (the
    agentic rows take about 3 s each)."""
    import json

    from kvcert.conformance.cli import main
    from tests.tiers import LONG

    rows = objective_tables()
    assert len(rows) == 10, rows
    assert {label for _, label, _ in rows} == set(OBJECTIVE_ROWS)
    for model, label, rates in rows:
        if not LONG and label.startswith("agentic"):
            continue
        out = tmp_path / "plans.json"
        argv = ["simulate", OBJECTIVE_MODELS[model], *OBJECTIVE_ROWS[label], "--eviction",
                "hybrid", "--placement", "align", "--compare-plans",
                "capacity,balanced,alignment", "--json", str(out)]  # fmt: skip
        assert main(argv) == 0
        runs = json.loads(out.read_text())["runs"]
        measured = [f"{100 * r['hit_tokens'] / r['prompt_tokens']:.1f}%" for r in runs]
        assert all(r["skipped"] == 0 for r in runs), (model, label)
        assert measured == rates, (model, label)


PLAN_MODELS = {
    "DeepSeek-V4-Flash": "deepseek-v4-flash",
    "Qwen3.5-35B-A3B": "qwen3.5-35b-a3b",
    "Gemma 4 31B": "gemma-4-31B",
    "GPT-OSS-120B": "gpt-oss-120b",
}


def test_the_objective_plan_table_is_the_planners():
    """Each objective's (alignment, capacity) and vLLM's, as `kvcert plan` computes them."""
    import argparse

    from kvcert.conformance.contract.plans import plan_input_from_json
    from kvcert.conformance.tools.catalog import load_model
    from kvcert.conformance.tools.model_plan import add_plan_options, checked_options, plan_input
    from kvcert.conformance.tools.plan import chosen_by
    from kvcert.conformance.vllm.planner_model import vllm_padded_plan

    text = words("plan")
    parser = argparse.ArgumentParser()
    add_plan_options(parser)
    for label, name in PLAN_MODELS.items():
        row = re.findall(rf"\| {re.escape(label)} \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
                         text)  # fmt: skip
        assert len(row) == 1, label
        cells = [re.match(r"(\d+): ([\d,]+)", c.strip()) for c in row[0]]
        stated = [(int(m[1]), int(m[2].replace(",", ""))) if m else None for m in cells]
        obj = plan_input(load_model(name), parser.parse_args([]))
        options = checked_options(obj)
        picks = chosen_by(options, obj)
        measured: list[tuple[int, int] | None] = [
            (options[picks[k]]["hit_alignment"], options[picks[k]]["token_capacity"])
            for k in ("capacity", "balanced", "alignment")
        ]
        vllm = vllm_padded_plan(plan_input_from_json(obj))
        if "refused" in vllm:
            measured.append(None)
        else:
            blocks = [g["block_size"] for g in vllm["groups"] if g["kind"] != "cross"]
            measured.append((math.lcm(*blocks), vllm["token_capacity"]))
        assert stated == measured, label


def test_the_trace_format_example_is_a_trace(tmp_path):
    """docs/simulate.md's trace line, as written, is read by `kvcert simulate`'s trace reader, and
    `output` is a token list (a count is refused)."""
    from kvcert.conformance.tools.simulate.traces import TraceError, read_jsonl

    line = re.search(r'`(\{"id": "r1".*?\})`', words("simulate"))
    assert line, "docs/simulate.md shows a trace line"
    example = line.group(1).replace("[token ids]", "[1, 2, 3]")
    path = tmp_path / "trace.jsonl"
    path.write_text(example + "\n")
    (request,) = read_jsonl(path)
    assert request.output == (1, 2, 3)
    path.write_text(example.replace('"output": [1, 2, 3]', '"output": 3') + "\n")
    import pytest

    with pytest.raises(TraceError, match="'output' must be a list of token ids"):
        read_jsonl(path)


def test_the_gpu_table_is_the_committed_report():
    """Every row of docs/kernels.md's GPU table, recomputed from kernels/GPU_REPORT.json; the
    report says every check was equal."""
    import json

    report = json.loads((ROOT / "kernels" / "GPU_REPORT.json").read_text())
    assert report["ok"]
    assert report["mode"] == "gpu"
    assert all(check["equal"] for check in report["checks"])
    text = doc("kernels")
    for s in report["speeds"]:
        row = (
            f"| {s['kernel']} | {s['case']} | {s['seconds'] * 1e6:,.1f} us | "
            f"{s['bandwidth'] / 1e12:.2f} TB/s | {s['copy_ratio']:.2f} | "
            f"{s['roofline_ratio']:.2f} |"
        )
        assert row in text, row
    equal = sum(c["equal"] for c in report["checks"])
    assert f"{equal} of {len(report['checks'])} checks byte-equal" in " ".join(text.split())


# --- the README's engine results, layout and links -----------------------------------------


def test_the_engine_results_table_is_the_committed_results():
    from kvcert.conformance.vllm.expected import summary

    table = doc("README").split("<!-- engine-results:", 1)[1].split("\n", 1)[1]
    assert table.startswith(summary())


def layout_entries(text: str) -> list[str]:
    """The paths the README's layout block names, from its indentation (two spaces a level)."""
    block = text.split("<!-- layout:", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    stack: list[str] = []
    paths = []
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 8):  # a continued description
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        stack[depth:] = [name]
        paths.append("".join(stack))
    return paths


def tree_folders() -> set[str]:
    """What the layout must name: every top-level folder, and every package folder under the
    four packages (a folder holding an __init__.py)."""
    skip = {"__pycache__"}
    built = {"build"}  # setuptools' build folder (git-ignored): an engine venv's install makes it
    folders = {
        f"{p.name}/" for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info")
        and p.name not in built
    }  # fmt: skip
    for top in ("spec", "reference", "kernels", "conformance"):
        for init in (ROOT / top).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT)
            if folder.parts[-1] not in skip and len(folder.parts) <= 3:
                folders.add("/".join(folder.parts) + "/")
    return folders


def test_the_layout_is_the_trees():
    entries = layout_entries(doc("README"))
    missing = [e for e in entries if not (ROOT / e).exists()]
    assert missing == [], f"the layout names what the tree lacks: {missing}"
    unlisted = sorted(tree_folders() - set(entries))
    assert unlisted == [], f"the tree has folders the layout omits: {unlisted}"


def test_the_layout_check_can_fail():
    text = "<!-- layout: -->\n```\nspec/   x\n  nowhere/   y\n```\n"
    assert layout_entries(text) == ["spec/", "spec/nowhere/"]
    assert not (ROOT / "spec/nowhere/").exists()


def test_every_link_in_the_docs_resolves():
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{path.name} links {target}"
