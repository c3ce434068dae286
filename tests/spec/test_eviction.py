"""§11 eviction: usefulness, provable death, the hybrid profile and what it guarantees."""

from __future__ import annotations

import dataclasses

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvcert.spec import FullAttention, Layout, SlidingWindow
from kvcert.spec import alloc as spec
from kvcert.spec.eviction import hybrid_victim, provably_dead, tail_first, useful_blocks
from kvcert.spec.invariants import violated
from tests.strategies import layouts
from tests.tiers import tiered

FULL_SW = Layout((FullAttention(4, name="f"), SlidingWindow(4, 9, name="s")))


def run(layout: Layout, num_blocks: int, ops, profile=spec.Eviction.HYBRID):
    state = spec.initial_state(spec.PoolConfig(layout, num_blocks, profile))
    observations = []
    for op in ops:
        state, observation = spec.step(state, op)
        observations.append(observation)
    return state, observations


def serve(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """One request computed in a single step, then finished."""
    return [spec.Admit(rid, tokens, len(tokens)), spec.EndStep(), spec.Finish(rid)]


def blocks_of(state: spec.State, group: int) -> dict[int, int]:
    """position -> block id of every registered block of a group."""
    return {c.position: c.block for c in spec.cached_blocks(state) if c.group == group}


def forget(state: spec.State, block: int) -> spec.State:
    """The state after `block` is reused for something else (its key and content dropped)."""
    blocks = list(state.blocks)
    blocks[block] = spec.Block()
    return dataclasses.replace(state, blocks=tuple(blocks))


# --- worked examples (the docstrings' diagrams) ------------------------------------------------


def test_useful_and_dead_after_a_window_block_is_lost():
    state, _ = run(FULL_SW, 16, serve("a", tuple(range(1, 14))))
    full, window = blocks_of(state, 0), blocks_of(state, 1)
    cached = spec.cached_blocks(state)
    assert useful_blocks(FULL_SW, cached) == set(full.values()) | set(window.values())
    assert provably_dead(FULL_SW, cached) == frozenset()

    lost_window = forget(state, window[1])
    assert useful_blocks(FULL_SW, spec.cached_blocks(lost_window)) == {full[0], window[0]}

    lost_full = forget(state, full[1])
    cached = spec.cached_blocks(lost_full)
    assert provably_dead(FULL_SW, cached) == {full[2], window[1]}
    assert useful_blocks(FULL_SW, cached) == {full[0], window[0]}  # s2 dead, not yet provably


def test_a_block_only_a_too_long_request_could_use_is_useless():
    """max_model_len 8: block 1 (tokens 0..7) serves only hits of 8, which need 9 tokens."""
    layout = Layout((FullAttention(4),), max_model_len=8)
    state, _ = run(layout, 4, serve("a", tuple(range(1, 9))))
    full = blocks_of(state, 0)
    assert useful_blocks(layout, spec.cached_blocks(state)) == {full[0]}


def test_a_shadowed_duplicate_is_dead():
    tokens = tuple(range(1, 10))
    ops = [spec.Admit("a", tokens, 9), spec.Admit("b", tokens, 9), spec.EndStep()]
    state, _ = run(Layout((FullAttention(4),)), 8, ops)
    holders = sorted(spec.cached_blocks(state), key=lambda c: c.stamp)
    served_first = {holders[0].block, holders[1].block}
    assert provably_dead(state.config.layout, spec.cached_blocks(state)) == {
        c.block for c in holders if c.block not in served_first
    }


def test_the_victim_is_the_first_dead_block_else_the_head():
    assert hybrid_victim((3, 9, 4, 7), frozenset({4, 7}), frozenset({9})) == 4
    assert hybrid_victim((3, 9, 4, 7), frozenset(), frozenset({7, 9})) == 9
    assert hybrid_victim((3, 9, 4, 7), frozenset(), frozenset()) == 3


def test_an_eviction_can_make_the_next_victim_dead():
    """Queue f0 g0 f1 (all useful): taking f0 kills f1, which goes before g0."""
    layout = Layout((FullAttention(2),))
    state, _ = run(layout, 4, serve("a", (1, 2, 3, 4)) + serve("b", (50, 51)))
    by_first_token = {(c.tokens[0], c.position): c.block for c in spec.cached_blocks(state)}
    f0, f1, g0 = by_first_token[1, 0], by_first_token[1, 1], by_first_token[50, 0]
    state = dataclasses.replace(state, free=(f0, g0, f1))
    assert spec.dead_free_blocks(state) == frozenset()
    _, taken = spec.evict_for(state, 2)
    assert taken == (f0, f1)


def test_tail_first_interleaves_groups_by_last_token():
    layout = Layout((FullAttention(4), SlidingWindow(8, 9)))
    held = [(0, 3, 13), (0, 2, 12), (0, 1, 11), (0, 0, 10), (1, 1, 21), (1, 0, 20)]
    assert tail_first(layout, held) == [21, 13, 12, 20, 11, 10]


def test_release_order_by_profile():
    tokens = tuple(range(1, 17))
    ops = [spec.Admit("a", tokens, 16), spec.EndStep(), spec.Finish("a")]
    layout = Layout((FullAttention(4), SlidingWindow(8, 9)))
    lru, _ = run(layout, 8, ops, spec.Eviction.LRU)
    hybrid, _ = run(layout, 8, ops, spec.Eviction.HYBRID)
    assert lru.free[-6:] == (4, 3, 2, 1, 6, 5)  # group by group, each last position first
    assert hybrid.free[-6:] == (6, 4, 3, 5, 2, 1)  # by last token 16 16 12 8 8 4, full last


def test_unkeyed_first_puts_unregistered_blocks_at_the_head():
    """ALLOC-FREE-2: 14 tokens, B=4 and B=8 (A=8): the partial blocks 4 (group 0) and 6
    (group 1) carry no key, nor does 3 (tokens 8..11, past the last multiple of A computed,
    ALLOC-COMMIT-1); group 1's goes ahead of group 0's, keyed blocks keep ALLOC-FREE-1's
    tail."""
    ops = [spec.Admit("a", tuple(range(1, 15)), 14), spec.EndStep(), spec.Finish("a")]
    layout = Layout((FullAttention(4), SlidingWindow(8, 9)))
    state, _ = run(layout, 10, ops, spec.Eviction.LRU_UNKEYED_FIRST)
    lru, _ = run(layout, 10, ops, spec.Eviction.LRU)
    assert state.free == (6, 4, 3, 7, 8, 9, 2, 1, 5)
    assert lru.free == (7, 8, 9, 4, 3, 2, 1, 6, 5)
    assert [state.blocks[b].key is None for b in (6, 4, 3, 2, 5)] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_hybrid_keeps_the_resent_prefix_where_lru_loses_it():
    """Seed 001 in miniature: A, A, B, A on full + SW; a request holds 6 blocks, the pool 9."""
    layout = Layout((FullAttention(4), SlidingWindow(4, 5)))
    a, b = tuple(range(1, 11)), tuple(range(100, 110))
    ops = serve("a", a) + serve("a2", a) + serve("b", b) + serve("a3", a)
    hits = {}
    for profile in spec.BLOCK_POOL_EVICTIONS:
        _, observations = run(layout, 10, ops, profile)
        hits[profile] = [o.hit for o in observations if isinstance(o, spec.Admitted)]
    assert hits[spec.Eviction.HYBRID] == [0, 8, 0, 8]
    assert hits[spec.Eviction.LRU] == [0, 8, 0, 0]


# --- properties over random traces --------------------------------------------------------------

BASES = [tuple(range(1, 33)), tuple(range(1, 9)) + tuple(range(50, 74)), tuple(range(90, 122))]


@st.composite
def traces(draw: st.DrawFn) -> tuple[Layout, int, list[tuple[int, int, int, int]]]:
    """A layout, a pool, and requests served one after another: (base, length, budget, outputs)."""
    layout = draw(layouts(max_groups=3))
    requests = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(BASES) - 1),
                st.integers(1, 32),
                st.integers(1, 32),
                st.integers(0, 3),
            ),
            min_size=1,
            max_size=8,
        )
    )
    return layout, draw(st.integers(3, 40)), requests


