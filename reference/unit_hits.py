"""The hybrid hit under the hit-granularity profile `unit U`: hits that may end inside a block.

The spec (HIT-UNIT-1..4) lets a hit end at any multiple of U. A group holds the request's
tokens up to a position P when it serves the request's key for its first P tokens: at a block
end that is the whole block, inside a block a *partial key* whose block holds [jB, P).

The search:

1. Each group's cache is read per block as its *reach*: how far the content of the block that
   serves the furthest key inside it goes (B when the block's own key is served, else the
   largest served partial position, else nothing). Keys are probed lazily, each at most once.
   A hit ending inside a block copies it, so there the *copyable* reach counts: the same,
   skipping a block key whose block is in flight (same-pass, HIT-UNIT-5).
2. A full-attention group accepts the multiples of U up to its cached prefix plus the
   copyable reach of the block after it (THM-UNIT-FULL-DOWN), which caps every candidate;
   below the cap it refuses only lengths inside a block whose copyable reach falls short.
3. From the largest multiple of U under the cap downwards, the first length every group
   accepts is the hit (HIT-HYB-1); under drop keying the next one (HIT-SPEC-2). A sliding
   window or chunk needs the whole blocks before the block L ends in and that block's
   copyable reach up to L (HIT-UNIT-2); a state group its key at exactly L (HIT-UNIT-3).

This is a descending scan over units, not the block search's jumps: its cost grows with the
candidates below the cap times the blocks a window needs. tests/differential holds it equal to
kvcert.spec on Hypothesis-drawn views.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from dataclasses import replace
from typing import TypeVar

from kvcert.reference.block_pool import NULL_BLOCK
from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.errors import ConfigError
from kvcert.reference.groups import first_needed
from kvcert.reference.keyindex import ServedMap

K = TypeVar("K", bound=Hashable)  # a key: a digest, or a position in the hit suite
Hit = tuple[int, list[list[int]]]  # the hit length and, per group, its block list


class _Reach:
    """One group's cache, read per block: how far each block's cached content reaches."""

    def __init__(
        self,
        group: GroupConfig,
        unit: int,
        keys: Sequence[K],
        served: ServedMap[K],
        in_flight: Container[int],
    ):
        self._size = group.block_size
        self._per_block = group.block_size // unit
        self._unit = unit
        self._keys = keys
        self._served = served
        self._in_flight = in_flight
        self._memo: dict[int, tuple[int, int]] = {}
        self._copyable: dict[int, tuple[int, int]] = {}

    def block(self, j: int) -> tuple[int, int]:
        """(tokens reached, block id) for block j; (j * B, NULL_BLOCK) when nothing is held."""
        found = self._memo.get(j)
        if found is None:
            found = self._furthest(j, copy=False)
            self._memo[j] = found
        return found

    def copyable(self, j: int) -> tuple[int, int]:
        """As `block`, for a hit ending inside block j, which copies it: a block key whose
        block is in flight does not count (HIT-UNIT-5)."""
        found = self._copyable.get(j)
        if found is None:
            found = self._furthest(j, copy=True)
            self._copyable[j] = found
        return found

    def _furthest(self, j: int, copy: bool) -> tuple[int, int]:
        whole = (j + 1) * self._per_block - 1  # the index of block j's own key
        last = min(whole + 1, len(self._keys))
        for i in range(last - 1, j * self._per_block - 1, -1):  # the furthest key first
            block_id = self._served.get(self._keys[i], NULL_BLOCK)
            if block_id != NULL_BLOCK and not (copy and i == whole and block_id in self._in_flight):
                return (i + 1) * self._unit, block_id
        return j * self._size, NULL_BLOCK

    def holds(self, first_token: int, length: int) -> bool:
        """Whether every token of [first_token, length) is held (HIT-UNIT-2), the block a
        hit ending inside copies by its copyable reach (HIT-UNIT-5)."""
        if first_token >= length:
            return True
        size = self._size
        whole = length // size
        if any(self.block(j)[0] < (j + 1) * size for j in range(first_token // size, whole)):
            return False
        return length % size == 0 or self.copyable(whole)[0] >= length

    def at(self, length: int) -> int:
        """The block id serving the key at exactly `length` (a state checkpoint), or NULL."""
        index = length // self._unit - 1
        if not 0 <= index < len(self._keys):
            return NULL_BLOCK
        return self._served.get(self._keys[index], NULL_BLOCK)


def _first_token(group: GroupConfig, length: int) -> int:
    """The first token a hit of `length` reads: groups.first_needed (HIT-FULL-1, HIT-SW-1,
    HIT-CHUNK-1) at one-token blocks, so the rule stays in one place."""
    return first_needed(replace(group, block_size=1), length)


def _accepts(group: GroupConfig, reach: _Reach, length: int) -> bool:
    if length == 0 or group.kind is Kind.CROSS:
        return True
    if group.kind is Kind.MAMBA:
        return group.mode is not MambaMode.NONE and reach.at(length) != NULL_BLOCK
    if group.kind is Kind.FULL:  # at or below _full_bound: every earlier block is whole
        size = group.block_size
        return length % size == 0 or reach.copyable(length // size)[0] >= length
    return reach.holds(_first_token(group, length), length)


def find_unit_hit(
    config: CacheConfig,
    num_tokens: int,
    unit_keys: Sequence[Sequence[K]],
    served: Sequence[ServedMap[K]],
    in_flight: Container[int] = frozenset(),
) -> Hit:
    """The hit length and, per group, its block list (HIT-UNIT-4: one entry per block the
    hit reaches, the block L falls in being the copy source when L is inside it).

    `unit_keys[g][i]` is the request's key for its first (i + 1) * U tokens in group g (as
    many as the group can key), `served[g]` maps a key to the block serving it, `in_flight`
    holds the blocks published for a pass that has not run (same-pass visibility).

    Implements HIT-LEN-1, HIT-UNIT-1, HIT-UNIT-2, HIT-UNIT-3, HIT-UNIT-4, HIT-UNIT-5,
    HIT-HYB-1, HIT-SPEC-1, HIT-SPEC-2."""
    unit = config.hit_unit
    if unit is None:
        raise ConfigError(
            "find_unit_hit serves the `unit U` profile and this config has no hit_unit: "
            "use kvcert.reference.coordinator.find_hit for block hits"
        )
    groups = config.groups
    reaches = [
        _Reach(g, unit, unit_keys[i], served[i], in_flight) if g.kind is not Kind.CROSS else None
        for i, g in enumerate(groups)
    ]
    bound = num_tokens - 1
    for group, reach in zip(groups, reaches, strict=True):
        if group.kind is Kind.FULL and reach is not None:
            bound = min(bound, _full_bound(group, reach, bound))
    others = [  # full groups too: below the cap one may refuse a length inside a block
        (g, r)
        for g, r in zip(groups, reaches, strict=True)
        if r is not None and (g.kind is not Kind.FULL or in_flight)
    ]
    found: list[int] = []
    length = bound // unit * unit
    while length >= 0 and len(found) < 2:
        if all(_accepts(g, r, length) for g, r in others):
            found.append(length)
        length -= unit
    hit = found[0]
    if config.speculative is DraftKeying.DROP:
        hit = found[1] if hit > 0 else 0
    return hit, [
        [] if r is None else _table(g, r, hit) for g, r in zip(groups, reaches, strict=True)
    ]


def _full_bound(group: GroupConfig, reach: _Reach, cap: int) -> int:
    """The longest prefix a full group holds, up to `cap`: its whole cached blocks, then the
    copyable reach of the block after them (a hit ending inside it copies it)."""
    size = group.block_size
    j = 0
    while (j + 1) * size <= cap and reach.block(j)[0] == (j + 1) * size:
        j += 1
    return min(cap, max(j * size, reach.copyable(j)[0]))


def _table(group: GroupConfig, reach: _Reach, hit: int) -> list[int]:
    size = group.block_size
    count = -(-hit // size)
    table = [NULL_BLOCK] * count
    if hit == 0:
        return table
    if group.kind is Kind.MAMBA:
        table[(hit - 1) // size] = reach.at(hit)
        return table
    first_token = _first_token(group, hit)
    if first_token < hit:  # the blocks of the units HIT-UNIT-2 needs: from first_token's on
        for j in range(first_token // size, count):
            table[j] = reach.block(j)[1]
        if hit % size:  # the copy source (HIT-UNIT-4, HIT-UNIT-5)
            table[-1] = reach.copyable(count - 1)[1]
    return table
