"""Hit vectors under the hit-granularity profile `unit U`, as SGLang serves them: pages of U.

SGLang's hit granularity is its page: its tree keys, and its Mamba component checkpoints, at
page ends. A layout whose hits end at multiples of U (HIT-UNIT-1) is therefore a model SGLang
runs with page size U; a vector's block of B tokens is B / U of its pages. The vector's cache
becomes the units each group holds (HIT-UNIT-2, -3):

    full B=64, U=16, block 0 cached, partial key at 96     units 0-3 (block 0) and 4, 5
                                                          (tokens 64..95 of block 1)
    Mamba B=64, U=16, block 0 cached, partial key at 80    checkpoints after units 3 and 4

and the case is looked up as the block-U case holding exactly those units. SGLang's answer,
per unit, comes back per block as HIT-UNIT-4 lists it: a block appears when it holds a unit
the group reads at the hit, the null block elsewhere, cdiv(L, B) entries.

The input is checked as the spec checks it (a unit dividing every block, partial keys only
under a unit, on its grid, inside a block, on a group that keeps keys, within the tokens the
key covers), so malformed vectors are refused, not answered. The checks are written here,
not taken from kvcert.spec.view: the spec's own check would answer the refusal vectors for
SGLang, and they would hold by construction.
"""

from __future__ import annotations

from kvcert.conformance.contract.codec import JSON

Problem = str  # why the input is malformed: the adapter answers it with a refusal


def unit_of(layout: JSON) -> int | Problem | None:
    """The layout's hit unit (None: block hits), or why it is malformed."""
    unit = layout.get("hit_unit")
    if unit is None:
        return None
    if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1:
        return f"hit_unit {unit!r} is not a positive integer"
    return unit


def partial_problem(
    case: JSON, groups: list[JSON], sizes: list[int], unit: int | None
) -> Problem | None:
    """Why the case's partial keys (and the unit against the blocks) are malformed, or None."""
    partial = case.get("partial")
    if unit is not None and any(size % unit for size in sizes):
        return f"hit_unit {unit} does not divide every block size {sizes}"
    if partial is None:
        return None
    if not isinstance(partial, list) or len(partial) != len(groups):
        return "one partial entry per group"
    layout = case["layout"]
    reach = layout.get("draft_reach", 1) if layout.get("speculative") == "exact" else 0
    if isinstance(reach, bool) or not isinstance(reach, int):
        return f"draft_reach {reach!r} is not an integer"
    for group, size, positions in zip(groups, sizes, partial, strict=True):
        if not isinstance(positions, list):
            return "partial positions are lists"
        if positions and unit is None:
            return "partial keys exist only under a layout's hit_unit"
        if positions and group.get("kind") == "mamba" and group.get("mode") == "none":
            return "a state group in mode none keeps no keys"
        keyable = case["num_tokens"] - (reach if group.get("draft") else 0)
        for p in positions:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 < p <= keyable:
                return f"partial key {p!r} is not a position of the request's keys"
            if unit is not None and (p % unit or not p % size):
                return f"partial key {p} is off the unit grid or at a block end"
    return None


def held_units(cached: set[int], positions: list[int], size: int, unit: int) -> set[int]:
    """HIT-UNIT-2: the units a group's blocks hold, whole or up to a partial key inside."""
    per_block = size // unit
    held = {j * per_block + k for j in cached for k in range(per_block)}
    for p in positions:
        first = p // size * per_block
        held |= set(range(first, p // unit))
    return held


def checkpoint_units(cached: set[int], positions: list[int], size: int, unit: int) -> set[int]:
    """HIT-UNIT-3: the units a state group has a checkpoint after (a block's end, or a
    partial key), as blocks of one unit."""
    ends = {(j + 1) * size for j in cached} | set(positions)
    return {end // unit - 1 for end in ends}


def in_units(
    groups: list[JSON], cached: list[set[int]], partial: list[list[int]], unit: int
) -> tuple[list[JSON], list[set[int]]]:
    """The block-U case holding the same units as the unit-U case."""
    unit_groups = [{**group, "block_size": unit} for group in groups]
    unit_cached = [
        (checkpoint_units if group.get("kind") == "mamba" else held_units)(
            blocks, positions, group["block_size"], unit
        )
        for group, blocks, positions in zip(groups, cached, partial, strict=True)
    ]
    return unit_groups, unit_cached


def to_blocks(answer: JSON, sizes: list[int], unit: int) -> JSON:
    """SGLang's per-unit answer per block (HIT-UNIT-4): cdiv(hit, B) entries per group, block
    j where it holds a unit listed, the null block elsewhere."""
    if "hit" not in answer:
        return answer
    hit = answer["hit"]
    blocks: list[list[int | None]] = []
    for size, per_unit in zip(sizes, answer["blocks"], strict=True):
        listed = {u * unit // size for u, entry in enumerate(per_unit) if entry is not None}
        blocks.append([j if j in listed else None for j in range(-(-hit // size))])
    return {"hit": hit, "blocks": blocks}
