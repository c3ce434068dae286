"""The rule index: every rule well formed, RULES.md fresh, every contract true when run."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import re
from importlib import resources

import pytest

import kvcert.spec as spec_package
from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    acceptance,
    alloc,
    checkpoints,
    errors,
    eviction,
    hashing,
    hit_alignment,
    hybrid,
    hybrid_hit,
    invariants,
    layers,
    layout,
    page_layout,
    plan,
    radix,
    retention,
    view,
)
from kvcert.spec.hashing import Extra, ExtraKind
from kvcert.spec.layout import is_draft
from kvcert.spec.rules import all_rules, render_rules_md, rule_of
from kvcert.spec.view import keyable_blocks
from tests.spec.contracts import ContractViolation, conditions, contracts_enforced

RULES = all_rules()
EXPECTED_TAGS = {
    "RADIX-SCOPE-1",
    "RADIX-HIT-1",
    "RADIX-LRU-1",
    "RADIX-SPLIT-1",
    "RADIX-PUB-1",
    "RADIX-PUB-2",
    "RADIX-DEDUP-1",
    "RADIX-EVICT-1",
    "RADIX-ID-1",
    "RADIX-FREE-1",
    "RADIX-RESET-1",
    "RADIX-INV-1",
    "HIT-FULL-1",
    "HIT-SW-1",
    "HIT-CHUNK-1",
    "HIT-MAMBA-1",
    "HIT-MAMBA-2",
    "HIT-CROSS-1",
    "HIT-GROUP-1",
    "HIT-GROUP-2",
    "HIT-LEN-1",
    "HIT-HYB-1",
    "HIT-SPEC-1",
    "HIT-SPEC-2",
    "HIT-UNIT-1",
    "HIT-UNIT-2",
    "HIT-UNIT-3",
    "HIT-UNIT-4",
    "HIT-UNIT-5",
    "HASH-UNIT-1",
    "ALLOC-UNIT-1",
    "ALLOC-UNIT-2",
    "ALLOC-UNIT-3",
    "ALLOC-UNIT-4",
    "INV-COPY-1",
    "INV-COPY-2",
    "INV-WRITE-1",
    "HASH-CHAIN-1",
    "HASH-EXTRA-1",
    "HASH-DRAFT-1",
    "HASH-MATCH-1",
    "ALLOC-INIT-1",
    "ALLOC-LOOKUP-1",
    "ALLOC-HOLD-1",
    "ALLOC-WRITE-1",
    "ALLOC-TWO-PHASE-1",
    "ALLOC-SKIP-1",
    "ALLOC-EVICT-1",
    "ALLOC-FREE-1",
    "ALLOC-FREE-2",
    "ALLOC-COMMIT-1",
    "ALLOC-VIS-1",
    "ALLOC-VIS-2",
    "ALLOC-VIS-3",
    "ALLOC-RESET-1",
    "RET-DENSE-1",
    "RET-SPARSE-1",
    "RET-SPARSE-2",
    "RET-SPARSE-3",
    "RET-JUNCTION-1",
    "EVICT-LIVE-1",
    "EVICT-DEAD-1",
    "EVICT-HYB-1",
    "EVICT-ORDER-1",
    "BRANCH-1",
    "CKPT-ALL-1",
    "CKPT-ALIGN-1",
    "CKPT-BRANCH-1",
    "CKPT-INNER-1",
    "CKPT-INNER-2",
    "ALLOC-SPEC-1",
    "ALLOC-SPEC-2",
    "INV-NULL-1",
    "INV-REF-1",
    "INV-FREE-1",
    "INV-KEY-1",
    "INV-HIT-1",
    "INV-VIS-1",
    "PAGE-BYTES-1",
    "PAGE-ANCHOR-1",
    "PAGE-SIZE-1",
    "PAGE-FIT-1",
    "PAGE-STATE-1",
    "PAGE-GROUP-1",
    "PAGE-SPLIT-1",
    "PAGE-POOL-1",
    "PAGE-CAP-1",
    "PAGE-ALIGN-1",
    "PAGE-ALIGN-2",
    "PAGE-RECOMP-1",
    "PAGE-OBJ-1",
    "PAGE-ADDR-1",
    "PAGE-ADDR-2",
    "PAGE-ADDR-3",
    "PAGE-ADDR-4",
    "PAGE-ADDR-5",
    "PAGE-SLOT-1",
    "INPUT-1",
}


def test_the_rule_set_is_the_documented_one():
    tags = [r.tag for r in RULES]
    assert len(tags) == len(set(tags)), "a tag is defined twice"
    assert set(tags) == EXPECTED_TAGS


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.tag)
def test_each_rule_has_sentence_diagram_and_contracts(rule):
    """Tag, one sentence, an ASCII diagram with numbers, then pre:/post: lines that compile."""
    assert rule.sentence.endswith("."), "the rule's first paragraph is one sentence"
    assert rule.sentence.count(". ") == 0, "one sentence, not several"
    body = rule.docstring.split("\n\n", 1)[1]
    diagram = [
        line for line in body.splitlines() if line.startswith("    ") and re.search(r"\d", line)
    ]
    assert diagram, "an indented diagram with worked numbers"
    function = getattr(__import__(rule.module, fromlist=[rule.function]), rule.function)
    pre, post = conditions(function)
    assert pre, "a pre: line"
    assert post, "a post: line"
    for expression in pre + post:
        compile(expression, rule.tag, "eval")


def test_rules_md_is_fresh():
    shipped = resources.files("kvcert.spec").joinpath("RULES.md").read_text(encoding="utf-8")
    assert shipped == render_rules_md(RULES), "regenerate: kvcert rules > spec/RULES.md"


def test_untagged_functions_are_not_rules():
    assert rule_of(keyable_blocks) is None
    assert rule_of(hybrid_hit) is None


def small_layouts():
    """Every one- and two-group layout over a handful of small groups, plus a draft group
    under each profile (block sizes 2 and 3, so alignment and lcm both matter)."""
    plain = [
        FullAttention(2),
        FullAttention(3),
        SlidingWindow(2, 3),
        ChunkedLocal(2, 3),
        MambaState(2),
        MambaState(2, MambaMode.NONE),
        CrossAttention(2),
    ]
    drafts = [FullAttention(2, draft=True), SlidingWindow(3, 4, draft=True)]
    for size in (1, 2):
        for groups in itertools.combinations(plain, size):
            if any(not isinstance(g, CrossAttention) for g in groups):
                yield Layout(groups)
            if size == 1:
                for draft, profile in itertools.product(drafts, Speculative):
                    yield Layout((*groups, draft), profile)


def all_views(chosen: Layout, max_tokens: int = 8):
    for num_tokens in range(1, max_tokens + 1):
        options = []
        for index, group in enumerate(chosen.groups):
            count = keyable_blocks(chosen, index, num_tokens)
            serves = not isinstance(group, CrossAttention) and not (
                isinstance(group, MambaState) and group.mode is MambaMode.NONE
            )
            blocks = range(count) if serves else range(0)
            options.append(
                [
                    frozenset(c)
                    for r in range(len(blocks) + 1)
                    for c in itertools.combinations(blocks, r)
                ]
            )
        for cached in itertools.product(*options):
            yield CacheView(chosen, num_tokens, cached)


def unit_views(max_tokens: int = 4):
    """One- and two-group layouts under `unit 1` with every subset of whole blocks and of
    partial keys (HIT-UNIT-1..4), written or all in flight (HIT-UNIT-5)."""
    plain = [FullAttention(2), SlidingWindow(2, 3), ChunkedLocal(2, 3), MambaState(2)]
    for size in (1, 2):
        for groups in itertools.combinations(plain, size):
            chosen = Layout(groups, hit_unit=1)
            for num_tokens in range(1, max_tokens + 1):
                options = []
                for index in range(len(groups)):
                    blocks = range(keyable_blocks(chosen, index, num_tokens))
                    odd = range(1, num_tokens + 1, 2)
                    options.append(list(itertools.product(subsets(blocks), subsets(odd))))
                for picked in itertools.product(*options):
                    cached = tuple(c for c, _ in picked)
                    partial = tuple(p for _, p in picked)
                    yield CacheView(chosen, num_tokens, cached, partial)
                    yield CacheView(chosen, num_tokens, cached, partial, in_flight=cached)


def subsets(items: range) -> list[frozenset[int]]:
    return [frozenset(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


@pytest.mark.sweep
def test_every_contract_holds_on_every_small_case():
    """Bounded exhaustive: all small layouts x lengths x cached subsets, contracts enforced."""
    rule_functions = [
        getattr(__import__(r.module, fromlist=[r.function]), r.function) for r in RULES
    ]
    seen: set[str] = set()
    modules = (
        acceptance,
        hybrid,
        hashing,
        layout,
        view,
        spec_package,
        alloc,
        retention,
        eviction,
        checkpoints,
        invariants,
        layers,
        plan,
        page_layout,
        radix,
        errors,
    )
    with contracts_enforced(modules, rule_functions, seen):
        cases = 0
        for chosen in small_layouts():
            for cache_view in all_views(chosen):
                hybrid_hit(cache_view)
                cases += 1
        for cache_view in unit_views():
            hybrid_hit(cache_view)
            cases += 1
        tokens = [1, 2, 1, 2, 3, 1, 2, 1, 2]
        extras = [Extra(ExtraKind.CACHE_SALT, "s"), Extra(ExtraKind.MULTIMODAL, "m", 2, 5)]
        for size in (1, 2, 4):
            for lookahead in (hashing.draft_lookahead(True, True), 0):
                keys = hashing.block_keys(tokens, size, extras, lookahead)
                hashing.matched_blocks(keys, frozenset(keys[:2]))
        for chosen in small_layouts():
            exercise_allocator(chosen)
        exercise_allocator(Layout((FullAttention(2), MambaState(2, MambaMode.ALIGN))))
        exercise_allocator(Layout((MambaState(2, MambaMode.ALIGN, speculative_blocks=2),)))
        exercise_pages()
        exercise_radix()
        for placement, computed, budget in itertools.product(
            checkpoints.Placement, range(10), (1, 3, 8)
        ):
            checkpoints.next_chunk(placement, computed, 10, budget, 2, branch=4)
        with pytest.raises(errors.SpecError):
            FullAttention(0)
    assert cases > 5_000
    assert seen == {r.function for r in RULES}, "every rule's contract was exercised"


def exercise_radix() -> None:
    """A scripted trace through every rule of the radix profile (§13), at pages of 1 and 4:
    hits, a split, duplicates, decode, evictions of whole leaves, a refused and a done reset."""
    prompt, other = tuple(range(1, 18)), tuple(range(40, 57))
    ops = [
        alloc.Admit("a", prompt, 64),
        alloc.Admit("b", prompt, 64),
        alloc.ResetCache(),
        alloc.EndStep(),
        alloc.Extend("a", 1, appended=(5,)),
        alloc.EndStep(),
        alloc.Finish("a"),
        alloc.Preempt("b"),
        alloc.Admit("c", prompt[:9], 2),
        alloc.EndStep(),
        alloc.Finish("c"),
        alloc.Admit("d", other, 64),
        alloc.EndStep(),
        alloc.Finish("d"),
        alloc.ResetCache(),
    ]
    for size, blocks in ((1, 40), (4, 11)):  # at page 4 d evicts a's whole leaf
        config = alloc.PoolConfig(Layout((FullAttention(size),)), blocks, alloc.Eviction.RADIX)
        state = radix.initial_state(config)
        for op in ops:
            state, _ = radix.step(state, op)
            assert radix.violated(state) == []


def exercise_pages() -> None:
    """Plans of small layer mixes in every dtype, and every address of their pages."""
    kinds = layers.AttentionKind
    attention = [
        layers.AttentionLayer(kinds.FULL, 2, 4, 2),
        layers.AttentionLayer(kinds.SLIDING_WINDOW, 1, 8, 8, window=4),
        layers.AttentionLayer(kinds.CHUNKED_LOCAL, 1, 2, 2, chunk=8),
        layers.AttentionLayer(kinds.CROSS, 1, 2, 2),
    ]
    latent = layers.LatentLayer(kinds.FULL, 4, 2, ratio=2)
    state = layers.StateLayer(
        (
            layers.StateTensor((3,), layers.KVDtype.BF16),
            layers.StateTensor((40,), layers.KVDtype.FP32),
        )
    )
    for dtype in layers.KVDtype:
        for mix in itertools.combinations([*attention, latent, state], 3):
            for mode in MambaMode:
                plan_input = plan.PlanInput(
                    mix * 2, dtype, 1 << 16, block_size=2, kernel=plan.KernelLimits(2, 64),
                    mamba_mode=mode, state_chunk=4,
                )  # fmt: skip
                with contextlib.suppress(errors.SpecError):
                    chosen = plan.plan(plan_input)
                    plan.expected_recompute(hit_alignment(chosen.layout))
        for token, head, part, index in itertools.product(
            range(2), range(2), page_layout.Part, range(2)
        ):
            page_layout.attention_offset(
                attention[0], dtype, 2, token=token, head=head, part=part, index=index
            )
            if layers.scale_bytes(dtype):
                page_layout.attention_scale_offset(
                    attention[0], dtype, 2, token=token, head=head, part=part
                )
        for entry, index in itertools.product(range(2), range(6)):
            page_layout.latent_offset(latent, dtype, 4, entry=entry, index=index)
            if layers.scale_bytes(dtype):
                page_layout.latent_scale_offset(latent, dtype, 4, entry=entry)
    for tensor, index in ((0, 2), (1, 39)):
        page_layout.state_offset(state, tensor, index)
    for position in range(8):
        page_layout.slot_address((3, 1), 4, 100, position)


def exercise_allocator(chosen: Layout) -> None:
    """A scripted trace through every allocator rule, invariants checked after each step."""
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    ops = [
        alloc.ResetCache(),
        alloc.Admit("a", prompt, 4, lookahead=1),
        alloc.Admit("b", prompt, 9),
        alloc.ResetCache(),
        alloc.EndStep(),
        alloc.Extend("a", 2),
        alloc.EndStep(),
        alloc.Extend("a", 8),
        alloc.EndStep(),
        alloc.Extend("a", 1, appended=(5,)),
        alloc.Finish("b"),
        alloc.Admit("c", (*prompt, 5), 2),
        alloc.EndStep(),
        alloc.Preempt("a"),
        alloc.Admit("d", tuple(range(20, 29)), 9),
        alloc.Finish("c"),
    ]
    for profile in alloc.BLOCK_POOL_EVICTIONS:
        run_script(alloc.initial_state(alloc.PoolConfig(chosen, 12, profile)), ops)
    # RET-*: the same trace keeping only retained blocks, with and without an interval
    step = hit_alignment(chosen)
    for interval in (0, step):
        sparse = alloc.PoolConfig(chosen, 12, retention="sparse", retention_interval=interval)
        run_script(alloc.initial_state(sparse), ops)
    # ALLOC-VIS-2/3: b reads a's chunk in flight; a's release is refused, c's is withdrawn
    same_pass = [
        alloc.Admit("a", prompt, 9),
        alloc.Admit("b", (*prompt, 5), 9),
        alloc.Preempt("a"),
        alloc.Admit("c", tuple(range(20, 29)), 9),
        alloc.Preempt("c"),
        alloc.EndStep(),
        alloc.Extend("b", 2, appended=(6,)),
        alloc.Finish("a"),
    ]
    pool = alloc.PoolConfig(chosen, 12, visibility=alloc.Visibility.SAME_PASS)
    state = alloc.initial_state(pool)
    for op in same_pass[:2]:
        state, _ = alloc.step(state, op)
    refused = frozenset({2}) if reads_in_flight(state, "b", "a") else frozenset()
    run_script(alloc.initial_state(pool), same_pass, refused)
    aligned = [
        g.block_size
        for g in chosen.groups
        if isinstance(g, MambaState) and g.mode is MambaMode.ALIGN
    ]
    if aligned and math.lcm(*aligned) < len(prompt):  # CKPT-INNER-1: one pass, a checkpoint
        inner = [alloc.Admit("e", prompt, 9, checkpoint=math.lcm(*aligned)), alloc.EndStep()]
        run_script(alloc.initial_state(alloc.PoolConfig(chosen, 12)), inner)
    if not any(is_draft(g) for g in chosen.groups):
        # ALLOC-UNIT-*: under `unit 1` the prompt's tail (7, inside a 2-token block) is
        # keyed at the end of the step ending there, its state kept by a copy, and a
        # re-send copies both tails
        prompt8 = prompt[:8]
        unit = [
            alloc.Admit("u", prompt8, 7),
            alloc.EndStep(),
            alloc.Extend("u", 1),
            alloc.EndStep(),
            alloc.Finish("u"),
            alloc.Admit("v", prompt8, 8),
            alloc.EndStep(),
            alloc.Finish("v"),
        ]
        unit_layout = dataclasses.replace(chosen, hit_unit=1)
        for retention_profile in ("dense", "sparse"):  # RET-SPARSE-2/-3 read unit lengths
            unit_config = alloc.PoolConfig(unit_layout, 12, retention=retention_profile)
            run_script(alloc.initial_state(unit_config), unit)
        if aligned and all(7 % size for size in aligned):
            # CKPT-INNER-2: one chunk saves the tail (7) in passing; a re-send copies it
            passing = [
                alloc.Admit("w", prompt8, 8, checkpoint=7),
                alloc.EndStep(),
                alloc.Finish("w"),
                alloc.Admit("x", prompt8, 8),
                alloc.EndStep(),
            ]
            for retention_profile in ("dense", "sparse"):
                unit_config = alloc.PoolConfig(unit_layout, 12, retention=retention_profile)
                run_script(alloc.initial_state(unit_config), passing)
    if any(isinstance(g, MambaState) and g.speculative_blocks for g in chosen.groups):
        # ALLOC-SPEC-2: accepted drafts cross 4 (B=2): the decode chunk [3, 6) checkpoints it
        drafts = [
            alloc.Admit("f", prompt[:3], 3),
            alloc.EndStep(),
            alloc.Extend("f", 3, appended=(5, 6, 7), checkpoint=4),
            alloc.EndStep(),
        ]
        run_script(alloc.initial_state(alloc.PoolConfig(chosen, 12)), drafts)


def reads_in_flight(state: alloc.State, reader: str, writer: str) -> bool:
    """Whether `reader` holds a block `writer` published for its chunk in flight."""
    if reader not in state.requests or writer not in state.requests:
        return False
    source = state.requests[writer]
    published = {
        block
        for g, start in enumerate(source.published)
        for block in source.tables[g][start : source.registered[g]]
    }
    return any(block in published for t in state.requests[reader].tables for block in t)


def run_script(
    state: alloc.State, ops: list[alloc.Op], refused: frozenset[int] = frozenset()
) -> None:
    """Apply `ops`; the ones at the indexes `refused` must be refused, and change nothing."""
    for index, scripted in enumerate(ops):
        op = scripted
        request = state.requests.get(getattr(op, "rid", ""))
        if isinstance(op, alloc.Finish | alloc.Preempt | alloc.Extend) and request is None:
            continue  # the admission waited for capacity
        if isinstance(op, alloc.Extend):
            done = request.computed == len(request.tokens)
            if done and not op.appended:
                continue  # a chunked-only layout hit the prompt without computing it
            if not done:
                op = alloc.Extend(scripted.rid, scripted.budget)  # prompt not finished yet
        if index in refused:
            with pytest.raises(errors.InvalidOp):
                alloc.step(state, op)
            continue
        state, _ = alloc.step(state, op)
        assert invariants.violated(state) == []
        checkpoints.branch_point(state, (1, 2, 3, 4, 5, 6, 7, 8, 9, 5), ())


def test_the_contract_checker_catches_a_false_postcondition():
    """Broken twin: a rule whose code disagrees with its post: line must be reported."""

    def wrong_limit(num_tokens: int) -> int:
        """post: __return__ == num_tokens - 1"""
        return num_tokens

    import types

    module = types.ModuleType("twin")
    module.wrong_limit = wrong_limit
    with contracts_enforced((module,), [wrong_limit], set()), pytest.raises(ContractViolation):
        module.wrong_limit(5)
