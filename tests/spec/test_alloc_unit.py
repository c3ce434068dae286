"""§6 under the hit-granularity profile `unit U`: the allocator's side (ALLOC-UNIT-1..4).

Worked examples of each rule, its refusals, the copies a hit inside a block needs, and two
whole-machine properties: the invariants (INV-COPY-1 among them) hold on random operation
sequences, and a re-send of a finished prompt is served its tail boundary (the keys the
allocator registers are the ones the hit rules need).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    Extra,
    ExtraKind,
    FullAttention,
    InvalidOp,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.alloc import (
    NULL_BLOCK,
    Admit,
    Admitted,
    EndStep,
    Eviction,
    Extend,
    Extended,
    Finish,
    PoolConfig,
    Preempt,
    StepEnded,
    Waiting,
    initial_state,
    step,
    tail_boundary,
)
from kvcert.spec.invariants import violated
from kvcert.spec.layout import is_cacheable
from kvcert.spec.retention import Retention
from tests.spec.test_alloc import SpecSelfCheck
from tests.strategies import layouts

PROMPT = tuple(range(1, 101))  # 100 distinct tokens
HYBRID = Layout((FullAttention(64), MambaState(64, MambaMode.ALIGN)), hit_unit=16)


def run(state, *ops):
    observations = []
    for op in ops:
        state, observation = step(state, op)
        assert violated(state) == [], (op, violated(state))
        observations.append(observation)
    return state, observations


def pool(layout=HYBRID, blocks=32, **profile):
    return initial_state(PoolConfig(layout, blocks, **profile))


def written(resend=PROMPT, layout=HYBRID, chunks=(96, 4), blocks=32, **profile):
    """A writer computes `PROMPT` in `chunks`, decodes one token and finishes."""
    state, _ = run(pool(layout, blocks, **profile), Admit("a", PROMPT, chunks[0]), EndStep())
    for chunk in chunks[1:]:
        state, _ = run(state, Extend("a", chunk), EndStep())
    state, _ = run(state, Extend("a", 1, appended=(7,)), EndStep(), Finish("a"))
    return state


# --- ALLOC-UNIT-1: what the allocator serves under `unit U` --------------------------------


@pytest.mark.parametrize(
    ("profile", "layout", "fragment"),
    [
        ({"eviction": Eviction.HYBRID}, HYBRID, "EVICT-DEAD-1"),
        (
            {},
            Layout(
                (FullAttention(64), SlidingWindow(64, 64, draft=True)),
                Speculative.DROP,
                hit_unit=16,
            ),
            "drop profile",
        ),
    ],
)
def test_the_unit_profile_refuses_what_it_does_not_define(profile, layout, fragment):
    with pytest.raises(InvalidOp, match=fragment):
        PoolConfig(layout, 8, **profile)


DRAFTED = Layout((FullAttention(64), FullAttention(64, draft=True)), Speculative.EXACT, hit_unit=16)


def test_draft_groups_keyed_exactly_are_served_under_the_unit_profile():
    assert spec.unit_problem(PoolConfig(DRAFTED, 8)) is None


@pytest.mark.parametrize(
    ("reach", "chunks", "tail"),
    [
        (1, (100,), 96),  # the key at 96 covers token 96, in the prompt; computed with it
        (2, (96, 4), 96),  # tokens 0..97: registered once token 96 is computed
        (2, (97, 3), 96),
        (4, (100,), 96),  # tokens 0..99: the whole prompt
        (5, (100,), 80),  # a key at 96 would cover token 100: T = 80 for every group
    ],
)
def test_a_draft_tail_is_keyed_where_a_resend_can_hit(reach, chunks, tail):
    """ALLOC-UNIT-2 for a draft group: T is the re-send hit, 100 - max(1, reach) floored to
    U (the key at T covers `reach` tokens past it, HASH-DRAFT-1), and a re-send hits it."""
    layout = dataclasses.replace(DRAFTED, draft_reach=reach)
    state = written(layout=layout, chunks=chunks)
    keyed_at = {b.partial_at for b in state.blocks if b.partial}
    assert keyed_at == {tail}
    _, (admitted,) = run(state, Admit("b", PROMPT, 100))
    assert admitted.hit == tail


def test_a_draft_tail_waits_for_the_reach_minus_one_tokens_after_it():
    """Reach 3: the KV at positions up to 95 in the draft layers needs tokens up to 97, so
    the step that ends at 97 registers the tail, the one ending at 96 does not."""
    layout = dataclasses.replace(DRAFTED, draft_reach=3)
    state, _ = run(pool(layout), Admit("a", PROMPT, 96), EndStep())
    assert not any(b.partial for b in state.blocks if b.partial and b.partial[0] == 1)
    state, _ = run(state, Extend("a", 2), EndStep())
    assert [b.partial_at for b in state.blocks if b.partial and b.partial[0] == 1] == [96]


@pytest.mark.parametrize("visibility", ["step-end", "same-pass"])
@pytest.mark.parametrize("eviction", ["lru", "lru-unkeyed-first"])
def test_the_unit_profile_serves_dense_lru_profiles(eviction, visibility):
    config = PoolConfig(HYBRID, 8, eviction=eviction, visibility=visibility)
    assert spec.unit_problem(config) is None
    plain = PoolConfig(Layout(HYBRID.groups), 8, visibility="same-pass")
    assert spec.unit_problem(plain) is None


# --- ALLOC-UNIT-2: the prompt's tail boundary is keyed -------------------------------------


def test_the_tail_boundary_is_the_longest_resend_hit():
    assert [tail_boundary(16, p) for p in (1, 16, 17, 100, 112, 113)] == [0, 0, 16, 96, 96, 112]


def test_docstring_examples_of_the_tail_position():
    full, state = 0, 1
    request = spec.Request(PROMPT, (), 100, 0, 0, ((), ()), (0, 0), prompt=100)
    assert spec.tail_position(HYBRID, full, request, before=64) == 96
    assert spec.tail_position(HYBRID, full, request, before=96) == 0  # no step computed 95
    assert spec.tail_position(HYBRID, state, request, before=64) == 0  # ended at 100
    at_96 = spec.Request(PROMPT, (), 96, 0, 0, ((), ()), (0, 0), prompt=100)
    assert spec.tail_position(HYBRID, state, at_96, before=0) == 96
    at_boundary = spec.Request(PROMPT[:65], (), 65, 0, 0, ((), ()), (0, 0), prompt=65)
    assert spec.tail_position(HYBRID, full, at_boundary, before=0) == 0  # T=64: a block end


def test_a_step_ending_at_the_tail_keys_attention_and_state():
    state, (admitted, ended) = run(pool(), Admit("a", PROMPT, 96), EndStep())
    full_tail, state_tail = admitted.tables[0][1], admitted.tables[1][1]
    assert ended == StepEnded(3)  # block 0 whole, and the tail at 96 in both groups
    for b in (full_tail, state_tail):
        assert state.blocks[b].partial_at == 96
        assert state.blocks[b].key is None


def test_a_chunk_past_the_tail_keys_attention_only():
    state, (admitted, ended) = run(pool(), Admit("a", PROMPT, 100), EndStep())
    assert ended == StepEnded(2)
    assert state.blocks[admitted.tables[0][1]].partial_at == 96
    assert state.blocks[admitted.tables[1][1]].partial is None


# --- CKPT-INNER-2: the chunk ending the prompt saves its tail in passing ------------------


def test_a_chunk_ending_the_prompt_saves_its_tail_in_passing_and_a_resend_hits_it():
    state, (admitted, ended) = run(pool(), Admit("a", PROMPT, 100, checkpoint=96), EndStep())
    saved = admitted.tables[1][0]  # ceil(100 / 64) - 2: the position before the running one
    assert saved != NULL_BLOCK
    assert ended == StepEnded(3)  # full block 0, the full tail, the state saved at 96
    assert state.blocks[saved].partial_at == 96
    assert state.blocks[admitted.tables[1][1]].partial is None  # the running state at 100
    state, _ = run(state, Finish("a"))
    state, (resend,) = run(state, Admit("b", PROMPT, 4))
    assert resend.hit == 96
    assert (1, saved, resend.tables[1][1]) in resend.copies
    # the twin: the same chunk naming no checkpoint leaves no state at 96, so no hit inside
    state, _ = run(pool(), Admit("a", PROMPT, 100), EndStep(), Finish("a"))
    state, (resend,) = run(state, Admit("b", PROMPT, 4))
    assert resend.hit == 0


def test_docstring_example_of_the_unit_checkpoint_position():
    assert spec.unit_checkpoint_position(MambaState(64, MambaMode.ALIGN), 100) == 0


def test_a_chunk_inside_the_prompt_saves_a_unit_position_a_diverging_prompt_hits():
    """CKPT-INNER-2 in a chunk that does not end the prompt: [0, 160) of a 200-token prompt
    (state B=64, attention B=16) saves the state at 112 into position 1 (ceil(160 / 64) - 2);
    a prompt sharing 120 tokens, then diverging, hits 112 (attention keys every 16 tokens);
    the twin naming no checkpoint leaves it 0 (no step ended at a state boundary)."""
    layout = Layout((FullAttention(16), MambaState(64, MambaMode.ALIGN)), hit_unit=16)
    long_prompt = tuple(range(1, 201))
    diverging = (*long_prompt[:120], *range(900, 940))
    for checkpoint, hit in ((112, 112), (0, 0)):
        state = pool(layout)
        state, (admitted,) = run(state, Admit("a", long_prompt, 160, checkpoint=checkpoint))
        state, _ = run(state, EndStep(), Extend("a", 40), EndStep(), Finish("a"))
        if checkpoint:
            assert state.blocks[admitted.tables[1][1]].partial_at == 112
        state, (reader,) = run(state, Admit("b", diverging, 4))
        assert reader.hit == hit


# --- RET-SPARSE-2/-3: `unit U` under sparse retention ---------------------------------------


def test_sparse_retention_keeps_the_prompts_tail_and_drops_a_state_saved_mid_prompt():
    """Chunks [0, 120) and [120, 200) of a 200-token prompt save the states at 112 and 192 in
    passing (CKPT-INNER-2). Under sparse retention the re-send hit inside a block (192:
    RET-SPARSE-1 floors to U) stays served, while 112 (no retained length) is not keyed
    (RET-SPARSE-3): the prompt diverging after 120 hits 112 under dense retention, 0 under
    sparse. The twin naming no checkpoint in the tail chunk leaves the re-send 0."""
    layout = Layout((FullAttention(16), MambaState(64, MambaMode.ALIGN)), hit_unit=16)
    long_prompt = tuple(range(1, 201))
    diverging = (*long_prompt[:120], *range(900, 940))
    for retention, tail, mid in (
        (Retention.DENSE, 192, 112),
        (Retention.SPARSE, 192, 0),
        (Retention.SPARSE, 0, 0),
    ):
        state = pool(layout, retention=retention)
        state, _ = run(state, Admit("a", long_prompt, 120, checkpoint=112), EndStep())
        state, _ = run(state, Extend("a", 80, checkpoint=tail), EndStep(), Finish("a"))
        _, (reader,) = run(state, Admit("b", diverging, 4))
        assert reader.hit == mid, retention
        _, (resend,) = run(state, Admit("c", long_prompt, 4))
        assert resend.hit == tail, (retention, tail)


def test_sparse_retention_under_unit_keeps_the_window_blocks_a_tail_hit_reads():
    """RET-SPARSE-2 at a length inside a block: SW B=64 W=64 with U=16, prompt 100 (re-send
    96): the window [33, 96) lies in blocks 0 and 1; block 0 is kept, and the tail key of
    block 1 serves the rest, so a re-send hits 96 under sparse retention as under dense."""
    layout = Layout((FullAttention(64), SlidingWindow(64, 64)), hit_unit=16)
    for retention in Retention:
        state = written(layout=layout, chunks=(100,), retention=retention)
        state, (resend,) = run(state, Admit("b", PROMPT, 4))
        assert resend.hit == 96, retention


@pytest.mark.parametrize(
    ("start", "checkpoint", "fragment"),
    [
        (64, 96, "holds the state the chunk reads"),  # [64, 100): position 0 is read
        (0, 90, "a multiple of U=16 inside a block"),  # not a multiple of the unit
    ],
)
def test_a_unit_checkpoint_the_chunk_cannot_save_is_refused(start, checkpoint, fragment):
    state = pool()
    if start:
        state, _ = run(state, Admit("a", PROMPT, start), EndStep())
        op = Extend("a", 100 - start, checkpoint=checkpoint)
    else:
        op = Admit("a", PROMPT, 100, checkpoint=checkpoint)
    with pytest.raises(InvalidOp, match=fragment):
        step(state, op)


def test_a_decode_chunk_names_no_unit_checkpoint():
    state, _ = run(pool(), Admit("a", PROMPT, 100), EndStep())
    with pytest.raises(InvalidOp, match="not a block boundary"):
        step(state, Extend("a", 13, appended=tuple(range(13)), checkpoint=112))


def test_a_tail_key_stays_when_its_block_is_registered_whole():
    layout = Layout((FullAttention(32),), hit_unit=16)
    state, (admitted, _) = run(pool(layout), Admit("a", PROMPT[:60], 60), EndStep())
    block = admitted.tables[0][1]  # T=48, inside block 1 [32, 64)
    for token in range(4):  # decode to 64 tokens: block 1 is whole
        state, _ = run(state, Extend("a", 1, appended=(token,)), EndStep())
    assert state.blocks[block].key is not None
    assert state.blocks[block].partial_at == 48
    state, _ = run(state, Finish("a"))
    state, (admitted,) = run(state, Admit("b", (*PROMPT[:50], 5), 51))
    assert admitted.hit == 48  # a prompt diverging after 48 still finds the tail key


# --- ALLOC-UNIT-3: a hit inside a block copies it ------------------------------------------


def test_a_resend_hits_the_tail_and_copies_both_tail_blocks():
    state = written()
    state, (admitted, ended) = run(state, Admit("b", PROMPT, 96), EndStep())
    assert admitted.hit == 96
    assert admitted.scheduled == 4
    (g0, source0, target0), (g1, source1, target1) = admitted.copies
    assert (g0, g1) == (0, 1)
    assert admitted.tables[0][1] == target0
    assert admitted.tables[1][1] == target1
    assert state.blocks[source0].partial_at == 96
    assert state.blocks[source1].partial_at == 96
    assert ended == StepEnded(0)  # its own tail was a hit: nothing new to key
    assert state.blocks[source0].ref_count == 0  # released at the end of the step, still keyed
    assert state.blocks[source0].partial is not None


def test_docstring_example_of_the_tail_source():
    layout = Layout((FullAttention(64),), hit_unit=16)
    state = written(layout=layout, chunks=(100,))  # a's block 1 keyed at 96
    longer = (*PROMPT, *range(200, 228))  # w: block 1 [64, 128) whole
    state, _ = run(state, Admit("w", longer, 128), EndStep(), Finish("w"))
    whole = spec.tail_source(state, 0, (*longer, 5), (), 80)
    assert state.blocks[whole].key is not None  # the whole-block key is the longest
    partial = spec.tail_source(state, 0, (*PROMPT[:96], 5), (), 80)
    assert state.blocks[partial].partial_at == 96
    assert partial != whole


def test_a_longer_prompt_hits_the_tail_and_a_shorter_one_cannot_name_it():
    layout = Layout((FullAttention(64), SlidingWindow(64, 32)), hit_unit=16)
    state = written(layout=layout, chunks=(100,))
    state, (longer,) = run(state, Admit("b", (*PROMPT, *range(300, 340)), 140))
    assert longer.hit == 96
    assert len(longer.copies) == 2
    state, (shorter,) = run(state, Admit("c", PROMPT[:90], 90))
    assert shorter.hit == 64
    assert shorter.copies == ()


def test_split_tails_leaves_block_ends_alone():
    tables, sources = spec.split_tails(HYBRID, 64, ((3,), (4,)))
    assert tables == ((3,), (4,))
    assert sources == ()
    tables, sources = spec.split_tails(HYBRID, 80, ((3, 9), (0, 4)))
    assert tables == ((3,), (0,))
    assert sources == ((0, 1, 9), (1, 1, 4))


def test_a_copy_source_is_held_until_the_step_ends():
    state = written(blocks=7)  # 6 usable blocks; the writer left 3 cached
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    sources = {source for _, source, _ in admitted.copies}
    state, (other,) = run(state, Admit("c", tuple(range(500, 564)), 64))
    assert isinstance(other, Waiting)  # the free blocks left are the held sources' only
    assert all(state.blocks[s].ref_count == 1 for s in sources)
    state, _ = run(state, EndStep())
    assert all(state.blocks[s].ref_count == 0 and s in state.free for s in sources)


def test_preempting_a_chunk_in_flight_releases_its_sources():
    state = written()
    state, (admitted, _) = run(state, Admit("b", PROMPT, 96), Preempt("b"))
    assert all(state.blocks[s].ref_count == 0 for _, s, _ in admitted.copies)
    assert state.requests == {}


def test_a_salted_request_is_not_served_another_tenants_tail():
    state = written()
    salted = (Extra(ExtraKind.CACHE_SALT, "t2"),)
    state, (admitted,) = run(state, Admit("b", PROMPT, 96, salted))
    assert admitted.hit == 0
    assert admitted.copies == ()


# --- HIT-UNIT-5: under same-pass a block in flight is a table entry, never a copy source ---

FULL = Layout((FullAttention(64),), hit_unit=16)
LONG = (*PROMPT, *range(200, 228))  # 128 tokens: blocks 0 and 1 whole


def test_a_block_in_flight_serves_whole_blocks_but_is_not_copied():
    """b re-sends a's 128-token prompt in a's step: its limit 127 ends inside block 1, whose
    whole key a's chunk just published (ALLOC-VIS-2) but a's pass has not written."""
    state = pool(FULL, visibility="same-pass")
    state, (a, b) = run(state, Admit("a", LONG, 128), Admit("b", LONG, 128))
    assert b.hit == 64  # 112 would copy a's block 1 before a's pass writes it
    assert b.tables[0][0] == a.tables[0][0]  # block 0 in flight: a table entry is sound
    assert b.copies == ()
    state, (_, c) = run(state, EndStep(), Admit("c", LONG, 128))
    assert c.hit == 112  # once the pass has run, a's block 1 is a copy source
    assert c.copies == ((0, a.tables[0][1], c.tables[0][1]),)


def test_the_step_end_profile_serves_nothing_of_a_chunk_in_flight():
    state = pool(FULL)
    state, (_, b) = run(state, Admit("a", LONG, 128), Admit("b", LONG, 128))
    assert b.hit == 0


def test_a_block_in_flight_is_copied_under_a_key_an_earlier_step_registered():
    """x keyed its block 1 at 96 (an earlier step); a resumes from that tail and publishes
    its own block 1 whole (in flight); b, in a's step, copies x's block under the older key."""
    state = written(layout=FULL, chunks=(100,), visibility="same-pass")
    state, (a, b) = run(state, Admit("a", LONG, 128), Admit("b", LONG, 128))
    assert a.hit == 96
    assert len(a.copies) == 1
    (_, older, _) = a.copies[0]
    assert b.hit == 96
    assert b.copies == ((0, older, b.tables[0][1]),)  # not a's block 1: a's pass writes it


def test_withdrawing_a_block_keeps_its_older_tail_key_for_the_copies_reading_it():
    """Found by the differential machine: a keyed its block at 2 (step 1); b copies it; a's
    next chunk publishes the block whole and a is released before its pass. The block loses
    its block key, keeps the tail key and the content it names, and b's copy stays sound."""
    full = Layout((FullAttention(4),), hit_unit=1)
    state = pool(full, 4, visibility="same-pass")
    state, (a, _, b, _, released) = run(
        state,
        Admit("a", (1, 2, 3), 3),
        EndStep(),
        Admit("b", (1, 2), 2),
        Extend("a", 1, appended=(0,)),
        Finish("a"),
    )
    block = state.blocks[a.tables[0][0]]
    assert b.copies == ((0, a.tables[0][0], b.tables[0][0]),)
    assert released == spec.Released(0)  # b still holds the source
    assert block.key is None
    assert block.partial_at == 2
    assert block.content == (0, (1, 2), ())


