"""§4 The hybrid hit: the longest prefix every group can serve, speculative decoding included.

The definition is a maximum over a set, not a search:

    common(view) = { L in [0, num_tokens - 1] : every group accepts L }      (HIT-LEN-1, -GROUP-1)
    hit(view)    = max(common(view))                                          (HIT-HYB-1)

0 is in every common set, so the maximum exists. Every L in it is a multiple of each
cacheable group's block size, hence of their lcm (`layout.hit_alignment`). How an engine finds
the maximum (fixed-point loops, one walk, early exits) is its own business; kvcert.reference
says which search it uses and tests/proofs show it returns this maximum.

Speculative decoding, defined once
----------------------------------
A draft layer (EAGLE, MTP, DFlash) computes its KV at position i from the target's hidden
state at i and the embedding of token i+1. So draft KV at i depends on one token *after* i,
and a cached draft block j (tokens [jB, (j+1)B)) is valid for a request only if the request's
token (j+1)B equals the one its writer saw. A drafter of k MTP modules reads further: module
m's KV at i reads token i+m, so the layout's `draft_reach` r = k tokens after i. Hidden
states are never needed from the cache: the positions from the hit onwards are recomputed,
and that is all the draft reads.

* `exact` (HIT-SPEC-1): draft groups key block j on tokens [0, (j+1)B + r) (HASH-DRAFT-1). A
  key match then certifies every dependency, and the hit is the plain hybrid hit.
* `drop` (HIT-SPEC-2): for engines whose draft groups reuse the target's keys. No key of a hit
  of length L covers tokens [L, L+r), on which the draft KV at L-1 depends. The hit therefore
  steps down once in the common set, to a length whose next r tokens lie inside the matched
  prefix (a layout is refused when r exceeds the hit alignment, the smallest step).
  That certifies the dependency when the matched blocks were written by one request (a
  re-sent or extended prompt); only `exact` certifies it always. Two writers are enough to
  break it: two requests that prefill a shared prefix side by side each write a copy, the
  cache keeps the first copy under the shared key, and a hit over the second one's chain gets
  a block computed from the first one's next token, inside the hit, which no drop reaches
  (`kvcert fuzz` finds it through vLLM's scheduler: docs/engines.md, draft-other-writer).

Both rules read the common set, so neither can depend on group order or group count, neither
drops more than once, and both return a length that every group accepts. The engines' bug
(vLLM #32802, #40624) was a per-group drop inside a fixed-point loop: every pass dropped again,
and three or more groups spiralled to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcert.spec.acceptance import group_accepts, group_blocks
from kvcert.spec.errors import UncacheableLayout, refuse
from kvcert.spec.layout import Speculative, hit_alignment, is_cacheable
from kvcert.spec.view import CacheView


def max_hit_length(num_tokens: int) -> int:
    """HIT-LEN-1: A hit leaves at least the request's last token to compute, so it is at most
    num_tokens - 1.

    The last token's forward pass yields the logits of the next token; a hit covering it
    would leave nothing to run. A block-aligned prompt therefore recomputes its last block.

        num_tokens=48, B=16:   | 0 | 1 | 2 |   hit <= 47, so at most 32; block 2 is recomputed

    pre: num_tokens >= 1
    post: __return__ == num_tokens - 1
    """
    return num_tokens - 1


def common_lengths(view: CacheView) -> tuple[int, ...]:
    """The lengths every group accepts, ascending (the set HIT-HYB-1 maximises).

    Only multiples of the hit alignment are asked: each cacheable group accepts multiples of
    its block size alone (HIT-GROUP-1), or of the unit under `unit U` (HIT-UNIT-1), so no
    other length can be in the set."""
    groups = view.layout.groups
    unit = view.layout.hit_unit
    return tuple(
        length
        for length in range(0, max_hit_length(view.num_tokens) + 1, hit_alignment(view.layout))
        if all(
            group_accepts(
                g,
                view.cached[i],
                length,
                unit=unit,
                partial=view.partial[i],
                in_flight=view.in_flight[i],
            )
            for i, g in enumerate(groups)
        )
    )


def plain_hit(common: tuple[int, ...]) -> int:
    """HIT-HYB-1: The hybrid hit is the largest length, up to the HIT-LEN-1 limit, that every
    group accepts.

        full  B=16        cached {0,1,2,3}   accepts 0 16 32 48 64
        SW    B=16 W=32   cached {2,3}       accepts 0          64
        request 71 tokens (limit 70)         common {0, 64}  -> hit 64

    pre: len(common) > 0 and common[0] == 0
    post: __return__ == max(common)
    """
    return max(common)


def exact_draft_hit(common: tuple[int, ...]) -> int:
    """HIT-SPEC-1: Under the exact speculative profile the hit is the plain hybrid hit: draft
    keys cover the draft_reach tokens after each block (HASH-DRAFT-1), so no cached block is
    dropped.

        full B=16 + draft full B=16, request 71:  draft block 3 is keyed on tokens 0..64
        common {0, 16, 32, 48, 64}                -> hit 64

    pre: len(common) > 0 and common[0] == 0
    post: __return__ == max(common)
    """
    return plain_hit(common)


def drop_draft_hit(common: tuple[int, ...]) -> int:
    """HIT-SPEC-2: Under the drop speculative profile the hit is the largest commonly accepted
    length strictly below the plain hit (0 when the plain hit is 0).

        common {0, 16, 32, 48, 64}    plain 64 -> hit 48      (one step, whatever the groups)
        common {0, 64}                plain 64 -> hit 0       (no shorter length is servable)
        common {0}                    plain 0  -> hit 0

    pre: len(common) > 0 and common[0] == 0
    post: __return__ in common
    post: __return__ == 0 or len([x for x in common if __return__ < x]) == 1
    """
    top = plain_hit(common)
    return max(length for length in common if length < top) if top > 0 else 0


@dataclass(frozen=True)
class HybridHit:
    """The observable result of a lookup."""

    length: int  # tokens served from the cache
    blocks: tuple[tuple[int | None, ...], ...]  # per group, HIT-GROUP-2's (HIT-UNIT-4's) list
    plain_length: int  # HIT-HYB-1's hit before any speculative drop


def hybrid_hit(view: CacheView) -> HybridHit:
    """The lookup result for a cache view: hit length and each group's block list.

    Raises UncacheableLayout when no group takes part in prefix hits (cross attention only).
    """
    layout = view.layout
    if not any(is_cacheable(g) for g in layout.groups):
        refuse(
            UncacheableLayout,
            "every group is cross attention, whose KV depends on the encoder input only; "
            "this model has no prefix to reuse, so do not look it up",
        )
    common = common_lengths(view)
    plain = plain_hit(common)
    length = {
        None: plain_hit,
        Speculative.EXACT: exact_draft_hit,
        Speculative.DROP: drop_draft_hit,
    }[layout.speculative](common)
    unit = layout.hit_unit
    blocks = tuple(
        group_blocks(g, view.cached[i], length, unit) for i, g in enumerate(layout.groups)
    )
    return HybridHit(length=length, blocks=blocks, plain_length=plain)
