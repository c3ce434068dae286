"""Trace each difference of a certification to the vLLM flag or bug it follows.

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.trace_causes REPORT MODE TRACE.json

MODE is `marked` or `unmarked` (a planned mode) or `hand`. For every case the report lists as
failed or errored, the case is run again with each fix of a vLLM bug in PATCHES applied and,
in a planned mode, with one engine argument changed from vLLM's default at a time (each only
where the release has it), with the other draft marking, with both, and in the hand mode. A
case that then passes follows that flag or fix: the difference is vLLM's default behaviour
(or that bug), not the adapter's and not chance; a flag never accepts a difference by itself
(kvcert.conformance.vllm.expected). A case that then fails exactly as in the hand mode has
the flag's difference on top of the hand mode's (known) one. The trace file (case id -> the
flags and fixes under which it passes, those under which it fails as the hand mode does,
those under which every hit is the spec's, whether the hand mode passes) is what
kvcert.conformance.vllm.expected reads to name the cause of each difference.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.contract.compare import compare_alloc, compare_hit, hits_match
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


@contextmanager
def extension_boundary() -> Iterator[None]:
    """vLLM with the fix for the lost extension boundary: without EAGLE its
    `replay_boundaries` returns only `num_prompt_tokens - 1`, so a block-aligned prompt's
    extension length floor_A(p) (spec RET-SPARSE-1) keeps no window; patched, it returns
    both, as its own docstring says it should."""
    coordinator: Any = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    original = coordinator.replay_boundaries

    def both(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> Any:
        found = original(num_prompt_tokens, scheduler_block_size, use_eagle)
        return found if use_eagle else tuple(sorted({*found, num_prompt_tokens}))

    coordinator.replay_boundaries = both
    try:
        yield
    finally:
        coordinator.replay_boundaries = original


@contextmanager
def lookahead_boundary() -> Iterator[None]:
    """vLLM with the fix for EAGLE boundaries that ignore the hash lookahead: its EAGLE
    `replay_boundaries` keeps the tail ending one block past floor(p - 1) - B and floor(p) - B,
    but under lookahead block hashes (k tokens past a block) that block has no hash until
    k tokens follow it, so when the prompt ends within them the retained window is never
    complete (spec RET-SPARSE-1 retains floor_A(p - max(1, r)) and floor_A(p - r)); patched,
    the boundaries are those of a prompt k - 1 tokens shorter."""
    coordinator: Any = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    cls = coordinator.KVCacheCoordinator
    original_cache, original_replay = cls.cache_blocks, coordinator.replay_boundaries

    def cache_blocks(self: Any, request: Any, num_computed_tokens: int) -> Any:
        lag = max(0, self.block_pool.num_hash_lookahead_tokens - 1)

        def shorter(num_prompt_tokens: int, block: int, use_eagle: bool) -> Any:
            return original_replay(max(1, num_prompt_tokens - lag), block, use_eagle)

        coordinator.replay_boundaries = shorter
        try:
            return original_cache(self, request, num_computed_tokens)
        finally:
            coordinator.replay_boundaries = original_replay

    cls.cache_blocks = cache_blocks
    try:
        yield
    finally:
        cls.cache_blocks = original_cache


@contextmanager
def target_junction() -> Iterator[None]:
    """vLLM with the junction found from the target tokens: under lookahead block hashes
    every group's key covers the k tokens after its block, so two prompts that share a
    prefix but not the token after it share no key in any group, and `get_computed_blocks`
    pins no junction (its `shared_prefix_boundary` is the longest single-group hit) where
    the full-attention group holds the prefix (spec RET-JUNCTION-1). Patched, the junction
    is the longest prefix an earlier prompt shares, floored to the hit alignment, where it
    lies past the hit: what keys without the lookahead for target groups would find (the
    design of vLLM's open PR #50897). A request looked up again (after waiting) counts its
    own earlier prompt, which pins its re-send length, a boundary vLLM keeps anyway."""
    module: Any = importlib.import_module("vllm.v1.core.kv_cache_manager")
    cls = module.KVCacheManager
    original = cls.get_computed_blocks
    seen: list[list[int]] = []

    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(self, request, *args, **kwargs)
        prompt = list(request.prompt_token_ids or ())
        shared = max((_common_prefix(prompt, p) for p in seen), default=0)
        seen.append(prompt)
        if len(found) != 3 or not self.coordinator.block_pool.num_hash_lookahead_tokens:
            return found
        blocks, hit, boundary = found
        unit = self.coordinator.scheduler_block_size
        junction = min(shared, len(prompt) - 1) // unit * unit
        return blocks, hit, max(boundary, junction) if junction > hit else boundary

    cls.get_computed_blocks = get_computed_blocks
    try:
        yield
    finally:
        cls.get_computed_blocks = original


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@contextmanager
def blocks_at_hit() -> Iterator[None]:
    """vLLM with every group's block list cut back to the common hit, as 0.33 cuts them: up
    to 0.28 one group's list may run past the hit (the hybrid coordinator does not cut the
    group it found first), and allocate_slots then counts those blocks as computed."""
    module: Any = importlib.import_module("vllm.v1.core.kv_cache_manager")
    cls = module.KVCacheManager
    original = cls.get_computed_blocks

    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(self, request, *args, **kwargs)
        blocks, hit = found[0], found[1]
        groups = self.kv_cache_config.kv_cache_groups
        cut = tuple(
            list(group_blocks)[: hit // groups[i].kv_cache_spec.block_size]
            for i, group_blocks in enumerate(blocks.blocks)
        )
        return (type(blocks)(cut), *found[1:])

    cls.get_computed_blocks = get_computed_blocks
    try:
        yield
    finally:
        cls.get_computed_blocks = original


def has_replay_boundaries() -> bool:
    """Whether the release has sparse retention's replay boundaries (0.33)."""
    module = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    return hasattr(module, "replay_boundaries")


