"""Reference counts over a run of blocks: the pool's take, release and allocate.

`counts` is the pool's array('i') of per-block counts. These are the definitions; the
compiled `_refcounts` (reference/_refcounts.c) does the same in one C loop and is used when
built (kvcert.reference.native). Every block is checked against the array's bounds before
any count changes; a block listed twice is stepped twice; any iterable of blocks will do.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence

from kvcert.reference.native import native


def _checked(counts: array[int], blocks: Iterable[int]) -> Sequence[int]:
    run = blocks if isinstance(blocks, list | tuple) else list(blocks)
    size = len(counts)
    for block in run:
        if not 0 <= block < size:
            raise IndexError(f"block {block} is outside the pool (0..{size - 1})")
    return run


def py_hold(counts: array[int], blocks: Iterable[int]) -> list[int]:
    """Add one to each block's count; the blocks that were free (count 0), in order."""
    blocks = _checked(counts, blocks)
    revived = []
    for block in blocks:
        if not counts[block]:
            revived.append(block)
        counts[block] += 1
    return revived


def py_drop(counts: array[int], blocks: Iterable[int]) -> list[int]:
    """Take one from each block's count; the blocks whose count reached 0, in order."""
    blocks = _checked(counts, blocks)
    freed = []
    for block in blocks:
        counts[block] -= 1
        if not counts[block]:
            freed.append(block)
    return freed


def py_set_one(counts: array[int], blocks: Iterable[int]) -> None:
    """Each block is held once (just allocated)."""
    blocks = _checked(counts, blocks)
    for block in blocks:
        counts[block] = 1


Step = Callable[["array[int]", Iterable[int]], list[int]]
_compiled = native("_refcounts")
hold: Step = _compiled.hold if _compiled else py_hold
drop: Step = _compiled.drop if _compiled else py_drop
set_one: Callable[[array[int], Iterable[int]], None] = (
    _compiled.set_one if _compiled else py_set_one
)
