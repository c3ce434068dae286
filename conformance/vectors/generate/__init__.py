"""Generate the conformance vectors from the spec: `python -m kvcert.conformance.vectors.generate
[--check]`.

Sources, all deterministic (no clock, fixed seeds, sorted keys):
* hand-written scenarios: every seed report and every vLLM behaviour the probes found
  (`hit.vllm-c*`), by name;
* bounded exhaustive enumeration of small hybrid layouts and cache views;
* seeded random allocator traces over small pools;
* regressions: failures the stateful machines found, as traces.

Each case's expectation is what kvcert.spec answers, and its `rules` are the rule tags whose
functions ran while the spec answered it (traced, not hand-listed). `--check` regenerates into
memory and fails if any committed byte would change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.alloc import (
    alloc_scenarios,
    regression_cases,
    same_pass_twins,
    unkeyed_first_twins,
)
from kvcert.conformance.vectors.generate.hit import (
    draft_reach_hits,
    enumerated_hits,
    hit_scenarios,
    sampled_layouts,
    shaped_hits,
    single_miss_hits,
    three_group_layouts,
)
from kvcert.conformance.vectors.generate.page import page_refusals, page_scenarios, random_plans
from kvcert.conformance.vectors.generate.radix import radix_scenarios, radix_traces, radix_twins
from kvcert.conformance.vectors.generate.refusals import refusals
from kvcert.conformance.vectors.generate.retention import (
    interval_traces,
    owed_hit_traces,
    sparse_twins,
)
from kvcert.conformance.vectors.generate.traces import (
    checkpoint_traces,
    draft_reach_traces,
    random_traces,
    speculative_state_traces,
)
from kvcert.conformance.vectors.generate.unit import (
    unit_hits,
    unit_hybrid_hits,
    unit_scenarios,
)
from kvcert.conformance.vectors.generate.unit_alloc import (
    same_pass_scenarios,
    unit_alloc_scenarios,
    unit_traces,
)
from kvcert.spec import SPEC_VERSION
from kvcert.spec import alloc as spec

FORMAT = "kvcert-vector/6"
VECTORS = Path(__file__).resolve().parents[1]  # kvcert/conformance/vectors


def suites() -> dict[str, list[JSON]]:
    """Every file's cases, keyed by its path under vectors/."""
    files = step_end_suites()
    files["alloc/same-pass.json"] = list(same_pass_twins(files))
    files["alloc/sparse.json"] = list(sparse_twins(files))
    return files


def owed_cases() -> list[JSON]:
    """The owed-hit families, and again under vLLM 0.25+'s free order where block ids
    depend on it (their hits do not: the pool never evicts)."""
    owed = [*owed_hit_traces(), *interval_traces()]
    return [*owed, *unkeyed_first_twins(iter(owed))]


def step_end_suites() -> dict[str, list[JSON]]:
    """Every file but the same-pass and sparse twins, whose cases they replay."""
    return {
        "hit/scenarios.json": list(hit_scenarios()),
        "hit/refusals.json": [c for c in refusals() if c["input"]["suite"] == "hit"],
        "hit/enumerated.json": list(enumerated_hits(400)),
        "hit/three-groups.json": list(single_miss_hits("hit.g3", three_group_layouts(), (7, 11))),
        "hit/sampled-groups.json": list(single_miss_hits("hit.g45", sampled_layouts(60), (9,))),
        "hit/shaped-groups.json": list(shaped_hits()),
        "hit/draft-reach.json": list(draft_reach_hits(200)),
        "hit/unit.json": [*unit_scenarios(), *unit_hits(150), *unit_hybrid_hits(200)],
        "alloc/unit.json": [
            *unit_alloc_scenarios(),
            *same_pass_scenarios(),
            *unit_traces(60, 7000, spec.Eviction.LRU),
            *unit_traces(30, 8000, spec.Eviction.LRU_UNKEYED_FIRST),
        ],
        "alloc/scenarios.json": list(alloc_scenarios()),
        "alloc/refusals.json": [c for c in refusals() if c["input"]["suite"] == "alloc"],
        "alloc/random.json": list(random_traces(60)),
        "alloc/random-hybrid.json": list(random_traces(40, spec.Eviction.HYBRID, 1000)),
        "alloc/random-lru-unkeyed-first.json": list(
            random_traces(40, spec.Eviction.LRU_UNKEYED_FIRST, 2000)
        ),
        "alloc/random-checkpoints.json": list(checkpoint_traces(40, 3000)),
        "alloc/random-speculative-state.json": list(speculative_state_traces(30, 4000)),
        "alloc/random-draft-reach.json": list(draft_reach_traces(30, 5000)),
        "alloc/random-draft-reach-lru-unkeyed-first.json": list(
            draft_reach_traces(30, 6000, spec.Eviction.LRU_UNKEYED_FIRST)
        ),
        "alloc/scenarios-lru-unkeyed-first.json": list(unkeyed_first_twins(alloc_scenarios())),
        "alloc/regressions.json": list(regression_cases()),
        "alloc/owed.json": owed_cases(),
        "alloc/radix.json": [
            *radix_scenarios(),
            *radix_twins(alloc_scenarios()),
            *radix_traces(60, 9000),
        ],
        "page/scenarios.json": list(page_scenarios()),
        "page/refusals.json": list(page_refusals()),
        "page/random.json": list(random_plans(60)),
    }


