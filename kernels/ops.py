"""Host wrappers: validate, then run the Triton kernel (GPU or TRITON_INTERPRET=1) or, on a
machine with neither, the torch reference (kvcert.kernels.reference), so the library works
everywhere. Pages are raw bytes: `pages` is a uint8 tensor [num_blocks, page_size], block 0
is the null block and is never read or written. Outputs live on the inputs' device.

The `launch_*` functions run a kernel with no checks, for callers that validated the same
arguments once already (a benchmark timing the kernel alone).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from kvcert.kernels import reference
from kvcert.kernels.errors import KernelInputError
from kvcert.kernels.layout import PageLayout

IN_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
OUT_KINDS = {"fp32": 0, "fp16": 1, "bf16": 2, "int8_per_token_head": 3, "fp8_per_token_head": 4}
BLOCK_T = 16  # the fewest tokens a write program takes; wider tiles for narrower heads
SLOT_TILE = 1024  # tokens per slot-mapping program
TILE_ELEMENTS = 8192  # a write program's tile: tokens x head elements


def use_triton() -> bool:
    """Kernels run under Triton on a GPU or in its interpreter; otherwise the reference."""
    if importlib.util.find_spec("triton") is None:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pages(pages: torch.Tensor, layout: PageLayout) -> int:
    if pages.dtype != torch.uint8 or pages.dim() != 2 or not pages.is_contiguous():
        raise KernelInputError("pages must be a contiguous uint8 tensor [num_blocks, page_size]")
    if pages.shape[1] != layout.page_size:
        raise KernelInputError(
            f"pages hold {pages.shape[1]} bytes per page but the layout says {layout.page_size}"
        )
    if pages.shape[0] < 2:
        raise KernelInputError("pages need the null block 0 and at least one more")
    return int(pages.shape[0])


def _values(x: torch.Tensor, name: str, heads: int, width: int, layout: PageLayout) -> None:
    if x.dtype not in IN_KINDS:
        raise KernelInputError(f"{name} must be fp32, fp16 or bf16, got {x.dtype}")
    if x.dim() != 3 or x.shape[1] != heads or x.shape[2] != width:
        raise KernelInputError(f"{name} must be [tokens, {heads}, {width}], got {list(x.shape)}")
    if not layout.quantized and reference.TORCH_DTYPES[layout.dtype] != x.dtype:
        raise KernelInputError(
            f"{name} is {x.dtype} but the cache stores {layout.dtype}: convert it first (the "
            "kernels move unquantized elements bit for bit)"
        )


def _slots(slots: torch.Tensor, tokens: int, num_blocks: int, layout: PageLayout) -> None:
    if slots.dtype != torch.int64 or slots.shape != (tokens,):
        raise KernelInputError(f"slot_mapping must be int64 [{tokens}], got {slots.dtype}")
    real = slots[slots >= 0]
    if bool((slots < -1).any()):
        raise KernelInputError("slot_mapping holds values below -1 (-1 marks a padding token)")
    if bool((real < layout.block_size).any()):
        raise KernelInputError("a slot points into the null block 0, which is never written")
    if bool((real >= num_blocks * layout.block_size).any()):
        raise KernelInputError(f"a slot points past block {num_blocks - 1}")
    if len(set(real.tolist())) != len(real):
        raise KernelInputError("two tokens write the same slot")


def _write(x: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor, layout: PageLayout,
           part: str) -> None:  # fmt: skip
    if not use_triton():
        reference.write_region(x, pages, slots, layout, part)
        return
    launch_write(x, pages, slots, layout, part)


def launch_write(x: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor, layout: PageLayout,
                 part: str) -> None:  # fmt: skip
    """The write kernel for one region (part "k" or "v"), unchecked."""
    from kvcert.kernels import _triton  # noqa: PLC0415 - needs triton and a GPU/interpreter

    scale = layout.k_scale if part == "k" else layout.v_scale
    data = layout.k_data if part == "k" else layout.v_data
    tokens, heads, width = x.shape
    x = x.contiguous()
    block_d = _pow2(width)
    block_t = max(BLOCK_T, min(128, TILE_ELEMENTS // block_d))
    grid = (_cdiv(tokens, block_t), heads)
    _triton.write_kernel[grid](
        x, pages, slots, tokens, x.stride(0), x.stride(1), layout.page_size, layout.block_size,
        scale, data, HEADS=heads, DIM=width, BLOCK_T=block_t, BLOCK_D=block_d,
        IN_KIND=IN_KINDS[x.dtype], OUT_KIND=OUT_KINDS[layout.dtype], num_warps=4,
    )  # fmt: skip


def write_kv(key: torch.Tensor, value: torch.Tensor, pages: torch.Tensor,
             slot_mapping: torch.Tensor, layout: PageLayout) -> None:  # fmt: skip
    """Write K [T, H, Dk] and V [T, H, Dv] into their slots (PAGE-ADDR-1/2; -1 is skipped)."""
    if layout.head_v == 0:
        raise KernelInputError("this layout is a latent cache: use write_latent")
    num_blocks = _pages(pages, layout)
    _values(key, "key", layout.heads, layout.head_k, layout)
    _values(value, "value", layout.heads, layout.head_v, layout)
    if key.shape[0] != value.shape[0]:
        raise KernelInputError("key and value need the same number of tokens")
    _slots(slot_mapping, key.shape[0], num_blocks, layout)
    _write(key, pages, slot_mapping, layout, "k")
    _write(value, pages, slot_mapping, layout, "v")


def write_latent(latent: torch.Tensor, pages: torch.Tensor, slot_mapping: torch.Tensor,
                 layout: PageLayout) -> None:  # fmt: skip
    """Write MLA latents [T, latent + rope] into their slots (PAGE-ADDR-3/5; -1 skipped)."""
    if layout.head_v != 0:
        raise KernelInputError("this layout has a V region: use write_kv")
    num_blocks = _pages(pages, layout)
    if latent.dim() != 2:
        raise KernelInputError(f"latent must be [tokens, {layout.head_k}]")
    x = latent[:, None, :]
    _values(x, "latent", 1, layout.head_k, layout)
    _slots(slot_mapping, x.shape[0], num_blocks, layout)
    _write(x, pages, slot_mapping, layout, "k")


def paged_decode(query: torch.Tensor, pages: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, layout: PageLayout, *, window: int = 0,
                 sm_scale: float | None = None) -> torch.Tensor:  # fmt: skip
    """One decode step: query [R, Hq, Dk] attends to each request's cached tokens (the last
    `window` of them when window > 0) through its block table; returns fp32 [R, Hq, Dv].

    Blocks before the window may be null in the table: they are never read.
    """
    num_blocks = _pages(pages, layout)
    if layout.head_v == 0:
        raise KernelInputError("latent (MLA) decode is not provided; use an attention layout")
    if query.dim() != 3 or query.shape[2] != layout.head_k or query.dtype not in IN_KINDS:
        raise KernelInputError(f"query must be fp32/fp16/bf16 [requests, heads, {layout.head_k}]")
    requests, query_heads, _ = query.shape
    if query_heads % layout.heads:
        raise KernelInputError(f"{query_heads} query heads do not group over {layout.heads}")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        raise KernelInputError("block_tables must be int32 [requests, max_blocks]")
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (requests,):
        raise KernelInputError(f"seq_lens must be int32 [{requests}]")
    if block_tables.shape[0] != requests:
        raise KernelInputError("one block table row per request")
    if window < 0:
        raise KernelInputError("window must be >= 0 (0: no window)")
    for r in range(requests):
        length = int(seq_lens[r])
        if length < 1:
            raise KernelInputError(f"request {r}: seq_len must be >= 1")
        last = _cdiv(length, layout.block_size)
        if last > block_tables.shape[1]:
            raise KernelInputError(
                f"request {r}: {length} tokens need {last} blocks but its table has "
                f"{block_tables.shape[1]}"
            )
        first = max(0, length - window) // layout.block_size if window else 0
        used = block_tables[r, first:last]
        if bool(((used < 1) | (used >= num_blocks)).any()):
            raise KernelInputError(
                f"request {r}: a block it reads is null or past the pool: {used.tolist()}"
            )
    scale = reference.softmax_scale(layout.head_k) if sm_scale is None else sm_scale
    if not use_triton():
        return reference.decode(
            query, pages, block_tables, seq_lens, layout, window=window, sm_scale=scale
        )
    longest = max(int(n) for n in seq_lens.tolist())
    return launch_decode(query, pages, block_tables, seq_lens, layout, window=window,
                         sm_scale=scale, max_tokens=min(longest, window or longest))  # fmt: skip


def launch_decode(query: torch.Tensor, pages: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, layout: PageLayout, *, window: int, sm_scale: float,
                  max_tokens: int) -> torch.Tensor:  # fmt: skip
    """The decode kernels, unchecked; `max_tokens`: the most tokens one request reads (its
    window, or its length). Each request's window is cut into splits so that requests x KV
    heads x splits fill the GPU (flash-decoding); tiles are at least 16 wide (the matrix
    instructions' least size; masked lanes move nothing)."""
    from kvcert.kernels import _triton  # noqa: PLC0415 - needs triton and a GPU/interpreter

    requests, query_heads, _ = query.shape
    device = query.device
    query = query.contiguous()
    tables = block_tables.contiguous()
    group = query_heads // layout.heads
    width = max(_pow2(layout.head_k), _pow2(layout.head_v), 16)
    block_n = 32 if width <= 128 else 16
    block_dv = max(16, _pow2(layout.head_v))
    programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count if (
        device.type == "cuda") else 8  # fmt: skip
    splits = max(1, min(_cdiv(programs, requests * layout.heads),
                        _cdiv(max_tokens, 4 * block_n)))  # fmt: skip
    split_tokens = block_n * _cdiv(_cdiv(max_tokens, splits), block_n)
    splits = _cdiv(max_tokens, split_tokens)
    rows = requests * query_heads * splits
    part_m = torch.empty(rows, dtype=torch.float32, device=device)
    part_l = torch.empty(rows, dtype=torch.float32, device=device)
    part_acc = torch.empty(rows, block_dv, dtype=torch.float32, device=device)
    _triton.decode_kernel[(requests, layout.heads, splits)](
        query, pages, tables, seq_lens, part_m, part_l, part_acc, query.stride(0),
        query.stride(1), tables.stride(0), layout.page_size, layout.block_size, window,
        split_tokens, sm_scale, layout.k_scale, layout.v_scale, layout.k_data, layout.v_data,
        GROUP=group, HEADS=layout.heads, DK=layout.head_k, DV=layout.head_v,
        BLOCK_G=max(16, _pow2(group)), BLOCK_N=block_n, BLOCK_DK=max(16, _pow2(layout.head_k)),
        BLOCK_DV=block_dv, Q_KIND=IN_KINDS[query.dtype], KIND=OUT_KINDS[layout.dtype],
        num_warps=4 if width <= 128 else 8,
    )  # fmt: skip
    out = torch.empty(requests, query_heads, layout.head_v, dtype=torch.float32, device=device)
    _triton.combine_kernel[(requests, query_heads)](
        part_m, part_l, part_acc, out, out.stride(0), out.stride(1), query_heads, splits,
        layout.head_v, BLOCK_S=max(2, _pow2(splits)), BLOCK_DV=block_dv,
    )  # fmt: skip
    return out


def copy_blocks(pages: torch.Tensor, pairs: torch.Tensor) -> None:
    """Copy whole pages (state checkpoints, copy-on-write): pairs int64 [N, 2] of (src, dst)."""
    if pages.dtype != torch.uint8 or pages.dim() != 2 or not pages.is_contiguous():
        raise KernelInputError("pages must be a contiguous uint8 tensor [num_blocks, page_size]")
    if pairs.dtype != torch.int64 or pairs.dim() != 2 or pairs.shape[1] != 2:
        raise KernelInputError("pairs must be int64 [N, 2] of (src, dst)")
    num_blocks = int(pages.shape[0])
    if bool(((pairs < 1) | (pairs >= num_blocks)).any()):
        raise KernelInputError("a pair names the null block 0 or a block past the pool")
    sources, targets = set(pairs[:, 0].tolist()), pairs[:, 1].tolist()
    if len(set(targets)) != len(targets):
        raise KernelInputError("two pairs write the same destination block")
    if sources & set(targets):
        raise KernelInputError("a block is both a source and a destination; split the copies")
    if not len(pairs):
        return
    if not use_triton():
        reference.copy_pages(pages, pairs)
        return
    launch_copy(pages, pairs)


def launch_copy(pages: torch.Tensor, pairs: torch.Tensor) -> None:
    """The copy kernel, unchecked: each page in the widest word dividing its size."""
    from kvcert.kernels import _triton  # noqa: PLC0415 - needs triton and a GPU/interpreter

    page_size = int(pages.shape[1])
    word = next(w for w in (8, 4, 2, 1) if page_size % w == 0)
    chunk = 1024
    grid = (int(pairs.shape[0]), _cdiv(page_size // word, chunk))
    _triton.copy_kernel[grid](pages, pairs.contiguous(), page_size // word, BLOCK=chunk,
                              WORD=word)  # fmt: skip


def slot_mapping(block_tables: torch.Tensor, request_ids: torch.Tensor,
                 positions: torch.Tensor, block_size: int) -> torch.Tensor:  # fmt: skip
    """PAGE-SLOT-1 per token: block_tables[request][p // B] x B + p % B; -1 for p = -1."""
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        raise KernelInputError("block_tables must be int32 [requests, max_blocks]")
    if positions.dtype != torch.int64 or positions.dim() != 1:
        raise KernelInputError("positions must be int64 [tokens]")
    if request_ids.dtype != torch.int64 or request_ids.shape != positions.shape:
        raise KernelInputError("request_ids must be int64, one per position")
    if block_size < 1:
        raise KernelInputError("block_size must be >= 1")
    if bool(((request_ids < 0) | (request_ids >= block_tables.shape[0])).any()):
        raise KernelInputError("a request id has no block table row")
    if bool((positions < -1).any()):
        raise KernelInputError("positions below -1 (-1 marks a padding token)")
    real = positions >= 0
    index = positions[real] // block_size
    if bool((index >= block_tables.shape[1]).any()):
        raise KernelInputError("a position lies past its block table: the table is too short")
    if bool((block_tables[request_ids[real], index] < 1).any()):
        raise KernelInputError("a position maps to the null block 0")
    if not use_triton():
        return reference.slots(block_tables, request_ids, positions, block_size)
    return launch_slots(block_tables, request_ids, positions, block_size)


def launch_slots(block_tables: torch.Tensor, request_ids: torch.Tensor,
                 positions: torch.Tensor, block_size: int) -> torch.Tensor:  # fmt: skip
    """The slot kernel, unchecked."""
    from kvcert.kernels import _triton  # noqa: PLC0415 - needs triton and a GPU/interpreter

    tokens = int(positions.shape[0])
    out = torch.empty(tokens, dtype=torch.int64, device=positions.device)
    tables = block_tables.contiguous()
    _triton.slot_kernel[(_cdiv(max(tokens, 1), SLOT_TILE),)](
        tables, request_ids, positions, out, tokens, tables.stride(0), block_size,
        BLOCK_T=SLOT_TILE,
    )  # fmt: skip
    return out