def test_docstring_example_of_a_block_in_flight():
    from kvcert.spec.acceptance import group_accepts, uncopied

    full, cached, flight = FullAttention(4), frozenset({0, 1}), frozenset({1})
    assert group_accepts(full, cached, 8, unit=1, in_flight=flight)
    assert not group_accepts(full, cached, 6, unit=1, in_flight=flight)
    assert group_accepts(full, cached, 6, unit=1, partial=frozenset({7}), in_flight=flight)
    assert uncopied({0: 4, 1: 8}, 4, frozenset(), 1) == {0: 4}
    assert uncopied({0: 4, 1: 8}, 4, frozenset({5, 7}), 1) == {0: 4, 1: 7}


def test_a_view_refuses_blocks_in_flight_it_does_not_cache():
    from kvcert.spec import CacheView, InvalidRequest

    with pytest.raises(InvalidRequest, match="not cached"):
        CacheView(FULL, 100, (frozenset({0}),), in_flight=(frozenset({1}),))
    with pytest.raises(InvalidRequest, match="frozenset"):
        CacheView(FULL, 100, (frozenset({0}),), in_flight=({0},))
    with pytest.raises(InvalidRequest, match="HIT-UNIT-5"):
        CacheView(Layout(FULL.groups), 100, (frozenset({0}),), in_flight=(frozenset({0}),))


