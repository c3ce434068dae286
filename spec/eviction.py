"""§11 Eviction: which cached blocks can still serve a hit, and the hybrid-aware profile.

The lru profile (ALLOC-EVICT-1, ALLOC-FREE-1) treats every free cached block alike. On a
hybrid layout they are not alike. A hit of length L needs, in every group at once, the blocks
HIT-*-1 name; a cached block no such combination can use is dead weight, and a full-attention
prefix block gates the hits of every group above it.

    EVICT-LIVE-1   useful blocks: served by some lookup now            (the meaning)
    EVICT-DEAD-1   provably dead: a missing key shows it is not useful (what a policy can see)
    EVICT-HYB-1    the hybrid profile takes provably dead free blocks first, then blocks freed
                   mid-request (cold), then the oldest
    EVICT-ORDER-1  and frees a request's blocks tail first across groups

EVICT-LIVE-1 is the meaning: what some lookup could be served. EVICT-DEAD-1 decides from the
keys a block's own tokens determine, and every block it calls dead is useless (tests/spec
checks the inclusion).

What the profile guarantees (tests/spec, Hypothesis over random traces): evicting a provably
dead block changes no lookup, and in a trace where it never has to evict a useful block every
hit equals the hit of an unbounded pool. It does not dominate lru on every trace: once the
pool is smaller than the working set both evict useful blocks, and lru's choice can happen to
serve a later request better (tests/spec/test_eviction.py has one such trace).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvcert.spec.acceptance import NULL, group_blocks
from kvcert.spec.hashing import BlockKey, Extra, block_keys, key_lookahead, matched_blocks
from kvcert.spec.hybrid import common_lengths
from kvcert.spec.layout import FullAttention, Layout
from kvcert.spec.view import CacheView


@dataclass(frozen=True)
class Cached:
    """A registered block as the eviction rules see it (built by kvcert.spec.alloc)."""

    block: int  # physical id
    group: int  # the group it is registered in
    position: int  # its block index in that group's chain
    key: BlockKey  # the key it is registered under
    tokens: tuple[int, ...]  # the tokens its key covers (one more for exact draft keys)
    extras: tuple[Extra, ...]  # the extras its key covers
    stamp: int  # registration order: the earliest holder of a key is the one served


def served(cached: Iterable[Cached]) -> dict[tuple[int, BlockKey], int]:
    """Per (group, key), the block a lookup is served (ALLOC-LOOKUP-1: earliest stamp)."""
    earliest: dict[tuple[int, BlockKey], Cached] = {}
    for c in cached:
        slot = (c.group, c.key)
        if slot not in earliest or c.stamp < earliest[slot].stamp:
            earliest[slot] = c
    return {slot: c.block for slot, c in earliest.items()}


def useful_blocks(layout: Layout, cached: Sequence[Cached]) -> frozenset[int]:
    """EVICT-LIVE-1: A cached block is useful when some request's lookup would be served it:
    it is needed at a length every group accepts for that request, and it is the block
    registered earliest under its key.

    Every hit of length L ends, in some group g, with a block whose tokens are the request's
    first L (+1 for an exact draft key); so the requests "that block's tokens, then one more
    token" (and that block's tokens themselves) reach every acceptable length of every
    request. The maximum is over the common set, so under the drop profile (HIT-SPEC-2) this
    over-approximates what is served, never under-approximates it.

        full B=4 + SW B=4 W=9 (2 blocks before L), one request of 12 tokens cached:
        full  | f0 | f1 | f2 |     SW | s0 | s1 | s2 |     every block useful
        s1 evicted:  L=8 needs s0 s1, L=12 needs s1 s2   -> only L=4 is left:
        useful {f0, s0};   f1, f2, s2 are dead weight

    pre: True
    post: __return__ <= frozenset(c.block for c in cached)
    """
    owner = served(cached)
    by_group = [frozenset(k for g, k in owner if g == index) for index in range(len(layout.groups))]
    limit = layout.max_model_len
    fresh = 1 + max((t for c in cached for t in c.tokens), default=0)
    candidates = {(c.tokens, c.extras) for c in cached} | {
        ((*c.tokens, fresh), c.extras) for c in cached
    }
    useful: set[int] = set()
    for tokens, extras in candidates:
        if limit is not None and len(tokens) > limit:
            continue
        keys = [
            block_keys(tokens, g.block_size, extras, key_lookahead(layout, g))
            for i, g in enumerate(layout.groups)
        ]
        view = CacheView(
            layout,
            len(tokens),
            tuple(matched_blocks(keys[i], by_group[i]) for i in range(len(layout.groups))),
        )
        for length in common_lengths(view):
            for i, group in enumerate(layout.groups):
                for j in group_blocks(group, view.cached[i], length):
                    if j is not NULL:
                        useful.add(owner[(i, keys[i][j])])
    return frozenset(useful)


@functools.lru_cache(maxsize=1 << 16)
def prerequisites(layout: Layout, c: Cached) -> tuple[tuple[int, BlockKey], ...]:
    """The full-attention keys every hit through `c` needs that `c`'s own tokens determine:
    per full-attention group, the last such key other than `c`'s own (see EVICT-DEAD-1).
    A pure function of its arguments, hence memoised."""
    span = (c.position + 1) * layout.groups[c.group].block_size  # every hit through c is >= this
    needs = []
    for f, group in enumerate(layout.groups):
        if not isinstance(group, FullAttention):
            continue
        keys = block_keys(c.tokens, group.block_size, c.extras, key_lookahead(layout, group))
        last = min(len(keys), span // group.block_size) - 1
        if (f, last) == (c.group, c.position):
            last -= 1
        if last >= 0:
            needs.append((f, keys[last]))
    return tuple(needs)


def provably_dead(layout: Layout, cached: Sequence[Cached]) -> frozenset[int]:
    """EVICT-DEAD-1: A cached block is provably dead when another block holds its key with an
    earlier stamp, or when a full-attention key its own tokens determine is registered
    nowhere; every provably dead block is useless (EVICT-LIVE-1).

    A hit of length L through block j of group g has L >= (j+1)*B_g, so every full-attention
    group f needs its blocks covering [0, (j+1)*B_g), in particular the last one whose key
    the block's tokens fix (an exact draft key needs one token more). One missing key rules
    out every such L. Unregistered free blocks hold nothing at all
    and are dead for the profile too (EVICT-HYB-1).

        full B=4 + SW B=4 W=9, 12 tokens cached, then f1 evicted:
        f2: its parent f1 is missing                      -> dead
        s1: tokens 0..7 fix f1, missing                   -> dead
        s2: tokens 0..11 fix f2, still registered         -> not yet (dead once f2 goes)
        s0: needs f0 only                                 -> alive (L=4 still accepted)

    pre: True
    post: __return__ <= frozenset(c.block for c in cached) - useful_blocks(layout, cached)
    """
    owner = served(cached)
    registered = set(owner)
    dead = set()
    for c in cached:
        shadowed = owner[(c.group, c.key)] != c.block
        if shadowed or any(need not in registered for need in prerequisites(layout, c)):
            dead.add(c.block)
    return frozenset(dead)


def hybrid_victim(free: Sequence[int], dead: frozenset[int], cold: frozenset[int]) -> int:
    """EVICT-HYB-1: Under the hybrid profile each new block is the first free block in queue
    order that is unregistered or provably dead, else the first cold one (released mid-request
    by ALLOC-SKIP-1), else the head of the queue; blocks are taken one at a time, so evicting
    one can make the next one dead.

        free queue 3 9 4 7 5,  dead {4}, cold {5}:    take 4;  queue 3 9 7 5
        then, if 4 held the parent of 7:              take 7;  queue 3 9 5
        then, nothing dead:                           take 5 (cold);  then 3, 9

    A cold block left a running request's window or chunk while the request went on: it can
    serve only a prompt that stops exactly inside that request's prefill, while a finished
    request's blocks serve its re-send and continuation. Chunked prefill of one long prompt
    frees thousands of them (a 2048-token chunk frees 128 blocks per 16-token SW group), and
    under lru they push every finished request's prefix out first.

    pre: len(free) > 0
    post: __return__ in free
    """
    return next((b for b in free if b in dead), next((b for b in free if b in cold), free[0]))


def tail_first(layout: Layout, held: Sequence[tuple[int, int, int]]) -> list[int]:
    """EVICT-ORDER-1: Under the hybrid profile released blocks join the free queue ordered by
    the last token they cover, latest first, and at equal ends full attention last; so a
    request's prefix, which gates every group's hits, is evicted after its tail.

        full B=4 [f0 f1 f2 f3] + SW B=8 [s0 s1]:   ends f0:4 f1:8 f2:12 f3:16  s0:8 s1:16
        queue tail gains  s1 f3 f2 s0 f1 f0         (lru: f3 f2 f1 f0 s1 s0)

    Remaining ties (two groups of one kind) go in group order, only to be deterministic.

    `held` lists (group, position, block) as the caller releases them.

    pre: True
    post: sorted(__return__) == sorted(b for _, _, b in held)
    """

    def end(item: tuple[int, int, int]) -> tuple[int, bool, int]:
        group, position, _ = item
        kind = layout.groups[group]
        return (-(position + 1) * kind.block_size, isinstance(kind, FullAttention), group)

    return [block for _, _, block in sorted(held, key=end)]
