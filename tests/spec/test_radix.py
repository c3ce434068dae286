"""§13 the radix profile: each rule on a worked trace, its refusals, and its invariants over
random scheduler-like traces (every reachable state keeps RADIX-INV-1; ids never repeat)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.spec import FullAttention, InvalidOp, Layout, SlidingWindow, Speculative, radix
from kvcert.spec import alloc as spec

PROMPT = tuple(range(100, 140))
OTHER = tuple(range(500, 540))
RADIX = spec.Eviction.RADIX


def fresh(blocks: int = 16, size: int = 4, **profiles: object) -> radix.State:
    config = spec.PoolConfig(Layout((FullAttention(size),)), blocks, RADIX, **profiles)
    return radix.initial_state(config)


def play(state: radix.State, ops: list[spec.Op]) -> tuple[radix.State, list[spec.Observation]]:
    seen = []
    for op in ops:
        state, observation = radix.step(state, op)
        assert radix.violated(state) == []
        seen.append(observation)
    return state, seen


def hits(observations: list[spec.Observation]) -> list[int | None]:
    """Each admission's hit, None for one that waits."""
    return [
        o.hit if isinstance(o, spec.Admitted) else None
        for o in observations
        if isinstance(o, spec.Admitted | spec.Waiting)
    ]


def served(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """A request prefilled in one step and finished."""
    return [spec.Admit(rid, tokens, 64), spec.EndStep(), spec.Finish(rid)]


# --- RADIX-SCOPE-1 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "profiles", "says"),
    [
        (Layout((FullAttention(4), SlidingWindow(4, 8))), {}, "one full-attention group"),
        (Layout((FullAttention(4, draft=True),), Speculative.EXACT), {}, "full-attention"),
        (Layout((FullAttention(4),), hit_unit=2), {}, "no hit unit"),
        (Layout((FullAttention(4),)), {"visibility": "same-pass"}, "step-end"),
        (Layout((FullAttention(4),)), {"retention": "sparse"}, "dense"),
    ],
)
def test_the_scope_refuses_what_the_profile_does_not_define(layout, profiles, says):
    with pytest.raises(InvalidOp, match=says):
        radix.initial_state(spec.PoolConfig(layout, 8, RADIX, **profiles))


def test_each_machine_refuses_the_other_ones_profile():
    layout = Layout((FullAttention(4),))
    with pytest.raises(InvalidOp, match=r"its own state machine \(§13\)"):
        spec.initial_state(spec.PoolConfig(layout, 8, RADIX))
    with pytest.raises(InvalidOp, match="serves eviction 'radix'"):
        radix.initial_state(spec.PoolConfig(layout, 8))
    assert radix.scope_problem(spec.PoolConfig(layout, 8)) is None
    assert RADIX not in spec.BLOCK_POOL_EVICTIONS


@pytest.mark.parametrize(
    ("op", "says"),
    [
        (spec.Admit("b", PROMPT[:8], 8, lookahead=1), "lookahead"),
        (spec.Admit("b", PROMPT[:8], 8, checkpoint=4), "inner checkpoint"),
        (spec.Extend("p", 4, lookahead=1), "lookahead"),
        (spec.Extend("p", 4, checkpoint=6), "inner checkpoint"),
        (spec.Extend("a", 4, appended=(1, 2)), "one token per step"),
        (spec.Admit("a", PROMPT[:8], 8), "already running"),
        (spec.Extend("z", 4), "unknown request"),
        (spec.Finish("z"), "unknown request"),
        (spec.Preempt("z"), "unknown request"),
    ],
)
def test_operations_outside_the_scope_or_the_protocol_are_refused(op, says):
    ready = [spec.Admit("a", PROMPT[:10], 64), spec.Admit("p", OTHER[:10], 4), spec.EndStep()]
    state, _ = play(fresh(), ready)
    with pytest.raises(InvalidOp, match=says):
        radix.step(state, op)


