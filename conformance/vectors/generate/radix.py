"""Vectors of the radix profile (§13): a scenario per rule, and seeded random traces.

The traces are ones a scheduler issues: a request is released only between steps, preempted
only once its prompt is computed, and decodes one token per step; prompts are cut from a few
shared bases, so that lookups hit, publishes meet duplicates and small pools evict.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from kvcert.conformance.contract.codec import JSON, layout_from_json, op_from_json
from kvcert.conformance.vectors.generate.cases import alloc_case
from kvcert.spec import FullAttention, Layout, radix
from kvcert.spec import alloc as spec

RADIX = spec.Eviction.RADIX
BASES = [tuple(range(1, 41)), tuple(range(1, 13)) + tuple(range(60, 88)), tuple(range(200, 240))]
PROMPT = tuple(range(100, 140))
OTHER = tuple(range(500, 540))


def _op(rnd: random.Random, state: radix.State) -> spec.Op | None:
    """One draw of the scheduler-like op mix, or None when the draw does not apply."""
    roll = rnd.random()
    requests = state.requests
    idle = sorted(r for r, q in requests.items() if not q.scheduled)
    if roll < 0.3:
        rid = next((r for r in "abcdef" if r not in requests), None)
        if rid is None:
            return None
        base = rnd.choice(BASES)
        tokens = base[: rnd.randint(1, len(base))]
        return spec.Admit(rid, tokens, rnd.choice([2, 4, 8, 16, 64]))
    if roll < 0.55 and idle:
        rid = rnd.choice(idle)
        request = requests[rid]
        if request.computed < len(request.tokens):
            return spec.Extend(rid, rnd.choice([2, 4, 8, 64]))
        return spec.Extend(rid, 1, (rnd.randint(1, 3),))
    if roll < 0.8:
        return spec.EndStep()
    if idle:
        rid = rnd.choice(idle)
        request = requests[rid]
        if rnd.random() < 0.3 and request.computed >= request.prompt:
            return spec.Preempt(rid)
        return spec.Finish(rid)
    return None


def radix_traces(count: int, first_seed: int = 0) -> Iterator[JSON]:
    """Seeded random traces under the radix profile: one full-attention group of page 1, 2
    or 4, pools of 6 to 24 pages (evicting often), 40 draws of the op mix each."""
    for n in range(count):
        rnd = random.Random(first_seed + n)
        layout = Layout((FullAttention(rnd.choice([1, 2, 4])),))
        config = spec.PoolConfig(layout, rnd.randint(6, 24), RADIX)
        state = radix.initial_state(config)
        ops: list[spec.Op] = []
        for _ in range(40):
            op = _op(rnd, state)
            if op is None:
                continue
            state, _ = radix.step(state, op)
            ops.append(op)
        yield alloc_case(f"alloc.radix.random.{n:03d}", layout, config.num_blocks, ops,
                         eviction=RADIX)  # fmt: skip


def _case(
    case_id: str, block: int, blocks: int, ops: list[spec.Op], comment: str, focus: str
) -> JSON:
    layout = Layout((FullAttention(block),))
    return alloc_case(case_id, layout, blocks, ops, comment=comment, focus=(focus,),
                      eviction=RADIX)  # fmt: skip


def _served(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """A request prefilled in one step, then finished: its prompt's pages stay cached."""
    return [spec.Admit(rid, tokens, 64), spec.EndStep(), spec.Finish(rid)]