def replay(layout, num_blocks, requests, profile, check=None):
    """Serve the requests one by one (chunked prefill, a few decode steps); returns the hits,
    whether any admission waited, and whether a useful free block was ever evicted."""
    state = spec.initial_state(spec.PoolConfig(layout, num_blocks, profile))
    hits, waited, evicted_useful = [], False, False

    def apply(op):
        nonlocal state, evicted_useful
        before = state
        useful = useful_blocks(layout, spec.cached_blocks(before))
        state, observation = spec.step(state, op)
        kept = {
            c.block
            for c in spec.cached_blocks(state)
            if before.blocks[c.block].key == (c.group, c.key)
        }
        lost = {c.block for c in spec.cached_blocks(before)} - kept
        if lost & useful:
            evicted_useful = True
        if check:
            check(before, state, lost, useful)
        return observation

    for n, (base, length, budget, outputs) in enumerate(requests):
        rid, tokens = f"r{n}", BASES[base][:length]
        observation = apply(spec.Admit(rid, tokens, budget))
        if isinstance(observation, spec.Waiting):
            waited = True
            continue
        hits.append(observation.hit)
        apply(spec.EndStep())
        for step in range(len(tokens) + outputs):
            request = state.requests[rid]
            if request.computed == len(request.tokens) and step >= outputs:
                break
            appended = (7,) if request.computed == len(request.tokens) else ()
            if isinstance(apply(spec.Extend(rid, budget, appended)), spec.Waiting):
                waited = True
                break
            apply(spec.EndStep())
        apply(spec.Finish(rid))
        assert violated(state) == []
    return hits, waited, evicted_useful


