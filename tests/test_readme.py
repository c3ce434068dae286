"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_reference_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README shows a Python example"
    namespace = {"prompt_token_ids": list(range(300)), "sampled_token": 7}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert "Stats(" in capsys.readouterr().out


# --- numbers the code can produce: each README claim is recomputed here --------------------

WORDS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def claim(pattern: str) -> int:
    """The number the README states where `pattern` (one group) matches, exactly once."""
    found = re.findall(pattern, " ".join(README.read_text(encoding="utf-8").split()))
    assert len(found) == 1, f"README: {pattern!r} matched {len(found)} times"
    text = found[0].replace(",", "")
    return WORDS[text.lower()] if text.lower() in WORDS else int(text)


def vector_cases():
    from kvcert.conformance.certify.runner import iter_cases

    return [case for _, case, _ in iter_cases() if case is not None]


def test_the_vector_counts_are_the_committed_ones():
    cases = vector_cases()
    assert claim(r"([\d,]+) vectors in three suites") == len(cases)
    profiles = [c["input"].get("eviction") for c in cases if c["input"]["suite"] == "alloc"]
    assert claim(r"(\d+) of them under the hybrid eviction profile") == profiles.count("hybrid")
    unkeyed = profiles.count("lru-unkeyed-first")
    assert claim(r"(\d+) under vLLM 0\.25\+'s free order") == unkeyed


def test_the_broken_engine_and_seeded_bug_counts():
    from kvcert.conformance.engines.mutants import BROKEN

    assert claim(r"(\w+) deliberately broken engines") == len(BROKEN)
    mutants = (Path(__file__).parent / "differential" / "test_mutants.py").read_text()
    assert claim(r"each of the (\d+) bugs seeded into the reference") == mutants.count(
        "\ndef test_"
    )


def test_the_model_check_counts():
    import pytest

    pytest.importorskip("z3")
    from kvcert.conformance.checks import check
    from kvcert.conformance.checks.proofs import MANIFEST, tier

    assert claim(r"\(`kvcert\.conformance\.checks\.proofs`\): (\d+) obligations") == len(MANIFEST)
    assert claim(r"contracts of (\d+) functions") == len(check.CONTRACT_TARGETS)
    crosshair = len(check.GOLDEN) + len(check.CONTRACT_TARGETS) + len(check.DIFF_TARGETS)
    machines = 2 + len(check.BROKEN)
    assert claim(r"The whole pr tier \((\d+) verdicts\)") == len(tier("pr")) + crosshair + machines
