"""Write a release's expected-results file from a certification report, one reason per case.

    python -m kvcert.conformance.vllm.expected REPORT > engines/vllm/0.33.0/expected.json
    python -m kvcert.conformance.vllm.expected REPORT TRACE > .../0.33.0/expected-planned.json
    python -m kvcert.conformance.vllm.expected --table [-planned | -planned-unmarked]

(REPORT: scripts/engine-certify.sh's .engines/vllm-0.33.0.report.json; --table: the tables of
docs/engines.md.) A planned mode's report comes with the trace of
kvcert.conformance.vllm.trace_causes (which vLLM flag each difference follows); its causes are
read from there first.

Every unexpected result gets the cause it was traced to (docs/engines.md explains each
cause with its evidence). A failure that matches no known cause is written as "uninvestigated":
such entries are open work, never a reason to stop looking.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.contract.compare import LATER_HITS, REFUSED_VALID, hits_match
from kvcert.conformance.vllm import checkout

CAUSES = {
    "validation": "vLLM's KVCacheManager does not validate this input; vLLM's config and model "
    "layers own that check, and the adapter drives the manager only",
    "chunk-alignment": "vLLM requires block_size to divide the attention chunk (its attention "
    "backends assert it at start-up); the spec allows any chunk",
    "chunk-block-sizes": "vLLM asserts that chunked local attention cannot share a model with "
    "groups of other block sizes (HybridKVCacheCoordinator)",
    "same-step": "ALLOC-VIS-1: vLLM makes blocks hittable at allocate_slots, so a request admitted "
    "in the step that computes them hits them (by design for attention, PR #29387 defers "
    "only Mamba); the spec registers at the end of the step",
    "salt-lora": "vllm#44701: cache-salt and LoRA extra keys collide in the block hash",
    "eagle-drop-past-hit": "HIT-SPEC-2 under drop: vLLM drops the draft group's own last "
    "matched block, and where the draft group matched blocks beyond the common hit that drop "
    "falls outside the hit, so vLLM returns the plain hit undropped; the spec steps the common "
    "hit down once, because the draft KV just before the hit depends on the next token, which "
    "then only a block outside the hit vouches for (found by the three-group enumeration, "
    "hit.g3.*, with mixed block sizes; with a draft whose heads differ from the target's, "
    "hit.shape.*, two groups suffice, because vLLM then keeps draft and target apart)",
    "blocks-past-hit": "vLLM <= 0.28 returns the spec's hit length, but one group's block list "
    "runs past it: that group is not cut back to the final hit (three-group layouts with two "
    "full-attention groups of different block sizes, and draft layouts; 0.33 cuts every "
    "list). The request then holds cached blocks beyond its computed tokens; whether a "
    "forward pass writes into them (a wrong-output risk) is not yet traced",
    "align-hold": "vLLM's Mamba align mode keeps the previous step's state block until the "
    "next step; ALLOC-HOLD-1 keeps only the running state",
    "registration-unit": "registered count differs in a layout of several block sizes: vLLM "
    "caches in whole units of the hit alignment (seen on 0.33: a B=1 group caches nothing "
    "until the B=2 group's block is full); the spec registers every full block at the step "
    "end. No hit differs: a hit is a multiple of the alignment and needs no block of a partial "
    "unit (THM-REG-UNIT, proved in kvcert check's pr tier, with its twin)",
    "equal-specs": "vLLM <= 0.28's HybridKVCacheCoordinator asserts that two groups have "
    "different specs (its planner merges equal ones, draft layers included); 0.33 accepts them",
    "preempt-in-flight": "known upstream, open PR vllm#43569 (wrong output, reproduced "
    "through vLLM's own Scheduler by kvcert.conformance.vllm.checks.preempt_in_flight): a request "
    "released in the step that scheduled it leaves the blocks of its unwritten chunk "
    "registered, because vLLM caches at allocate_slots; vLLM's priority scheduler preempts "
    "requests already scheduled in the step (sched/scheduler.py). The spec registers only "
    "committed chunks (ALLOC-VIS-1)",
    "mamba-all-hold": "vLLM keeps only the running Mamba block held in mode all too (older "
    "checkpoints go back to the cache at once); ALLOC-HOLD-1 keeps every position of a mode-all "
    "state group held, though no later token reads an older checkpoint: the spec holds more "
    "than it needs here, a spec rule to revisit (no hit differs)",
    "eagle-drop": "vllm#32802 family: the EAGLE last-block drop loses more than one block. "
    "<= 0.15.0 spirals to 0 (PR #33524 fixed one full plus one other group in 0.16.0); "
    "<= 0.19.1 drops once per group pass and spirals with three or more attention groups "
    "(both fixed in 0.20.0, vectors hit.vllm-c1 to hit.vllm-c4b)",
    "eagle-block-sizes": "vllm#39450 era: EAGLE with groups of different block sizes asserts "
    "'aligned_length is not compatible with eagle' (fixed in 0.19.1)",
    "eagle-chunked-local": "new (limitation): vLLM asserts 'Hybrid KV cache is not supported "
    "for eagle + chunked local attention'; no upstream issue found",
    "lookahead-kept": "missing feature: vLLM's allocate_slots only ever grows a request's "
    "table, so a block allocated for lookahead slots stays held when a later step asks for "
    "fewer; the spec gives back the positions no step can read any more (ALLOC-HOLD-1, "
    "ALLOC-SKIP-1). One block more held until the request ends; hits and registrations are "
    "the same (the tables match wherever the spec holds a block)",
    "free-hit": "a layout where no group reads the whole prefix (short windows, local "
    "chunks): the spec serves the tokens no later token reads without any cached block "
    "(HIT-SW-1, HIT-CHUNK-1); vLLM serves only blocks it finds cached. Degenerate layouts only",
    "one-token-window": "a sliding window of 1 token (each token attends to itself only) needs "
    "no cached block for any hit (HIT-SW-1: the W - 1 = 0 tokens before it), but vLLM 0.33 "
    "caches none of its blocks (reachable_block_mask keeps a tail of 0 blocks) and its "
    "SlidingWindowManager reports a hit only past a cached block, so every hit is 0 and "
    "fewer blocks are registered. Degenerate layouts only",
    "drop-proof-margin": "new (the spec serves less): under drop keying vLLM 0.33's EAGLE "
    "group matches one block past a candidate hit (eagle_proof_margin), also past the request's "
    "last token, and drops only that block; so a request whose hit is capped by HIT-LEN-1 keeps "
    "the plain hit, the block after it vouching for the tokens the last draft KV reads. The "
    "spec's HIT-SPEC-2 steps down within lengths up to num_tokens - 1 and serves one aligned "
    "step less. Sound under the same one-writer condition as the drop itself; a spec rule to "
    "revisit (kvcert.spec.hybrid)",
    "sparse-extension-dropped": "new (a lost hit under the sparse retention vLLM declares): "
    "without EAGLE, vLLM 0.33's replay_boundaries returns only num_prompt_tokens - 1, so a "
    "block-aligned prompt keeps no sliding-window or state blocks at its extension length "
    "floor_A(p) (spec RET-SPARSE-1); a request extending the prompt hits one alignment step "
    "less, and fewer blocks are registered (its docstring names both positions, and the EAGLE "
    "branch keeps both). Minimal repro: alloc.unkeyed-first.owed.sw.p12.extension (a 12-token "
    "prompt, blocks of 4, window 8: the 15-token extension hits 8, owed 12). The case passes "
    "with both positions returned (kvcert.conformance.vllm.trace_causes.extension_boundary). "
    "Upstream: vllm#54713 (merged) made the EAGLE branch keep both positions for the "
    "block-aligned re-send; this non-EAGLE half is not reported (searched 2026-11-26), and "
    "vllm#57610 (a divergence inside the last alignment block) is another loss",
    "sparse-lookahead-boundary": "new (a lost hit under the sparse retention vLLM declares): "
    "with EAGLE, vLLM 0.33's replay_boundaries keeps the window ending one block past "
    "floor(p - 1) - B and floor(p) - B, the block its EAGLE match peeks at; under lookahead "
    "block hashes for k >= 2 draft tokens (multi-module MTP) that block gets no hash until k "
    "tokens follow it, so when the prompt ends within them the retained window is never "
    "complete and the re-send hits 0 (spec RET-SPARSE-1 retains floor_A(p - r)). Minimal "
    "repro: alloc.sparse.unkeyed-first.owed.sw-exact-k2.p13.re-send (13 tokens, blocks of 4, "
    "window 8, 2 draft tokens: hit 0, owed 8). Every hit matches with the boundaries of a "
    "prompt k - 1 tokens shorter (kvcert.conformance.vllm.trace_causes.lookahead_boundary); "
    "registrations still differ by reprefill-all-groups. Upstream: not reported (searched "
    "2026-11-26); vllm#53945 and vllm#54713 placed the EAGLE boundaries and vllm#57444 (open) "
    "refines them for fine-grained hashes, none for the k-token lookahead of RFC vllm#50438",
    "lookahead-boundary": "vLLM 0.33's lookahead block hashes (the default with EAGLE) key every "
    "group's block with the token after it, so under its sparse retention a sibling that "
    "diverges right after a retained boundary misses that boundary's block in every group, "
    "target groups included, and the hit falls back (reported upstream: RFC vllm#50438, "
    "'a different following token falls back to an earlier hash boundary'); the case passes "
    "with disable_lookahead_block_hashes",
    "timeout": "the adapter's hit set-up (a writer request computed chunk by chunk) exceeds "
    "the per-case time limit on this release",
    "eagle-fallback-drops": "a drafter whose layers vLLM does not identify gets the "
    "release's fallback, every group flagged for EAGLE (0.33: a drafter that does not mark its "
    "layers, mode unmarked; before 0.33 every drafter but DeepSeek-V4's MTP layer): each "
    "attention type drops its own last matched block, so three or more types lose more than "
    "the one block HIT-SPEC-2 allows. On 0.33 the same case passes with the draft layers "
    "marked (with dense retention too where sliding-window or Mamba groups keep fewer "
    "blocks); the hand mode, which flags only draft groups, passes it on every release",
    "lookahead-registration": "vLLM 0.33's default for EAGLE (lookahead block hashes) hashes "
    "every group's block only once the token after it is known and then drops nothing; the "
    "spec's exact profile waits so only for draft groups (HASH-DRAFT-1), so vLLM registers "
    "target blocks one step later. Passes with disable_lookahead_block_hashes",
    "chunked-as-full": "VllmConfig turns the hybrid KV-cache manager off for a model with "
    "chunked local attention (always with EAGLE; otherwise unless "
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1), and the planner then serves chunked "
    "local layers as full attention: every block is kept and needed, where the spec's chunked "
    "group needs only the current chunk (HIT-CHUNK-1): fewer hits in a dense trace; under "
    "sparse retention, where the spec keeps a chunked group's blocks only at retained lengths "
    "(RET-SPARSE-2), vLLM keeps them all and may hit more. A full group needs a superset of "
    "the chunked group's blocks, so no hit is wrong",
    "mamba-hash-block": "vLLM up to 0.28 (planned modes): when a Mamba group's block size "
    "differs from --block-size (mode all, or --mamba-block-size), the block size vLLM hashes "
    "at (--block-size up to 0.19; from 0.20 the lcm of the groups' blocks, in "
    "resolve_kv_cache_block_sizes) does not divide every group's block size, and its "
    "HybridKVCacheCoordinator refuses to start. A model with these layers and flags does not "
    "start; the spec serves it",
    "reprefill-all-groups": "draft_reach k > 1 (multi-module MTP): vLLM caches only "
    "num_computed - (k - 1) tokens in every group (num_reprefillable_tokens), the target's "
    "included; the spec waits in draft groups only, whose last positions are drafted again "
    "(ALLOC-COMMIT-1). Only the registered count differs: a hit needs the draft groups' blocks",
    "mtp-block-size": "vLLM 0.33 refuses to start multi-module MTP with prefix caching when "
    "the scheduler block is shorter than the modules (num_speculative_tokens); the spec keys "
    "a draft block on the reach tokens after it whatever the block size (HASH-DRAFT-1) and "
    "refuses only the drop beyond the hit alignment (HIT-SPEC-2). A model with these layers "
    "does not start; the spec serves it",
    "swa-lookahead-index": "vLLM 0.33 raises IndexError in "
    "SlidingWindowManager.find_longest_cache_hit (an engine crash) when no full-attention "
    "group bounds the hit and its lookahead hashes cover k > 1 tokens: a request's last "
    "blocks stay unhashed until k tokens follow them, but the finder reads a hash for every "
    "block below num_tokens - 1. Only all-sliding-window attention (with multi-module MTP) "
    "reaches it; no vLLM issue found (2026-11-25)",
    "uninvestigated": "uninvestigated: the first divergence is not yet traced to a cause",
}
VALIDATION = {
    "alloc.refuse.pool-too-small",
    "hit.refuse.layout-draft-without-profile",
    "hit.refuse.layout-profile-without-draft",
    "hit.refuse.layout-max-model-len-zero",
    "hit.refuse.layout-alignment-impossible",
    "hit.refuse.layout-unknown-mamba-mode",
    "hit.refuse.layout-draft-on-state-group",
    "hit.refuse.layout-draft-reach-without-drafts",
}


def same_step(ops: list[dict[str, Any]], index: int) -> bool:
    """Whether op `index` is an admission while an earlier op of the same step scheduled work."""
    if ops[index].get("op") != "admit":
        return False
    for op in reversed(ops[:index]):
        if op.get("op") == "end_step":
            return False
        if op.get("op") in ("admit", "extend"):
            return True
    return False


def released_in_flight(ops: list[dict[str, Any]], index: int) -> bool:
    """Whether op `index` ends a step after a request was released in the step that
    scheduled it (where a step-end engine's registration count shows it)."""
    return ops[index].get("op") == "end_step" and released_in_flight_before(ops, index)


def released_in_flight_before(ops: list[dict[str, Any]], index: int) -> bool:
    """Whether a request was released, at op `index` or before, in the step that scheduled
    it: under the same-pass profile its published blocks lose their keys then (ALLOC-VIS-3),
    so the first divergence shows at the release or at any later op, not only at the end of
    the step."""
    scheduled: set[str] = set()
    for op in ops[: index + 1]:
        kind = op.get("op")
        if kind == "end_step":
            scheduled.clear()
        elif kind in ("admit", "extend"):
            scheduled.add(str(op.get("rid")))
        elif kind in ("finish", "preempt") and str(op.get("rid")) in scheduled:
            return True
    return False


def _equal_groups(layout: dict[str, Any]) -> bool:
    shapes = [
        json.dumps(
            {k: v for k, v in g.items() if k not in ("name", "draft", "shape")}, sort_keys=True
        )
        for g in layout.get("groups", [])
    ]
    return len(set(shapes)) < len(shapes)


def _lookahead_kept(detail: str) -> bool:
    """Same tables, except that the engine still holds blocks at the last positions where
    the spec holds none."""
    found = re.match(r"step \d+: tables (.*) are not a consistent renaming of (.*)$", detail)
    if not found:
        return False
    got, want = (ast.literal_eval(found.group(i)) for i in (1, 2))
    kept = False
    for g, w in zip(got, want, strict=True):
        if len(g) != len(w):
            return False
        tail = len(w)
        while tail and w[tail - 1] == 0 and g[tail - 1] != 0:
            tail -= 1
        if g[:tail] != w[:tail]:
            return False
        kept = kept or tail < len(w)
    return kept


def _blocks_past_hit(detail: str) -> bool:
    """Same hit, and each group's block list starts with the expected one, one runs longer."""
    found = re.match(r"block lists \(as runs\) (.*) != expected (.*)$", detail)
    if not found:
        return False

    def flat(runs: list[tuple[int | None, int]]) -> list[int | None]:
        return [None if start is None else start + i for start, n in runs for i in range(n)]

    got, want = (ast.literal_eval(found.group(i)) for i in (1, 2))
    pairs = [(flat(g), flat(w)) for g, w in zip(got, want, strict=True)]
    return all(g[: len(w)] == w for g, w in pairs) and any(len(g) > len(w) for g, w in pairs)


def traced_cause(trace: dict[str, Any], layout: dict[str, Any], detail: str) -> str | None:
    """The cause a planned-mode case follows, from the flags under which it passes."""
    flags = set(trace.get("passes_with", ())) | set(trace.get("as_hand_with", ()))
    # a fix of vLLM's, not a flag: the bug it fixes, where it restores the whole case or,
    # when only registrations still differ (another cause's), every hit
    fixed = flags | (set() if trace.get("hits_equal") else set(trace.get("hits_match_with", ())))
    if "extension-boundary" in fixed:
        return "sparse-extension-dropped"
    if "lookahead-replay" in fixed:
        return "sparse-lookahead-boundary"
    if layout.get("speculative") != "exact" and flags & {"no-lookahead-hashes"}:
        return "lookahead-boundary"
    if layout.get("speculative") == "exact" and flags & {"no-lookahead-hashes", "no-block-drop"}:
        return "lookahead-registration"
    hits = re.match(r"hit (\d+) != expected (\d+)", detail)
    fallback = "other-marking" in flags or (
        trace.get("hand") and layout.get("speculative") == "drop"
    )
    if fallback and hits and int(hits.group(1)) < int(hits.group(2)):
        return "eagle-fallback-drops"
    return None


# Causes that say no hit differs: never given to a case whose hits differ later in its trace
# (compare_alloc lists them after the first difference).
HITS_UNCHANGED = frozenset(
    {"registration-unit", "reprefill-all-groups", "lookahead-kept", "lookahead-registration"}
)


def cause(
    result: dict[str, Any], case: dict[str, Any] | None, trace: dict[str, Any] | None = None
) -> str:
    detail, _, later = result["detail"].partition(LATER_HITS)
    if trace is not None:  # whether this run's hits were the spec's, registrations aside
        trace = {**trace, "hits_equal": hits_match(result["detail"])}
    found = _cause(detail, result["id"], case, trace)
    admitted = re.match(
        r"step (\d+): \{'admitted': \{'hit': (\d+).* != expected \{'admitted': \{'hit': (\d+)",
        detail,
    )
    if found == "uninvestigated" and admitted:
        step, got, want = admitted.groups()
        if _proof_margin(case, int(step), got, int(want)):
            return "drop-proof-margin"
    if later and found in HITS_UNCHANGED:
        # the first difference says no hit differs, yet one does: the case takes the cause
        # of its first differing hit, or none
        step, got, want = re.findall(r"step (\d+) \((\d+|None) != expected (\d+)\)", later)[0]
        if _proof_margin(case, int(step), got, int(want)):
            return "drop-proof-margin"
        first_hit = f"step {step}: hit {got} != expected {want}"
        hit_cause = _cause(first_hit, result["id"], case, trace)
        return hit_cause if hit_cause not in HITS_UNCHANGED else "uninvestigated"
    return found


def _proof_margin(case: dict[str, Any] | None, step: int, got: str, want: int) -> bool:
    """An admission under drop keying where the engine kept a hit that HIT-LEN-1 caps: the
    plain hit `got` is within the request's last token and one aligned step past it is not."""
    if case is None or got == "None" or int(got) <= want:
        return False
    layout = case["input"]["layout"]
    op = case["input"]["ops"][step]
    if layout.get("speculative") != "drop" or op.get("op") != "admit":
        return False
    alignment = math.lcm(*(g["block_size"] for g in layout["groups"] if g.get("kind") != "cross"))
    last = len(op["tokens"]) - 1
    return int(got) <= last < int(got) + alignment


def _cause(
    detail: str, case_id: str, case: dict[str, Any] | None, trace: dict[str, Any] | None
) -> str:
    layout = (case or {}).get("input", {}).get("layout", {})
    if trace is not None and (name := traced_cause(trace, layout, detail)):
        return name
    if case_id in VALIDATION:
        return "validation"
    if case_id.endswith("isolation.salt-and-lora-do-not-collide"):
        return "salt-lora"
    if case_id.endswith("mamba-align.checkpoint-at-step-end"):
        return "align-hold"
    if "aligned_length is not compatible with eagle" in detail:
        return "eagle-block-sizes"
    if "not supported for eagle + chunked local" in detail:
        return "eagle-chunked-local"
    if "TimeoutError" in detail:
        return "timeout"
    if "different block sizes are not compatible with chunked local" in detail:
        return "chunk-block-sizes"
    if _blocks_past_hit(detail):
        return "blocks-past-hit"
    if _lookahead_kept(detail):
        return "lookahead-kept"
    if detail.startswith(REFUSED_VALID) and any(
        g.get("kind") == "chunked_local" and g["chunk"] % g["block_size"]
        for g in layout.get("groups", [])
    ):
        return "chunk-alignment"
    if trace is not None and detail.startswith(REFUSED_VALID):
        groups = layout.get("groups", [])
        attention = [g["block_size"] for g in groups if g.get("kind") != "mamba"]
        apart = [
            g
            for g in groups
            if g.get("kind") == "mamba"
            and (g.get("mode") == "all" or g["block_size"] != min(attention, default=0))
        ]
        if apart and len({g["block_size"] for g in groups}) > 1:
            return "mamba-hash-block"
    reach = layout.get("draft_reach", 1)
    blocks = [g["block_size"] for g in layout.get("groups", []) if g.get("kind") != "mamba"]
    if detail.startswith(REFUSED_VALID) and reach > min(blocks, default=reach):
        return "mtp-block-size"
    if (
        "IndexError" in detail
        and reach > 1
        and "full" not in {g.get("kind") for g in layout.get("groups", [])}
    ):
        return "swa-lookahead-index"
    if detail.startswith(REFUSED_VALID) and _equal_groups(layout):
        return "equal-specs"
    if layout.get("speculative") == "drop":
        hits = re.match(r"hit (\d+) != expected (\d+)", detail)
        if hits and int(hits.group(1)) < int(hits.group(2)):
            return "eagle-drop"
        if hits and int(hits.group(1)) > int(hits.group(2)) and len(layout["groups"]) >= 2:
            return "eagle-drop-past-hit"
        needs = re.search(r"'needed': (\d+).*'needed': (\d+)", detail)
        if needs and int(needs.group(1)) > int(needs.group(2)):
            return "eagle-drop"  # a smaller hit leaves more blocks to allocate
        if needs and int(needs.group(1)) < int(needs.group(2)) and len(layout["groups"]) >= 2:
            return "eagle-drop-past-hit"  # a larger hit leaves fewer blocks to allocate
    counts = re.match(r"step \d+: \{'step_ended': \{'registered': (\d+)\}\} != "
                      r"expected \{'step_ended': \{'registered': (\d+)", detail)  # fmt: skip
    one_size = len({g["block_size"] for g in layout.get("groups", [])}) == 1  # else
    # registration-unit; under either keying (the wait is the runner's re-prefill)
    if reach > 1 and one_size and counts is not None and int(counts[1]) < int(counts[2]):
        return "reprefill-all-groups"
    if trace is not None and any(g.get("kind") == "chunked_local" for g in layout["groups"]):
        return "chunked-as-full"
    if "'hit'" in detail and not any(
        g.get("kind") in ("full", "mamba") for g in layout.get("groups", [])
    ):
        return "free-hit"
    if any(
        g.get("kind") == "sliding_window" and g.get("window") == 1 for g in layout.get("groups", [])
    ):
        return "one-token-window"
    step = re.match(r"step (\d+):", detail)
    if case is not None and step:
        ops = case["input"]["ops"]
        index = int(step.group(1))
        same_pass = case["input"].get("visibility") == "same-pass"
        # under the same-pass profile a same-step hit is what the spec serves too
        if same_step(ops, index) and not same_pass:
            return "same-step"
        if released_in_flight(ops, index) or (same_pass and released_in_flight_before(ops, index)):
            return "preempt-in-flight"
        modes = {g.get("mode") for g in layout["groups"] if g.get("kind") == "mamba"}
        if "not a consistent renaming" in detail and modes:
            return "mamba-all-hold" if "all" in modes else "align-hold"
        if ops[index].get("op") == "end_step" and "registered" in detail:
            sizes = {g["block_size"] for g in layout["groups"]}
            if len(sizes) > 1:
                return "registration-unit"
    return "uninvestigated"


def classify(
    report: dict[str, Any], traces: dict[str, Any] | None = None
) -> dict[str, tuple[str, str]]:
    """case id -> (cause, detail) for every result that is not a pass; `traces` (a planned
    mode's trace_causes.py output) names the flag each difference follows."""
    cases = {c["id"]: c for _, c, _ in iter_cases() if c is not None}
    return {
        r["id"]: (
            cause(r, cases.get(r["id"]), None if traces is None else traces.get(r["id"], {})),
            r["detail"],
        )
        for r in report["results"]
        if r["status"] in ("failed", "errored", "xfailed")
    }


NO_PROFILE = "none (see docs/engines.md: free order)"  # a RESULTS line, when none is claimed


def markdown(report: dict[str, Any], traces: dict[str, Any] | None = None) -> str:
    """The results document of one release (and adapter mode)."""
    engine = report["engine"]
    found = classify(report, traces)
    lines = [
        f"# {engine['name']} {engine['version']}: conformance results",
        "",
        "Generated by `python -m kvcert.conformance.vllm.expected --markdown REPORT` from "
        "`scripts/engine-certify.sh`'s report; docs/engines.md explains each cause.",
        "",
        f"* features claimed: {', '.join(engine['features'])}",
        f"* profiles claimed: {', '.join(engine['profiles']) or NO_PROFILE}",
        f"* counts: {json.dumps(report['counts'], sort_keys=True)}",
        "",
        "| cause | cases | first example (what differed) |",
        "|---|---|---|",
    ]
    by_cause: dict[str, list[str]] = {}
    for case_id, (name, _) in sorted(found.items()):
        by_cause.setdefault(name, []).append(case_id)
    for name, ids in sorted(by_cause.items(), key=lambda item: -len(item[1])):
        detail = found[ids[0]][1].replace("|", "/")[:160]
        lines.append(f"| {name} | {len(ids)} | `{ids[0]}`: {detail} |")
    lacking: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for result in report["results"]:
        detail = result["detail"]
        if result["status"] != "skipped":
            continue
        if detail.startswith("engine lacks "):
            lacking.update(detail.removeprefix("engine lacks ").split(", "))
        else:
            other[detail] += 1
    lines += ["", "## Skipped", ""]
    lines.append(
        "Cases needing a feature the engine does not claim (a case counts once per feature): "
        + ", ".join(f"{feature} {n}" for feature, n in lacking.most_common())
    )
    lines += [f"* {n}: {reason}" for reason, n in other.most_common()]
    lines += ["", "## Every unexpected case", ""]
    for name, ids in sorted(by_cause.items()):
        lines.append(f"* **{name}** ({CAUSES[name]}): " + ", ".join(f"`{i}`" for i in ids))
    return "\n".join(lines) + "\n"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.name.split("."))


