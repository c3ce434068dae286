"""§6c checkpoint placement: every number in the rules' diagrams (CKPT-ALL-1, CKPT-ALIGN-1,
CKPT-BRANCH-1, BRANCH-1) and the placement dispatch."""

from __future__ import annotations

import pytest

from kvcert.spec import FullAttention, InvalidRequest, Layout, MambaMode, MambaState
from kvcert.spec.alloc import Admit, EndStep, Finish, PoolConfig, initial_state, step
from kvcert.spec.checkpoints import (
    Placement,
    align_chunk,
    all_chunk,
    branch_chunk,
    branch_point,
    next_chunk,
)


def chunks(placement: str, num_tokens: int, budget: int, block: int, branch: int = 0) -> list[int]:
    """The prefill chunks a prompt is computed in under a placement."""
    out, computed = [], 0
    while computed < num_tokens:
        out.append(next_chunk(placement, computed, num_tokens, budget, block, branch=branch))
        computed += out[-1]
    return out


def test_all_takes_the_budget_capped_by_the_prompt():
    """CKPT-ALL-1: prompt 100, budget 64: chunks 64, then 36."""
    assert (all_chunk(0, 100, 64), all_chunk(64, 100, 64)) == (64, 36)
    assert chunks(Placement.ALL, 100, 64, 16) == [64, 36]


def test_align_takes_whole_blocks_up_to_the_resend_boundary():
    """CKPT-ALIGN-1: block 16, prompt 100 (resend boundary 96): budget 40 gives 32 32 32 4;
    budget 8, below a block, gives six blocks of 16, then 4."""
    assert chunks("align", 100, 40, 16) == [32, 32, 32, 4]
    assert chunks("align", 100, 8, 16) == [16] * 6 + [4]
    assert align_chunk(96, 100, 40, 16) == 4  # past the boundary the tail is one chunk
    assert chunks("align", 96, 64, 16) == [64, 16, 16]  # boundary 80, not 96 (HIT-LEN-1)


def test_branch_cuts_the_align_chunk_at_the_branch_point():
    """CKPT-BRANCH-1: block 16, prompt 100, branch point 48, budget 64: chunks 48, 48, 4."""
    assert chunks("branch", 100, 64, 16, branch=48) == [48, 48, 4]
    assert branch_chunk(48, 100, 64, 16, 48) == 48  # the branch point is behind: align's chunk
    assert chunks("branch", 100, 64, 16, branch=0) == chunks("align", 100, 64, 16)


def test_a_placement_is_its_enum_or_its_exact_value():
    with pytest.raises(InvalidRequest, match="placement"):
        next_chunk("Align", 0, 100, 40, 16)


def test_the_branch_point_is_where_the_cached_attention_prefix_ends():
    """BRANCH-1: full B=4 caches a 24-token shared prompt (blocks 0..5); the state group (B=8,
    mode none) keeps no checkpoint, so a 40-token request hits 0 and branches at 24."""
    layout = Layout((FullAttention(4), MambaState(8, MambaMode.NONE)))
    shared = tuple(range(100, 124))
    state = initial_state(PoolConfig(layout, 32))
    for op in (Admit("a", (*shared, 1), 64), EndStep(), Finish("a")):
        state, _ = step(state, op)
    request = (*shared, *range(200, 216))
    state, admitted = step(state, Admit("b", request, 64))
    assert admitted.hit == 0
    assert branch_point(state, request, ()) == 24
    assert branch_point(state, (*shared[:20], *range(300, 320)), ()) == 16  # a multiple of 8