# Fixes of vLLM bugs, by name, each with whether the release has the code it fixes: a case
# that passes with one applied differs because of that bug
PATCHES: dict[str, tuple[Callable[[], bool], Callable[[], AbstractContextManager[None]]]] = {
    "extension-boundary": (has_replay_boundaries, extension_boundary),
    "lookahead-replay": (has_replay_boundaries, lookahead_boundary),
    "target-junction": (has_replay_boundaries, target_junction),
    "blocks-at-hit": (lambda: True, blocks_at_hit),
}


def difference(engine: VllmEngine, case: dict[str, Any]) -> str | None:
    """The first difference from the vector's expectation (None: the case passes)."""
    try:
        answer = engine.run(case["input"])
    except Exception as error:  # an engine that raises does not pass
        return f"{type(error).__name__}: {error}"
    if "unsupported" in answer:
        return f"unsupported: {answer['unsupported']}"
    return COMPARE[case["input"]["suite"]](case["expect"], answer)


def _later(patched: str | None, base: str | None) -> bool:
    """Whether `patched` first differs at a later op than `base` (None: not at all)."""
    if base is None:
        return False
    if patched is None:
        return True
    now, before = (re.match(r"step (\d+):", d) for d in (patched, base))
    return now is not None and before is not None and int(now[1]) > int(before[1])


def trace(report: dict[str, Any], mode: str) -> dict[str, Any]:
    cases = {c["id"]: c for _, c, _ in iter_cases() if c is not None}
    # a case that ran out of time is not re-run: without the runner's limit it could run for
    # as long again per variant, and a timeout shows no difference to trace
    failing = [
        r["id"]
        for r in report["results"]
        if r["status"] in ("failed", "errored") and "TimeoutError" not in r.get("detail", "")
    ]
    engines: dict[str, VllmEngine] = {}
    if mode != "hand":  # engine arguments and the draft marking reach vLLM through its planner
        flags = candidate_flags()
        other = "unmarked" if mode == "marked" else "marked"
        engines = {name: VllmEngine(mode, f) for name, f in flags.items()}
        engines["other-marking"] = VllmEngine(other)
        for name, f in flags.items():  # a flag together with the other marking
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
        for name, (applies, fix) in PATCHES.items():
            if applies():
                with fix():
                    found[name] = difference(VllmEngine(mode), case)
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
            # where every admission's hit is the spec's, registrations aside: a fix that
            # restores the hits names the bug that lost them
            "hits_match_with": [
                name
                for name, d in found.items()
                if case["input"]["suite"] == "alloc" and hits_match(d)
            ],
            # fixes under which the case first differs at a later op (or not at all): the
            # first difference is that bug's, whatever differs after it
            "first_difference_fixed_by": [
                name
                for name in PATCHES
                if name in found and _later(found[name], planned_difference)
            ],
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