# Ids no vector carries any more, and why: engines' skip and xfail files naming them fail
# loudly as stale, and no new case may take them.
RETIRED = {
    "page.model.qwen3-5-0-8b.auto": "the same plan as page.vllm-544, which keeps its origin",
    "alloc.refuse.unit-allocator-not-specified": "spec 0.7.0 specifies the allocator's side "
    "of `unit U` (ALLOC-UNIT-1..4): alloc/unit.json, and ALLOC-UNIT-1's refusals",
    "alloc.refuse.unit-same-pass": "spec 0.8.0 serves same-pass visibility under `unit U` "
    "(HIT-UNIT-5): alloc/unit.json's same-pass scenarios and alloc/same-pass.json's twins",
    "alloc.refuse.unit-draft-groups": "spec 0.9.0 serves draft groups keyed exactly under "
    "`unit U` (ALLOC-UNIT-2): alloc/unit.json's draft-tail scenarios; the drop stays refused "
    "(alloc.refuse.unit-draft-groups-dropped)",
}


class DuplicateVector(ValueError):
    """Two cases ask the same thing: one of them tests nothing the other does not."""


def refuse_duplicates(files: dict[str, list[JSON]]) -> None:
    """Every id is new, unretired, and no two cases share their input and expectation."""
    ids: set[str] = set()
    seen: dict[str, str] = {}
    for cases in files.values():
        for case in cases:
            if case["id"] in ids or case["id"] in RETIRED:
                raise DuplicateVector(f"case id {case['id']} is used twice or retired")
            ids.add(case["id"])
            key = json.dumps([case["input"], case["expect"]], sort_keys=True)
            if key in seen:
                raise DuplicateVector(
                    f"{case['id']} has the same input and expectation as {seen[key]}: "
                    "change what it tests or drop it"
                )
            seen[key] = case["id"]


def render() -> dict[str, str]:
    """File name -> exact text, manifest included."""
    files = {}
    cases_by_file = suites()
    refuse_duplicates(cases_by_file)
    for path, cases in cases_by_file.items():
        body = {
            "format": FORMAT,
            "spec_version": SPEC_VERSION,
            "suite": path.split("/")[0],
            "cases": cases,
        }
        files[path] = json.dumps(body, indent=1, sort_keys=True) + "\n"
    manifest = {
        "format": FORMAT,
        "spec_version": SPEC_VERSION,
        "files": {
            p: {
                "sha256": hashlib.sha256(t.encode()).hexdigest(),
                "cases": len(json.loads(t)["cases"]),
            }
            for p, t in sorted(files.items())
        },
        "retired_ids": sorted(RETIRED),
    }
    files["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate kvcert's conformance vectors")
    parser.add_argument(
        "--check",
        action="store_true",
        help="fail if the committed vectors differ from a regeneration",
    )
    args = parser.parse_args(argv)
    files = render()
    stale = []
    for name, text in files.items():
        path = VECTORS / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"stale vectors: {stale}; run python -m kvcert.conformance.vectors.generate",
            file=sys.stderr,
        )
        return 1
    total = sum(len(json.loads(t).get("cases", [])) for t in files.values())
    print(f"{'checked' if args.check else 'wrote'} {len(files)} files, {total} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
