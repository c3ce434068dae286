"""The hybrid hit search.

The spec defines the hit as the maximum of the set of lengths every group accepts (then one
step down under the drop profile). This search returns that maximum without building the set:

1. Candidates are the multiples of the alignment A (lcm of cacheable block sizes) up to
   num_tokens - 1; every other length is refused by some group (HIT-GROUP-1).
2. Full-attention groups are downward closed (THM-FULL-DOWN): each accepts exactly the
   multiples of its block size up to its cached prefix, found by one left-to-right scan. The
   smallest such bound U caps every candidate, and no full group refuses anything <= U.
3. From the largest candidate <= U downwards, the first length every other group accepts is
   the maximum (each is checked against its needed blocks only). Every kind needs a run of
   blocks ending at length // B whose start never decreases as the length grows, so a
   missing block m refuses every candidate whose run contains it: the scan jumps below
   m * B (THM-SKIP-MISSING), one jump per missing block instead of one step per candidate.
   The largest candidate is first tested in one pass over each group's run: a shared
   prefix's hit usually passes it, and then no scan is set up.
4. Under the drop profile the scan continues to the next accepted candidate: one step in
   the common set, never one per group (vLLM #32802, #40624).

A group's cache is given as the request's keys for its blocks 0, 1, ... and a mapping from
key to block id: the manager passes its digests and the pool's map, the conformance engine
block indices and the case's cached set. The scans run in C (map over the map's `get`): a
full group's prefix is one probe per key, and its blocks are the table; a million-token
prefix is a few milliseconds, not a Python loop per block.
tests/differential shows the search equal to kvcert.spec.hybrid on Hypothesis-drawn views, and
THM-HYB-SEARCH (Z3) proves its shape.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Hashable, MutableSequence, Sequence
from itertools import compress, repeat
from operator import not_
from typing import Literal, TypeVar, overload

from kvcert.reference.block_pool import NULL_BLOCK
from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.groups import first_needed, needs_last_block
from kvcert.reference.keyindex import ServedMap
from kvcert.reference.native import native

K = TypeVar("K", bound=Hashable)  # a block key: a digest, or a block index in the hit suite
Keys = Sequence[Sequence[K]]  # per group, the request's key of each block
Served = Sequence[ServedMap[K]]  # per group, key -> cached block id (a dict or a view)
BLOCK_IDS = "i"  # array typecode of a packed block table: int32, as the pool's arrays
_compiled = native("_keyindex")
# find_hit when its first candidate passes, state groups included (None: not built)
_attention_hit = None if _compiled is None else _compiled.attention_hit


@overload
def find_hit(
    config: CacheConfig,
    num_tokens: int,
    keys: Keys[K],
    served: Served[K],
    *,
    ignore_state: bool = False,
    limit: int | None = None,
    packed: Literal[False] = False,
) -> tuple[int, list[list[int]]]: ...


@overload
def find_hit(
    config: CacheConfig,
    num_tokens: int,
    keys: Keys[K],
    served: Served[K],
    *,
    ignore_state: bool = False,
    limit: int | None = None,
    packed: Literal[True],
) -> tuple[int, list[array[int]]]: ...


def find_hit(
    config: CacheConfig,
    num_tokens: int,
    keys: Keys[K],
    served: Served[K],
    *,
    ignore_state: bool = False,
    limit: int | None = None,
    packed: bool = False,
) -> tuple[int, list[list[int]]] | tuple[int, list[array[int]]]:
    """The hit length and, per group, its block list (NULL_BLOCK where nothing is needed);
    with `packed`, each list an int32 array (BLOCK_IDS): the same blocks without a Python
    int each, which for a long hit cost more than the search.

    Implements HIT-LEN-1, HIT-GROUP-1, HIT-GROUP-2, HIT-HYB-1, HIT-SPEC-1, HIT-SPEC-2, and
    HIT-MAMBA-2 and HIT-CROSS-1 (mode none serves only 0; cross groups constrain nothing).

    With `ignore_state` state groups constrain only the alignment and nothing is dropped: the
    result is the branch point (spec BRANCH-1), where the attention groups' prefix ends.

    With `limit` (for a caller whose hit without it exceeded `limit`): the largest length at
    most `limit` that every group accepts. Each such length is a sound hit; under drop keying
    because a longer accepted length exists (the uncapped hit), which is all HIT-SPEC-2's
    drop asks of the block after it."""
    groups = config.groups
    alignment = config.alignment
    bound = num_tokens - 1 if limit is None else min(num_tokens - 1, limit)
    drops = config.speculative is DraftKeying.DROP and not ignore_state and limit is None
    plan = config.search_plan
    if _attention_hit is not None and plan is not None and not drops:
        # compiled, when the largest candidate passes (reference/_keyindex_hit.c)
        found = _attention_hit(served, plan, keys, bound, alignment, packed, ignore_state)
        if found is not None:
            return found  # type: ignore[no-any-return]  # packed: int32 arrays (BLOCK_IDS)
    others = []
    prefixes: dict[int, MutableSequence[int]] = {}  # per full group, its cached prefix
    for g, group in enumerate(groups):
        if group.kind is Kind.FULL:
            prefix = _cached_prefix(served[g], keys[g], bound // group.block_size, packed)
            prefixes[g] = prefix
            bound = min(bound, len(prefix) * group.block_size)
        elif group.kind is Kind.MAMBA and ignore_state:
            continue
        elif group.kind is Kind.MAMBA and group.mode is MambaMode.NONE:
            bound = 0
        elif group.kind is not Kind.CROSS:
            others.append(g)

    top = (bound // alignment) * alignment
    if not drops and all(_accepts(groups[g], served[g], keys[g], top) for g in others):
        found = [top]  # the first candidate passes (a shared prefix's usual case): no scan
    else:
        presence = [_Presence(served[g], keys[g]) for g in others]
        refusal = _refuser([groups[g] for g in others], presence)
        found = _first_accepted(top, alignment, refusal, 1 + drops)
    hit = found[0] if found else 0
    if drops:
        hit = found[1] if len(found) > 1 and hit > 0 else 0
    tables: list[MutableSequence[int]] = []
    for g, group in enumerate(groups):
        if group.kind is Kind.CROSS:
            tables.append(_nulls(0, packed))
            continue
        count = hit // group.block_size
        if g in prefixes:
            prefix = prefixes[g]
            tables.append(prefix if count == len(prefix) else prefix[:count])
            continue
        start = first_needed(group, hit) if count else count
        table = _nulls(start, packed)
        if group.kind is Kind.MAMBA and ignore_state:  # unconstrained: maybe no checkpoint
            table.extend(served[g].get(key, NULL_BLOCK) for key in keys[g][start:count])
        else:  # every group accepts `hit`: each block it needs is cached
            table.extend(map(served[g].__getitem__, keys[g][start:count]))
        tables.append(table)
    return hit, tables  # type: ignore[return-value]  # lists, or arrays when packed


def _nulls(count: int, packed: bool) -> MutableSequence[int]:
    """A table's first `count` columns, needing no block: NULL_BLOCK each."""
    if packed:
        return array(BLOCK_IDS, [NULL_BLOCK]) * count
    return [NULL_BLOCK] * count