def test_a_copy_of_a_block_in_flight_breaks_inv_copy_2():
    """The broken twin of HIT-UNIT-5: a spec whose lookup ignores blocks in flight copies a's
    unwritten block 1 into b, and INV-COPY-2 says so."""
    state = pool(FULL, visibility="same-pass")
    state, _ = run(state, Admit("a", LONG, 128))
    original = spec.blocks_in_flight
    try:
        spec.blocks_in_flight = lambda state: frozenset()
        broken, b = step(state, Admit("b", LONG, 128))
    finally:
        spec.blocks_in_flight = original
    assert b.hit == 112
    assert violated(broken) == ["INV-COPY-2"]


# --- ALLOC-UNIT-4: a keyed state block is copied before it is overwritten ------------------


def test_docstring_example_of_keeping_a_state_checkpoint():
    state, (admitted, _) = run(pool(), Admit("a", PROMPT, 96), EndStep())
    keyed = admitted.tables[1][1]
    state, (extended, _) = run(state, Extend("a", 4), EndStep())
    (group, source, target) = extended.copies[0]
    assert (group, source) == (1, keyed)
    assert extended.tables[1][1] == keyed != target  # the table only grows: a writes 7 itself
    assert state.blocks[target].ref_count == 0  # released at the step's end, cached
    assert state.blocks[target].partial_at == 96
    assert state.blocks[keyed].partial is None
    assert state.blocks[keyed].ref_count == 1  # a's running state block
    assert len(extended.copies) == 1  # attention keeps writing its own tail block


