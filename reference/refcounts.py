"""Reference counts over a run of blocks: the pool's take, release and allocate.

`counts` is the pool's array('i'), one int32 per block. A held block's entry is its count
(1 or more); a block no one holds reads 0 or less. A free block has no count and a held one
no place in the free queue, so the lru queue keeps each free block's predecessor there,
negated (kvcert.reference.eviction.FreeQueue), and `links` is that queue's successor array:
`hold` then unlinks the blocks it revives in the same pass. Without `links` (the hybrid
queue, a heap) a free block's entry is 0.

`link` and `unlink_head` are the lru queue's own runs: released blocks joining its tail, an
allocation taking its head; `release_tables` is a whole request's release under lru, `drop`
then `link` over its tables in one call.

These are the definitions; the compiled `_refcounts` (reference/_refcounts.c) does the same
in one C loop and is used when built (kvcert.reference.native). Every block is checked
against the array's bounds before any entry changes; a block listed twice is stepped twice;
any iterable of blocks will do.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence

from kvcert.reference.native import native


def _checked(
    counts: array[int], blocks: Iterable[int], links: array[int] | None = None
) -> Sequence[int]:
    run = blocks if isinstance(blocks, list | tuple) else list(blocks)
    size = len(counts)
    if links is not None and len(links) != size:
        raise ValueError(f"links has {len(links)} entries, counts {size}: one per block")
    low = 0 if links is None else 1  # with links, block 0's entries are the queue's ends
    for block in run:
        if not low <= block < size:
            raise IndexError(f"block {block} is outside the pool's blocks ({low}..{size - 1})")
    return run


def py_hold(
    counts: array[int], blocks: Iterable[int], links: array[int] | None = None
) -> list[int]:
    """Add one to each held block's count; the blocks that were free (entry 0 or less), in
    order, each now held once and, when `links` is given, unlinked from the free queue."""
    blocks = _checked(counts, blocks, links)
    revived = []
    for block in blocks:
        entry = counts[block]
        if entry > 0:
            counts[block] = entry + 1
            continue
        revived.append(block)
        if links is not None:  # its neighbours close up: -entry is its predecessor
            before, after = -entry, links[block]
            if not (before < len(counts) and 0 <= after < len(counts)):
                raise ValueError(
                    f"block {block}'s free-queue neighbours ({before}, {after}) are outside "
                    "the pool: the counts and links were not kept by one queue"
                )
            links[before] = after
            counts[after] = -before
        counts[block] = 1
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


def py_count_free(counts: array[int], blocks: Iterable[int]) -> int:
    """How many listed blocks no one holds (entry 0 or less): an admission's free hit blocks,
    which count against the pool's capacity (ALLOC-TWO-PHASE-1)."""
    blocks = _checked(counts, blocks)
    return sum(1 for block in blocks if counts[block] <= 0)


def _checked_ring(counts: array[int], links: array[int]) -> int:
    """The ring's size, once the arrays are seen to be one per block."""
    if len(links) != len(counts):
        raise ValueError(f"links has {len(links)} entries, counts {len(counts)}: one per block")
    return len(counts)


def py_link(counts: array[int], links: array[int], blocks: Iterable[int]) -> None:
    """The lru queue's tail takes `blocks` (free now, their entries 0), in order: linked as
    one run before the sentinel (kvcert.reference.eviction.FreeQueue.add)."""
    size = _checked_ring(counts, links)
    run = blocks if isinstance(blocks, list | tuple) else list(blocks)
    for block in run:
        if not 1 <= block < size:
            raise IndexError(f"block {block} is outside the pool's blocks (1..{size - 1})")
    if not run:
        return
    last = -counts[0]
    if not 0 <= last < size:
        raise ValueError(f"the queue's tail {last} is outside the pool: not kept by one queue")
    for block in run:
        links[last] = block
        counts[block] = -last
        last = block
    links[last] = 0
    counts[0] = -last


def py_unlink_head(counts: array[int], links: array[int], count: int) -> list[int]:
    """The first `count` blocks of the lru queue, unlinked as one run (the caller holds them
    next); the queue must hold that many (FreeQueue.pop_many)."""
    size = _checked_ring(counts, links)
    taken = []
    block = links[0]
    for _ in range(count):
        if not 1 <= block < size:
            raise ValueError(f"the queue holds fewer than {count} blocks, or is not one queue")
        taken.append(block)
        block = links[block]
    if not 0 <= block < size:
        raise ValueError(f"block {block} follows the run: not kept by one queue")
    links[0] = block
    counts[block] = 0  # the new head's predecessor is the sentinel (or, empty, its own tail)
    return taken


def py_release_tables(
    counts: array[int], links: array[int], tables: Sequence[Sequence[int]], lows: Sequence[int]
) -> int:
    """A whole request's release under lru (ALLOC-FREE-1): table g's blocks from its last
    position down to position lows[g], the null block (0) skipped, group by group in layout
    order, each dropped once (`drop`); those whose count reached 0 join the queue's tail in
    that order (`link`). How many joined. Nothing changes when an argument is refused."""
    size = _checked_ring(counts, links)
    if len(tables) != len(lows):
        raise ValueError(f"{len(tables)} tables and {len(lows)} lows: one low per table")
    held: list[int] = []
    for table, low in zip(tables, lows, strict=True):
        if low < 0:
            raise ValueError(f"a table's low position must be 0 or more, got {low}")
        held += [block for block in reversed(table[low:]) if block]
    _checked(counts, held)
    if held and not 0 <= -counts[0] < size:
        raise ValueError(
            f"the queue's tail {-counts[0]} is outside the pool: not kept by one queue"
        )
    freed = py_drop(counts, held)
    py_link(counts, links, freed)
    return len(freed)


Hold = Callable[["array[int]", Iterable[int], "array[int] | None"], list[int]]
Step = Callable[["array[int]", Iterable[int]], list[int]]
_compiled = native("_refcounts")
hold: Hold = _compiled.hold if _compiled else py_hold
drop: Step = _compiled.drop if _compiled else py_drop
set_one: Callable[[array[int], Iterable[int]], None] = (
    _compiled.set_one if _compiled else py_set_one
)
count_free: Callable[[array[int], Iterable[int]], int] = (
    _compiled.count_free if _compiled else py_count_free
)
link: Callable[[array[int], array[int], Iterable[int]], None] = (
    _compiled.link if _compiled else py_link
)
unlink_head: Callable[[array[int], array[int], int], list[int]] = (
    _compiled.unlink_head if _compiled else py_unlink_head
)
release_tables: Callable[[array[int], array[int], Sequence[Sequence[int]], Sequence[int]], int] = (
    _compiled.release_tables if _compiled else py_release_tables
)