def _decode(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """One decode step per token, each ending its step."""
    return [op for t in tokens for op in (spec.Extend(rid, 1, (t,)), spec.EndStep())]


def radix_scenarios() -> Iterator[JSON]:
    """One hand-written trace per rule of §13, B=4 unless said otherwise."""
    a_prompt = PROMPT[:10]
    yield _case(
        "alloc.radix.hit-whole-pages",
        4,
        16,
        [
            spec.Admit("a", a_prompt, 64),
            spec.EndStep(),
            spec.Admit("b", PROMPT[:13], 64),
            spec.Admit("c", PROMPT[:9], 64),
            spec.Admit("d", PROMPT[:8], 64),
        ],
        "a publishes the 2 whole pages of its 10 tokens; b (13 tokens) and c (9) hit them "
        "(8 tokens), d (8 tokens) only 4: its last token is left to compute",
        "RADIX-HIT-1",
    )
    yield _case(
        "alloc.radix.output-at-finish",
        4,
        16,
        [
            spec.Admit("a", PROMPT[:8], 64),
            spec.EndStep(),
            *_decode("a", (1, 2, 3, 4)),
            spec.Admit("b", (*PROMPT[:8], 1, 2, 3, 4, 5), 64),
            spec.Finish("a"),
            spec.Admit("c", (*PROMPT[:8], 1, 2, 3, 4, 5), 64),
        ],
        "a's output page (tokens 8..11) is written by step 5 but joins the tree only when a "
        "finishes: b, admitted before, hits the prompt's 8 tokens, c, after, hits 12",
        "RADIX-PUB-2",
    )
    yield _case(
        "alloc.radix.preempt-drops-output",
        4,
        16,
        [
            spec.Admit("a", PROMPT[:8], 64),
            spec.EndStep(),
            *_decode("a", (1, 2, 3, 4, 5)),
            spec.Preempt("a"),
            spec.Admit("a", (*PROMPT[:8], 1, 2, 3, 4, 5), 64),
        ],
        "a preempted after 5 decoded tokens frees its output pages unpublished: re-admitted "
        "with them, it hits its prompt's 8 tokens only",
        "RADIX-FREE-1",
    )
    yield _case(
        "alloc.radix.duplicates-freed",
        4,
        16,
        [
            spec.Admit("a", a_prompt, 64),
            spec.Admit("b", a_prompt, 64),
            spec.EndStep(),
            spec.Extend("b", 1, (7,)),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Finish("b"),
        ],
        "a and b compute the same 10 tokens in one step; a publishes first, b's 2 duplicate "
        "pages are freed and its table takes a's (its next table shows them); a's finish "
        "releases only its own tail page, b's releases all it holds",
        "RADIX-DEDUP-1",
    )
    yield _case(
        "alloc.radix.least-recent-leaf",
        4,
        9,
        [
            *_served("a", PROMPT[:9]),
            *_served("b", OTHER[:9]),
            *_served("c", PROMPT[:9]),
            spec.Admit("d", tuple(range(900, 913)), 64),
            spec.Admit("e", PROMPT[:9], 64),
            spec.Admit("f", OTHER[:9], 64),
        ],
        "8 pages; a's and b's prompts leave 2-page leaves, c's lookup refreshes a's; d's 13 "
        "tokens ask for 17 tokens' pages (5) with 4 free: the least recent leaf, b's, goes "
        "whole; e still hits a's prompt, f misses b's (it waits for all 3 pages)",
        "RADIX-EVICT-1",
    )
    yield _case(
        "alloc.radix.whole-leaf",
        4,
        9,
        [
            *_served("a", PROMPT[:17]),
            spec.Admit("b", tuple(range(900, 913)), 64),
            spec.Admit("c", PROMPT[:5], 64),
        ],
        "a leaves one 4-page leaf and 4 pages free; b's 13 tokens ask for 17 tokens' pages "
        "(5): the whole leaf goes, 4 pages for 1 short, so c misses a page it shared with a",
        "RADIX-EVICT-1",
    )
    yield _case(
        "alloc.radix.lookup-splits",
        4,
        9,
        [
            *_served("a", PROMPT[:17]),
            spec.Admit("c", PROMPT[:9], 1),
            spec.EndStep(),
            spec.Finish("c"),
            spec.Admit("b", tuple(range(900, 913)), 64),
            spec.Admit("d", PROMPT[:9], 64),
        ],
        "c's lookup ends 2 pages into a's 4-page leaf and splits it; b then evicts the "
        "2-page tail only (the split's fresher half is still older than the matched head), "
        "and d hits the head c refreshed",
        "RADIX-SPLIT-1",
    )
    yield _case(
        "alloc.radix.over-asks-a-page",
        4,
        6,
        [
            *_served("a", PROMPT[:9]),
            spec.Admit("b", OTHER[:9], 64),
            spec.Admit("c", PROMPT[:9], 64),
        ],
        "5 pages; a's prompt leaves a 2-page leaf and 3 free; b needs 3 pages but asks for "
        "its 9 tokens plus a page (4 pages): a's leaf is evicted although 3 pages were free, "
        "and c misses",
        "RADIX-EVICT-1",
    )
    yield _case(
        "alloc.radix.decode-over-asks",
        4,
        6,
        [
            spec.Admit("a", PROMPT[:8], 64),
            spec.Admit("b", OTHER[:11], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Extend("b", 1, (3,)),
            spec.EndStep(),
            spec.Admit("c", PROMPT[:9], 64),
        ],
        "5 pages: a's 2, b's 3, none free; a finishes, its prompt cached; b's decode writes "
        "into its last page (none needed) yet asks for a page: a's leaf is evicted, c misses",
        "RADIX-EVICT-1",
    )
    yield _case(
        "alloc.radix.waiting-lookup-refreshes",
        4,
        9,
        [
            *_served("a", PROMPT[:9]),
            *_served("b", OTHER[:9]),
            spec.Admit("x", tuple(range(900, 905)), 64),
            spec.Admit("c", (*PROMPT[:8], *range(300, 330)), 64),
            spec.Admit("d", tuple(range(700, 709)), 64),
            spec.Admit("e", PROMPT[:9], 64),
        ],
        "c hits a's prompt but waits (its 38 tokens need 8 more pages); its lookup still "
        "refreshed a's leaf, so d's eviction takes b's, and e hits a's prompt",
        "RADIX-LRU-1",
    )
    yield _case(
        "alloc.radix.ids-name-lifetimes",
        2,
        5,
        [
            spec.Admit("a", (1, 2, 3), 3),
            spec.EndStep(),
            spec.Preempt("a"),
            spec.Admit("b", (4, 5, 6), 3),
        ],
        "B=2: a's first page is published, its second (half written) freed when a is "
        "preempted; b's pages get ids 3 and 4, never the freed 2 (an engine may reuse the "
        "page: ids name lifetimes)",
        "RADIX-ID-1",
    )
    yield _case(
        "alloc.radix.reset",
        4,
        9,
        [
            spec.Admit("a", PROMPT[:9], 64),
            spec.ResetCache(),
            spec.EndStep(),
            spec.Finish("a"),
            spec.ResetCache(),
            spec.Admit("b", PROMPT[:9], 64),
        ],
        "a reset is refused while a runs; after a finishes it empties the tree: b misses",
        "RADIX-RESET-1",
    )


def radix_twins(cases: Iterator[JSON]) -> Iterator[JSON]:
    """The §6 scenarios of one full-attention group whose operations the radix profile
    takes (no lookahead, no inner checkpoint, no extras, one token per decode step),
    replayed under it: the same traces, answered by §13."""
    for case in cases:
        data = case["input"]
        groups = data["layout"]["groups"]
        if len(groups) != 1 or groups[0]["kind"] != "full" or groups[0].get("draft"):
            continue
        if set(data) & {"visibility", "retention", "retention_interval"}:
            continue
        if set(data["layout"]) != {"groups"} or any(_beyond_scope(op) for op in data["ops"]):
            continue
        yield alloc_case(
            case["id"].replace("alloc.", "alloc.radix.", 1),
            layout_from_json(data["layout"]),
            data["num_blocks"],
            [op_from_json(op) for op in data["ops"]],
            case.get("origin"),
            case.get("comment", ""),
            ("RADIX-HIT-1",),
            eviction=RADIX,
        )


def _beyond_scope(op: JSON) -> bool:
    """An operation RADIX-SCOPE-1 refuses (lookahead, inner checkpoint, several tokens
    appended) or one with extra keys, which SGLang's adapter does not drive."""
    many = len(op.get("appended", ())) > 1
    return bool(op.get("lookahead") or op.get("checkpoint") or op.get("extras") or many)
