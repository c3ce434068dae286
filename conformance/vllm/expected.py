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
from kvcert.conformance.sglang.chunked import CHUNKED, window_twin_hit
from kvcert.conformance.sglang.whole_ask import follows_whole_ask
from kvcert.conformance.vllm import checkout, unit_model
from kvcert.conformance.vllm.causes import CAUSES

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


def _window_edge_held(detail: str, layout: dict[str, Any]) -> bool:
    """Same tables, except that the engine still holds blocks just before the first block
    the spec holds in a sliding-window group (its window's trailing edge)."""
    found = re.match(r"step \d+: tables (.*) are not a consistent renaming of (.*)$", detail)
    if not found:
        return False
    got, want = (ast.literal_eval(found.group(i)) for i in (1, 2))
    kinds = [g.get("kind") for g in layout.get("groups", [])]
    if len(kinds) != len(got):
        return False
    held = False
    for g, w, kind in zip(got, want, kinds, strict=True):
        if len(g) != len(w):
            return False
        first = next((i for i, b in enumerate(w) if b), len(w))
        edge = first
        while edge and w[edge - 1] == 0 and g[edge - 1] != 0:
            edge -= 1
        if g[:edge] != w[:edge] or g[first:] != w[first:]:
            return False
        if edge < first and kind != "sliding_window":
            return False
        held = held or edge < first
    return held


