"""Per-kind position arithmetic: what a hit needs, what a request reads and writes.

Every kind needs a contiguous run of blocks ending at the hit (spec §3), so each rule reduces
to "the first position": O(1) arithmetic instead of the spec's sets.
"""

from __future__ import annotations

from kvcert.reference.config import GroupConfig, Kind, MambaMode


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def first_needed(group: GroupConfig, length: int) -> int:
    """First block a hit of `length` needs; the run ends at length // block_size.

    Implements HIT-FULL-1, HIT-SW-1, HIT-CHUNK-1, HIT-MAMBA-1 (length > 0 for state groups).
    """
    size = group.block_size
    if group.kind is Kind.MAMBA:
        return max(0, length // size - 1)
    return first_token_read(group, length) // size


def first_token_read(group: GroupConfig, length: int) -> int:
    """The first cached token an attention group's hit of `length` reads (none when it is
    `length` itself): full attention 0, a window the W - 1 before, chunked local the hit's
    chunk start. Implements HIT-FULL-1, HIT-SW-1, HIT-CHUNK-1."""
    if group.kind is Kind.SLIDING_WINDOW:
        return max(0, length - (group.window - 1))
    if group.kind is Kind.CHUNKED_LOCAL:
        return (length // group.chunk) * group.chunk
    return 0


def needs_last_block(group: GroupConfig) -> bool:
    """Whether every hit of a length L >= block_size needs block L // block_size - 1, the
    last one before it: first_needed(L) <= L // B - 1 for every such L."""
    if group.kind is Kind.SLIDING_WINDOW:
        return group.window - 1 >= group.block_size
    return group.kind in (Kind.FULL, Kind.MAMBA)


def first_read(group: GroupConfig, computed: int, end: int) -> int:
    """First position kept while computing [computed, end). Implements ALLOC-HOLD-1."""
    size = group.block_size
    if group.kind is Kind.SLIDING_WINDOW:
        return max(0, computed - (group.window - 1)) // size
    if group.kind is Kind.CHUNKED_LOCAL:
        return (computed // group.chunk) * group.chunk // size
    if group.kind is Kind.MAMBA and group.mode is not MambaMode.ALL:
        # the state after `computed` tokens, carried into the running state at the end
        return (computed - 1) // size if computed else cdiv(end, size) - 1
    return 0


def first_release(group: GroupConfig, low: int) -> int | None:
    """The least `computed` whose one-token step [computed, computed + 1) no longer reads
    position `low` (ALLOC-HOLD-1's first_read passes it, ALLOC-SKIP-1 releases it); None
    for kinds that keep every position. The inverse of first_read, for the decode fast path."""
    size = group.block_size
    if group.kind is Kind.SLIDING_WINDOW:
        return (low + 1) * size + group.window - 1
    if group.kind is Kind.CHUNKED_LOCAL:
        return cdiv((low + 1) * size, group.chunk) * group.chunk
    if group.kind is Kind.MAMBA and group.mode is not MambaMode.ALL:
        return (low + 1) * size + 1
    return None


def table_end(group: GroupConfig, end: int, decoding: bool, limit: int | None = None) -> int:
    """How many positions a chunk ending at `end` spans: the one `end` falls in, and for a
    decode chunk of a state group with speculative blocks every position a verifying step
    ending up to S tokens later (never past `limit`, max_model_len) puts its running state
    in, plus the S after it. Implements ALLOC-SPEC-1."""
    spare = group.speculative_blocks
    if spare and decoding:
        reach = end + spare if limit is None else max(end, min(end + spare, limit))
        return cdiv(reach, group.block_size) + spare
    return cdiv(end, group.block_size)


def first_written(group: GroupConfig, computed: int, end: int) -> int:
    """First position written while computing [computed, end). Implements ALLOC-WRITE-1."""
    if group.kind is Kind.MAMBA and group.mode is not MambaMode.ALL:
        return cdiv(end, group.block_size) - 1
    return computed // group.block_size


def checkpoint_position(size: int, checkpoint: int, end: int) -> int:
    """The table position a state group in mode align (blocks of `size`) saves the inner
    checkpoint of a chunk ending at `end` at: the block ending at a boundary (CKPT-INNER-1),
    or for a position inside a block the one before the chunk's running one (CKPT-INNER-2)."""
    if checkpoint % size:
        return cdiv(end, size) - 2
    return checkpoint // size - 1


def tail_boundary(unit: int, prompt_length: int, reach: int) -> int:
    """A prompt's tail boundary under `unit U`: the longest hit a re-send takes, the last
    multiple of U at or below its length less max(1, r) (r: the tokens a draft key covers
    past its end). Implements the spec's tail_boundary (ALLOC-UNIT-2)."""
    return max(prompt_length - max(1, reach), 0) // unit * unit
