"""§6-7 the allocator state machine: rule examples, broken states, a self-check machine."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcert.spec import (
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
from kvcert.spec.alloc import (
    NULL_BLOCK,
    Admit,
    Admitted,
    Block,
    CacheReset,
    EndStep,
    Extend,
    Extended,
    Finish,
    PoolConfig,
    Preempt,
    Released,
    ResetCache,
    StepEnded,
    Waiting,
    allowed_checkpoints,
    initial_state,
    step,
)
from kvcert.spec.invariants import INVARIANTS, violated
from tests.strategies import layouts

PROMPT = tuple(range(100, 140))  # 40 distinct tokens


def run(state, *ops):
    observations = []
    for op in ops:
        state, observation = step(state, op)
        assert violated(state) == [], (op, violated(state))
        observations.append(observation)
    return state, observations


def pool(*groups, blocks=64, speculative=None):
    return initial_state(PoolConfig(Layout(tuple(groups), speculative), blocks))


def test_initial_state_frees_every_block_but_the_null_one():
    """ALLOC-INIT-1."""
    state = pool(FullAttention(4), blocks=5)
    assert state.free == (1, 2, 3, 4)
    assert violated(state) == []


def test_blocks_become_hittable_only_at_the_end_of_the_step():
    """VIS-1 (vLLM #41838): b admitted in a's step misses; after EndStep it hits."""
    state = pool(FullAttention(16))
    state, (first, same_step, _, next_step) = run(
        state, Admit("a", PROMPT, 64), Admit("b", PROMPT, 64), EndStep(), Admit("c", PROMPT, 64)
    )
    assert (first.hit, same_step.hit) == (0, 0)
    assert next_step.hit == 32  # 40 tokens: limit 39, two whole blocks of a


def test_hit_blocks_are_shared_and_counted():
    """ALLOC-LOOKUP-1: c's hit names a's blocks; their counts go to 2."""
    state, (a, _, c) = run(
        pool(FullAttention(16)), Admit("a", PROMPT, 64), EndStep(), Admit("c", PROMPT, 64)
    )
    assert c.tables[0][:2] == a.tables[0][:2]
    assert [state.blocks[b].ref_count for b in c.tables[0][:2]] == [2, 2]


def test_duplicates_are_cached_and_the_earliest_is_served():
    """ALLOC-LOOKUP-1: a and b compute the same blocks in one step: two copies, a's first."""
    _state, (a, b, ended, c) = run(
        pool(FullAttention(16)),
        Admit("a", PROMPT, 64),
        Admit("b", PROMPT, 64),
        EndStep(),
        Admit("c", PROMPT, 64),
    )
    assert ended.registered == 4
    assert c.tables[0][:2] == a.tables[0][:2] != b.tables[0][:2]


def test_out_of_capacity_waits_and_changes_nothing():
    """ALLOC-TWO-PHASE-1: 40 tokens need 3 blocks of 16; a pool of 3 free blocks has room for
    one such request, not two."""
    state, (a,) = run(pool(FullAttention(16), blocks=4), Admit("a", PROMPT, 64))
    assert isinstance(a, Admitted)
    after, observation = step(state, Admit("b", tuple(range(40)), 64))
    assert observation == Waiting(needed=3, free=0)
    assert after is state


def test_free_hit_blocks_count_against_capacity_and_are_never_evicted_by_their_request():
    """ALLOC-TWO-PHASE-1 (vLLM #33775): a's 2 cached blocks sit at the head of the free
    queue; c hits them and needs 1 new block. The hits are taken first, so the new block is
    not one of them."""
    _state, (a, _, _, c) = run(
        pool(FullAttention(16), blocks=4),
        Admit("a", PROMPT, 64),
        EndStep(),
        Finish("a"),
        Admit("c", PROMPT, 64),
    )
    assert c.hit == 32
    assert c.tables[0][:2] == a.tables[0][:2]
    assert c.tables[0][2] not in c.tables[0][:2]


def test_eviction_takes_the_head_and_forgets_the_key():
    """ALLOC-EVICT-1: after a finishes, an unrelated b reuses a's blocks; a's prefix misses."""
    _state, obs = run(
        pool(FullAttention(16), blocks=4),
        Admit("a", PROMPT, 64),
        EndStep(),
        Finish("a"),
        Admit("b", tuple(range(40)), 64),
        EndStep(),
        Finish("b"),
        Admit("a2", PROMPT, 64),
    )
    assert obs[-1].hit == 0


def test_lru_free_order_puts_group_zero_first():
    """ALLOC-FREE-1, case C12 / vLLM #42948: after a finishes, the queue tail holds group 0's
    blocks (last position first) before group 1's, so group 0's prefix is evicted first."""
    state, (a, _, _) = run(
        pool(FullAttention(16), SlidingWindow(16, 32)),
        Admit("a", PROMPT, 64),
        EndStep(),
        Finish("a"),
    )
    g0, g1 = a.tables
    assert state.free[-6:] == (*reversed(g0), *reversed(g1))


def test_sliding_window_releases_blocks_outside_the_window_with_nulls():
    """ALLOC-SKIP-1/ALLOC-HOLD-1: W=8, B=4: computing token 20 needs tokens 13.., so positions
    0..2 are released, latest first, and replaced by the null block."""
    state, (a, _, extended) = run(
        pool(SlidingWindow(4, 8)), Admit("a", PROMPT, 20), EndStep(), Extend("a", 4)
    )
    assert extended.tables[0][:3] == (NULL_BLOCK,) * 3
    assert state.free[-3:] == (a.tables[0][2], a.tables[0][1], a.tables[0][0])


def test_attention_registers_in_whole_units_of_the_hit_alignment():
    """ALLOC-COMMIT-1: full B=2 beside a window B=1 (A=2): a chunk ending at 3 registers the
    window's positions 0 and 1, not 2 (it waits for computed 4); one ending at 5 leaves
    position 4 waiting, and a finish gives it back uncached."""
    layout = Layout((FullAttention(2), SlidingWindow(1, 4)))
    state = initial_state(PoolConfig(layout, 16))
    state, (_, ended, _, fourth, _, fifth) = run(
        state,
        Admit("a", PROMPT[:6], 3),
        EndStep(),
        Extend("a", 1),
        EndStep(),
        Extend("a", 1),
        EndStep(),
    )
    assert ended == StepEnded(registered=1 + 2)  # full 0; window 0, 1
    assert fourth == StepEnded(registered=1 + 2)  # full 1; window 2, 3 (computed 4)
    assert fifth == StepEnded(registered=0)  # window 4 waits for computed 6
    waiting = state.requests["a"].tables[1][4]
    state, _ = run(state, Finish("a"))
    assert state.blocks[waiting].key is None


def test_a_position_released_before_its_unit_is_no_published_block():
    """ALLOC-VIS-3 with ALLOC-COMMIT-1's units: a window of 1 (A=2) releases position 0 before
    it is registered, so finishing the request whose chunk is in flight is no withdrawal of
    a block another request holds (the null block is nobody's hit)."""
    layout = Layout((FullAttention(2), SlidingWindow(1, 1)))
    state = initial_state(PoolConfig(layout, 8, visibility="same-pass"))
    ops = [Admit("a", PROMPT[:2], 2), Admit("b", PROMPT[:3], 1), Admit("c", PROMPT[:2], 1)]
    state, _ = run(state, *ops, EndStep(), Extend("c", 4))
    assert state.requests["c"].tables[1][0] == NULL_BLOCK
    _, (released,) = run(state, Finish("c"))
    assert released == Released(blocks=2)


def test_same_pass_publishes_attention_at_once_and_state_at_the_step_end():
    """ALLOC-VIS-2's diagram: b, with a's 64-token prefix plus 8, looks up in a's step. Full
    attention alone serves it a's four blocks; beside a state group (align) b hits 0, as the
    state at 64 waits for the step's end (ALLOC-VIS-1); after it, c hits 64."""
    prefix, tail = tuple(range(500, 564)), tuple(range(600, 608))
    ops = [Admit("a", (*prefix, 1), 64), Admit("b", (*prefix, *tail), 64)]
    alone = initial_state(PoolConfig(Layout((FullAttention(16),)), 32, visibility="same-pass"))
    _, (_, b) = run(alone, *ops)
    assert b.hit == 64
    hybrid = Layout((FullAttention(16), MambaState(16, MambaMode.ALIGN)))
    state = initial_state(PoolConfig(hybrid, 32, visibility="same-pass"))
    _, (_, b, _, c) = run(state, *ops, EndStep(), Admit("c", (*prefix, *tail), 64))
    assert (b.hit, c.hit) == (0, 64)


def test_mamba_align_registers_a_checkpoint_only_where_a_step_ends_on_a_boundary():
    """ALLOC-COMMIT-1: steps ending at 16 (aligned) and 20 (not) with B=8: one checkpoint."""
    state, (_, ended1, _, ended2) = run(
        pool(MambaState(8, MambaMode.ALIGN)),
        Admit("a", PROMPT, 16),
        EndStep(),
        Extend("a", 4),
        EndStep(),
    )
    assert (ended1.registered, ended2.registered) == (1, 0)
    state, (hit,) = run(state, Admit("b", PROMPT[:30], 30))
    assert hit.hit == 16


def test_an_inner_checkpoint_registers_the_state_at_its_boundary():
    """CKPT-INNER-1: one chunk [0, 30) naming 24 (B=8) registers the state at 24 as a chunk
    ending there would; without it nothing (30 is no boundary); attention registers its own."""
    layout = (FullAttention(8), MambaState(8, MambaMode.ALIGN))
    state, (admitted, ended) = run(
        pool(*layout), Admit("a", PROMPT[:30], 30, checkpoint=24), EndStep()
    )
    assert admitted.tables[1] == (0, 0, admitted.tables[1][2], admitted.tables[1][3])
    assert ended.registered == 3 + 1  # attention 0..2, the state at 24
    _, (hit,) = run(state, Admit("b", PROMPT[:30], 30))
    assert hit.hit == 24
    plain, _ = run(pool(*layout), Admit("a", PROMPT[:30], 30), EndStep())
    _, (miss,) = run(plain, Admit("b", PROMPT[:30], 30))
    assert miss.hit == 0


def test_an_inner_checkpoint_equals_a_chunk_ending_there():
    """CKPT-INNER-1: chunk [8, 40) with checkpoint 32 registers the same keys as chunks
    [8, 32) and [32, 40)."""
    layout = (FullAttention(8), MambaState(8, MambaMode.ALIGN))
    base = (Admit("a", PROMPT, 8), EndStep())
    one, _ = run(pool(*layout), *base, Extend("a", 32, checkpoint=32), EndStep())
    two, _ = run(pool(*layout), *base, Extend("a", 24), EndStep(), Extend("a", 8), EndStep())

    def keys(state):
        return sorted(b.key for b in state.blocks if b.key is not None)

    assert keys(one) == keys(two)


@pytest.mark.parametrize(
    ("layout", "ops", "fragment"),
    [
        (
            (MambaState(8, MambaMode.ALIGN),),
            [Admit("a", PROMPT, 16, checkpoint=16)],
            "strictly inside",
        ),
        (
            (MambaState(8, MambaMode.ALIGN),),
            [Admit("a", PROMPT, 16, checkpoint=12)],
            "not a block boundary",
        ),
        ((FullAttention(8),), [Admit("a", PROMPT, 16, checkpoint=8)], "mode align"),
        ((MambaState(8, MambaMode.NONE),), [Admit("a", PROMPT, 16, checkpoint=8)], "mode align"),
        (  # the state at 12 is read from position 1: 16 would overwrite it
            (MambaState(8, MambaMode.ALIGN),),
            [Admit("a", PROMPT, 12), EndStep(), Extend("a", 12, checkpoint=16)],
            "at or after 24",
        ),
        (
            (MambaState(8, MambaMode.ALIGN), MambaState(16, MambaMode.ALIGN)),
            [Admit("a", PROMPT, 30, checkpoint=24)],
            "state group 1",
        ),
    ],
)
def test_a_misplaced_inner_checkpoint_is_refused(layout, ops, fragment):
    with pytest.raises(InvalidOp, match=fragment):
        run(pool(*layout), *ops)


def test_allowed_checkpoints_are_every_boundary_the_rule_accepts():
    """CKPT-INNER-1's placements as a list (what generators draw from): boundaries of every
    align group strictly inside the chunk, past the block the chunk's state is read from."""
    from kvcert.spec.layout import Layout

    one = Layout((MambaState(8, MambaMode.ALIGN),))
    assert allowed_checkpoints(one, 0, 30) == (8, 16, 24)
    assert allowed_checkpoints(one, 12, 40) == (24, 32)  # the state at 12 is read from 1
    assert allowed_checkpoints(one, 16, 24) == ()
    two = Layout((MambaState(8, MambaMode.ALIGN), MambaState(16, MambaMode.ALIGN)))
    assert allowed_checkpoints(two, 0, 40) == (16, 32)
    assert allowed_checkpoints(Layout((FullAttention(8),)), 0, 40) == ()


def test_speculative_state_blocks_follow_the_running_position():
    """ALLOC-SPEC-1: B=16, S=2: the prefill chunk [0, 40) writes its running state in
    position 2 alone; the decode chunk [40, 41) also writes the drafts' states, in 3 and 4;
    decoding on to 47 adds position 5 (a step ending at 49 runs in 3); max_model_len 48
    stops that (no step ends past 48)."""
    group = MambaState(16, MambaMode.ALIGN, speculative_blocks=2)
    state, (admitted, _, decoded) = run(
        pool(group), Admit("a", PROMPT, 40), EndStep(), Extend("a", 1, appended=(7,))
    )
    assert admitted.tables[0] == (NULL_BLOCK, NULL_BLOCK, admitted.tables[0][2])
    assert admitted.tables[0][2] != NULL_BLOCK
    table = decoded.tables[0]
    assert (len(table), table[2]) == (5, admitted.tables[0][2])
    assert NULL_BLOCK not in table[2:]
    state, (_, extended) = run(state, EndStep(), Extend("a", 6, appended=(7,) * 6))
    assert extended.tables[0][:5] == table
    assert len(extended.tables[0]) == 6
    assert NULL_BLOCK not in extended.tables[0][2:]
    capped = initial_state(PoolConfig(Layout((group,), None, 48), 64))
    _, (*_, at_limit) = run(capped, Admit("a", PROMPT, 40), EndStep(), Extend("a", 7, (7,) * 7))
    assert len(at_limit.tables[0]) == 5


def test_speculative_state_blocks_change_no_hit():
    """ALLOC-SPEC-1: the blocks kept for drafts' states are never registered: the same steps
    with and without them register the same keys and serve the same hit."""

    def played(spare):
        group = MambaState(8, MambaMode.ALIGN, speculative_blocks=spare)
        decode = [op for t in range(9) for op in (Extend("a", 1, (t,)), EndStep())]
        state, observations = run(
            pool(FullAttention(8), group),
            Admit("a", PROMPT, 16),
            EndStep(),
            Extend("a", 24),
            EndStep(),
            *decode,
        )
        keys = sorted(b.key for b in state.blocks if b.key is not None)
        registered = sum(o.registered for o in observations if isinstance(o, StepEnded))
        _, (hit,) = run(state, Admit("b", (*PROMPT, *range(9)), 49))
        return keys, registered, hit.hit

    plain = played(0)
    assert plain[1:] == (2 + 1 + 3 + 1 + 1 + 1, 48)  # decoding registers 48 in both groups
    assert played(1) == played(3) == plain


def test_speculative_state_blocks_count_against_capacity():
    """ALLOC-SPEC-1's positions need real blocks: after a prefill [0, 40) holding one, 2 free
    blocks hold the decode chunk [40, 41) with S=2 (positions 2..4), not with S=3 (2..5)."""

    def decode(spare):
        group = MambaState(16, MambaMode.ALIGN, speculative_blocks=spare)
        _, (_, _, decoded) = run(
            pool(group, blocks=4), Admit("a", PROMPT, 40), EndStep(), Extend("a", 1, (7,))
        )
        return decoded

    assert isinstance(decode(2), Extended)
    assert decode(3) == Waiting(3, 2)


def test_a_decode_chunk_checkpoints_the_boundary_its_accepted_drafts_crossed():
    """ALLOC-SPEC-2: B=16, S=2: the decode chunk [46, 50) (two accepted drafts and the bonus
    token) may name 48, in the block it reads from; the step registers it there, and a
    re-send hits 48. Without speculative blocks, or in a prefill chunk, 48 is refused."""
    group = MambaState(16, MambaMode.ALIGN, speculative_blocks=2)
    prompt = tuple(range(100, 146))
    base = (Admit("a", prompt, 46), EndStep())
    state, (*_, decoded, ended) = run(
        pool(group), *base, Extend("a", 4, (1, 2, 3, 4), checkpoint=48), EndStep()
    )
    assert ended.registered == 1
    assert state.blocks[decoded.tables[0][2]].key is not None
    _, (hit,) = run(state, Admit("b", (*prompt, 1, 2, 9), 49))
    assert hit.hit == 48
    assert allowed_checkpoints(Layout((group,)), 46, 50, decoding=True) == (48,)
    assert allowed_checkpoints(Layout((group,)), 46, 50) == ()
    plain = MambaState(16, MambaMode.ALIGN)
    with pytest.raises(InvalidOp, match="at or after 64"):
        run(pool(plain), *base, Extend("a", 4, (1, 2, 3, 4), checkpoint=48))


@pytest.mark.parametrize(
    ("group", "fragment"),
    [
        (lambda: MambaState(8, MambaMode.NONE, speculative_blocks=1), "needs mode align"),
        (lambda: MambaState(8, MambaMode.ALL, speculative_blocks=2), "needs mode align"),
        (lambda: MambaState(8, MambaMode.ALIGN, speculative_blocks=-1), ">= 0"),
        (lambda: MambaState(8, MambaMode.ALIGN, speculative_blocks=True), "an integer"),
    ],
)
def test_speculative_blocks_are_validated(group, fragment):
    from kvcert.spec import InvalidLayout

    with pytest.raises(InvalidLayout, match=fragment):
        group()


def test_mamba_none_never_registers():
    _state, (_, ended) = run(pool(MambaState(8, MambaMode.NONE)), Admit("a", PROMPT, 16), EndStep())
    assert ended.registered == 0


def test_exact_draft_blocks_wait_for_the_next_token():
    """ALLOC-COMMIT-1 with HASH-DRAFT-1: 16 tokens, B=8: the draft registers block 0 only,
    because block 1's next token (16) does not exist yet."""
    state, (_, ended) = run(
        pool(FullAttention(8), FullAttention(8, draft=True), speculative=Speculative.EXACT),
        Admit("a", PROMPT[:16], 16),
        EndStep(),
    )
    assert ended.registered == 2 + 1
    state, (_, ended) = run(state, Extend("a", 1, appended=(7,)), EndStep())
    assert ended.registered == 1  # the draft's block 1 now has its next token


def test_different_salts_never_share_blocks():
    """Isolation: the same prompt under another cache salt hits nothing."""
    salt_a, salt_b = (Extra(ExtraKind.CACHE_SALT, "a"),), (Extra(ExtraKind.CACHE_SALT, "b"),)
    _, obs = run(
        pool(FullAttention(8)),
        Admit("a", PROMPT, 64, extras=salt_a),
        EndStep(),
        Admit("b", PROMPT, 64, extras=salt_b),
        Admit("c", PROMPT, 64, extras=salt_a),
    )
    assert (obs[2].hit, obs[3].hit) == (0, 32)


def test_preempt_releases_like_finish_and_allows_readmission():
    _state, obs = run(
        pool(FullAttention(8)),
        Admit("a", PROMPT, 64),
        EndStep(),
        Preempt("a"),
        Admit("a", PROMPT, 64),
    )
    assert isinstance(obs[2], Released)
    assert obs[3].hit == 32


def test_reset_is_refused_while_blocks_are_held():
    """ALLOC-RESET-1."""
    _state, (_, _, refused, _, done, again) = run(
        pool(FullAttention(8)),
        Admit("a", PROMPT, 64),
        EndStep(),
        ResetCache(),
        Finish("a"),
        ResetCache(),
        Admit("b", PROMPT, 64),
    )
    assert (refused, done) == (CacheReset(False), CacheReset(True))
    assert again.hit == 0


def test_decode_appends_sampled_tokens_and_caches_output_blocks():
    _state, obs = run(
        pool(FullAttention(4)),
        Admit("a", PROMPT[:8], 8),
        EndStep(),
        Extend("a", 1, appended=(1,)),
        EndStep(),
        Extend("a", 1, appended=(2,)),
        EndStep(),
        Extend("a", 1, appended=(3,)),
        EndStep(),
        Extend("a", 1, appended=(4,)),
        EndStep(),
    )
    assert isinstance(obs[2], Extended)
    assert [o.registered for o in obs if isinstance(o, StepEnded)] == [2, 0, 0, 0, 1]


@pytest.mark.parametrize(
    ("ops", "fragment"),
    [
        ([Extend("x", 1)], "unknown request"),
        ([Finish("x")], "unknown request"),
        ([Admit("a", PROMPT, 8), Admit("a", PROMPT, 8)], "already running"),
        ([Admit("a", (), 8)], "at least one token"),
        ([Admit("a", PROMPT, 0)], "budget must be an integer >= 1"),
        ([Admit("a", PROMPT, 2.5)], "budget must be an integer >= 1"),
        ([Admit("a", PROMPT, 8, lookahead=-1)], "lookahead an integer >= 0"),
        ([Admit("a", tuple("hello world"), 8)], "must be token ids"),
        ([Admit("a", (1, -2, 3), 8)], "must be token ids"),
        ([Admit("a", (1, 2.0), 8)], "must be token ids"),
        ([Admit("a", (2**63,), 8)], "must be token ids"),
        ([Admit(7, PROMPT, 8)], "a request id is a non-empty string"),
        ([Admit("", PROMPT, 8)], "a request id is a non-empty string"),
        ([Admit("a", PROMPT[:4], 8), EndStep(), Extend("a", 1, (-1,))], "appended tokens"),
        ([Admit("a", PROMPT, 8), Extend("a", 8)], "chunk in flight"),
        ([Admit("a", PROMPT[:4], 8), EndStep(), Extend("a", 1)], "no token left"),
        ([Admit("a", PROMPT, 8), EndStep(), Extend("a", 1, appended=(1,))], "prompt tokens"),
    ],
)
def test_misuse_raises_invalid_op(ops, fragment):
    state = pool(FullAttention(4))
    with pytest.raises(InvalidOp, match=fragment):
        run(state, *ops)


def test_max_model_len_and_pool_size_are_enforced():
    state = initial_state(PoolConfig(Layout((FullAttention(4),), max_model_len=10), 8))
    with pytest.raises(InvalidOp, match="exceed max_model_len=10"):
        step(state, Admit("a", PROMPT, 8))
    state, _ = run(state, Admit("a", PROMPT[:10], 10), EndStep())
    with pytest.raises(InvalidOp, match="exceed max_model_len"):
        step(state, Extend("a", 1, appended=(1,)))
    with pytest.raises(InvalidOp, match="num_blocks must be >= 2"):
        PoolConfig(Layout((FullAttention(4),)), 1)
    with pytest.raises(InvalidOp, match="num_blocks must be an integer"):
        PoolConfig(Layout((FullAttention(4),)), "8")


# --- broken twins: each invariant fails on a state that breaks it --------------------------


def corrupt(name):
    if name == "INV-COPY-1":  # `unit U`: b's chunk in flight copies a's tail [8, 10)
        unit = initial_state(PoolConfig(Layout((FullAttention(4),), hit_unit=2), 16))
        state, (*_, b) = run(
            unit, Admit("a", PROMPT[:11], 11), EndStep(), Finish("a"), Admit("b", PROMPT[:11], 11)
        )
        ((_, source, _),) = b.copies
        blocks = list(state.blocks)
        blocks[source] = dataclasses.replace(blocks[source], content=(0, (9,) * 10, ()))
        return dataclasses.replace(state, blocks=tuple(blocks))
    if name == "INV-COPY-2":  # same-pass `unit U`: b copies a's block 2 that a writes now
        full = Layout((FullAttention(4),), hit_unit=2)
        unit = initial_state(PoolConfig(full, 16, visibility="same-pass"))
        state, (a, _) = run(unit, Admit("a", PROMPT[:12], 12), Admit("b", PROMPT[:12], 12))
        b = dataclasses.replace(state.requests["b"], computed=10, sources=((0, 2, a.tables[0][2]),))
        return dataclasses.replace(state, requests={**state.requests, "b": b})
    if name == "INV-WRITE-1":  # `unit U`: the block a's next chunk writes holds a's tail key
        unit = initial_state(PoolConfig(Layout((FullAttention(4), MambaState(4)), hit_unit=2), 16))
        state, (*_, extended) = run(unit, Admit("a", PROMPT[:7], 6), EndStep(), Extend("a", 1))
        assert len(extended.copies) == 1  # the keyed block is copied out before the pass
        a = dataclasses.replace(state.requests["a"], keeps=())  # ... but with no copy out:
        return dataclasses.replace(state, requests={**state.requests, "a": a})
    state, (a, _) = run(pool(FullAttention(4)), Admit("a", PROMPT[:10], 10), EndStep())
    state, (b,) = run(state, Admit("b", PROMPT[:10], 10))
    blocks = list(state.blocks)
    held = a.tables[0][0]
    if name == "INV-NULL-1":
        return dataclasses.replace(state, free=(*state.free, NULL_BLOCK))
    if name == "INV-REF-1":
        blocks[held] = dataclasses.replace(blocks[held], ref_count=1)
    if name == "INV-FREE-1":
        return dataclasses.replace(state, free=state.free[1:])
    if name == "INV-KEY-1":
        blocks[held] = dataclasses.replace(blocks[held], content=(0, (9, 9, 9, 9), ()))
        bad = dataclasses.replace(state, blocks=tuple(blocks))
        assert not INVARIANTS["INV-KEY-1"](bad)
        blocks[held] = dataclasses.replace(blocks[held], content=None)
    if name == "INV-HIT-1":
        request = state.requests["b"]
        foreign = state.free[0]
        blocks[foreign] = Block(ref_count=1, content=(0, (9, 9, 9, 9), ()))
        table = (foreign, *request.tables[0][1:])
        requests = {**state.requests, "b": dataclasses.replace(request, tables=(table,))}
        blocks[request.tables[0][0]] = dataclasses.replace(
            blocks[request.tables[0][0]], ref_count=blocks[request.tables[0][0]].ref_count - 1
        )
        return dataclasses.replace(
            state, blocks=tuple(blocks), requests=requests, free=state.free[1:]
        )
    if name == "INV-VIS-1":
        last = b.tables[0][-1]
        blocks[last] = dataclasses.replace(blocks[last], key=blocks[held].key)
    return dataclasses.replace(state, blocks=tuple(blocks))


@pytest.mark.parametrize("tag", sorted(INVARIANTS))
def test_each_invariant_has_a_state_that_breaks_it(tag):
    assert tag in violated(corrupt(tag))


def test_a_table_entry_under_another_groups_key_breaks_inv_hit():
    """INV-HIT-1's key check: a block registered for group 1 held in group 0's table."""
    layout = Layout((FullAttention(4), FullAttention(4, name="other")))
    state, (a, _) = run(
        initial_state(PoolConfig(layout, 16)), Admit("a", PROMPT[:10], 10), EndStep()
    )
    blocks = list(state.blocks)
    mine, other = a.tables[0][0], a.tables[1][0]
    blocks[mine] = dataclasses.replace(blocks[mine], key=blocks[other].key)
    assert "INV-HIT-1" in violated(dataclasses.replace(state, blocks=tuple(blocks)))


# --- the spec checking itself: random operation sequences keep every invariant ------------

BASES = [tuple(range(1, 33)), tuple(range(1, 9)) + tuple(range(50, 74)), tuple(range(90, 122))]


class SpecSelfCheck(RuleBasedStateMachine):
    """Drives `step` with random operations; every invariant must hold after each one."""

    def __init__(self):
        super().__init__()
        self.state = None

    @initialize(layout=layouts(max_groups=3, reach=True), blocks=st.integers(2, 40))
    def start(self, layout, blocks):
        self.state = initial_state(PoolConfig(layout, blocks))

    def _apply(self, op):
        self.state, _ = step(self.state, op)

    @rule(
        rid=st.sampled_from("abcd"),
        base=st.sampled_from(BASES),
        length=st.integers(1, 32),
        budget=st.integers(1, 32),
        lookahead=st.integers(0, 3),
        salt=st.sampled_from([(), (Extra(ExtraKind.CACHE_SALT, "s"),)]),
    )
    def admit(self, rid, base, length, budget, lookahead, salt):
        if rid not in self.state.requests:
            self._apply(Admit(rid, base[:length], budget, salt, lookahead))

    @rule(
        rid=st.sampled_from("abcd"),
        budget=st.integers(1, 16),
        token=st.integers(0, 3),
        lookahead=st.integers(0, 3),
    )
    def extend(self, rid, budget, token, lookahead):
        request = self.state.requests.get(rid)
        if request is None or request.scheduled:
            return
        appended = (token,) if request.computed == len(request.tokens) else ()
        self._apply(Extend(rid, budget, appended, lookahead))

    @rule()
    def end_step(self):
        self._apply(EndStep())

    @rule(rid=st.sampled_from("abcd"), preempt=st.booleans())
    def release(self, rid, preempt):
        if rid in self.state.requests:
            self._apply(Preempt(rid) if preempt else Finish(rid))

    @rule()
    def reset(self):
        self._apply(ResetCache())

    @invariant()
    def invariants_hold(self):
        if self.state is not None:
            assert violated(self.state) == []


TestSpecSelfCheck = SpecSelfCheck.TestCase


def test_a_draft_block_released_before_its_next_token_is_not_registered():
    """Regression found by the differential machine: with a 1-token window, draft block 0 is
    released (ALLOC-SKIP-1) before token 1 arrives, so ALLOC-COMMIT-1 has nothing to
    register there; registering it would have put a key on the null block (INV-NULL-1)."""
    state = pool(
        FullAttention(2), SlidingWindow(1, 1, draft=True), blocks=3, speculative=Speculative.EXACT
    )
    state, observations = run(
        state, Admit("b", (1,), 1), EndStep(), Extend("b", 1, appended=(0,)), EndStep()
    )
    assert observations[2].tables[1][0] == NULL_BLOCK
    # only the full group's block 0 (tokens 0-1) registers; the draft's block 1 waits for
    # token 2, and its block 0 is gone
    assert observations[3] == StepEnded(registered=1)
    assert violated(state) == []