def test_a_finished_writer_leaves_its_checkpoint_cached():
    state, _ = run(pool(), Admit("a", PROMPT, 96), EndStep(), Finish("a"))
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    assert admitted.hit == 96


def test_mode_all_keys_and_keeps_the_tail_too():
    layout = Layout((FullAttention(64), MambaState(64, MambaMode.ALL)), hit_unit=16)
    state = written(layout=layout)
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    assert admitted.hit == 96


def test_mode_none_keys_nothing_and_serves_no_state_hit():
    layout = Layout((FullAttention(64), MambaState(64, MambaMode.NONE)), hit_unit=16)
    state = written(layout=layout)
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    assert admitted.hit == 0


def test_cross_attention_takes_no_block_under_the_unit_profile():
    """A cross-attention group keeps no keys and no blocks (its KV is the encoder's): the
    unit profile serves the full group's hit and leaves the cross table empty."""
    layout = Layout((FullAttention(64), CrossAttention(64)), hit_unit=16)
    _, (admitted,) = run(written(layout=layout), Admit("b", PROMPT, 96))
    assert admitted.hit == 96
    assert admitted.tables[1] == ()


# --- the block profile is the unit profile at U = B -----------------------------------------


def _played(layout, ops):
    state = initial_state(PoolConfig(layout, 24))
    out = []
    for op in ops:
        if isinstance(op, Finish) and op.rid not in state.requests:
            continue  # its admission waited
        state, observation = step(state, op)
        out.append(observation)
    return out


