"""Bytes each kernel moves against the least the operation needs (no timing is possible here).

Counted analytically from the kernels' loads and stores (masked lanes move nothing):

    write_kv      reads slots (8 B/token) and the new K/V; writes K/V elements and scales.
                  Minimum: the new K/V once in, their elements and scales once out.
    paged_decode  per (request, KV head): its query group, the K/V (and scales) of the tokens
                  in its window, one table entry per visited block; writes the output.
                  Minimum: the window's K/V and scales once, the query, the output.
    copy_blocks   reads and writes whole pages, padding included. Minimum: the data bytes.
    slot_mapping  reads position, request id and one table entry; writes the slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcert.kernels.layout import PageLayout


@dataclass(frozen=True)
class Traffic:
    """Bytes moved by the kernel and the least the operation needs."""

    moved: int
    minimum: int

    @property
    def ratio(self) -> float:
        return self.moved / self.minimum if self.minimum else 1.0


def write_kv(tokens: int, padding_tokens: int, layout: PageLayout, input_bytes: int) -> Traffic:
    """`tokens` real tokens plus `padding_tokens` slots of -1."""
    per_token = layout.heads * (layout.head_k + layout.head_v)
    scales = 2 * layout.heads * 4 if layout.quantized else 0
    payload = tokens * (per_token * (input_bytes + layout.element) + scales)
    slots = 8 * (tokens + padding_tokens)
    return Traffic(payload + slots, payload)


def paged_decode(seq_lens: list[int], layout: PageLayout, query_heads: int, query_bytes: int,
                 window: int = 0) -> Traffic:  # fmt: skip
    moved = minimum = 0
    per_token = layout.heads * (layout.head_k + layout.head_v) * layout.element
    per_token += 2 * layout.heads * 4 if layout.quantized else 0
    for length in seq_lens:
        start = max(0, length - window) if window else 0
        tokens = length - start
        visited = -(-length // layout.block_size) - start // layout.block_size
        io = query_heads * (layout.head_k * query_bytes + layout.head_v * 4) + 4  # q, out, len
        minimum += tokens * per_token + io
        moved += tokens * per_token + io + 4 * visited * layout.heads  # table entries
    return Traffic(moved, minimum)


def copy_blocks(pairs: int, layout: PageLayout) -> Traffic:
    return Traffic(pairs * (2 * layout.page_size + 16), pairs * 2 * layout.data_bytes)


def slot_mapping(tokens: int) -> Traffic:
    return Traffic(tokens * (8 + 8 + 4 + 8), tokens * (8 + 8 + 4 + 8))
