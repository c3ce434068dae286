"""§12 Checkpoint placement: where a state group in mode align gets its checkpoints.

In mode align (ALLOC-COMMIT-1) a state group registers a checkpoint only where a scheduler
step ends on a block boundary, so the scheduler's chunking decides which lengths a later
request can hit (HIT-MAMBA-1 needs a checkpoint exactly at the hit). A placement policy is
that chunking rule for prefill; decode steps end on every boundary they cross anyway.

    all      mode all: every boundary is a checkpoint, chunks are the budget   (CKPT-ALL-1)
    align    chunks whole blocks, one ends at the longest hit a re-send takes  (CKPT-ALIGN-1)
    branch   align, and one chunk ends where the attention groups' match ends  (CKPT-BRANCH-1)

`branch` is Marconi's observation (Pan et al., 2025) in allocator terms: a prefix two requests
share is likely shared again, so the state where they diverge is worth a checkpoint; here
the divergence point is what the attention groups already hold (BRANCH-1), so the policy
needs no extra index.
"""

from __future__ import annotations

from enum import StrEnum

from kvcert.spec.acceptance import group_accepts
from kvcert.spec.alloc import State, request_keys
from kvcert.spec.errors import InvalidRequest, as_choice
from kvcert.spec.hashing import Extra, matched_blocks
from kvcert.spec.layout import MambaState


class Placement(StrEnum):
    """Checkpoint placement policies for state groups."""

    ALL = "all"  # mode all: a checkpoint at every block boundary
    ALIGN = "align"  # mode align, whole-block chunks ending at the re-send boundary
    BRANCH = "branch"  # align plus a checkpoint at the branch point


def branch_point(state: State, tokens: tuple[int, ...], extras: tuple[Extra, ...]) -> int:
    """BRANCH-1: A request's branch point is the longest length, up to the HIT-LEN-1 limit and
    a multiple of every state group's block size, that every group other than the state groups
    accepts: where the cached attention prefix ends, checkpoint or not (no speculative drop).

        full B=4 cached blocks 0..5 (24 tokens of a shared prompt), state B=8 has no
        checkpoint at 16 or 24; request of 40 tokens:   hit 0,  branch point 24

    pre: len(tokens) >= 1
    post: 0 <= __return__ <= len(tokens) - 1
    """
    layout = state.config.layout
    keys = request_keys(layout, tokens, extras)
    cached = [
        matched_blocks(
            keys[g],
            frozenset(b.key[1] for b in state.blocks if b.key is not None and b.key[0] == g),
        )
        for g in range(len(layout.groups))
    ]
    sizes = [g.block_size for g in layout.groups if isinstance(g, MambaState)]
    return max(
        length
        for length in range(len(tokens))
        if all(length % size == 0 for size in sizes)
        and all(
            group_accepts(g, cached[i], length)
            for i, g in enumerate(layout.groups)
            if not isinstance(g, MambaState)
        )
    )


def all_chunk(computed: int, num_tokens: int, budget: int) -> int:
    """CKPT-ALL-1: Under placement all the next prefill chunk is the budget, capped by the
    prompt; mode all checkpoints every boundary the chunk crosses.

        prompt 100, computed 0, budget 64:   chunk 64, then 36

    pre: 0 <= computed < num_tokens and budget >= 1
    post: 1 <= __return__ <= min(budget, num_tokens - computed)
    """
    return min(budget, num_tokens - computed)


def align_chunk(computed: int, num_tokens: int, budget: int, block: int) -> int:
    """CKPT-ALIGN-1: Under placement align a prefill chunk is whole blocks (at least one) and
    stops at the resend boundary, the longest hit a re-send of the prompt can take,
    ((num_tokens - 1) // block) * block; past it the prompt's tail is one chunk.

        block 16, prompt 100 (resend boundary 96), budget 40:  chunks 32 32 32 4
        budget 8 (below a block):                               chunks 16 x 6, then 4

    Stopping at num_tokens - num_tokens % block instead would checkpoint where a re-send of
    a block-aligned prompt cannot use it (HIT-LEN-1 leaves its last token to compute).

    pre: 0 <= computed < num_tokens and budget >= 1 and block >= 1
    post: 1 <= __return__ <= num_tokens - computed
    """
    boundary = ((num_tokens - 1) // block) * block
    if computed >= boundary:
        return num_tokens - computed
    whole = max(block, budget // block * block)
    return min(whole, boundary - computed)


def branch_chunk(computed: int, num_tokens: int, budget: int, block: int, branch: int) -> int:
    """CKPT-BRANCH-1: Under placement branch a prefill chunk is the align chunk, cut short to
    end at the request's branch point (BRANCH-1) when it lies ahead, so the state where the
    request leaves the cached prefix is checkpointed.

        block 16, prompt 100, branch point 48, budget 64:   chunks 48 (ends at 48), 48, 4

    pre: 0 <= computed < num_tokens and budget >= 1 and block >= 1 and branch % block == 0
    post: 1 <= __return__ <= num_tokens - computed
    """
    chunk = align_chunk(computed, num_tokens, budget, block)
    if computed < branch < computed + chunk:
        return branch - computed
    return chunk


def next_chunk(
    placement: Placement,
    computed: int,
    num_tokens: int,
    budget: int,
    block: int,
    *,
    branch: int = 0,
) -> int:
    """The next prefill chunk under a placement policy (dispatch only; the rules are above)."""
    placement = as_choice(Placement, placement, "placement", InvalidRequest)
    if placement is Placement.ALL:
        return all_chunk(computed, num_tokens, budget)
    if placement is Placement.ALIGN:
        return align_chunk(computed, num_tokens, budget, block)
    return branch_chunk(computed, num_tokens, budget, block, branch)
