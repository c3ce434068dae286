"""Trace each difference of a planned-mode certification to the vLLM flag it follows.

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.trace_causes REPORT MODE TRACE.json

For every case the report lists as failed or errored, the case is run again through the same
planned mode with one engine argument changed from vLLM's default at a time (each only where
the release has it), with the other draft marking, with both, and in the hand mode. A case
that then passes follows that flag: the difference is vLLM's default behaviour, not the
adapter's and not chance. A case that then fails exactly as in the hand mode has the flag's
difference on top of the hand mode's (known) one. The trace file (case id -> the flags under
which it passes, those under which it fails as the hand mode does, whether the hand mode
passes) is what kvcert.conformance.vllm.expected reads to name the cause of each planned-mode
difference.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.contract.compare import compare_alloc, compare_hit
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.adapter import VllmEngine

COMPARE = {"hit": compare_hit, "alloc": compare_alloc}


def candidate_flags() -> dict[str, tuple[tuple[str, str, Any], ...]]:
    """Each engine argument to try, by name, where this release has it."""
    v = runtime.vllm()
    cache_fields = {f.name for f in dataclasses.fields(v.CacheConfig)}
    out: dict[str, tuple[tuple[str, str, Any], ...]] = {}
    if "prefix_cache_retention_interval" in cache_fields:
        out["dense-retention"] = (("cache", "prefix_cache_retention_interval", None),)
    if runtime.has_lookahead_hashes():
        out["no-lookahead-hashes"] = (("speculative", "disable_lookahead_block_hashes", True),)
    envs = __import__("vllm.envs", fromlist=["environment_variables"])
    chunked = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
    if chunked in getattr(envs, "environment_variables", {}):
        out["chunked-local-hybrid"] = (("env", chunked, "1"),)
    spec_fields = {f.name for f in dataclasses.fields(v.SpeculativeConfig)}
    if "disable_eagle_block_drop" in spec_fields:
        out["no-block-drop"] = (("speculative", "disable_eagle_block_drop", True),)
    return out


def difference(engine: VllmEngine, case: dict[str, Any]) -> str | None:
    """The first difference from the vector's expectation (None: the case passes)."""
    try:
        answer = engine.run(case["input"])
    except Exception as error:  # an engine that raises does not pass
        return f"{type(error).__name__}: {error}"
    if "unsupported" in answer:
        return f"unsupported: {answer['unsupported']}"
    return COMPARE[case["input"]["suite"]](case["expect"], answer)


def trace(report: dict[str, Any], mode: str) -> dict[str, Any]:
    cases = {c["id"]: c for _, c, _ in iter_cases() if c is not None}
    failing = [r["id"] for r in report["results"] if r["status"] in ("failed", "errored")]
    flags = candidate_flags()
    other = "unmarked" if mode == "marked" else "marked"
    engines = {name: VllmEngine(mode, f) for name, f in flags.items()}
    engines["other-marking"] = VllmEngine(other)
    for name, f in flags.items():  # two causes at once: a flag together with the other marking
        engines[f"{name}+other-marking"] = VllmEngine(other, f)
    hand = VllmEngine("hand")
    out: dict[str, Any] = {}
    for case_id in failing:
        case = cases[case_id]
        if case["input"]["suite"] not in COMPARE:
            continue
        hand_difference = difference(hand, case)
        planned_difference = difference(VllmEngine(mode), case)
        found = {name: difference(e, case) for name, e in engines.items()}
        out[case_id] = {
            "passes_with": [name for name, d in found.items() if d is None],
            # flags that turn a planned-only difference into exactly the hand mode's: the
            # planned path's extra difference is that flag's, the rest the hand mode's cause
            "as_hand_with": [
                name
                for name, d in found.items()
                if d is not None and d == hand_difference != planned_difference
            ],
            "hand": hand_difference is None,
        }
    return out


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    text = json.dumps(trace(report, argv[1]), indent=1, sort_keys=True) + "\n"
    if len(argv) > 2:  # a file: some releases log to stdout
        Path(argv[2]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
