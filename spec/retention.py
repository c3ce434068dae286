"""§6b Retention: which blocks a request leaves cached, and so which later hits it is owed.

A full-attention hit needs every block before it, so a full-attention group keeps them all.
A *bounded* group (sliding window, chunked local, state) needs only a few blocks before a
hit (HIT-SW-1, HIT-CHUNK-1, HIT-MAMBA-1): keeping all of them spends memory on hits nobody
can reach. The retention profile says which of them stay cached:

* `dense` (RET-DENSE-1): every length at the hit granularity is retained, so every committed
  block some hit can read stays cached until it is evicted (a window block no aligned hit
  reads never is). The profile the rest of the spec assumed before retention had a name.
* `sparse` (RET-SPARSE-1/-2, RET-JUNCTION-1): only the blocks some hit at a *retained
  length* needs. The promise, stated to the user who picks it:

      memory: a bounded group keeps O(1) blocks per retained length, not one per block;
      hits:   each of these later requests gets the hit it gets under dense retention,
              while the blocks stay cached --
              - the re-send of the prompt                 (hit floor_A(p - 1))
              - a request extending the prompt            (hit floor_A(p))
              - a request sharing the prefix the request found cached when it was
                admitted and diverging after it (the junction, RET-JUNCTION-1)
              - any request sharing a multiple of the retention interval N (when N > 0);
              under the drop speculative profile (HIT-SPEC-2), the step below each of
              them too, which the drop serves.
      given up: every other length inside the request, and its decoded tokens beyond the
              interval multiples (a multi-turn follow-up hits at the prompt's end).
      provided: an align-mode state group holds a state only where the request saved one
              (a chunk ended there, or CKPT-INNER-1); the promise holds at a retained
              length where the writer saved its state. Dense retention keeps the state at
              every aligned chunk end, so a prompt of 9 split 4 + 5 re-sent hits 4 under
              dense and 0 under sparse: an engine under sparse retention splits the prefill
              at the re-send length (vLLM's align-mode scheduler does) or saves it inside.

An engine's mask is judged by this promise: a block it leaves out that a retained length
needs is a lost hit, whatever its code intended. Hits themselves are still decided by the
unchanged HIT-* rules over what is registered, so "owed" is not a second hit rule.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum

from kvcert.spec.acceptance import group_accepts, needed_blocks
from kvcert.spec.hashing import keys_reach
from kvcert.spec.layout import (
    ChunkedLocal,
    Group,
    Layout,
    MambaState,
    SlidingWindow,
    Speculative,
    hit_alignment,
    is_cacheable,
)
from kvcert.spec.view import CacheView


class Retention(StrEnum):
    """Which committed blocks of bounded groups stay cached (a profile an engine declares)."""

    DENSE = "dense"  # every length at the hit granularity (RET-DENSE-1)
    SPARSE = "sparse"  # only those a retained length needs (RET-SPARSE-1, RET-SPARSE-2)


BOUNDED_KINDS = (SlidingWindow, ChunkedLocal, MambaState)


def is_bounded(group: Group) -> bool:
    """Whether a hit needs only a few blocks of this group before it (sliding window, chunked
    local, state), so retention may leave some of its committed blocks uncached; a group
    whose hit needs every block before it (full, latent, cross attention) registers every
    position ALLOC-COMMIT-1 commits, under either profile.

    pre: True
    post: __return__ == isinstance(group, (SlidingWindow, ChunkedLocal, MambaState))
    """
    return isinstance(group, BOUNDED_KINDS)


@dataclasses.dataclass(frozen=True)
class Retained:
    """A request's retained lengths: the `named` ones and every positive multiple of `every`
    (0: none), each also `below` tokens lower (the drop profile's step below; 0: not)."""

    named: frozenset[int] = frozenset()
    every: int = 0
    below: int = 0

    def __contains__(self, length: int) -> bool:
        periodic = self.every > 0 and (
            length % self.every == 0 or (self.below > 0 and (length + self.below) % self.every == 0)
        )
        return length > 0 and (periodic or length in self.named)

    def within(self, low: int, high: int) -> list[int]:
        """The retained lengths in [low, high], ascending."""
        found = {length for length in self.named if low <= length <= high}
        if self.every:
            for shift in {0, self.below}:
                first = -(-(low + shift) // self.every) * self.every - shift
                found.update(range(first, high + 1, self.every))
        return sorted(length for length in found if length > 0)


def dense_lengths(layout: Layout) -> Retained:
    """RET-DENSE-1: Under dense retention every length at the hit granularity is retained
    (every multiple of the hit alignment A, or of U under `unit U`), so a bounded group
    registers every committed block some such hit reads (RET-SPARSE-2) and no other.

        full B=16, 64 tokens computed:            registers 0 1 2 3 under either profile
        SW B=16 W=32 beside full B=16 (A=16):     registers 0 1 2 3 (each read at 16k)
        SW B=8 W=8 beside full B=32 (A=32):       registers 3 7 of 0..7 (only [24, 32) and
                                                  [56, 64) are read, by the hits at 32, 64)
        state B=16 beside SW B=32 (A=32):         keeps the states at 32, 64, not 16, 48

    pre: True
    post: __return__.every == hit_alignment(layout) and not __return__.named
    """
    return Retained(every=hit_alignment(layout))


def junction(view: CacheView, hit: int) -> int:
    """RET-JUNCTION-1: A request's junction is the longest multiple of the hit alignment, up
    to HIT-LEN-1's limit, at which some one group holds the request's prefix in whole blocks
    (it accepts the length and needs at least one block there) when it is admitted, if that
    is longer than the hit it got (else 0): the prefix it shares with a cached request that a
    bounded group had not kept.

        full B=16 cached {0..5}, SW W=32 cached {}:   full alone accepts 96
        request of 120 tokens, hit 0                  -> junction 96
        a third request sharing 96 tokens then hits 96 (RET-SPARSE-1 keeps it)
        chunked C=64 accepts 64 needing nothing:      no evidence of a shared prefix
        unit U=8: full B=16 holds 80 of a 90-token prefix -> junction 80 (not 88: a partial
                  key is no whole block)

    pre: hit >= 0
    post: __return__ == 0 or __return__ > hit
    """
    layout = view.layout
    step = hit_alignment(layout)
    longest = max(
        (
            length
            for length in range(step, view.num_tokens, step)
            for i, group in enumerate(layout.groups)
            if is_cacheable(group)
            and length % group.block_size == 0  # whole blocks: under `unit U` too
            and needed_blocks(group, length)
            and group_accepts(group, view.cached[i], length)
        ),
        default=0,
    )
    return longest if longest > hit else 0


def retained_lengths(layout: Layout, prompt: int, junction_at: int, interval: int) -> Retained:
    """RET-SPARSE-1: Under sparse retention the retained lengths of a request with a prompt of
    p tokens are its re-send hit floor_A(p - max(1, r)), its extension hit floor_A(p - r),
    its junction (RET-JUNCTION-1) and, when the interval N > 0, every multiple of N (decoded
    tokens included, and lengths its later chunks reach), with each one's step below (minus
    A) under the drop speculative profile.

    A is the hit alignment, r the tokens past a block exact draft keys cover (HASH-DRAFT-1;
    0 without them), which the prompt must hold for a draft block to have a key; 0 is left
    out (the empty hit needs nothing).

        A=16, p=100, junction 48, N=0:       {96 (re-send), 96 (extension), 48}
        A=16, p=96:                          re-send 80, extension 96
        drop, p=96:                          {64, 80, 96}
        exact, r=2, p=97:                    re-send 80, extension 80
        N=64:                                adds 64, 128, 192, ... (a window block a chunk
                                             ending at 112 commits is kept for 128)

    pre: prompt >= 1 and junction_at >= 0 and interval >= 0
    post: all(length > 0 and length % hit_alignment(layout) == 0 for length in __return__.named)
    """
    step = hit_alignment(layout)
    reach = keys_reach(layout)
    resend, extension = prompt - max(1, reach), prompt - reach
    lengths = {resend // step * step, extension // step * step, junction_at // step * step}
    drop = layout.speculative is Speculative.DROP
    if drop:
        lengths.update({length - step for length in lengths})
    named = frozenset(length for length in lengths if length > 0)
    return Retained(named, every=interval, below=step if drop and interval else 0)


def keeps(group: Group, lengths: Retained, position: int) -> bool:
    """RET-SPARSE-2: A bounded group registers a committed position only if a hit at one of
    its request's retained lengths (RET-DENSE-1 or RET-SPARSE-1) reads it (HIT-SW-1,
    HIT-CHUNK-1, HIT-MAMBA-1; under `unit U`, for a length inside a block, HIT-UNIT-2/-3);
    the others are released uncached.

        SW B=16 W=32, lengths {96}:          needs [65, 96) -> positions 4 5
        SW B=16 W=32, lengths {48, 96}:      positions 1 2 4 5    (3: in neither window)
        state B=16, lengths {48, 96}:        positions 2 5        (the checkpoints at 48, 96)
        chunked B=16 C=64, lengths {96}:     positions 4 5        (chunk 64..127 before 96)
        unit U=8, SW B=16 W=16, {88}:        reads [73, 88) -> positions 4 5 (5 holds 80..87)
        unit U=8, state B=16, {88}:          none (the state at 88 is a partial key: RET-SPARSE-3)
        SW B=16 W=32, every 64:              positions 2 3 (for 64), 6 7 (for 128), ...

    Only lengths up to the block's end plus the group's reach (window or chunk) can read it,
    so a length the request has not computed yet keeps the block as well.

    pre: is_bounded(group) and position >= 0
    post: not __return__ or lengths.every > 0 or bool(lengths.named)
    """
    size = group.block_size
    reach = group.window if isinstance(group, SlidingWindow) else 0
    reach = group.chunk if isinstance(group, ChunkedLocal) else reach
    candidates = lengths.within(position * size + 1, (position + 1) * size + reach)
    return any(position in blocks_read(group, length) for length in candidates)


def blocks_read(group: Group, length: int) -> range:
    """The blocks a hit at `length` reads from group `group`: at a block boundary those
    HIT-GROUP-1 needs; inside a block (`unit U`) an attention group's blocks holding the tokens
    its kind's rule reads (the last one up to the hit, HIT-UNIT-2), a state group's none (its
    checkpoint there is a partial key, HIT-UNIT-3).

    pre: is_bounded(group) and length >= 1
    post: all(j <= (length - 1) // group.block_size for j in __return__)
    """
    size = group.block_size
    if length % size == 0:
        return needed_blocks(group, length)
    if isinstance(group, MambaState):
        return range(0)
    tokens = needed_blocks(dataclasses.replace(group, block_size=1), length)
    return range(tokens.start // size, (length - 1) // size + 1) if tokens else range(0)


def keeps_checkpoint(lengths: Retained | None, position: int) -> bool:
    """RET-SPARSE-3: A state checkpoint a chunk saved inside a block (CKPT-INNER-2) is keyed
    only at one of its request's retained lengths, so the prompt's tail keys (ALLOC-UNIT-2),
    at its re-send length, always are.

        dense (RET-DENSE-1): every multiple of U is retained, so every saved checkpoint is
        unit U=16, state B=64, prompt 200 (re-send 192): a chunk ending at 112 saves 112
        dense:   keyed (a request diverging at 120 hits 112)
        sparse:  not keyed (112 is no retained length; that hit is given up, §6b)

    `lengths` None: a group that keeps every committed block (never a state group).

    pre: position >= 1
    post: __return__ == (lengths is None or position in lengths)
    """
    return lengths is None or position in lengths