@st.composite
def _sessions(draw):
    ops = []
    for rid in "abc":
        length = draw(st.integers(1, 40))
        base = draw(st.sampled_from([PROMPT, (*PROMPT[:20], *range(300, 400))]))
        ops.append(Admit(rid, base[:length], draw(st.integers(1, 40))))
        ops.append(EndStep())
        if draw(st.booleans()):
            ops.append(Finish(rid))
    return ops


@given(ops=_sessions(), size=st.sampled_from([2, 4, 8]))
def test_unit_equal_to_the_block_size_is_the_block_profile(ops, size):
    groups = (FullAttention(size), MambaState(size), SlidingWindow(size, 5))
    plain = _played(Layout(groups), ops)
    unit = _played(Layout(groups, hit_unit=size), ops)
    assert unit == plain


# --- completeness of the registration: a re-send is served its tail boundary ---------------


@st.composite
def unit_layouts(draw, max_groups=3):
    """A layout without draft groups under `unit U`, U a divisor of every cacheable size."""
    body = draw(layouts(max_groups=max_groups, speculative=False))
    sizes = math.gcd(*(g.block_size for g in body.groups if is_cacheable(g)))
    unit = draw(st.sampled_from([d for d in range(1, sizes + 1) if sizes % d == 0]))
    return Layout(body.groups, hit_unit=unit)


