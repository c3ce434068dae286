"""A model of vLLM 0.33's fine-grained (`--prefix-match-unit`) lookup over a hit vector's
view, to attribute each difference from HIT-UNIT-1..4 to the mechanism behind it.

Read from vLLM 0.33.0's sources (kv_cache_coordinator.HybridKVCacheCoordinator
.find_longest_cache_hit, single_type_kv_cache_manager.FullAttentionManager and MambaManager
.find_longest_cache_hit, kv_cache_utils.eagle_proof_margin), written here from that reading:

* the coordinator starts from num_tokens - 1 and visits the groups in order until no group
  shortens the length; a full-attention group (a draft one too) is looked up once and then
  only trimmed;
* a full-attention lookup takes whole blocks while their keys are cached and within the
  length it is asked for, then probes the next block's unit boundaries from that length
  down and keeps the first cached one (`tail="exact"`: a block cached under a longer key is
  not found at a shorter length; `tail="covering"` is HIT-UNIT-2's reading instead);
* a Mamba lookup keeps the longest cached unit boundary up to the length it is asked for;
* groups of equal specs (a draft group beside its target, as the adapter builds them) are
  looked up as one, a block counting only where each holds its key (`merge`);
* under drop keying a draft group not yet verified for the current length is asked one unit
  more (eagle_proof_margin) and drops one unit from what it finds (`drop="proof"`;
  `drop="spec"` replaces it with HIT-SPEC-2's one step down the common set).

`model_hit(case, tail, drop, merge)` gives the hit. With HIT-UNIT-2's tail, HIT-SPEC-2's drop
and no merging it is the spec's hit on every `hit.unit.hybrid` vector (tests/engines checks
it); kvcert.conformance.vllm.expected names a cause only where the model with vLLM's readings
reproduces the answer vLLM gave, then says which reading makes the difference.
"""

from __future__ import annotations

import re
from typing import Any

from kvcert.conformance.contract.codec import JSON, from_ranges


def _keys(case: JSON) -> list[set[int]]:
    """Per group, the positions the view keys: block ends and partial keys."""
    data = case["input"]
    groups = data["layout"]["groups"]
    partial = data.get("partial") or [[] for _ in groups]
    return [
        {(j + 1) * g["block_size"] for j in from_ranges(ranges)} | set(positions)
        for g, ranges, positions in zip(groups, data["cached"], partial, strict=True)
    ]


def _full(keys: set[int], size: int, unit: int, bounds: tuple[int, int], tail: str) -> int:
    """FullAttentionManager.find_longest_cache_hit's length before any drop; `bounds` are
    the length asked for and the request's last unit boundary."""
    asked, top = bounds
    whole = 0
    while whole + size <= asked and whole + size in keys:
        whole += size
    last = min(whole + size - unit, asked, top)  # the unit boundaries probed in the next block
    for end in range(last - last % unit, whole, -unit):
        if tail == "exact" and end in keys:
            return end
        if tail == "covering" and any(end <= k <= whole + size for k in keys):
            return end
    return whole


def _mamba(keys: set[int], unit: int, asked: int, top: int) -> int:
    """MambaManager.find_longest_cache_hit's length (fine-grained)."""
    limit = min(asked, top)
    return max((k for k in keys if k <= limit and k % unit == 0), default=0)


def _spec_groups(case: JSON, merge: bool = True) -> list[tuple[dict[str, Any], set[int], bool]]:
    """The coordinator's SpecGroups: groups of equal specs merged (a block counts only when
    every merged group holds its key; the EAGLE bit if any of them is a draft group), full
    attention first."""
    layout = case["input"]["layout"]
    merged: dict[tuple[str, int, int], tuple[dict[str, Any], set[int], bool]] = {}
    for index, (group, keys) in enumerate(zip(layout["groups"], _keys(case), strict=True)):
        spec = (group["kind"], group["block_size"], 0 if merge else index)
        draft = bool(group.get("draft")) and layout.get("speculative") == "drop"
        if spec in merged:
            first, held, eagle = merged[spec]
            merged[spec] = (first, held & keys, eagle or draft)
        else:
            merged[spec] = (group, set(keys), draft)
    return sorted(merged.values(), key=lambda m: m[0]["kind"] != "full")


