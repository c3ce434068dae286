"""Generate the conformance vectors from the spec: `python -m kvcert.conformance.gen [--check]`.

Sources, all deterministic (no clock, fixed seeds, sorted keys):
* hand-written scenarios: every seed report and every bug in the research notes, by name;
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
import importlib
import itertools
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from kvcert.conformance.catalog import load_model, model_names
from kvcert.conformance.codec import (
    JSON,
    layout_from_json,
    layout_to_json,
    op_from_json,
    op_to_json,
    to_ranges,
    to_runs,
)
from kvcert.conformance.engines import SpecEngine
from kvcert.conformance.scenario import parse_scenario
from kvcert.spec import (
    SPEC_VERSION,
    ChunkedLocal,
    CrossAttention,
    Extra,
    ExtraKind,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.rules import all_rules
from kvcert.spec.view import keyable_blocks

FORMAT = "kvcert-vector/1"
VECTORS = Path(__file__).resolve().parent / "vectors"


def _rule_codes() -> dict[object, str]:
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
            case CrossAttention():
                needed.add("kind.cross")
    if layout.speculative is not None:
        needed.add(f"speculative.{layout.speculative.value}")
    for op in ops:
        for extra in getattr(op, "extras", ()):
            needed.add(f"extras.{extra.kind.value}")
        if getattr(op, "lookahead", 0):
            needed.add("alloc.lookahead")
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
    "alloc.visibility": ("ALLOC-VIS-1",),
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
    "alloc.regression": ("ALLOC-COMMIT-1",),
    "hit.refuse": ("INPUT-1",),
    "alloc.refuse": ("INPUT-1",),
}


def _focus(case_id: str, given: tuple[str, ...]) -> tuple[str, ...]:
    if given:
        return given
    matches = [k for k in FOCUS if case_id.startswith(k)]
    return FOCUS[max(matches, key=len)] if matches else ()


def _case(
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
) -> JSON:
    case_input = {
        "suite": "hit",
        "layout": layout_to_json(layout),
        "num_tokens": num_tokens,
        "cached": [to_ranges(c) for c in cached],
    }
    answer, rules = traced(lambda: SpecEngine().run(case_input))
    expect = {"hit": answer["hit"], "block_runs": [to_runs(b) for b in answer["blocks"]]}
    return _case(case_id, rules, requires(layout), case_input, expect, origin, comment, focus)


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
) -> JSON:
    case_input: JSON = {
        "suite": "alloc",
        "layout": layout_to_json(layout),
        "num_blocks": num_blocks,
        "ops": [op_to_json(op) for op in ops],
    }
    if eviction is not spec.Eviction.LRU:
        case_input["eviction"] = eviction.value
    expect, rules = traced(lambda: SpecEngine().run(case_input))
    reuse = reuses_freed_blocks(layout, num_blocks, ops, eviction)
    needs = requires(layout, ops, reuse, eviction)
    return _case(case_id, rules, needs, case_input, expect, origin, comment, focus)


# --- hand-written hit scenarios ---------------------------------------------------------------

B = 16
FULL, SW = FullAttention(B), SlidingWindow(B, 2 * B)


def _all(n: int) -> list[int]:
    return list(range(n))


def hit_scenarios() -> Iterator[JSON]:
    """Every seed, the vLLM probe cases (research notes §6) and the peer-test examples."""
    for name in sorted(
        p.name
        for p in (resources.files("kvcert.conformance") / "examples").iterdir()
        if p.name.endswith(".json")
    ):
        text = (resources.files("kvcert.conformance") / "examples" / name).read_text("utf-8")
        obj = json.loads(text)
        scenario = parse_scenario(obj, name)
        view = scenario.view
        yield hit_case(
            f"hit.seed.{name.removesuffix('.json')}",
            view.layout,
            view.num_tokens,
            [sorted(c) for c in view.cached],
            obj.get("origin"),
            obj["description"],
        )
    four = _all(4)
    c8 = [
        ("evict-full-0", [1, 2, 3], four),
        ("evict-sw-0", four, [1, 2, 3]),
        ("evict-full-3-sw-0", [0, 1, 2], [1, 2, 3]),
        ("evict-full-2-sw-0", [0, 1, 3], [1, 2, 3]),
        ("evict-sw-2", four, [0, 1, 3]),
    ]
    for label, full, window in c8:
        yield hit_case(
            f"hit.vllm-c8.{label}",
            Layout((FULL, SW)),
            69,
            [full, window],
            "vllm test_prefill_hybrid_model",
            "downward closure and window eviction",
        )
    eagle = {
        "c1": (FullAttention(B, draft=True), SW),
        "c2": (FullAttention(B, draft=True), SW, MambaState(B)),
        "c3": (FULL, SW, FullAttention(B, draft=True, name="draft")),
        "c3b": (FullAttention(B, draft=True), SW, SlidingWindow(B, 4 * B)),
    }
    for label, groups in eagle.items():
        origin = {"c1": "vllm#32802", "c3": "vllm#40624"}.get(label, "vllm notes §6")
        yield hit_case(
            f"hit.vllm-{label}.eagle-drop-once",
            Layout(groups, Speculative.DROP),
            69,
            [four] * len(groups),
            origin,
            "the drop steps down once, whatever the group count (<= 0.19 spiralled to 0)",
        )
    yield hit_case(
        "hit.vllm-c4.gemma4-block-sizes-eagle",
        Layout((FullAttention(32, draft=True), SlidingWindow(16, 64)), Speculative.DROP),
        133,
        [_all(4), _all(8)],
        "vllm#39450",
        "lcm 32: 128 in common, one step down to 96 (0.19.1 dropped twice)",
    )
    yield hit_case(
        "hit.vllm-c4b.reverse-block-sizes-eagle",
        Layout((FullAttention(16, draft=True), SlidingWindow(32, 64)), Speculative.DROP),
        133,
        [_all(8), _all(4)],
        "vllm notes §6",
    )
    yield hit_case(
        "hit.vllm-c9.mamba-not-downward-closed",
        Layout((FULL, MambaState(B))),
        69,
        [four, [0, 1, 2]],
        "vllm notes §6",
        "only the checkpoint at the hit counts",
    )
    yield hit_case(
        "hit.vllm-c9.mamba-boundary-checkpoint",
        Layout((SW, SlidingWindow(B, 4 * B), MambaState(B))),
        69,
        [four, four, [0, 1, 3]],
        "vllm notes §6",
    )
    peer = [
        ("a", [1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1]),
        ("b", [1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]),
        ("c", [1]),
        ("d", [1, 0]),
    ]
    for label, pattern in peer:
        cached = [j for j, bit in enumerate(pattern) if bit]
        yield hit_case(
            f"hit.vllm-peer.sw-possible-prefix-{label}",
            Layout((SlidingWindow(2, 4),)),
            2 * len(pattern) + 1,
            [cached],
            "vllm test_sliding_window_possible_cached_prefix",
        )
    yield hit_case(
        "hit.sw.window-counts-the-query-token",
        Layout((SlidingWindow(B, B + 1),)),
        69,
        [[0, 1, 3]],
        "vllm cdiv(W-1, B)",
        "W=17, B=16: a hit at 64 needs only block 3 (tokens 48-63); without the -1 it would "
        "also need block 2",
    )
    yield hit_case(
        "hit.chunked.boundary-needs-nothing",
        Layout((ChunkedLocal(B, 2 * B),)),
        70,
        [[]],
        None,
        "a chunk boundary needs no cached block",
    )
    yield hit_case(
        "hit.cross.constrains-nothing",
        Layout((FULL, CrossAttention(B))),
        69,
        [four, []],
        None,
        "cross attention is never cached and never limits",
    )
    yield hit_case(
        "hit.mamba-none.only-empty-hit",
        Layout((FULL, MambaState(B, MambaMode.NONE))),
        69,
        [four, []],
        None,
    )


# --- refusals: invalid layouts, requests and operations --------------------------------------


def raw_case(case_id: str, case_input: JSON, comment: str, needs: Sequence[str] = ()) -> JSON:
    """A case written directly in JSON (invalid input cannot be built from spec types).
    `needs`: the features a valid layout in it uses (an invalid layout needs none)."""
    expect, rules = traced(lambda: SpecEngine().run(case_input))
    if expect != {"refused": True} and case_input["suite"] == "hit":
        raise ValueError(f"{case_id} was meant to be refused, got {expect}")
    return {
        "id": case_id,
        "rules": rules or ["HIT-GROUP-1"],
        "requires": sorted(needs),
        "comment": comment,
        "input": case_input,
        "expect": expect,
    }


def refusals() -> Iterator[JSON]:
    """Input every engine must refuse, each with what is wrong."""
    full = {"kind": "full", "block_size": 16}
    bad_layouts = {
        "block-size-zero": ({"groups": [{"kind": "full", "block_size": 0}]}, "block size 0"),
        "block-size-text": ({"groups": [{"kind": "full", "block_size": "16"}]}, "not an integer"),
        "window-zero": (
            {"groups": [full, {"kind": "sliding_window", "block_size": 16, "window": 0}]},
            "window < 1",
        ),
        "chunk-zero": (
            {"groups": [full, {"kind": "chunked_local", "block_size": 16, "chunk": 0}]},
            "chunk < 1",
        ),
        "unknown-kind": ({"groups": [{"kind": "paged", "block_size": 16}]}, "unknown kind"),
        "unknown-mamba-mode": (
            {"groups": [full, {"kind": "mamba", "block_size": 16, "mode": "sometimes"}]},
            "unknown mode",
        ),
        "no-groups": ({"groups": []}, "a layout needs groups"),
        "draft-not-boolean": (
            {"groups": [{**full, "draft": "yes"}], "speculative": "drop"},
            "draft must be true or false",
        ),
        "draft-without-profile": (
            {"groups": [{**full, "draft": True}]},
            "draft layers but no speculative profile",
        ),
        "profile-without-draft": (
            {"groups": [full], "speculative": "drop"},
            "speculative profile but no draft group",
        ),
        "unknown-profile": (
            {"groups": [{**full, "draft": True}], "speculative": "eagle"},
            "unknown speculative profile",
        ),
        "draft-on-state-group": (
            {
                "groups": [full, {"kind": "mamba", "block_size": 16, "draft": True}],
                "speculative": "drop",
            },
            "state groups hold no draft layers",
        ),
        "max-model-len-zero": ({"groups": [full], "max_model_len": 0}, "max_model_len < 1"),
        "alignment-impossible": (
            {
                "groups": [
                    {"kind": "full", "block_size": 48},
                    {"kind": "sliding_window", "block_size": 64, "window": 128},
                ],
                "max_model_len": 100,
            },
            "lcm 192 exceeds what max_model_len 100 can reuse",
        ),
    }
    for label, (layout, why) in bad_layouts.items():  # layout: a JSON object
        yield raw_case(
            f"hit.refuse.layout-{label}",
            {
                "suite": "hit",
                "layout": layout,
                "num_tokens": 40,
                "cached": [[] for _ in layout["groups"]],  # type: ignore[index]
            },
            why,
        )
    ok = {
        "groups": [
            full,
            {"kind": "cross", "block_size": 16},
            {"kind": "mamba", "block_size": 16, "mode": "none"},
        ],
        "max_model_len": 100,
    }
    bad_views = {
        "zero-tokens": (0, [[], [], []], "a request has at least one token"),
        "tokens-not-integer": ("40", [[], [], []], "num_tokens must be an integer"),
        "beyond-max-model-len": (101, [[], [], []], "longer than max_model_len"),
        "cached-entries-per-group": (40, [[]], "one cached entry per group"),
        "block-outside-request": (40, [[[0, 3]], [], []], "block 2 is not a full block"),
        "cross-attention-cached": (40, [[], [[0, 1]], []], "cross attention is never cached"),
        "mode-none-cached": (40, [[], [], [[0, 1]]], "mode none keeps no checkpoints"),
    }
    for label, (tokens, cached, why) in bad_views.items():
        yield raw_case(
            f"hit.refuse.request-{label}",
            {"suite": "hit", "layout": ok, "num_tokens": tokens, "cached": cached},
            why,
            ("kind.full", "kind.cross", "kind.mamba.none"),
        )
    yield raw_case(
        "hit.refuse.cross-attention-only",
        {
            "suite": "hit",
            "layout": {"groups": [{"kind": "cross", "block_size": 16}]},
            "num_tokens": 40,
            "cached": [[]],
        },
        "nothing to cache: every group is cross attention",
        ("kind.cross",),
    )
    yield raw_case(
        "alloc.refuse.pool-too-small",
        {"suite": "alloc", "layout": {"groups": [full]}, "num_blocks": 1, "ops": []},
        "a pool needs the null block plus one",
        ("kind.full",),
    )
    yield raw_case(
        "alloc.refuse.pool-size-not-integer",
        {"suite": "alloc", "layout": {"groups": [full]}, "num_blocks": "64", "ops": []},
        "num_blocks must be an integer",
        ("kind.full",),
    )
    bad_extras = [
        {"kind": "cache_salt", "value": "s", "start": 0, "end": 4},
        {"kind": "multimodal", "value": "img"},
        {"kind": "lora", "value": 3},
        {"kind": "watermark", "value": "w"},
        {"kind": "multimodal", "value": "img", "start": 30, "end": 90},
    ]
    ops = [
        {"op": "admit", "rid": f"r{i}", "tokens": list(PROMPT), "budget": 8, "extras": [e]}
        for i, e in enumerate(bad_extras)
    ]
    yield raw_case(
        "alloc.refuse.malformed-extras",
        {
            "suite": "alloc",
            "layout": {"groups": [full, {"kind": "cross", "block_size": 16}]},
            "num_blocks": 16,
            "ops": [
                *ops,
                {"op": "admit", "rid": "ok", "tokens": list(PROMPT), "budget": 8},
                {"op": "end_step"},
                {"op": "finish", "rid": "ok"},
            ],
        },
        "request-wide extras take no span, positioned ones need one within the prompt, kinds "
        "are closed, values are strings; then a valid request in a layout with cross attention",
        ("kind.full", "kind.cross"),
    )


# --- bounded enumeration --------------------------------------------------------------------


def enumerated_hits(limit: int) -> Iterator[JSON]:
    """Small layouts x lengths x cached subsets, one case per new (layout, outcome) shape."""
    groups: list[Group] = [
        FullAttention(2),
        FullAttention(3),
        SlidingWindow(2, 3),
        ChunkedLocal(2, 3),
        MambaState(2),
        MambaState(2, MambaMode.ALIGN),
        CrossAttention(2),
    ]
    drafts: list[Group] = [FullAttention(2, draft=True), SlidingWindow(3, 4, draft=True)]
    layouts = [
        Layout(c)
        for size in (1, 2)
        for c in itertools.combinations(groups, size)
        if any(not isinstance(g, CrossAttention) for g in c)
    ]
    layouts += [Layout((g, d), p) for g in groups for d in drafts for p in Speculative]
    seen: set[tuple[object, ...]] = set()
    emitted = 0
    for index, layout in enumerate(layouts):
        for num_tokens in (5, 7, 9):
            options = []
            for g, group in enumerate(layout.groups):
                count = keyable_blocks(layout, g, num_tokens)
                serves = not isinstance(group, CrossAttention)
                blocks = range(count) if serves else range(0)
                options.append(
                    [
                        list(c)
                        for r in range(len(blocks) + 1)
                        for c in itertools.combinations(blocks, r)
                    ]
                )
            for cached in itertools.product(*options):
                case = hit_case(
                    f"hit.enum.{index:03d}.{num_tokens}.{emitted:05d}",
                    layout,
                    num_tokens,
                    list(cached),
                )
                shape = (
                    index,
                    case["expect"]["hit"],
                    tuple(case["rules"]),
                    json.dumps(case["expect"]["block_runs"]),
                )
                if shape in seen:
                    continue
                seen.add(shape)
                emitted += 1
                yield case
                if emitted >= limit:
                    return


# --- allocator traces -------------------------------------------------------------------------

PROMPT = tuple(range(100, 140))
OTHER = tuple(range(500, 540))


def served(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """A request computed in one step, then finished."""
    return [spec.Admit(rid, tokens, 64), spec.EndStep(), spec.Finish(rid)]


def seed_001_ops() -> list[spec.Op]:
    """A, an unrelated B of the same length, A again (seed 001's re-send)."""
    return [*served("a", PROMPT[:39]), *served("b", OTHER[:39]), spec.Admit("a2", PROMPT[:39], 64)]


def hybrid_scenarios() -> Iterator[JSON]:
    """The hybrid eviction profile (§11): the lru scenario above, and each EVICT-* rule."""
    yield alloc_case(
        "alloc.hybrid.resent-prefix-survives",
        Layout((FULL, SW, SW)),
        16,
        seed_001_ops(),
        "vllm#42948",
        "the lru case above under the hybrid profile: b evicts a's tail, the prefix stays",
        eviction=spec.Eviction.HYBRID,
    )
    yield alloc_case(
        "alloc.hybrid.shadowed-copy-first",
        Layout((FULL,)),
        7,
        [
            spec.Admit("a", PROMPT[:40], 64),
            spec.Admit("b", PROMPT[:40], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Finish("b"),
            spec.Admit("c", OTHER[:33], 64),
            spec.EndStep(),
            spec.Admit("a2", PROMPT[:40], 64),
        ],
        comment="b's copies of a's blocks are never served: c evicts them before a's",
        eviction=spec.Eviction.HYBRID,
    )
    yield alloc_case(
        "alloc.hybrid.orphans-follow-their-parent",
        Layout((FullAttention(8), SlidingWindow(8, 9))),
        12,
        [
            *served("a", PROMPT[:33]),
            *served("b", OTHER[:17]),
            spec.Admit("c", OTHER[17:40], 64),
            spec.EndStep(),
            spec.Admit("a2", PROMPT[:33], 64),
        ],
        comment="once a block's full-attention prerequisite is evicted it is dead and goes next",
        eviction=spec.Eviction.HYBRID,
    )


def alloc_scenarios() -> Iterator[JSON]:
    """Hand-written traces for each allocator rule and each bug in the notes."""
    one = Layout((FULL,))
    two = Layout((FULL, SW))
    yield alloc_case(
        "alloc.visibility.same-step-miss",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Admit("c", PROMPT, 64),
        ],
        "vllm#41838",
        "blocks are hittable only after the step that wrote them",
    )
    yield alloc_case(
        "alloc.two-phase.hits-before-allocation",
        one,
        5,
        [
            spec.Admit("a", PROMPT[:32], 64),
            spec.Admit("b", OTHER[:32], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Finish("b"),
            spec.Admit("c", (*PROMPT[:32], *OTHER[:24]), 64),
        ],
        "vllm#33775",
        "a's blocks head the free queue; c hits them and needs two new blocks: taking the "
        "hits first keeps the allocation from evicting them",
    )
    yield alloc_case(
        "alloc.duplicates.earliest-served",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Admit("c", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.eviction.reuse-forgets-key",
        one,
        4,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", OTHER, 64),
            spec.EndStep(),
            spec.Finish("b"),
            spec.Admit("a2", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.lru.group-zero-prefix-evicted-first",
        Layout((FULL, SW, SW)),
        16,
        seed_001_ops(),
        "vllm#42948",
        "group-major release order sacrifices the full-attention prefix (C12)",
    )
    yield from hybrid_scenarios()
    yield alloc_case(
        "alloc.sliding-window.release-with-nulls",
        Layout((SlidingWindow(4, 8),)),
        32,
        [spec.Admit("a", PROMPT, 20), spec.EndStep(), spec.Extend("a", 4)],
    )
    yield alloc_case(
        "alloc.mamba-align.checkpoint-at-step-end",
        Layout((MambaState(8, MambaMode.ALIGN),)),
        16,
        [
            spec.Admit("a", PROMPT, 16),
            spec.EndStep(),
            spec.Extend("a", 4),
            spec.EndStep(),
            spec.Admit("b", PROMPT[:30], 30),
        ],
        "vllm#36493",
    )
    yield alloc_case(
        "alloc.mamba-none.never-registers",
        Layout((MambaState(8, MambaMode.NONE),)),
        16,
        [spec.Admit("a", PROMPT, 16), spec.EndStep(), spec.Admit("b", PROMPT, 16)],
    )
    yield alloc_case(
        "alloc.draft-exact.waits-for-next-token",
        Layout((FullAttention(8), FullAttention(8, draft=True)), Speculative.EXACT),
        16,
        [
            spec.Admit("a", PROMPT[:16], 16),
            spec.EndStep(),
            spec.Extend("a", 1, (7,)),
            spec.EndStep(),
        ],
    )
    salt = (Extra(ExtraKind.CACHE_SALT, "x"),)
    lora = (Extra(ExtraKind.LORA, "x"),)
    yield alloc_case(
        "alloc.isolation.salt-and-lora-do-not-collide",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64, salt),
            spec.EndStep(),
            spec.Admit("b", PROMPT, 64, (Extra(ExtraKind.CACHE_SALT, "y"),)),
            spec.Admit("c", PROMPT, 64, lora),
            spec.Admit("d", PROMPT, 64, salt),
        ],
        "vllm#44701",
        "another salt or a LoRA named like the salt misses; the same salt hits",
    )
    image = (Extra(ExtraKind.MULTIMODAL, "img", 20, 30),)
    yield alloc_case(
        "alloc.multimodal.prefix-before-image-is-shared",
        one,
        32,
        [spec.Admit("a", PROMPT, 64, image), spec.EndStep(), spec.Admit("b", PROMPT, 64)],
    )
    yield alloc_case(
        "alloc.preempt-and-readmit",
        two,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.Preempt("a"),
            spec.Admit("a", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.reset.refused-while-held",
        one,
        16,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.ResetCache(),
            spec.Finish("a"),
            spec.ResetCache(),
            spec.Admit("b", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.decode.output-blocks-cached",
        Layout((FullAttention(4),)),
        16,
        [
            spec.Admit("a", PROMPT[:8], 8),
            spec.EndStep(),
            *[op for t in (1, 2, 3, 4) for op in (spec.Extend("a", 1, (t,)), spec.EndStep())],
            spec.Admit("b", (*PROMPT[:8], 1, 2, 3, 4, 5), 16),
        ],
    )
    yield alloc_case(
        "alloc.capacity.waiting-changes-nothing",
        one,
        4,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", OTHER, 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", OTHER, 64),
        ],
    )
    yield alloc_case(
        "alloc.lookahead.speculative-slots",
        Layout((FullAttention(4),)),
        16,
        [
            spec.Admit("a", PROMPT[:8], 8, (), 3),
            spec.EndStep(),
            spec.Extend("a", 1, (1,), 3),
            spec.EndStep(),
            spec.Extend("a", 1, (2,)),
        ],
    )
    yield alloc_case(
        "alloc.misuse.refused",
        one,
        8,
        [
            spec.Extend("x", 1),
            spec.Finish("x"),
            spec.Admit("a", PROMPT, 8),
            spec.Admit("a", PROMPT, 8),
            spec.Extend("a", 8),
            spec.EndStep(),
            spec.Extend("a", 1, (1,)),
            spec.Admit("b", (), 8),
            spec.Admit("c", PROMPT, 0),
        ],
    )
    yield alloc_case(
        "alloc.max-model-len.refused",
        Layout((FULL,), max_model_len=40),
        16,
        [
            spec.Admit("a", (*PROMPT, 1), 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Extend("b", 1, (1,)),
        ],
    )


def random_traces(
    count: int, eviction: spec.Eviction = spec.Eviction.LRU, first_seed: int = 0
) -> Iterator[JSON]:
    """Seeded random traces over small random layouts (the stateful machine's op mix)."""
    kinds: list[Callable[[random.Random], Group]] = [
        lambda r: FullAttention(r.choice([1, 2, 4])),
        lambda r: SlidingWindow(r.choice([1, 2, 4]), r.randint(1, 9)),
        lambda r: ChunkedLocal(r.choice([2, 4]), r.randint(2, 9)),
        lambda r: MambaState(r.choice([2, 4]), r.choice(list(MambaMode))),
    ]
    bases = [tuple(range(1, 25)), tuple(range(1, 9)) + tuple(range(60, 76))]
    for n in range(count):
        rnd = random.Random(first_seed + n)
        groups = [rnd.choice(kinds)(rnd) for _ in range(rnd.randint(1, 3))]
        if (
            not any(isinstance(g, FullAttention | SlidingWindow | ChunkedLocal) for g in groups)
            or rnd.random() < 0.3
        ):
            groups.append(FullAttention(rnd.choice([2, 4])))
        profile = rnd.choice([None, None, Speculative.EXACT, Speculative.DROP])
        if profile is not None:
            groups.append(FullAttention(rnd.choice([2, 4]), draft=True))
        layout = Layout(tuple(groups), profile)
        ops: list[spec.Op] = []
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(6, 40), eviction))
        for _ in range(30):
            roll = rnd.random()
            running = sorted(state.requests)
            if roll < 0.35:
                rid = next((r for r in "abcd" if r not in state.requests), None)
                if rid is None:
                    continue
                op: spec.Op = spec.Admit(
                    rid,
                    rnd.choice(bases)[: rnd.randint(1, 24)],
                    rnd.randint(1, 24),
                    (),
                    rnd.choice([0, 0, 1]),
                )
            elif roll < 0.55 and running:
                rid = rnd.choice(running)
                request = state.requests[rid]
                if request.scheduled:
                    continue
                done = request.computed == len(request.tokens)
                op = spec.Extend(rid, rnd.randint(1, 8), (rnd.randint(0, 2),) if done else ())
            elif roll < 0.85:
                op = spec.EndStep()
            elif running:
                rid = rnd.choice(running)
                op = spec.Preempt(rid) if rnd.random() < 0.3 else spec.Finish(rid)
            else:
                continue
            state, _ = spec.step(state, op)
            ops.append(op)
        label = "random" if eviction is spec.Eviction.LRU else f"random-{eviction.value}"
        yield alloc_case(
            f"alloc.{label}.{n:03d}",
            layout,
            state.config.num_blocks,
            ops,
            eviction=eviction,
        )


def unkeyed_first_twins(cases: Iterator[JSON]) -> Iterator[JSON]:
    """The lru scenarios whose outcome depends on the free order, replayed under the
    lru-unkeyed-first profile (ALLOC-FREE-2), so engines with vLLM 0.25+'s order run them."""
    for case in cases:
        if "eviction.lru" not in case["requires"]:
            continue
        data = case["input"]
        yield alloc_case(
            case["id"].replace("alloc.", "alloc.unkeyed-first.", 1),
            layout_from_json(data["layout"]),
            data["num_blocks"],
            [op_from_json(op) for op in data["ops"]],
            case.get("origin"),
            case.get("comment", ""),
            tuple(case.get("focus", ())),
            eviction=spec.Eviction.LRU_UNKEYED_FIRST,
        )


# --- regressions: traces the stateful machines shrank, curated in conformance/regressions/ ---

REGRESSIONS = Path(__file__).resolve().parent / "regressions"


def regression_cases() -> Iterator[JSON]:
    """Each curated failure trace, with its expectation recomputed from the spec."""
    for path in sorted(REGRESSIONS.glob("*.json")):
        saved = json.loads(path.read_text(encoding="utf-8"))
        ops = [op_from_json(op) for op in saved["ops"]]
        yield alloc_case(
            saved["id"],
            layout_from_json(saved["layout"]),
            saved["num_blocks"],
            ops,
            saved.get("origin"),
            saved.get("comment", ""),
            tuple(saved.get("focus", ())),
        )


# --- page plans -------------------------------------------------------------------------------

GIB = 1 << 30


def page_case(case_id: str, plan: JSON, origin: str | None = None, comment: str = "") -> JSON:
    """A page-plan case; the expectation is the spec's plan (or refusal)."""
    case_input = {"suite": "page", "plan": plan}
    expect, rules = traced(lambda: SpecEngine().run(case_input))
    if not rules and expect.get("refused"):
        rules = ["INPUT-1"]  # refused by the JSON checks before any rule could run
    return _case(case_id, rules, ["page.plan"], case_input, expect, origin, comment, ())


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower())