def _serves_a_resend(layout):
    return all(
        not isinstance(g, MambaState) or g.mode is not MambaMode.NONE
        for g in layout.groups
        if is_cacheable(g)
    )


@given(layout=unit_layouts(), length=st.integers(2, 40), budget=st.integers(1, 40))
def test_a_resend_of_a_finished_prompt_is_served_its_tail(layout, length, budget):
    """The writer computes its prompt in chunks of `budget`, but ends one at the tail
    boundary T (CKPT-ALIGN-1's stop, at unit granularity), decodes once and finishes; a
    re-send of the prompt then hits T exactly in an ample pool, for every layout whose
    groups keep keys."""
    prompt = PROMPT[:length]
    tail = tail_boundary(layout.hit_unit, length)
    state = initial_state(PoolConfig(layout, 400))
    rid = "a"
    computed = 0  # a window of one token may hit on a fresh pool: computed is read back
    while computed < length:
        stop = tail if computed < tail else length
        chunk = min(budget, stop - computed)
        op = Extend(rid, chunk) if rid in state.requests else Admit(rid, prompt, chunk)
        state, _ = run(state, op, EndStep())
        computed = state.requests[rid].computed
    state, _ = run(state, Extend(rid, 1, appended=(7,)), EndStep(), Finish(rid))
    state, (admitted,) = run(state, Admit("b", prompt, length))
    if _serves_a_resend(layout):
        assert admitted.hit == tail
    else:
        assert admitted.hit == 0