# --- RADIX-HIT-1, RADIX-PUB-1/2, RADIX-DEDUP-1 -------------------------------------------------


def test_a_hit_is_whole_published_pages_leaving_the_last_token():
    _, seen = play(
        fresh(),
        [
            spec.Admit("a", PROMPT[:10], 64),
            spec.Admit("early", PROMPT[:10], 64),  # a's pages are not published yet
            spec.EndStep(),
            spec.Admit("b", PROMPT[:13], 64),
            spec.Admit("c", PROMPT[:8], 64),
            spec.Admit("d", PROMPT[:1], 64),
        ],
    )
    assert hits(seen) == [0, 0, 8, 4, 0]


def test_decode_pages_join_the_tree_at_the_finish_only():
    decode = [op for t in (1, 2, 3, 4) for op in (spec.Extend("a", 1, (t,)), spec.EndStep())]
    longer = (*PROMPT[:8], 1, 2, 3, 4, 5)
    state, seen = play(fresh(), [spec.Admit("a", PROMPT[:8], 64), spec.EndStep(), *decode])
    assert [o.registered for o in seen if isinstance(o, spec.StepEnded)] == [2, 0, 0, 0, 0]
    _, before = radix.step(state, spec.Admit("b", longer, 64))
    finished, _ = radix.step(state, spec.Finish("a"))
    _, after = radix.step(finished, spec.Admit("b", longer, 64))
    preempted, _ = radix.step(state, spec.Preempt("a"))
    _, lost = radix.step(preempted, spec.Admit("b", longer, 64))
    assert (before.hit, after.hit, lost.hit) == (8, 12, 8)


def test_a_duplicate_is_freed_and_the_table_takes_the_tree_page():
    state, seen = play(
        fresh(),
        [
            spec.Admit("a", PROMPT[:10], 64),
            spec.Admit("b", PROMPT[:10], 64),
            spec.EndStep(),
            spec.Extend("b", 1, (7,)),
        ],
    )
    a_table, b_table = seen[0].tables[0], seen[1].tables[0]
    assert seen[2].registered == 2  # b's two whole pages were duplicates
    assert seen[3].tables[0] == (*a_table[:2], b_table[2])
    assert radix.free_pages(state) == 15 - 4  # a's 3 pages, b's own third, nothing else
    _, released = radix.step(state, spec.Finish("a"))
    assert released.blocks == 1  # b still holds the two shared pages


# --- RADIX-LRU-1, RADIX-SPLIT-1, RADIX-EVICT-1 -------------------------------------------------


def test_the_least_recently_used_leaf_is_evicted_whole():
    _, seen = play(
        fresh(9),
        [
            *served("a", PROMPT[:9]),
            *served("b", OTHER[:9]),
            *served("c", PROMPT[:9]),  # refreshes a's leaf
            spec.Admit("d", tuple(range(900, 913)), 64),  # asks 17 tokens' pages: 5, 4 free
            spec.Admit("e", PROMPT[:9], 64),
            spec.Admit("f", OTHER[:9], 64),
        ],
    )
    assert hits(seen) == [0, 0, 8, 0, 8, None]  # f: b's leaf went, it waits for 3 pages


def test_a_lookup_splits_the_node_it_ends_inside():
    state, _ = play(fresh(9), served("a", PROMPT[:17]))
    (leaf,) = state.nodes
    looked, node = radix.lookup(state, radix.page_keys(state, PROMPT[:8], ()))
    head, tail = looked.nodes[node], looked.nodes[leaf]
    assert (len(head.pages), len(tail.pages), tail.parent) == (2, 2, node)
    assert tail.stamp < head.stamp  # the matched head is the fresher
    assert radix.lookup(state, radix.page_keys(state, OTHER[:8], ()))[1] == radix.ROOT