def table(engine: str = "vllm", mode: str = "") -> str:
    """docs/engines.md's results table for one adapter mode ("" hand, "-planned", ...):
    per release, passed and skipped cases, the probed free order, and the count per cause,
    read from the committed RESULTS and expected files."""
    root = checkout() / "engines" / engine
    releases = sorted(
        (d for d in root.iterdir() if (d / f"expected{mode}.json").is_file()), key=_version_key
    )
    by_text = {text: name for name, text in CAUSES.items()}
    rows, seen = [], Counter[str]()
    for release in releases:
        entries = json.loads((release / f"expected{mode}.json").read_text(encoding="utf-8"))
        causes = Counter(by_text[text] for text in entries.values())
        seen.update(causes)
        results = (release / f"RESULTS{mode}.md").read_text(encoding="utf-8")
        counts = json.loads(re.search(r"^\* counts: (.*)$", results, re.M).group(1))  # type: ignore[union-attr]
        profiles = re.search(r"^\* profiles claimed: (.*)$", results, re.M).group(1)  # type: ignore[union-attr]
        order = profiles.removeprefix("eviction.") if profiles.startswith("eviction.") else "-"
        rows.append((release.name, counts.get("passed", 0), counts.get("skipped", 0), order,
                     causes))  # fmt: skip
    columns = [name for name, _ in seen.most_common()]
    lines = [
        "| release | passed | skipped | free order | " + " | ".join(columns) + " |",
        "|---|---|---|---|" + "---|" * len(columns),
    ]
    for name, passed, skipped, order, causes in rows:
        cells = " | ".join(str(causes[c]) if causes[c] else "" for c in columns)
        lines.append(f"| {name} | {passed} | {skipped} | {order} | {cells} |")
    return "\n".join(lines) + "\n"