def test_a_resend_without_a_chunk_ending_at_the_tail_loses_the_state_checkpoint():
    """The broken twin of the property above: a state group keys its tail only where a step
    ends there, so chunking past it leaves a re-send the last whole-block checkpoint."""
    state = written(chunks=(100,))
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    assert admitted.hit == 0  # block 0's state was never checkpointed either


# --- the machine: random operations keep every invariant -----------------------------------


class UnitSpecSelfCheck(SpecSelfCheck):
    """test_alloc's self-check machine under `unit U` (lru or lru-unkeyed-first, step-end or
    same-pass): every invariant holds after each operation, INV-COPY-1 (copies carry the
    request's tokens), INV-COPY-2 (they read written KV) and INV-KEY-1 on partial keys among
    them; and every copy's target is in the request's table (ALLOC-UNIT-3), or its source is,
    a state block keyed at a tail that the chunk writes (ALLOC-UNIT-4)."""

    @initialize(
        layout=unit_layouts(),
        blocks=st.integers(2, 40),
        eviction=st.sampled_from(["lru", "lru-unkeyed-first"]),
        visibility=st.sampled_from(["step-end", "same-pass"]),
    )
    def start(self, layout, blocks, eviction, visibility):
        config = PoolConfig(layout, blocks, eviction=eviction, visibility=visibility)
        self.state = initial_state(config)

    def _apply(self, op):
        withdrawn = isinstance(op, Preempt | Finish) and self._read_by_others(op.rid)
        if withdrawn:  # ALLOC-VIS-3 refuses it: another request reads the chunk in flight
            with pytest.raises(InvalidOp, match="ALLOC-VIS-2"):
                step(self.state, op)
            return
        self.state, observation = step(self.state, op)
        if isinstance(observation, Admitted | Extended):
            for g, source, target in observation.copies:
                assert target not in (NULL_BLOCK, source)
                if target not in observation.tables[g]:  # ALLOC-UNIT-4: a kept checkpoint
                    assert source in observation.tables[g]
                    assert self.state.blocks[source].partial is not None

    def _read_by_others(self, rid):
        request = self.state.requests.get(rid)
        if request is None or not request.published:
            return False
        mine = {
            request.tables[g][j]
            for g, start in enumerate(request.published)
            for j in range(start, request.registered[g])
        }
        others = (r for other, r in self.state.requests.items() if other != rid)
        return any(b in mine for r in others for table in r.tables for b in table)


