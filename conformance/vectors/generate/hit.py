"""The hit suite: every seed report, the vLLM probe cases, the peer tests, and a bounded
enumeration of small layouts."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterator

from kvcert.conformance.contract.codec import (
    JSON,
)
from kvcert.conformance.tools.scenario import example_names, load_example
from kvcert.conformance.vectors.generate.cases import hit_case
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec.view import keyable_blocks

B = 16
FULL, SW = FullAttention(B), SlidingWindow(B, 2 * B)


def _all(n: int) -> list[int]:
    return list(range(n))


def hit_scenarios() -> Iterator[JSON]:
    """Every seed, the vLLM probe cases (`hit.vllm-c*`: vLLM's manager's behaviours the
    probes found, docs/engines.md traces each to a cause) and the peer-test examples."""
    for name in sorted(example_names(), key=lambda n: f"{n}.json"):  # file order
        scenario = load_example(name)
        view = scenario.view
        yield hit_case(
            f"hit.seed.{name}",
            view.layout,
            view.num_tokens,
            [sorted(c) for c in view.cached],
            scenario.origin,
            scenario.description,
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
    yield from _distinct_hits("hit.enum", layouts, (5, 7, 9), limit)


def draft_reach_hits(limit: int) -> Iterator[JSON]:
    """The enumerated pairs (one group beside a draft group) with drafters reading 2 and 3
    tokens ahead: exact keys span them (HASH-DRAFT-1), drop hits step down over them."""
    groups: list[Group] = [
        FullAttention(2),
        FullAttention(4),
        SlidingWindow(2, 3),
        MambaState(2, MambaMode.ALIGN),
    ]
    drafts: list[Group] = [FullAttention(2, draft=True), SlidingWindow(3, 4, draft=True)]
    layouts = [
        Layout((g, d), p, draft_reach=reach)
        for g in groups
        for d in drafts
        for p in Speculative
        for reach in (2, 3)
        if p is Speculative.EXACT or reach <= math.lcm(g.block_size, d.block_size)
    ]
    yield from _distinct_hits("hit.reach", layouts, (5, 8, 11), limit)


def _distinct_hits(
    prefix: str, layouts: list[Layout], lengths: tuple[int, ...], limit: int
) -> Iterator[JSON]:
    """Layouts x lengths x cached subsets, one case per new (layout, outcome) shape."""
    seen: set[tuple[object, ...]] = set()
    emitted = 0
    for index, layout in enumerate(layouts):
        for num_tokens in lengths:
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
                    f"{prefix}.{index:03d}.{num_tokens}.{emitted:05d}",
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


# --- three groups and more: where engines' per-group bugs live ------------------------------


def _group_types() -> list[Group]:
    """Small groups of every cacheable kind with block sizes 1-4, windows that straddle a block
    boundary and chunks of two blocks."""
    types: list[Group] = [FullAttention(b) for b in (1, 2, 3, 4)]
    types += [SlidingWindow(b, b + 1) for b in (1, 2, 3)]
    types += [ChunkedLocal(b, 2 * b) for b in (1, 2)]
    types += [MambaState(b, mode) for b in (2, 4) for mode in (MambaMode.ALL, MambaMode.ALIGN)]
    return types


def three_group_layouts() -> list[Layout]:
    """Every multiset of three group types with mixed block sizes and at most one state group;
    a multiset is taken once, in a canonical order (group order changes no hit, so the other
    orders add nothing but their count). Then two target groups with a draft group under each
    speculative profile."""
    types = _group_types()
    layouts = []
    for combo in itertools.combinations_with_replacement(range(len(types)), 3):
        groups = tuple(types[i] for i in combo)
        if len({g.block_size for g in groups}) < 2:
            continue
        if sum(isinstance(g, MambaState) for g in groups) > 1:
            continue
        layouts.append(Layout(groups))
    drafts: list[Group] = [FullAttention(2, draft=True), SlidingWindow(3, 4, draft=True)]
    targets = [t for t in types if not isinstance(t, MambaState)]
    for pair in itertools.combinations(targets, 2):
        for draft in drafts:
            for profile in Speculative:
                layouts.append(Layout((*pair, draft), profile))
    return layouts


def sampled_layouts(count: int, seed: int = 20261123) -> list[Layout]:
    """Seeded 4- and 5-group layouts (at most one state group, mixed block sizes)."""
    rng = random.Random(seed)
    types = _group_types()
    layouts: list[Layout] = []
    while len(layouts) < count:
        groups = tuple(rng.choice(types) for _ in range(rng.choice((4, 5))))
        if len({g.block_size for g in groups}) < 2:
            continue
        if sum(isinstance(g, MambaState) for g in groups) > 1:
            continue
        layouts.append(Layout(groups))
    return layouts


def _single_misses(layout: Layout, num_tokens: int) -> list[list[list[int]]]:
    """Every keyable block cached, then each pattern with exactly one block missing."""
    counts = [keyable_blocks(layout, g, num_tokens) for g in range(len(layout.groups))]
    full = [list(range(c)) for c in counts]
    return [full] + [
        [[x for x in full[g] if (g, x) != (group, miss)] for g in range(len(full))]
        for group in range(len(full))
        for miss in full[group]
    ]


def single_miss_hits(
    prefix: str, layouts: list[Layout], lengths: tuple[int, ...]
) -> Iterator[JSON]:
    """Every block cached, then every pattern with exactly one block missing in one group; one
    case per distinct (layout, hit, blocks) outcome."""
    for index, layout in enumerate(layouts):
        seen: set[tuple[object, ...]] = set()
        for num_tokens in lengths:
            for number, cached in enumerate(_single_misses(layout, num_tokens)):
                case = hit_case(f"{prefix}.{index:03d}.{num_tokens}.{number:03d}", layout,
                                num_tokens, cached)  # fmt: skip
                shape = (case["expect"]["hit"], json.dumps(case["expect"]["block_runs"]))
                if shape not in seen:
                    seen.add(shape)
                    yield case


# --- layer shapes (format /2): groups a planner keeps apart, unifies or merges ---------------

PAGE_BYTES = 1024  # every shaped group's page at its own block size


def layer_shape(block_size: int, heads: int) -> JSON:
    """fp16 heads sized so the group's page is PAGE_BYTES at `block_size` (4 bytes per head
    element and token: K and V, two bytes each). A planner that starts every attention layer
    at the smallest block and unifies pages by growing blocks then gives each group its own
    block size; two groups of one kind and block size differ only in `heads`."""
    return {"num_kv_heads": heads, "head_size_k": PAGE_BYTES // (4 * heads * block_size),
            "dtype": "fp16"}  # fmt: skip


def shaped_layouts() -> list[tuple[Layout, tuple[int | None, ...]]]:
    """(layout, KV heads per group; None for a state group): targets whose groups differ in
    shape only, or in shape and block size, and targets with a draft whose heads differ from
    theirs (the common EAGLE/MTP case), each draft layout under both speculative profiles."""
    sw, full2, full4 = SlidingWindow(2, 3), FullAttention(2), FullAttention(4)
    plain: list[tuple[tuple[Group, ...], tuple[int | None, ...]]] = [
        ((full2, full2), (1, 2)),  # one kind, one block size, two head shapes
        ((full2, full4), (1, 1)),  # wider heads, smaller blocks (Gemma-style global layers)
        ((sw, SlidingWindow(2, 3)), (1, 2)),
        ((sw, full2, FullAttention(2)), (1, 1, 2)),
        ((sw, full2, full4), (1, 1, 1)),
    ]
    drafted: list[tuple[tuple[Group, ...], tuple[int | None, ...]]] = [
        ((full2, FullAttention(2, draft=True)), (1, 2)),
        ((full2, FullAttention(4, draft=True)), (1, 1)),
        ((sw, full2, FullAttention(2, draft=True)), (1, 1, 2)),
        ((sw, full2, FullAttention(4, draft=True)), (1, 1, 1)),
        ((full2, SlidingWindow(2, 3, draft=True)), (1, 2)),
        ((full2, ChunkedLocal(2, 4), FullAttention(2, draft=True)), (1, 1, 2)),
        ((full2, MambaState(2, MambaMode.ALIGN), FullAttention(2, draft=True)), (1, None, 2)),
        ((full2, MambaState(2, MambaMode.ALL), FullAttention(4, draft=True)), (1, None, 1)),
    ]
    out = [(Layout(groups), heads) for groups, heads in plain]
    for groups, heads in drafted:
        out += [(Layout(groups, profile), heads) for profile in Speculative]
    return out


def shaped_hits(lengths: tuple[int, ...] = (7, 11)) -> Iterator[JSON]:
    """Every block cached, one block missing in one group, and one token range missing in every
    group (the only misses a planner that merges groups into one table can show); one case
    per distinct outcome. The spec's answer ignores the shapes; the engine's path may not."""
    for index, (layout, heads) in enumerate(shaped_layouts()):
        seen: set[tuple[object, ...]] = set()
        unit = max(g.block_size for g in layout.groups)
        for num_tokens in lengths:
            patterns = _single_misses(layout, num_tokens)
            full = patterns[0]
            for span in range(num_tokens // unit):
                low, high = span * unit, (span + 1) * unit
                patterns.append([
                    [x for x in full[g]
                     if not (x * b < high and (x + 1) * b > low)]
                    for g, b in enumerate(g.block_size for g in layout.groups)
                ])  # fmt: skip
            for number, cached in enumerate(patterns):
                case = hit_case(f"hit.shape.{index:03d}.{num_tokens}.{number:03d}", layout,
                                num_tokens, cached)  # fmt: skip
                outcome = (case["expect"]["hit"], json.dumps(case["expect"]["block_runs"]))
                if outcome in seen:
                    continue
                seen.add(outcome)
                for group, (spec_group, count) in zip(
                    case["input"]["layout"]["groups"],
                    zip(layout.groups, heads, strict=True),
                    strict=True,
                ):
                    if count is not None:
                        group["shape"] = layer_shape(spec_group.block_size, count)
                yield case