def _waits_for_a_smaller_hit(detail: str, layout: dict[str, Any]) -> bool:
    """The engine waits, needing more new blocks than the spec's admission (which hit) takes:
    the blocks each group's table holds past the hit."""
    found = re.match(
        r"step \d+: \{'waiting': \{'needed': (\d+).* != expected (\{'admitted': .*\}\})$", detail
    )
    if not found:
        return False
    admitted = ast.literal_eval(found.group(2))["admitted"]
    sizes = [g["block_size"] for g in layout.get("groups", [])]
    if admitted["hit"] == 0 or len(sizes) != len(admitted["tables"]):
        return False
    new = sum(
        sum(1 for b in table[admitted["hit"] // size :] if b)
        for table, size in zip(admitted["tables"], sizes, strict=True)
    )
    return int(found.group(1)) > new


def _bigram_cap(detail: str, case: dict[str, Any] | None) -> bool:
    """A draft layout whose owed hit is the HIT-LEN-1 limit n - 1, served lower."""
    found = re.match(r"hit (\d+) != expected (\d+)$", detail)
    if case is None or not found:
        return False
    groups = case["input"]["layout"].get("groups", [])
    got, want = int(found.group(1)), int(found.group(2))
    owed_at_limit = want == case["input"].get("num_tokens", 0) - 1
    return any(g.get("draft") for g in groups) and owed_at_limit and got < want


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


def _successor_copy(case: dict[str, Any] | None, step: int) -> bool:
    """Whether the request admitted at op `step` shares a block's tokens with two earlier
    requests that differ in the token right after that block, and shares that token with
    the later one: an engine that keys target blocks with the token after them (vLLM's
    lookahead hashes) serves the later request's copy, the spec (HASH-DRAFT-1 keys only
    draft groups) the earlier one's, with the same tokens in it."""
    if case is None:
        return False
    ops = case["input"]["ops"]
    if ops[step].get("op") != "admit":
        return False
    sizes = {g["block_size"] for g in case["input"]["layout"]["groups"]}
    reader = ops[step]["tokens"]
    earlier = [op["tokens"] for op in ops[:step] if op.get("op") == "admit"]
    for size in sizes:
        for end in range(size, len(reader), size):
            same = [t for t in earlier if len(t) > end and t[:end] == reader[:end]]
            if any(t[end] != reader[end] for t in same[:1]) and any(
                t[end] == reader[end] for t in same[1:]
            ):
                return True
    return False


def traced_cause(
    trace: dict[str, Any], layout: dict[str, Any], detail: str, case: dict[str, Any] | None
) -> str | None:
    """The cause a planned-mode case follows, from the flags under which it passes."""
    flags = set(trace.get("passes_with", ())) | set(trace.get("as_hand_with", ()))
    # a fix of vLLM's, not a flag: the bug it fixes, where it restores the whole case or,
    # when only registrations still differ (another cause's), every hit
    fixed = flags | (set() if trace.get("hits_equal") else set(trace.get("hits_match_with", ())))
    if "blocks-at-hit" in fixed | set(trace.get("first_difference_fixed_by", ())):
        return "blocks-past-hit"
    if "extension-boundary" in fixed:
        return "sparse-extension-dropped"
    if "lookahead-replay" in fixed:
        return "sparse-lookahead-boundary"
    if layout.get("speculative") != "exact" and flags & {"no-lookahead-hashes"}:
        return "lookahead-boundary"
    if layout.get("speculative") == "exact" and "target-junction" in fixed:
        return "lookahead-junction"
    if layout.get("speculative") == "exact" and flags & {"no-lookahead-hashes", "no-block-drop"}:
        return "lookahead-registration"
    if layout.get("speculative") == "exact" and trace.get("hits_equal"):
        table_step = re.match(r"step (\d+): tables ", detail)
        if table_step and _successor_copy(case, int(table_step[1])):
            return "lookahead-copy"
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
    {
        "registration-unit",
        "reprefill-all-groups",
        "lookahead-kept",
        "lookahead-registration",
        "lookahead-copy",
        "chunk-end-registered",
        "eagle-window-tail",
        "reprefill-window-held",
    }
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
    # later admissions answered otherwise; one that waits where the spec admits with no hit
    # (None != expected 0) loses no owed hit: what it lacked was room, which the first
    # difference (blocks held or freed otherwise) explains
    differing = [
        (step, got, want)
        for step, got, want in re.findall(r"step (\d+) \((\d+|None) != expected (\d+)\)", later)
        if (got, want) != ("None", "0")
    ]
    if differing and found in HITS_UNCHANGED:
        # the first difference says no hit differs, yet one does: the case takes the cause
        # of its first differing hit, or none
        step, got, want = differing[0]
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
    if trace is not None and (name := traced_cause(trace, layout, detail, case)):
        return name
    if case_id in VALIDATION:
        return "validation"
    if case_id.startswith("alloc.radix.") and case is not None and follows_whole_ask(case):
        return "whole-ask-eviction"
    if case_id.endswith("isolation.salt-and-lora-do-not-collide"):
        return "salt-lora"
    if case_id.endswith("mamba-align.checkpoint-at-step-end"):
        return "align-hold"
    if "aligned_length is not compatible with eagle" in detail:
        return "eagle-block-sizes"
    if "not supported for eagle + chunked local" in detail:
        return "eagle-chunked-local"
    if "different block sizes are not compatible with chunked local" in detail:
        return "chunk-block-sizes"
    if _blocks_past_hit(detail):
        return "blocks-past-hit"
    if case_id.startswith("hit.unit.") and (unit := unit_model.unit_cause(detail, case)):
        return unit
    if _lookahead_kept(detail):
        return "lookahead-kept"
    if layout.get("draft_reach", 1) > 1 and _window_edge_held(detail, layout):
        return "reprefill-window-held"
    if detail.startswith(REFUSED_VALID) and any(
        g.get("kind") == "chunked_local" and g["chunk"] % g["block_size"]
        for g in layout.get("groups", [])
    ):
        return "chunk-alignment"
    if trace is not None and trace.get("planned") and detail.startswith(REFUSED_VALID):
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
    if any(  # degenerate: every hit 0, whatever else the layout has
        g.get("kind") == "sliding_window" and g.get("window") == 1 for g in layout.get("groups", [])
    ):
        return "one-token-window"
    if layout.get("speculative") == "drop":
        hits = re.match(r"hit (\d+) != expected (\d+)", detail)
        served = re.match(
            r"step \d+: \{'admitted': \{'hit': (\d+).* != expected \{'admitted': \{'hit': (\d+)",
            detail,
        )
        if any(m and int(m.group(1)) < int(m.group(2)) for m in (hits, served)):
            return "eagle-drop"
        if _waits_for_a_smaller_hit(detail, layout):
            return "eagle-drop"  # it needs more blocks than the spec's admission takes
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
    planned = trace is not None and trace.get("planned")
    if planned and any(g.get("kind") == "chunked_local" for g in layout["groups"]):
        return "chunked-as-full"
    if "'hit'" in detail and not any(
        g.get("kind") in ("full", "mamba") for g in layout.get("groups", [])
    ):
        return "free-hit"
    if _chunk_end_registered(counts, case, layout, trace):
        return "chunk-end-registered"
    if _bigram_cap(detail, case):
        return "eagle-bigram-cap"
    found = _step_cause(detail, case, layout) or _lookahead_wait(detail, layout, trace)
    if found == "uninvestigated" and _chunk_as_window(detail, case):
        return "chunked-as-window"
    return found


def _chunk_as_window(detail: str, case: dict[str, Any] | None) -> bool:
    """A chunked-local case served less than owed, and exactly the hit the spec gives with
    the chunked layers cached as a window of the chunk (see the cause)."""
    served = re.match(r"hit (\d+) != expected (\d+)", detail)
    if case is None or served is None or int(served[1]) >= int(served[2]):
        return False
    if not any(g.get("kind") == CHUNKED for g in case["input"]["layout"].get("groups", [])):
        return False
    return window_twin_hit(case["input"]) == int(served[1])


def _chunk_end_registered(
    counts: re.Match[str] | None,
    case: dict[str, Any] | None,
    layout: dict[str, Any],
    trace: dict[str, Any] | None,
) -> bool:
    """Under dense retention, more blocks registered than the spec's, every hit the spec's,
    in a layout with a chunked local group (see the cause)."""
    dense = (case or {}).get("input", {}).get("retention", "dense") == "dense"
    return (
        dense
        and counts is not None
        and int(counts[1]) > int(counts[2])
        and trace is not None
        and bool(trace.get("hits_equal"))
        and any(g.get("kind") == "chunked_local" for g in layout.get("groups", []))
    )


def _eagle_window_tail(detail: str, layout: dict[str, Any]) -> bool:
    """Under drop keying, more blocks registered than the spec's in a layout with a sliding
    window (see the cause)."""
    more = re.match(r"step \d+: \{'step_ended': \{'registered': (\d+)\}\} != "
                    r"expected \{'step_ended': \{'registered': (\d+)", detail)  # fmt: skip
    return (
        layout.get("speculative") == "drop"
        and more is not None
        and int(more[1]) > int(more[2])
        and any(g.get("kind") == "sliding_window" for g in layout.get("groups", []))
    )


def _lookahead_wait(detail: str, layout: dict[str, Any], trace: dict[str, Any] | None) -> str:
    """Under exact keying with one draft token and one block size, fewer blocks registered
    while every hit is the spec's: the keys that wait for the token after their block (under
    sparse retention the flag that stops the wait also restores the EAGLE drop, so the case
    cannot pass with it)."""
    fewer = re.match(r"step \d+: \{'step_ended': \{'registered': (\d+)\}\} != "
                     r"expected \{'step_ended': \{'registered': (\d+)", detail)  # fmt: skip
    if (
        trace is not None
        and trace.get("hits_equal")
        and layout.get("speculative") == "exact"
        and layout.get("draft_reach", 1) == 1
        and len({g["block_size"] for g in layout.get("groups", [])}) == 1
        and fewer
        and int(fewer[1]) < int(fewer[2])
    ):
        return "lookahead-registration"
    return "uninvestigated"


def _step_cause(detail: str, case: dict[str, Any] | None, layout: dict[str, Any]) -> str | None:
    """Causes read from the op where the case first differs."""
    step = re.match(r"step (\d+):", detail)
    if case is not None and step:
        ops = case["input"]["ops"]
        index = int(step.group(1))
        same_pass = case["input"].get("visibility") == "same-pass"
        # only a case whose answer the visibility profile decides (it requires step-end)
        # can differ by a same-step hit; under same-pass the spec serves one too
        if same_step(ops, index) and "visibility.step-end" in case.get("requires", ()):
            return "same-step"
        admitted = re.match(
            r"step \d+: \{'admitted': \{'hit': (\d+).* != expected \{'admitted': \{'hit': (\d+)",
            detail,
        )
        if (
            admitted
            and int(admitted[1]) > int(admitted[2])
            and same_step(ops, index)
            and any(g.get("kind") == "mamba" for g in layout["groups"])
        ):
            return "mamba-same-step"
        needs = re.match(
            r"step \d+: \{'waiting': \{'needed': (\d+).* != "
            r"expected \{'waiting': .*'needed': (\d+)",
            detail,
        )
        if (
            needs
            and int(needs[1]) > int(needs[2])
            and ops[index].get("lookahead")
            and any(g.get("mode") == "all" for g in layout["groups"] if g.get("kind") == "mamba")
        ):
            return "mamba-lookahead-blocks"
        waits = re.match(r"step \d+: \{'waiting': \{'needed': (\d+)", detail)
        if (
            waits
            and int(waits[1]) > case["input"].get("num_blocks", int(waits[1]))
            and same_step(ops, index)
            and any(g.get("kind") == "mamba" for g in layout["groups"])
        ):
            return "mamba-same-step-wait"
        if released_in_flight(ops, index) or (same_pass and released_in_flight_before(ops, index)):
            return "preempt-in-flight"
        modes = {g.get("mode") for g in layout["groups"] if g.get("kind") == "mamba"}
        if "not a consistent renaming" in detail and modes:
            return "mamba-all-hold" if "all" in modes else "align-hold"
        if ops[index].get("op") == "end_step" and "registered" in detail:
            if _eagle_window_tail(detail, layout):
                return "eagle-window-tail"
            sizes = {g["block_size"] for g in layout["groups"]}
            if len(sizes) > 1:
                return "registration-unit"
    return None


def classify(
    report: dict[str, Any], traces: dict[str, Any] | None = None
) -> dict[str, tuple[str, str]]:
    """case id -> (cause, detail) for every result that is not a pass; `traces` (a planned
    mode's trace_causes.py output) names the flag each difference follows."""
    cases = {c["id"]: c for _, c, _ in iter_cases() if c is not None}
    # a planned mode's trace also names engine arguments; the hand mode's only vLLM's fixes
    planned = report["engine"]["name"].startswith("vllm-planned")
    return {
        r["id"]: (
            cause(
                r,
                cases.get(r["id"]),
                None if traces is None else {**traces.get(r["id"], {}), "planned": planned},
            ),
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
    """The README's results table: per engine release and adapter mode, the vectors run, those
    that pass, those that do not (each with its cause in expected*.json) and those skipped (a
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
                passed = counts.get("passed", 0)
                cells.append(f"{passed + failing:,} / {passed:,} / {failing:,} / "
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