def _model_plan(name: str, dtype: str, **options: Any) -> JSON:
    model = load_model(name)
    plan: JSON = {
        "layers": list(model.layers),
        "kv_cache_dtype": model.dtype if dtype == "auto" else dtype,
        "memory_bytes": 24 * GIB,
        **options,
    }
    if model.speculative:
        plan["speculative"] = model.speculative
    return plan


def _layer(kind: str, heads: int, head: int, **extra: Any) -> JSON:
    return {"kind": kind, "num_kv_heads": heads, "head_size_k": head, "head_size_v": head, **extra}


def page_scenarios() -> Iterator[JSON]:
    """Every bundled model in three dtypes, and the worked examples of the PAGE rules."""
    for name in model_names():
        for dtype in ("auto", "fp8", "int8_per_token_head"):
            origin = "vllm#40388" if name.startswith("gemma-4") and "per_token" in dtype else None
            yield page_case(
                f"page.model.{_slug(name)}.{_slug(dtype)}",
                _model_plan(name, dtype),
                origin,
                f"{name} with kv-cache dtype {dtype}, 24 GiB",
            )
    yield page_case(
        "page.vllm-544",
        _model_plan("qwen3.5-0.8b", "auto"),
        "lmcache-docs",
        "vLLM's unified block size for Qwen3.5-0.8B is 544 tokens: the attention block grows "
        "until its page holds the GDN state",
    )
    yield page_case(
        "page.mamba-all-state-chunk",
        _model_plan("qwen3.5-0.8b", "auto", mamba_mode="all", state_chunk=64),
        comment="mode all: the anchor is also a multiple of the state chunk (576, not 544)",
    )
    full, sw = _layer("full", 8, 128), _layer("sliding_window", 8, 128, window=128)
    for layers, padding, label in [
        ([full, sw], "1/20", "1-full-1-sw"),
        ([full, full, sw, sw, sw, sw], "1/20", "2-full-4-sw"),
        ([full] * 3 + [sw] * 7, "1/4", "3-full-7-sw"),
        ([full] * 6 + [sw] * 5, "1/10", "6-full-5-sw"),
        ([full] * 3 + [sw] * 7, "0", "no-empty-slots"),
    ]:
        yield page_case(
            f"page.grouping.{label}",
            {
                "layers": layers,
                "kv_cache_dtype": "bf16",
                "memory_bytes": GIB,
                "group_padding": padding,
            },
            "vllm-notes-4.3",
            "strided groups of g layers; g is the largest with empty slots within the share",
        )
    gemma_sw = _layer("sliding_window", 8, 256, window=1024)
    gemma_global = _layer("full", 2, 512)
    for block in (16, 32, 64):
        yield page_case(
            f"page.gemma4-pth.block-{block}",
            {
                "layers": [gemma_sw] * 5 + [gemma_global],
                "kv_cache_dtype": "int8_per_token_head",
                "memory_bytes": GIB,
                "block_size": block,
            },
            "vllm#40388",
            "520 vs 1032 bytes per token-head: the global block doubles and pads 512 bytes",
        )
    latent = {"kind": "full", "latent_size": 448, "rope_size": 64, "ratio": 128}
    yield page_case(
        "page.latent-ratio-above-anchor",
        {"layers": [gemma_sw, latent], "kv_cache_dtype": "fp8", "memory_bytes": GIB},
        comment="a compressed latent layer (128 tokens per entry) gets anchor x 2^k >= 128",
    )
    draft = _layer("full", 8, 128, draft=True)
    yield page_case(
        "page.draft-joins-its-bucket",
        {
            "layers": [full, full, sw, sw, draft],
            "kv_cache_dtype": "bf16",
            "memory_bytes": GIB,
            "speculative": "exact",
        },
        comment="a draft layer equal to the target's full layers shares their group",
    )
    yield page_case(
        "page.cross-and-chunked",
        {
            "layers": [_layer("cross", 4, 64), _layer("chunked_local", 8, 128, chunk=8192), full],
            "kv_cache_dtype": "fp16",
            "memory_bytes": GIB,
        },
        comment="cross-attention groups take part in the page but not in the capacity",
    )