def test_an_insert_splits_where_it_diverges_and_stamps_in_walk_order():
    state, _ = play(
        fresh(12), [*served("a", PROMPT[:17]), *served("b", (*PROMPT[:8], 7, 7, 7, 7, 7))]
    )
    lengths = sorted(len(node.pages) for node in state.nodes.values())
    assert lengths == [1, 2, 2]  # [p0 p1] above a's [p2 p3] and b's [q2]
    stamps = sorted(state.nodes.values(), key=lambda n: n.stamp)
    assert len(stamps[-1].pages) == 1  # b's new leaf, stamped last


def test_an_insert_splits_the_node_it_diverges_inside():
    """RADIX-SPLIT-1 inside an insert: a and b are admitted in one step, both missing; at its
    end a's pages go in first, so b's insert meets a's node, diverges inside it after two
    pages and splits it. b's own first two pages are freed (RADIX-DEDUP-1): its table takes
    a's."""
    b_tokens = (*PROMPT[:8], 7, 7, 7, 7, 7)
    ops = [spec.Admit("a", PROMPT[:17], 64), spec.Admit("b", b_tokens, 64), spec.EndStep()]
    state, seen = play(fresh(12), ops)
    assert hits(seen) == [0, 0]
    assert sorted(len(node.pages) for node in state.nodes.values()) == [1, 2, 2]
    assert state.requests["b"].table[:2] == state.requests["a"].table[:2]


def test_the_allocation_over_asks_a_page():
    over = [
        *served("a", PROMPT[:9]),
        spec.Admit("b", OTHER[:9], 64),
        spec.Admit("c", PROMPT[:9], 64),
    ]
    _, seen = play(fresh(6), over)
    assert seen[-1] == spec.Waiting(3, 2)  # 3 pages were free for b's 3: a's leaf went anyway
    page_one = [
        *served("a", PROMPT[:3]),
        spec.Admit("b", OTHER[:2], 64),
        spec.Admit("c", PROMPT[:3], 64),
    ]
    _, seen = play(fresh(6, size=1), page_one)
    assert hits(seen) == [0, 0, 2]  # at page 1 no page is asked for beyond the chunk