def model_hit(case: JSON, tail: str = "exact", drop: str = "proof", merge: bool = True) -> int:
    """The hit vLLM 0.33 would answer for a `unit U` hit vector of full-attention and state
    groups, under the given readings (`merge=False`: every group looked up on its own)."""
    data = case["input"]
    layout: dict[str, Any] = data["layout"]
    unit: int = layout["hit_unit"]
    n: int = data["num_tokens"]
    if drop == "spec" and layout.get("speculative") == "drop":
        return _spec_drop(case, tail, merge)
    top = n // unit * unit  # len(block_hashes) * hash_block_size
    groups = _spec_groups(case, merge)
    hit = n - 1
    found: dict[int, int] = {}
    verified: set[int] = set()
    while True:
        current = hit
        for g, (group, keys, eagle) in enumerate(groups):
            if group["kind"] == "full" and g in found:
                current = min(current, found[g])
                continue
            dropping = eagle and g not in verified
            size = group["block_size"]
            if group["kind"] == "mamba":
                new = _mamba(keys, unit, current, top)
            else:
                margin = unit if size > unit else size
                asked = min(current + margin, top) if dropping else current
                new = _full(keys, size, unit, (asked, top), tail)
                if dropping and new > 0:
                    new -= min(unit, size)
                new -= new % unit
            if dropping:
                verified.add(g)
            elif new < current:
                verified.clear()
            current = new
            found[g] = new
        if current >= hit:
            return hit
        hit = current


def _spec_drop(case: JSON, tail: str, merge: bool) -> int:
    """The plain hit under the model's tail reading, then HIT-SPEC-2: one step down the
    lengths every group accepts."""
    plain_case = {**case, "input": {**case["input"], "layout": {
        **case["input"]["layout"], "speculative": None}}}  # fmt: skip
    lengths = _accepted(plain_case, tail, merge)
    plain = max(lengths)
    return max((x for x in lengths if x < plain), default=0) if plain else 0


def _accepted(case: JSON, tail: str, merge: bool) -> list[int]:
    """The lengths up to num_tokens - 1 that the model's lookup serves (no drop)."""
    data = case["input"]
    unit, n = data["layout"]["hit_unit"], data["num_tokens"]
    served = []
    for length in range(0, n, unit):
        capped = {**case, "input": {**data, "num_tokens": length + 1}}
        if model_hit(capped, tail, "proof", merge) == length:
            served.append(length)
    return served


# what each cause says in engines/vllm/VERSION/RESULTS.md (kvcert.conformance.vllm.expected)
UNIT_CAUSES = {
    "unit-tail-past-asked": "new (a lost hit, vLLM serves less): under --prefix-match-unit "
    "vLLM 0.33's full-attention lookup (FullAttentionManager.find_longest_cache_hit) takes a "
    "block inside which the hit ends only under a key at or below the length it is asked "
    "(num_tokens - 1 at first), so a block cached under its whole-block key or a longer partial "
    "key, which holds every token up to the hit, is not found there and the hit falls back "
    "(HIT-UNIT-2, THM-UNIT-FULL-DOWN; the model kvcert.conformance.vllm.unit_model reproduces "
    "vLLM's answer and the spec's once it reads the tail as covering). With vLLM's promotion "
    "(a block's partial key is dropped once the block is full; vllm#49125, PRs #52972 and "
    "#53158 keep it dropped) a re-send of a prompt ending inside a block its writer then "
    "filled finds that block only under its whole-block key, past the re-send's cap; no "
    "upstream issue found on the lookup side",
    "unit-drop-proof-margin": "under --prefix-match-unit and drop keying vLLM 0.33's EAGLE "
    "group is asked one hash unit past the candidate (eagle_proof_margin) and drops one unit "
    "from what it finds, so it keeps a hit the matched unit after it vouches for, where "
    "HIT-SPEC-2 steps down the common set (the known drop-proof-margin difference, at unit "
    "granularity; kvcert.conformance.vllm.unit_model reproduces vLLM's answer and the spec's "
    "once it drops as HIT-SPEC-2 does)",
    "unit-tail-and-drop": "under --prefix-match-unit and drop keying both unit-tail-past-asked "
    "and unit-drop-proof-margin act on one lookup: kvcert.conformance.vllm.unit_model "
    "reproduces vLLM's answer, and the spec's only with both readings changed",
    "unit-merged-draft": "under --prefix-match-unit and drop keying vLLM 0.33 looks a draft "
    "group up together with a target group of the same spec (HybridKVCacheCoordinator "
    ".verify_and_split_kv_cache_groups), a block counting only where both hold its key, "
    "besides its tail and drop readings; kvcert.conformance.vllm.unit_model reproduces vLLM's "
    "answer, and the spec's with each group looked up alone and the spec's readings",
}


def unit_cause(detail: str, case: dict[str, Any] | None) -> str | None:
    """A `unit U` hit difference the model of vLLM's fine-grained lookup reproduces, named by
    the reading of vLLM's that makes it (kvcert.conformance.vllm.unit_model)."""
    hits = re.match(r"hit (\d+) != expected (\d+)", detail)
    if case is None or hits is None:
        return None
    got, want = int(hits.group(1)), int(hits.group(2))
    if model_hit(case) != got:
        return None
    if model_hit(case, tail="covering") == want:
        return "unit-tail-past-asked"
    if model_hit(case, drop="spec") == want:
        return "unit-drop-proof-margin"
    if model_hit(case, tail="covering", drop="spec") == want:
        return "unit-tail-and-drop"
    if model_hit(case, tail="covering", drop="spec", merge=False) == want:
        return "unit-merged-draft"
    return None