def page_refusals() -> Iterator[JSON]:
    """Malformed and infeasible plan inputs: the engine must refuse, not guess."""
    full = _layer("full", 8, 128)
    gdn = {"kind": "mamba", "tensors": [{"shape": [32, 128, 128], "dtype": "fp32"}]}
    base: JSON = {"layers": [full], "kv_cache_dtype": "bf16", "memory_bytes": GIB}
    bad: list[tuple[str, JSON, str]] = [
        ("no-layers", {**base, "layers": []}, "a plan needs layers"),
        ("heads-zero", {**base, "layers": [_layer("full", 0, 128)]}, "num_kv_heads >= 1"),
        ("sw-without-window", {**base, "layers": [_layer("sliding_window", 8, 128)]}, "window"),
        ("unknown-dtype", {**base, "kv_cache_dtype": "fp4"}, "unknown dtype"),
        ("block-not-multiple", {**base, "block_size": 24}, "kernel multiple 16"),
        ("memory-too-small", {**base, "memory_bytes": 1000}, "fewer than 2 blocks"),
        (
            "state-beyond-maximum",
            {**base, "layers": [full, gdn], "kernel": {"maximum": 256}},
            "the state page needs a block beyond the kernel maximum",
        ),
        (
            "quantized-state",
            {**base, "layers": [{"kind": "mamba", "tensors": [{"shape": [4], "dtype": "fp8"}]}]},
            "state is never quantized",
        ),
        (
            "draft-without-profile",
            {**base, "layers": [full, _layer("full", 8, 64, draft=True)]},
            "draft layers need a speculative profile",
        ),
        (
            "latent-cross",
            {**base, "layers": [{"kind": "cross", "latent_size": 4}]},
            "latent layers are full or sliding_window",
        ),
        ("group-padding-one", {**base, "group_padding": 1}, "group_padding < 1"),
        (
            "window-on-full",
            {**base, "layers": [_layer("full", 8, 128, window=64)]},
            "only sliding_window layers take a window",
        ),
        (
            "chunk-on-sliding",
            {**base, "layers": [_layer("sliding_window", 8, 128, window=64, chunk=64)]},
            "only chunked_local layers take a chunk",
        ),
        (
            "rope-negative",
            {**base, "layers": [{"kind": "full", "latent_size": 8, "rope_size": -1}]},
            "rope_size >= 0",
        ),
        (
            "rope-fraction",
            {**base, "layers": [{"kind": "full", "latent_size": 8, "rope_size": 1.5}]},
            "rope_size is an integer",
        ),
        (
            "state-without-tensors",
            {**base, "layers": [{"kind": "mamba", "tensors": []}]},
            "a state layer needs a tensor",
        ),
        (
            "state-dimension-zero",
            {**base, "layers": [{"kind": "mamba", "tensors": [{"shape": [0], "dtype": "fp32"}]}]},
            "state dimensions >= 1",
        ),
        ("kernel-multiple-zero", {**base, "kernel": {"multiple": 0}}, "kernel multiple >= 1"),
        (
            "kernel-maximum-below-multiple",
            {**base, "kernel": {"multiple": 32, "maximum": 16}},
            "kernel maximum >= multiple",
        ),
        ("memory-zero", {**base, "memory_bytes": 0}, "memory_bytes >= 1"),
        ("state-chunk-zero", {**base, "state_chunk": 0}, "state_chunk >= 1"),
    ]
    for label, plan, comment in bad:
        yield page_case(f"page.refuse.{label}", plan, comment=comment)