def longest_single_group(
    config: CacheConfig, num_tokens: int, keys: Keys[K], served: Served[K]
) -> int:
    """The longest multiple of the alignment, up to num_tokens - 1, at which some one group
    holds the request's prefix in whole blocks (accepts it, needing at least one): where the
    shared prefix ends for the group that kept the most of it. The caller's junction when it
    exceeds the hit. Implements RET-JUNCTION-1."""
    alignment = config.alignment
    longest = 0
    for g, group in enumerate(config.groups):
        if group.kind is Kind.CROSS or (group.kind is Kind.MAMBA and group.mode is MambaMode.NONE):
            continue
        if group.kind is Kind.FULL:
            size = group.block_size
            prefix = _cached_prefix(served[g], keys[g], (num_tokens - 1) // size)
            length = len(prefix) * size // alignment * alignment
        else:  # whole blocks of the group (under `unit U` too: its blocks are multiples)
            step = math.lcm(alignment, group.block_size)
            refusal = _refuser([group], [_Presence(served[g], keys[g])])
            length = (num_tokens - 1) // step * step
            while length > longest:  # the first accepted length that needs a block
                found = _first_accepted(length, step, refusal, 1)
                length = found[0] if found else 0
                if first_needed(group, length) < length // group.block_size:
                    break
                length -= step
        longest = max(longest, length)
    return longest


def _cached_prefix(
    served: ServedMap[K], keys: Sequence[K], cap: int, packed: bool = False
) -> MutableSequence[int]:
    """The blocks serving keys[0], keys[1], ... up to the first key not served (at most
    `cap`); with `packed`, as an int32 array (BLOCK_IDS). The pool's compiled map answers in
    one C loop (`prefix`, and `prefix_ids` packed: tests/reference/test_keyindex.py holds
    both equal to the generic scan)."""
    compiled = getattr(served, "prefix_ids" if packed else "prefix", None)
    if compiled is not None:
        found = compiled(keys, cap)
        return array(BLOCK_IDS, found) if packed else found
    blocks = _probed_prefix(served, keys, cap)
    return array(BLOCK_IDS, blocks) if packed else blocks


def _probed_prefix(served: ServedMap[K], keys: Sequence[K], cap: int) -> list[int]:
    """The generic scan: one dictionary probe per key, in C, in runs that double in length,
    so a prefix of n blocks costs at most 2n + 64 probes however long the prompt."""
    get = served.get
    blocks: list[int] = []
    start, run = 0, 64
    while start < cap:
        stop = min(cap, start + run)
        found = list(map(get, keys[start:stop], repeat(NULL_BLOCK, stop - start)))
        if not all(found):  # NULL_BLOCK (0) is never served: it marks the first miss
            return blocks + found[: found.index(NULL_BLOCK)]
        blocks += found
        start, run = stop, 2 * run
    return blocks


def _accepts(group: GroupConfig, served: ServedMap[K], keys: Sequence[K], length: int) -> bool:
    """Whether `group` accepts `length`: it needs no block there, or every block of its run
    [first_needed, length // B) is keyed and cached (step 3's test of one candidate, as
    `_refuser` makes it, in one pass over the run)."""
    first, stop = first_needed(group, length), length // group.block_size
    return first >= stop or (stop <= len(keys) and all(map(served.__contains__, keys[first:stop])))


def _refuser(
    groups: Sequence[GroupConfig], presence: Sequence[_Presence]
) -> Callable[[int], int | None]:
    """Step 3's test of one candidate against the groups that are not full attention."""
    leaping = [needs_last_block(group) for group in groups]

    def refusal(length: int) -> int | None:
        """None when every group accepts `length`; else a bound that every accepted
        candidate below it respects. A group needing a missing block m refuses every length
        whose run [first_needed, length // B) contains m, and first_needed only grows with
        the length, so no candidate above m * B can pass (THM-SKIP-MISSING); the group
        applies that jump again at m * B until its run there is whole."""
        limit = None
        for group, probe, leaps in zip(groups, presence, leaping, strict=True):
            size = group.block_size
            at = length
            while at > 0:
                stop = at // size
                first = first_needed(group, at)
                if first >= stop:
                    break  # it needs no block at this length, keyed or not
                if stop > probe.count:
                    at = probe.count * size
                    continue
                missing = probe.last_missing(first, stop)
                if missing is None:
                    break
                # where every run holds its last block, the jumps through a stretch of
                # missing blocks m, m - 1, ..., a end at a * B: take them at once
                at = (probe.stretch_start(missing) if leaps else missing) * size
            if at < length:
                limit = at if limit is None else min(limit, at)
        return limit

    return refusal


class _Presence:
    """Which of a group's blocks are cached, probed lazily from the top down in runs that
    double in length: the scan of step 3 descends, so each key is probed at most once. The
    probed window opens at the first run the scan asks about, not at the last key: the
    blocks past the full groups' bound are never needed (a prompt's uncached tail is most
    of its keys), and a state group's hit needs one block."""

    def __init__(self, served: ServedMap[K], keys: Sequence[K]) -> None:
        self._contains = served.__contains__
        self._keys = keys
        self.count = len(keys)
        self._low = self._high = -1  # probed: [low, high); -1 until the first question
        self._missing: list[int] = []  # the missing blocks among them, ascending
        self._run = 8

    def last_missing(self, first: int, stop: int) -> int | None:
        """The last block in [first, stop) that is not cached, or None (stop <= count)."""
        if self._high < 0:
            self._low = self._high = stop
        elif stop > self._high:  # pragma: no cover - the scan never goes back up
            raise ValueError("the hit scan probes lengths in decreasing order")
        while True:
            index = bisect_left(self._missing, stop) - 1
            if index >= 0:
                block = self._missing[index]
                return block if block >= first else None
            if first >= self._low:
                return None
            self._probe_below(first)

    def stretch_start(self, block: int) -> int:
        """The first of the consecutive missing blocks that end at the missing `block`
        (within the probed range). The list ascends without repeats, so the blocks from
        index k to `block`'s are consecutive exactly when their values span their indices:
        a binary search over k finds the first such index."""
        missing = self._missing
        end = bisect_left(missing, block)
        low, high = 0, end  # the answer lies in [low, high]
        while low < high:
            middle = (low + high) // 2
            if block - missing[middle] == end - middle:
                high = middle
            else:
                low = middle + 1
        return missing[low]

    def _probe_below(self, first: int) -> None:
        low = max(0, min(first, self._low - self._run))
        self._run *= 2
        absent = map(not_, map(self._contains, self._keys[low : self._low]))
        self._missing[:0] = compress(range(low, self._low), absent)
        self._low = low


def _first_accepted(
    top: int, alignment: int, refusal: Callable[[int], int | None], count: int
) -> list[int]:
    """The first `count` accepted multiples of `alignment` from `top` down (0 is always
    accepted), skipping the candidates each refusal rules out: two under drop keying, whose
    hit is the second (HIT-SPEC-2), else one."""
    found: list[int] = []
    length = top
    while length >= 0:
        limit = refusal(length)
        if limit is None:
            found.append(length)
            if len(found) == count:
                break
            limit = length - 1
        length = min(length - alignment, limit // alignment * alignment)
    return found
