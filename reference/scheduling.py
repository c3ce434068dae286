"""Prefill chunking for state-checkpoint placement (spec §12: CKPT-*, BRANCH-1).

In mode align a state group checkpoints only where a step ends on a block boundary, so the
scheduler's chunk sizes decide which hits a later request can take. `next_chunk` is the
closed form of the spec's three policies; `KVCacheManager.branch_point` gives the branch
point the `branch` policy cuts at.
"""

from __future__ import annotations

from enum import StrEnum

from kvcert.reference.config import as_choice


class Placement(StrEnum):
    """Where state checkpoints go."""

    ALL = "all"  # mode all: every block boundary
    ALIGN = "align"  # whole-block chunks, one ending at the re-send boundary
    BRANCH = "branch"  # align, plus a chunk ending at the branch point


def next_chunk(
    placement: Placement,
    computed: int,
    num_tokens: int,
    budget: int,
    block: int,
    *,
    branch: int = 0,
) -> int:
    """Tokens to schedule in the next prefill step of a prompt of `num_tokens`.

    Implements CKPT-ALL-1, CKPT-ALIGN-1 and CKPT-BRANCH-1 (the branch point is BRANCH-1's,
    from KVCacheManager.branch_point)."""
    placement = as_choice(Placement, placement, "placement")
    remaining = num_tokens - computed
    if placement is Placement.ALL:
        return min(budget, remaining)
    resend = (num_tokens - 1) - (num_tokens - 1) % block
    if computed >= resend:
        return remaining
    stop = resend
    if placement is Placement.BRANCH and computed < branch < resend:
        stop = branch
    whole = budget - budget % block if budget >= block else block
    return min(whole, stop - computed)