def _random_layer(rng: random.Random) -> JSON:
    kind = rng.choice(["attention", "attention", "latent", "state"])
    if kind == "state":
        tensors = [
            {
                "shape": [rng.choice([3, 16, 128, 1024]) for _ in range(rng.randint(1, 3))],
                "dtype": rng.choice(["fp32", "bf16"]),
            }
            for _ in range(rng.randint(1, 2))
        ]
        return {"kind": "mamba", "tensors": tensors}
    if kind == "latent":
        return {
            "kind": "full",
            "latent_size": rng.choice([128, 512]),
            "rope_size": rng.choice([0, 64]),
            "ratio": rng.choice([1, 4, 128]),
        }
    attention = rng.choice(["full", "sliding_window", "chunked_local"])
    extra = {"window": 512} if attention == "sliding_window" else {}
    if attention == "chunked_local":
        extra = {"chunk": 8192}
    head = rng.choice([64, 128, 256, 512])
    return _layer(attention, rng.choice([1, 2, 4, 8]), head, **extra)


def random_plans(count: int) -> Iterator[JSON]:
    """Seeded random layer mixes, each a few layer types repeated in a random order."""
    rng = random.Random(20261122)
    for index in range(count):
        types = [_random_layer(rng) for _ in range(rng.randint(1, 3))]
        layers = [rng.choice(types) for _ in range(rng.randint(1, 16))]
        plan = {
            "layers": layers,
            "kv_cache_dtype": rng.choice(["bf16", "fp8", "int8_per_token_head", "fp32"]),
            "memory_bytes": rng.choice([1 << 26, GIB, 16 * GIB]),
            "block_size": rng.choice([16, 32]),
            "mamba_mode": rng.choice(["align", "all"]),
        }
        yield page_case(f"page.random.{index:03d}", plan)


