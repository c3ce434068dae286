"""The hybrid hit search.

Implements HIT-LEN-1, HIT-GROUP-1, HIT-HYB-1, HIT-SPEC-1 and HIT-SPEC-2: the spec defines
the hit as the maximum of the set of lengths every group accepts (then one step down under
the drop profile). This search returns that maximum without building the set:

1. Candidates are the multiples of the alignment A (lcm of cacheable block sizes) up to
   num_tokens - 1; every other length is refused by some group (HIT-GROUP-1).
2. Full-attention groups are downward closed (THM-FULL-DOWN): each accepts exactly the
   multiples of its block size up to its cached prefix, found by one left-to-right scan. The
   smallest such bound U caps every candidate, and no full group refuses anything <= U.
3. From the largest candidate <= U downwards, the first length every other group accepts is
   the maximum (each is checked with O(needed blocks) lookups, memoised per block).
4. Under the drop profile the scan continues to the next accepted candidate: one step in
   the common set, never one per group (vLLM #32802, #40624).

tests/differential shows it equal to kvcert.spec.hybrid on Hypothesis-drawn views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvcert.reference.block_pool import NULL_BLOCK
from kvcert.reference.config import CacheConfig, DraftKeying, Kind, MambaMode
from kvcert.reference.groups import first_needed

Finder = Callable[[int, int], int | None]  # (group, block index) -> block id or None


def find_hit(
    config: CacheConfig, num_tokens: int, find: Finder, *, ignore_state: bool = False
) -> tuple[int, list[list[int]]]:
    """The hit length and, per group, its block list (NULL_BLOCK where nothing is needed).

    With `ignore_state` state groups constrain only the alignment and nothing is dropped: the
    result is the branch point (spec BRANCH-1), where the attention groups' prefix ends."""
    groups = config.groups
    limit = num_tokens - 1
    alignment = config.alignment
    memo: dict[tuple[int, int], int | None] = {}

    def cached(g: int, j: int) -> int | None:
        key = (g, j)
        if key not in memo:
            memo[key] = find(g, j)
        return memo[key]

    bound = limit
    others = []
    for g, group in enumerate(groups):
        if group.kind is Kind.FULL:
            prefix = 0
            while (prefix + 1) * group.block_size <= bound and cached(g, prefix) is not None:
                prefix += 1
            bound = min(bound, prefix * group.block_size)
        elif group.kind is Kind.MAMBA and ignore_state:
            continue
        elif group.kind is Kind.MAMBA and group.mode is MambaMode.NONE:
            bound = 0
        elif group.kind is not Kind.CROSS:
            others.append(g)

    def accepted(length: int) -> bool:
        for g in others:
            size = groups[g].block_size
            for j in range(first_needed(groups[g], length), length // size):
                if cached(g, j) is None:
                    return False
        return True

    candidates = range((bound // alignment) * alignment, -1, -alignment)
    found = _first_two(candidates, accepted)
    hit = found[0] if found else 0
    if config.speculative is DraftKeying.DROP and not ignore_state:
        hit = found[1] if len(found) > 1 and hit > 0 else 0
    tables: list[list[int]] = []
    for g, group in enumerate(groups):
        if group.kind is Kind.CROSS:
            tables.append([])
            continue
        count = hit // group.block_size
        start = first_needed(group, hit) if count else count
        table = [NULL_BLOCK] * start
        table.extend(cached(g, j) or NULL_BLOCK for j in range(start, count))
        tables.append(table)
    return hit, tables


def _first_two(candidates: Sequence[int], accepted: Callable[[int], bool]) -> list[int]:
    """The first two accepted candidates in order (0 is always accepted)."""
    found: list[int] = []
    for length in candidates:
        if accepted(length):
            found.append(length)
            if len(found) == 2:
                break
    return found