def test_a_decode_step_asks_a_page_it_does_not_need():
    _, seen = play(
        fresh(6),
        [
            spec.Admit("a", PROMPT[:8], 64),
            spec.Admit("b", OTHER[:11], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Extend("b", 1, (3,)),
            spec.EndStep(),
            spec.Admit("c", PROMPT[:9], 64),
        ],
    )
    assert seen[-1] == spec.Waiting(3, 2)


def test_a_waiting_admission_still_refreshes_its_lookup():
    _, seen = play(
        fresh(9),
        [
            *served("a", PROMPT[:9]),
            *served("b", OTHER[:9]),
            spec.Admit("x", tuple(range(900, 905)), 64),
            spec.Admit("c", (*PROMPT[:8], *range(300, 330)), 64),
            spec.Admit("d", tuple(range(700, 709)), 64),
            spec.Admit("e", PROMPT[:9], 64),
        ],
    )
    assert seen[-3] == spec.Waiting(8, 4)
    assert hits(seen)[-1] == 8  # b's leaf was the least recent: c's lookup refreshed a's


def test_extensions_wait_and_change_nothing():
    state, _ = play(fresh(4, size=1), [spec.Admit("a", (1, 2, 3), 3), spec.EndStep()])
    waited, seen = radix.step(state, spec.Extend("a", 1, (4,)))
    assert seen == spec.Waiting(1, 0)
    assert waited == state


# --- RADIX-ID-1, RADIX-FREE-1, RADIX-RESET-1 -------------------------------------------------


def test_ids_are_never_handed_out_twice():
    state, seen = play(
        fresh(5, size=2),
        [
            spec.Admit("a", (1, 2, 3), 3),
            spec.EndStep(),
            spec.Preempt("a"),
            spec.Admit("b", (4, 5, 6), 3),
        ],
    )
    assert seen[0].tables == ((1, 2),)
    assert seen[3].tables == ((3, 4),)
    assert radix.allocate(state, 2)[1] == (5, 6)


def test_a_release_counts_the_pages_nobody_else_holds():
    _, seen = play(
        fresh(),
        [
            *served("a", PROMPT[:9]),
            spec.Admit("b", PROMPT[:9], 64),
            spec.Admit("c", PROMPT[:9], 64),
            spec.EndStep(),
            spec.Preempt("b"),
            spec.Finish("c"),
        ],
    )
    assert [o.blocks for o in seen if isinstance(o, spec.Released)] == [3, 1, 3]


def test_a_reset_is_refused_while_a_request_runs():
    state, seen = play(
        fresh(),
        [spec.Admit("a", PROMPT[:9], 64), spec.ResetCache(), spec.EndStep(), spec.Finish("a")],
    )
    assert seen[1] == spec.CacheReset(False)
    state, done = radix.step(state, spec.ResetCache())
    assert done == spec.CacheReset(True)
    assert state.nodes == {}
    assert radix.free_pages(state) == 15


def test_a_request_released_mid_step_publishes_what_it_computed():
    state, seen = play(
        fresh(),
        [
            spec.Admit("a", PROMPT[:9], 4),
            spec.EndStep(),
            spec.Extend("a", 4),
            spec.Finish("a"),  # its second chunk never ran
            spec.EndStep(),
        ],
    )
    assert [len(n.pages) for n in state.nodes.values()] == [1]
    assert seen[-1] == spec.StepEnded(0)


# --- RADIX-INV-1: its checks catch broken states ----------------------------------------------


def test_the_invariant_catches_each_broken_state():
    state, _ = play(
        fresh(), [*served("a", PROMPT[:9]), spec.Admit("b", PROMPT[:13], 64), spec.EndStep()]
    )
    node = next(iter(state.nodes))
    page = state.nodes[node].pages[0]
    request = state.requests["b"]
    broken = [
        dataclasses.replace(state, written={**state.written, page: (OTHER[:4], ())}),
        dataclasses.replace(state, written={p: c for p, c in state.written.items() if p != page}),
        dataclasses.replace(state, requests={"b": dataclasses.replace(request, protected=0)}),
        dataclasses.replace(
            state, requests={"b": dataclasses.replace(request, table=(99, *request.table[1:]))}
        ),
        dataclasses.replace(state, config=dataclasses.replace(state.config, num_blocks=3)),
    ]
    assert radix.violated(state) == []
    for twin in broken:
        assert radix.violated(twin), twin


# --- every reachable state, over random scheduler-like traces ---------------------------------

OPS = st.lists(st.tuples(st.integers(0, 99), st.integers(0, 5), st.integers(1, 40)), max_size=40)


@settings(deadline=None)
@given(size=st.sampled_from([1, 2, 4]), blocks=st.integers(3, 20), draws=OPS)
def test_every_reachable_state_keeps_the_invariant_and_fresh_ids(size, blocks, draws):
    state = fresh(blocks, size)
    bases = [PROMPT, (*PROMPT[:6], *OTHER), OTHER]
    handed: set[int] = set()
    for roll, pick, length in draws:
        rid = "abcdef"[pick]
        request = state.requests.get(rid)
        if request is None:
            op: spec.Op = spec.Admit(rid, bases[pick % 3][:length], length % 9 + 1)
        elif request.scheduled or roll < 30:
            op = (
                spec.EndStep()
                if roll < 60
                else spec.Finish(rid)
                if roll < 85
                else spec.Preempt(rid)
            )
        elif request.computed < len(request.tokens):
            op = spec.Extend(rid, length % 9 + 1)
        else:
            op = spec.Extend(rid, 1, (roll,))
        before = radix.live_pages(state)
        state, _ = radix.step(state, op)
        assert radix.violated(state) == []
        new = radix.live_pages(state) - before
        assert not new & handed, "an id was handed out twice"
        handed |= new
        assert radix.free_pages(state) >= 0