# --- files ------------------------------------------------------------------------------------


def suites() -> dict[str, list[JSON]]:
    """Every file's cases, keyed by its path under vectors/."""
    return {
        "hit/scenarios.json": list(hit_scenarios()),
        "hit/refusals.json": [c for c in refusals() if c["input"]["suite"] == "hit"],
        "hit/enumerated.json": list(enumerated_hits(400)),
        "alloc/scenarios.json": list(alloc_scenarios()),
        "alloc/refusals.json": [c for c in refusals() if c["input"]["suite"] == "alloc"],
        "alloc/random.json": list(random_traces(60)),
        "alloc/random-hybrid.json": list(random_traces(40, spec.Eviction.HYBRID, 1000)),
        "alloc/random-lru-unkeyed-first.json": list(
            random_traces(40, spec.Eviction.LRU_UNKEYED_FIRST, 2000)
        ),
        "alloc/scenarios-lru-unkeyed-first.json": list(unkeyed_first_twins(alloc_scenarios())),
        "alloc/regressions.json": list(regression_cases()),
        "page/scenarios.json": list(page_scenarios()),
        "page/refusals.json": list(page_refusals()),
        "page/random.json": list(random_plans(60)),
    }


def render() -> dict[str, str]:
    """File name -> exact text, manifest included."""
    files = {}
    for path, cases in suites().items():
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
        "retired_ids": [],
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
        print(f"stale vectors: {stale}; run python -m kvcert.conformance.gen", file=sys.stderr)
        return 1
    total = sum(len(json.loads(t).get("cases", [])) for t in files.values())
    print(f"{'checked' if args.check else 'wrote'} {len(files)} files, {total} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