ADAPTER_MODES = {"": "as the vector reads", "-planned": "through vLLM's planner",
         "-planned-unmarked": "planned, drafts unmarked"}  # fmt: skip


def summary() -> str:
    """The README's results table: per engine release and adapter mode, the vectors that
    pass, those that do not (each with its cause in expected*.json) and those skipped (a
    feature or profile the engine does not claim), read from the committed RESULTS files."""
    header = "| engine | " + " | ".join(ADAPTER_MODES.values()) + " |"
    lines = [header, "|---|" + "---|" * len(ADAPTER_MODES)]
    for engine in ("vllm", "sglang"):
        root = checkout() / "engines" / engine
        for release in sorted((d for d in root.iterdir() if d.name[0].isdigit()),
                              key=_version_key):  # fmt: skip
            cells = []
            for mode in ADAPTER_MODES:
                results = release / f"RESULTS{mode}.md"
                if not results.is_file():
                    cells.append("")
                    continue
                found = re.search(r"^\* counts: (.*)$", results.read_text(encoding="utf-8"), re.M)
                counts = json.loads(found.group(1)) if found else {}
                failing = counts.get("failed", 0) + counts.get("errored", 0)
                cells.append(f"{counts.get('passed', 0):,} / {failing:,} / "
                             f"{counts.get('skipped', 0):,}")  # fmt: skip
            name = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
            lines.append(f"| {name} {release.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--summary":
        print(summary(), end="")
        return 0
    if argv and argv[0] == "--table":
        print(table(mode=argv[1] if len(argv) > 1 else ""), end="")
        return 0
    as_markdown = "--markdown" in argv
    paths = [a for a in argv if a != "--markdown"]
    report = json.loads(Path(paths[0]).read_text(encoding="utf-8"))
    traces = json.loads(Path(paths[1]).read_text(encoding="utf-8")) if len(paths) > 1 else None
    if as_markdown:
        print(markdown(report, traces), end="")
    else:
        reasons = {k: CAUSES[name] for k, (name, _) in classify(report, traces).items()}
        print(json.dumps(reasons, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
