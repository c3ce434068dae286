"""The rule index: every rule well formed, RULES.md fresh, every contract true when run."""

from __future__ import annotations

import itertools
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
    errors,
    hashing,
    hybrid,
    hybrid_hit,
    invariants,
    layout,
    view,
)
from kvcert.spec.hashing import Extra, ExtraKind
from kvcert.spec.rules import all_rules, render_rules_md, rule_of
from kvcert.spec.view import keyable_blocks
from tests.spec.contracts import ContractViolation, conditions, contracts_enforced

RULES = all_rules()
EXPECTED_TAGS = {
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
    "ALLOC-COMMIT-1",
    "ALLOC-VIS-1",
    "ALLOC-RESET-1",
    "INV-NULL-1",
    "INV-REF-1",
    "INV-FREE-1",
    "INV-KEY-1",
    "INV-HIT-1",
    "INV-VIS-1",
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


def test_every_contract_holds_on_every_small_case():
    """Bounded exhaustive: all small layouts x lengths x cached subsets, contracts enforced."""
    rule_functions = [
        getattr(__import__(r.module, fromlist=[r.function]), r.function) for r in RULES
    ]
    seen: set[str] = set()
    modules = (acceptance, hybrid, hashing, layout, view, spec_package, alloc, invariants, errors)
    with contracts_enforced(modules, rule_functions, seen):
        cases = 0
        for chosen in small_layouts():
            for cache_view in all_views(chosen):
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
        with pytest.raises(errors.SpecError):
            FullAttention(0)
    assert cases > 5_000
    assert seen == {r.function for r in RULES}, "every rule's contract was exercised"


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
    state = alloc.initial_state(alloc.PoolConfig(chosen, 12))
    for scripted in ops:
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
        state, _ = alloc.step(state, op)
        assert invariants.violated(state) == []


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