@settings(max_examples=tiered(25, 1500))
@given(traces())
def test_provably_dead_blocks_are_useless_and_evicting_them_changes_no_lookup(trace):
    layout, num_blocks, requests = trace

    def check(before, after, lost, useful):
        cached = spec.cached_blocks(after)
        dead = provably_dead(layout, cached)
        assert dead <= {c.block for c in cached} - useful_blocks(layout, cached)
        for c in cached:  # every useless block can go without changing any lookup
            if c.block in useful_blocks(layout, cached):
                continue
            for d in cached:
                probe = (*d.tokens, 999)
                assert spec.lookup(forget(after, c.block), probe, d.extras) == spec.lookup(
                    after, probe, d.extras
                )
            break  # one useless block per step keeps this affordable

    replay(layout, num_blocks, requests, spec.Eviction.HYBRID, check)


@settings(max_examples=tiered(30, 2000))
@given(traces())
def test_hybrid_equals_an_unbounded_pool_while_it_evicts_nothing_useful(trace):
    """The guarantee: if the hybrid profile never had to evict a useful block (and nothing
    waited), every hit equals the hit the same trace gets from an unbounded pool."""
    layout, num_blocks, requests = trace
    lost_blocks = []
    hits, waited, evicted_useful = replay(
        layout,
        num_blocks,
        requests,
        spec.Eviction.HYBRID,
        lambda before, after, lost, useful: lost_blocks.extend(lost),
    )
    unbounded, _, _ = replay(layout, 1000, requests, spec.Eviction.HYBRID)
    if waited or evicted_useful:
        event("premise false (pool too small for the working set)")
        return
    event("premise true, cached blocks evicted" if lost_blocks else "premise true, no eviction")
    assert hits == unbounded


def test_lru_breaks_that_guarantee_hybrid_keeps_it():
    """Broken twin of the property above: lru evicts the re-sent prefix while dead blocks sit
    in the queue, so its hits fall below the unbounded pool's; hybrid gives up only a block
    no later request needs (SW block 0, useful for a hit of 4 nobody asks for)."""
    layout = Layout((FullAttention(4), SlidingWindow(4, 5)))
    requests = [(0, 10, 10, 0), (0, 10, 10, 0), (2, 10, 10, 0), (0, 10, 10, 0)]
    unbounded, _, _ = replay(layout, 1000, requests, spec.Eviction.LRU)
    hits, waited, evicted_useful = replay(layout, 10, requests, spec.Eviction.LRU)
    assert not waited
    assert evicted_useful
    assert hits != unbounded
    hits, waited, evicted_useful = replay(layout, 10, requests, spec.Eviction.HYBRID)
    assert not waited
    assert hits == unbounded


def test_hybrid_does_not_dominate_lru_on_every_trace():
    """Stated limit, found by Hypothesis: once the pool is smaller than the working set both
    profiles evict useful blocks, and lru's choice can serve a later request better."""
    layout = Layout((SlidingWindow(1, 2),))
    requests = [(0, 1, 1, 1), (0, 2, 1, 1), (0, 2, 1, 0)]
    lru = replay(layout, 4, requests, spec.Eviction.LRU)
    hybrid = replay(layout, 4, requests, spec.Eviction.HYBRID)
    assert lru == ([0, 1, 1], False, True)
    assert hybrid == ([0, 1, 0], False, True)  # the window block, freed mid-decode, went first