TestUnitSpecSelfCheck = UnitSpecSelfCheck.TestCase


def test_chunked_local_tails_are_keyed_like_full_attention():
    layout = Layout((ChunkedLocal(64, 128),), hit_unit=16)
    state = written(layout=layout, chunks=(100,))
    state, (admitted,) = run(state, Admit("b", PROMPT, 96))
    assert admitted.hit == 96
    assert len(admitted.copies) == 1


# --- broken twins: the invariants' unit clauses each fail on a state that breaks them ------


def _copying():
    """b re-sends the prompt: its chunk in flight copies both tails."""
    state, (admitted,) = run(written(), Admit("b", PROMPT, 96))
    return state, admitted.copies


def _with_block(state, b, **changes):
    blocks = list(state.blocks)
    blocks[b] = dataclasses.replace(blocks[b], **changes)
    return dataclasses.replace(state, blocks=tuple(blocks))


def test_a_partial_key_not_describing_its_content_breaks_inv_key():
    state, ((_, source, _), _) = _copying()
    assert "INV-KEY-1" in violated(_with_block(state, source, partial_at=80))
    assert "INV-KEY-1" in violated(_with_block(state, source, partial_at=0))


def test_a_partial_key_past_what_its_holder_computed_breaks_inv_vis():
    state, (admitted,) = run(pool(), Admit("a", PROMPT, 96))
    tail = admitted.tables[0][1]
    key = spec.partial_key(PROMPT, 64, 96)
    broken = _with_block(state, tail, partial=(0, key), partial_at=96, content=(0, PROMPT[:96], ()))
    assert "INV-VIS-1" in violated(broken)


def test_a_copy_of_other_tokens_breaks_inv_copy():
    state, ((_, full_source, _), (_, state_source, _)) = _copying()
    other = (0, (9, *PROMPT[1:96]), ())
    assert "INV-COPY-1" in violated(_with_block(state, full_source, content=None))
    assert "INV-COPY-1" in violated(_with_block(state, full_source, content=other))
    longer = (1, PROMPT[:100], ())  # a state at 100 copied to resume at 96
    assert "INV-COPY-1" in violated(_with_block(state, state_source, content=longer))
    salted = (0, PROMPT[:96], (Extra(ExtraKind.CACHE_SALT, "t2"),))
    assert "INV-COPY-1" in violated(_with_block(state, full_source, content=salted))
