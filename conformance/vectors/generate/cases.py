"""Case builders: each case's expectation is what kvcert.spec answers, its `rules` the rule
tags whose functions ran meanwhile (traced, not hand-listed), its `requires` the features it
needs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from kvcert.conformance.contract.codec import (
    JSON,
    REFUSED,
    layout_to_json,
    op_to_json,
    to_ranges,
    to_runs,
)
from kvcert.conformance.engines.spec_engine import SpecEngine
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Layout,
    MambaState,
    SlidingWindow,
    SpecError,
)
from kvcert.spec import alloc as spec
from kvcert.spec.retention import Retention
from kvcert.spec.rules import all_rules


@cache
def _rule_codes() -> dict[object, str]:
    """Each rule function's code object -> its tag (the rule index parses every spec module's
    docstrings: built once, not per case)."""
    return {
        getattr(importlib.import_module(r.module), r.function).__code__: r.tag for r in all_rules()
    }


def traced(run: Callable[[], JSON]) -> tuple[JSON, list[str]]:
    """Run the spec and record the rule tags whose functions were called."""
    codes = _rule_codes()
    seen: set[str] = set()

    def profile(frame: Any, event: str, _: Any) -> None:
        if event == "call" and frame.f_code in codes:
            seen.add(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(previous)
    return result, sorted(seen)


def spec_answer(case_input: JSON) -> tuple[JSON, list[str]]:
    """The spec's answer to a case, as a vector's expectation, and the rules it called. A
    refusal is expected as `{"refused": true}`: the spec's reason is for people reading a
    report, and engines word theirs as they like."""
    answer, rules = traced(lambda: SpecEngine().run(case_input))

    def bare(value: JSON) -> JSON:
        return REFUSED if value.get("refused") is True else value

    if "observations" in answer:
        answer = {**answer, "observations": [bare(o) for o in answer["observations"]]}
    return bare(answer), rules


def requires(
    layout: Layout,
    ops: Sequence[spec.Op] = (),
    reuse: bool = False,
    eviction: spec.Eviction = spec.Eviction.LRU,
) -> list[str]:
    """The engine features a case needs (the runner skips cases an engine lacks)."""
    needed = set()
    for group in layout.groups:
        match group:
            case FullAttention():
                needed.add("kind.full")
            case SlidingWindow():
                needed.add("kind.sliding_window")
            case ChunkedLocal():
                needed.add("kind.chunked_local")
            case MambaState():
                needed.add(f"kind.mamba.{group.mode.value}")
                if group.speculative_blocks:
                    needed.add("alloc.speculative_state")
            case CrossAttention():
                needed.add("kind.cross")
    if layout.speculative is not None:
        needed.add(f"speculative.{layout.speculative.value}")
    if layout.draft_reach > 1:
        needed.add("speculative.reach")
    if layout.hit_unit is not None:
        needed.add("hit.unit")
    for op in ops:
        for extra in getattr(op, "extras", ()):
            needed.add(f"extras.{extra.kind.value}")
        if getattr(op, "lookahead", 0):
            needed.add("alloc.lookahead")
        if getattr(op, "checkpoint", 0):
            needed.add("alloc.state_checkpoint")
        if isinstance(op, spec.Preempt):
            needed.add("alloc.preempt")
        if isinstance(op, spec.ResetCache):
            needed.add("alloc.reset_cache")
    if reuse:
        needed.add(f"eviction.{eviction.value}")
    return sorted(needed)


# The rule each hand-written scenario was written for (by id prefix): failing engines are
# reported against these first, since rules every case exercises cannot single a bug out.
FOCUS: dict[str, tuple[str, ...]] = {
    "hit.seed.gpt-oss-eagle": ("HIT-SPEC-2",),
    "hit.seed.gemma4-dflash-exact": ("HIT-SPEC-1",),
    "hit.seed.gemma4-dflash": ("HIT-SPEC-2",),
    "hit.seed.eagle-block-aligned": ("HIT-SPEC-2", "HIT-LEN-1"),
    "hit.seed.deepseek-v4-flash": ("HIT-FULL-1", "HIT-SW-1"),
    "hit.seed.qwen35": ("HIT-MAMBA-1",),
    "hit.vllm-c8": ("HIT-SW-1", "HIT-FULL-1"),
    "hit.vllm-c1": ("HIT-SPEC-2",),
    "hit.vllm-c2": ("HIT-SPEC-2",),
    "hit.vllm-c3": ("HIT-SPEC-2",),
    "hit.vllm-c4": ("HIT-SPEC-2", "HIT-HYB-1"),
    "hit.vllm-c9": ("HIT-MAMBA-1",),
    "hit.vllm-peer": ("HIT-SW-1",),
    "hit.sw": ("HIT-SW-1",),
    "hit.chunked": ("HIT-CHUNK-1",),
    "hit.cross": ("HIT-CROSS-1",),
    "hit.mamba-none": ("HIT-MAMBA-2",),
    "hit.unit.qwen35-like": ("HIT-UNIT-2", "HIT-UNIT-3"),
    "alloc.visibility": ("ALLOC-VIS-1",),
    "alloc.same-pass.window-hit": ("ALLOC-VIS-2",),
    "alloc.same-pass.withdrawn": ("ALLOC-VIS-3",),
    "alloc.same-pass.read-writer-stays": ("ALLOC-VIS-3",),
    "alloc.two-phase": ("ALLOC-TWO-PHASE-1",),
    "alloc.duplicates": ("ALLOC-LOOKUP-1",),
    "alloc.eviction": ("ALLOC-EVICT-1",),
    "alloc.lru": ("ALLOC-FREE-1",),
    "alloc.hybrid.resent": ("EVICT-ORDER-1",),
    "alloc.hybrid": ("EVICT-HYB-1",),
    "alloc.sliding-window": ("ALLOC-SKIP-1", "ALLOC-HOLD-1"),
    "alloc.mamba-align": ("ALLOC-COMMIT-1",),
    "alloc.mamba-none": ("ALLOC-COMMIT-1",),
    "alloc.draft-exact": ("ALLOC-COMMIT-1", "HASH-DRAFT-1"),
    "alloc.isolation": ("HASH-EXTRA-1",),
    "alloc.multimodal": ("HASH-EXTRA-1",),
    "alloc.reset": ("ALLOC-RESET-1",),
    "alloc.decode": ("ALLOC-COMMIT-1",),
    "alloc.capacity": ("ALLOC-TWO-PHASE-1",),
    "alloc.lookahead": ("ALLOC-WRITE-1",),
    "alloc.inner-checkpoint": ("CKPT-INNER-1",),
    "alloc.speculative-state": ("ALLOC-SPEC-1",),
    "alloc.speculative-state.crossed-boundary": ("ALLOC-SPEC-2",),
    "hit.refuse": ("INPUT-1",),
    "alloc.refuse": ("INPUT-1",),
}


def _focus(case_id: str, given: tuple[str, ...]) -> tuple[str, ...]:
    if given:
        return given
    matches = [k for k in FOCUS if case_id.startswith(k)]
    return FOCUS[max(matches, key=len)] if matches else ()


def make_case(
    case_id: str,
    rules: list[str],
    needs: list[str],
    case_input: JSON,
    expect: JSON,
    origin: str | None,
    comment: str,
    focus: tuple[str, ...],
) -> JSON:
    """One vector case; a focus rule must be one the case actually exercises."""
    out: JSON = {"id": case_id, "rules": rules, "requires": needs}
    if origin:
        out["origin"] = origin
    if comment:
        out["comment"] = comment
    focus = _focus(case_id, focus)
    if set(focus) - set(rules):
        raise ValueError(f"{case_id}: focus rules {set(focus) - set(rules)} are not exercised")
    if focus:
        out["focus"] = list(focus)
    out.update(input=case_input, expect=expect)
    return out


def hit_case(
    case_id: str,
    layout: Layout,
    num_tokens: int,
    cached: list[list[int]],
    origin: str | None = None,
    comment: str = "",
    focus: tuple[str, ...] = (),
    partial: list[list[int]] | None = None,
) -> JSON:
    case_input: JSON = {
        "suite": "hit",
        "layout": layout_to_json(layout),
        "num_tokens": num_tokens,
        "cached": [to_ranges(c) for c in cached],
    }
    if partial is not None:  # format /5: only under a layout's hit_unit
        case_input["partial"] = [sorted(p) for p in partial]
    answer, rules = spec_answer(case_input)
    expect = {"hit": answer["hit"], "block_runs": [to_runs(b) for b in answer["blocks"]]}
    return make_case(case_id, rules, requires(layout), case_input, expect, origin, comment, focus)


def reuses_freed_blocks(
    layout: Layout,
    num_blocks: int,
    ops: list[spec.Op],
    eviction: spec.Eviction = spec.Eviction.LRU,
) -> bool:
    """Whether new blocks are handed out while a previously used block is free: then which
    block an engine hands out is normative only under the eviction profile (an engine with
    another order may legally pick the used one, e.g. vLLM 0.33 reuses unhashed blocks
    first)."""
    state = spec.initial_state(spec.PoolConfig(layout, num_blocks, eviction))
    used: set[int] = set()
    for op in ops:
        before = state
        try:
            state, _ = spec.step(state, op)
        except SpecError:  # a refused operation changes nothing
            continue
        popped = {
            b
            for b in before.free
            if b not in state.free and state.blocks[b].content is None and state.blocks[b].ref_count
        }
        if popped and used & set(before.free):
            return True
        used |= {
            b for t in (r.tables for r in state.requests.values()) for tt in t for b in tt if b
        }
    return False


def alloc_case(
    case_id: str,
    layout: Layout,
    num_blocks: int,
    ops: list[spec.Op],
    origin: str | None = None,
    comment: str = "",
    focus: tuple[str, ...] = (),
    eviction: spec.Eviction = spec.Eviction.LRU,
    visibility: spec.Visibility = spec.Visibility.STEP_END,
    retention: Retention = Retention.DENSE,
    retention_interval: int = 0,
) -> JSON:
    """An alloc case; it requires its visibility and retention profiles only where another
    profile answers it differently (a lookup in the step that schedules a block's writer; a
    hit on a bounded group's block sparse retention leaves uncached); a positive retention
    interval always requires `retention.sparse-interval`."""
    case_input: JSON = {
        "suite": "alloc",
        "layout": layout_to_json(layout),
        "num_blocks": num_blocks,
        "ops": [op_to_json(op) for op in ops],
    }
    if eviction is not spec.Eviction.LRU:
        case_input["eviction"] = eviction.value
    for name, profile in (("visibility", visibility), ("retention", retention)):
        if profile is not PROFILE_DEFAULTS[name]:
            case_input[name] = profile.value
    if retention_interval:
        case_input["retention_interval"] = retention_interval
    expect, rules = spec_answer(case_input)
    # a freed block handed out again, or (where the profiles above free blocks unkeyed in
    # the op that allocates) any answer another free order gives otherwise
    # (under radix no id is handed out twice, RADIX-ID-1: only the answers can tell)
    physical = eviction is not spec.Eviction.RADIX
    reuse = (physical and reuses_freed_blocks(layout, num_blocks, ops, eviction)) or (
        profile_matters(case_input, expect, "eviction")
    )
    needs = requires(layout, ops, reuse, eviction)
    for name, profile in (("visibility", visibility), ("retention", retention)):
        if retention_interval and name == "retention":
            needs = sorted([*needs, "retention.sparse-interval"])
        elif profile_matters(case_input, expect, name):
            needs = sorted([*needs, f"{name}.{profile.value}"])
    return make_case(case_id, rules, needs, case_input, expect, origin, comment, focus)


PROFILE_DEFAULTS: dict[str, spec.Eviction | spec.Visibility | Retention] = {
    "eviction": spec.Eviction.LRU,
    "visibility": spec.Visibility.STEP_END,
    "retention": Retention.DENSE,
}


def under_unit(case: JSON) -> bool:
    """Whether an alloc case runs under the hit-granularity profile `unit U`."""
    return case["input"]["layout"].get("hit_unit") is not None


def profile_matters(case_input: JSON, expect: JSON, name: str) -> bool:
    """Whether another profile of the family `name` (eviction, visibility, retention) than the one
    `case_input` names answers the case otherwise. A profile the spec refuses for the case's
    configuration (the radix profile beside a sliding window, same-pass under radix) is no
    alternative: no engine can claim it for that case."""
    default = PROFILE_DEFAULTS[name]
    chosen = case_input.get(name, default.value)
    for other in type(default):
        if other.value == chosen:
            continue
        changed = {k: v for k, v in case_input.items() if k != name}
        if other is not default:
            changed[name] = other.value
        answer = spec_answer(changed)[0]
        if answer not in (expect, REFUSED):
            return True
    return False


PROMPT = tuple(range(100, 140))  # the token sequences the hand-written traces share
OTHER = tuple(range(500, 540))
