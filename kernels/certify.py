"""Every kernel against the spec's page layout, on the machine at hand, with its bandwidth.

    python -m kvcert.kernels.certify [--quick] [--json FILE] [--examples N]

On a GPU: (a) each kernel runs on a fixed family of page layouts (fp32, fp16, bf16, int8 and
fp8 per token-head with their scales; blocks of 16 to 1024 tokens; heads of 64 to 512
elements; pages padded as kvcert.spec's planner pads them, the planner's own pages of three
hybrid models among them), and every page byte it writes must equal kvcert.kernels.reference,
the torch oracle that asks kvcert.spec.page_layout where each byte goes (decode outputs:
within twice kvcert.kernels.accuracy's fp32 error bound, different summation orders); (b)
Hypothesis draws shapes, slots and block tables over that family with a fixed seed and example
count, so a run is bounded and repeatable; (c) each kernel is timed on a large input (medians
of CUDA-event timings) and its bytes (kvcert.kernels.traffic) over its time are compared with
the device's copy bandwidth measured in the same run; decode also against the roofline of the
bytes it must read.

`--quick` runs (a) and (b) small under the Triton interpreter on a CPU (TRITON_INTERPRET=1,
set here before Triton loads) and measures nothing: the fast test tier runs it, so the check
cannot rot between GPU runs. Exit status 1 when any byte or output differs.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvcert.kernels import accuracy, ops, reference, traffic
from kvcert.kernels.layout import PageLayout, attention_layout, latent_layout
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, StateLayer, StateTensor
from kvcert.spec.plan import PlanInput, plan

ATTENTION_DTYPES = ("fp32", "fp16", "bf16", "int8_per_token_head", "fp8_per_token_head")
BLOCKS = (16, 64, 256, 1024)
HEAD_SIZES = (64, 128, 256, 512)
KV_HEADS = (1, 2, 8)
SOURCES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# A kernel's elements per block (block x heads x head size) stay at most this in the byte
# checks: the oracle asks the spec for every byte position, once per layout.
ORACLE_ELEMENTS = 1 << 16


@dataclass
class Check:
    """One kernel on one layout: equal to the oracle or not."""

    kernel: str
    layout: str
    examples: int
    equal: bool
    detail: str = ""


@dataclass
class Speed:
    """One kernel timed on one large input."""

    kernel: str
    case: str
    seconds: float
    moved_bytes: int
    minimum_bytes: int
    bandwidth: float  # moved bytes per second
    copy_ratio: float  # bandwidth / the device's copy bandwidth
    roofline_ratio: float  # (minimum bytes / copy bandwidth) / seconds


@dataclass
class Report:
    """The whole run."""

    device: str
    mode: str
    versions: dict[str, str]
    date: str
    copy_bandwidth: float = 0.0  # bytes per second, read plus written
    checks: list[Check] = field(default_factory=list)
    speeds: list[Speed] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.equal for c in self.checks)


# --- the layouts ------------------------------------------------------------------------------


def _page(data: int, dtype: str, padding: int) -> int:
    """A page holding `data` bytes plus `padding`, aligned as its scales or elements need."""
    align = 4 if dtype.endswith("per_token_head") else {"fp32": 4}.get(dtype, 2)
    return -(-(data + padding) // align) * align


def describe(layout: PageLayout) -> str:
    kind = "latent" if layout.head_v == 0 else "attention"
    shape = (
        f"B{layout.block_size} D{layout.head_k}"
        if layout.head_v == 0
        else f"B{layout.block_size} H{layout.heads} Dk{layout.head_k} Dv{layout.head_v}"
    )
    padding = layout.page_size - layout.data_bytes
    return f"{kind} {layout.dtype} {shape} page {layout.page_size} (+{padding} padding)"


def grid_layouts(quick: bool) -> list[PageLayout]:
    """Every dtype with every block size and every head size, rotated so that a dtype meets
    each block size and each head size once (a full cross product would compile for hours)."""
    if quick:
        return [
            attention_layout(16, 2, 64, 64, "bf16", page_size=_page(8192, "bf16", 64)),
            attention_layout(
                16,
                1,
                64,
                32,
                "int8_per_token_head",
                page_size=_page(3200, "int8_per_token_head", 128),
            ),
        ]
    layouts = []
    for d, dtype in enumerate(ATTENTION_DTYPES):
        for i, block in enumerate(BLOCKS):
            head = HEAD_SIZES[(i + d) % len(HEAD_SIZES)]
            heads = KV_HEADS[(i + d) % len(KV_HEADS)]
            while heads > 1 and block * heads * head > ORACLE_ELEMENTS:
                heads //= 2
            while block * heads * head > ORACLE_ELEMENTS:
                head //= 2
            data = attention_layout(block, heads, head, head, dtype, page_size=1 << 40).data_bytes
            layouts.append(
                attention_layout(
                    block, heads, head, head, dtype, page_size=_page(data, dtype, 512 * (i % 3))
                )
            )
    return layouts


def latent_layouts(quick: bool) -> list[PageLayout]:
    """MLA pages of 512 + 64 elements (DeepSeek's), padded."""
    blocks = (16,) if quick else (16, 64)
    dtypes = ("bf16",) if quick else ("bf16", "fp8_per_token_head", "fp16")
    layouts = []
    for block in blocks:
        for dtype in dtypes:
            data = latent_layout(block, 576, dtype, page_size=1 << 40).data_bytes
            layouts.append(latent_layout(block, 576, dtype, page_size=_page(data, dtype, 256)))
    return layouts


def planned_layouts() -> list[PageLayout]:
    """The attention pages kvcert.spec's planner gives three hybrid models, with the page
    size each is padded to (a window of 8 x 256 beside global 2 x 512, Gemma 4's; a GDN
    state beside full 2 x 256, Qwen3.5's; sliding and full of one shape)."""
    full, window = AttentionKind.FULL, AttentionKind.SLIDING_WINDOW
    models = {
        "gemma4-like": (
            *[AttentionLayer(window, 8, 256, 256, window=1024) for _ in range(5)],
            AttentionLayer(full, 2, 512, 512),
        ),
        "qwen3.5-like": (
            StateLayer(
                (StateTensor((3, 6144), KVDtype.BF16), StateTensor((16, 128, 128), KVDtype.BF16))
            ),
            StateLayer(
                (StateTensor((3, 6144), KVDtype.BF16), StateTensor((16, 128, 128), KVDtype.BF16))
            ),
            AttentionLayer(full, 2, 256, 256),
        ),
        "gpt-oss-like": (
            AttentionLayer(window, 8, 64, 64, window=128),
            AttentionLayer(full, 8, 64, 64),
        ),
    }
    layouts: dict[tuple[Any, ...], PageLayout] = {}
    for layers in models.values():
        for dtype in (KVDtype.BF16, KVDtype.INT8_PER_TOKEN_HEAD):
            planned = plan(PlanInput(layers, dtype, 8 << 30, block_size=16))
            for group in planned.groups:
                if group.kind == "mamba":
                    continue
                layer = layers[next(x for x in group.layers if x is not None)]
                if not isinstance(layer, AttentionLayer):
                    continue
                key = (
                    group.block_size,
                    layer.num_kv_heads,
                    layer.head_size_k,
                    dtype.value,
                    planned.page_size,
                )
                if group.block_size * layer.num_kv_heads * layer.head_size_k <= ORACLE_ELEMENTS:
                    layouts[key] = attention_layout(
                        group.block_size,
                        layer.num_kv_heads,
                        layer.head_size_k,
                        layer.head_size_v,
                        dtype.value,
                        page_size=planned.page_size,
                    )
    return list(layouts.values())


# --- inputs -----------------------------------------------------------------------------------


def values(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, decades: float = 6
) -> torch.Tensor:
    """Normals whose rows spread over `decades` decades of magnitude, a tenth of the rows all
    zero (scale 1), never all zeros. Writes take six (quantization's hard cases); decode
    takes one, as real keys and queries have (over six, a logit of 1e8 turns fp32 rounding
    of the summation order into different softmax weights: no fp32 kernel matches then)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    spread = torch.empty((*shape[:-1], 1)).uniform_(-decades / 2, decades / 2, generator=generator)
    x = x * torch.pow(10.0, spread)
    x[torch.rand(shape[:-1], generator=generator) < 0.1] = 0.0
    return x.to(dtype)


def source_dtype(layout: PageLayout, seed: int) -> torch.dtype:
    """The input dtype: the cache's own, or any of three for the quantized caches."""
    return SOURCES.get(layout.dtype) or (torch.float32, torch.float16, torch.bfloat16)[seed % 3]


def poisoned(blocks: int, layout: PageLayout, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (blocks, layout.page_size), dtype=torch.uint8, generator=generator)


# --- the byte checks --------------------------------------------------------------------------


def check_write(layout: PageLayout, tokens: int, seed: int, device: str) -> str:
    """'' when write_kv (or write_latent) gives the oracle's pages byte for byte."""
    generator = torch.Generator().manual_seed(seed)
    blocks = 2 + -(-tokens // layout.block_size)
    free = torch.randperm((blocks - 1) * layout.block_size, generator=generator)
    slots = free[:tokens] + layout.block_size
    slots[torch.rand(tokens, generator=generator) < 0.1] = -1  # padding tokens write nothing
    src = source_dtype(layout, seed)
    pages = poisoned(blocks, layout, seed)
    expected = pages.clone()
    got = pages.to(device)
    if layout.head_v == 0:
        latent = values((tokens, layout.head_k), src, seed)
        ops.write_latent(latent.to(device), got, slots.to(device), layout)
        reference.write_region(latent[:, None, :], expected, slots, layout, "k")
    else:
        key = values((tokens, layout.heads, layout.head_k), src, seed)
        value = values((tokens, layout.heads, layout.head_v), src, seed + 1)
        ops.write_kv(key.to(device), value.to(device), got, slots.to(device), layout)
        reference.write_region(key, expected, slots, layout, "k")
        reference.write_region(value, expected, slots, layout, "v")
    differ = (got.cpu() != expected).nonzero()
    if not len(differ):
        return ""
    block, byte = (int(x) for x in differ[0])
    return f"{len(differ)} bytes differ, the first at block {block} byte {byte}"


def check_decode(
    layout: PageLayout, lengths: list[int], window: int, group: int, *, seed: int, device: str
) -> str:
    """'' when paged_decode matches the oracle within twice the fp32 error bound
    (`kvcert.kernels.accuracy`) reading only the window's blocks (the others are null in the
    table and poisoned in the pool)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(-(-n // layout.block_size) for n in lengths)
    blocks = 1 + len(lengths) * width
    order = (torch.randperm(blocks - 1, generator=generator) + 1).tolist()
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    for r, n in enumerate(lengths):
        first = max(0, n - window) // layout.block_size if window else 0
        for j in range(first, -(-n // layout.block_size)):
            tables[r, j] = order[r * width + j]
    pages = torch.full((blocks, layout.page_size), 0xFF, dtype=torch.uint8)  # NaN if read
    slots = torch.arange(layout.block_size, blocks * layout.block_size, dtype=torch.int64)
    src = source_dtype(layout, seed)
    key = values((len(slots), layout.heads, layout.head_k), src, seed, decades=1)
    value = values((len(slots), layout.heads, layout.head_v), src, seed + 1, decades=1)
    reference.write_region(key, pages, slots, layout, "k")
    reference.write_region(value, pages, slots, layout, "v")
    query = values((len(lengths), layout.heads * group, layout.head_k), src, seed + 2, 1)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    scale = reference.softmax_scale(layout.head_k)
    want = reference.decode(query, pages, tables, seq_lens, layout, window=window, sm_scale=scale)
    got = ops.paged_decode(
        query.to(device),
        pages.to(device),
        tables.to(device),
        seq_lens.to(device),
        layout,
        window=window,
        sm_scale=scale,
    ).cpu()
    if not bool(torch.isfinite(got).all()):
        return "non-finite output: a null, poisoned or out-of-window block was read"
    bound = accuracy.decode_error_bound(query, pages, tables, seq_lens, layout, window=window,
                                        sm_scale=scale)  # fmt: skip
    return accuracy.decode_mismatch(got, want, bound)


def check_copy(page_size: int, pairs: int, seed: int, device: str) -> str:
    generator = torch.Generator().manual_seed(seed)
    blocks = 1 + 2 * pairs
    pages = torch.randint(0, 256, (blocks, page_size), dtype=torch.uint8, generator=generator)
    order = (torch.randperm(blocks - 1, generator=generator) + 1).reshape(-1, 2)
    expected = pages.clone()
    got = pages.to(device)
    ops.copy_blocks(got, order.to(device))
    reference.copy_pages(expected, order)
    return "" if torch.equal(got.cpu(), expected) else "pages differ after the copy"


def check_slots(
    requests: int, width: int, block: int, tokens: int, *, seed: int, device: str
) -> str:
    generator = torch.Generator().manual_seed(seed)
    tables = torch.randint(1, 1 << 20, (requests, width), dtype=torch.int32, generator=generator)
    ids = torch.randint(0, requests, (tokens,), generator=generator)
    positions = torch.randint(-1, width * block, (tokens,), generator=generator)
    got = ops.slot_mapping(tables.to(device), ids.to(device), positions.to(device), block).cpu()
    want = reference.slots(tables, ids, positions, block)
    return "" if torch.equal(got, want) else "slots differ"


def fixed_checks(quick: bool, device: str) -> Iterator[Check]:
    """(a): every layout of the family, once each kernel."""
    attention = grid_layouts(quick) + ([] if quick else planned_layouts())
    for i, layout in enumerate(attention):
        tokens = 3 * layout.block_size + 5
        why = check_write(layout, tokens, i, device)
        yield Check("write_kv", describe(layout), 1, not why, why)
        lengths = [layout.block_size + 3, 3 * layout.block_size, 1]
        window = 0 if i % 2 else layout.block_size + 7
        group = (1, 2, 4, 8)[i % 4]
        why = check_decode(layout, lengths, window, group, seed=i, device=device)
        yield Check(
            "paged_decode", describe(layout) + f" window {window} group {group}", 1, not why, why
        )
    for i, layout in enumerate(latent_layouts(quick)):
        why = check_write(layout, 2 * layout.block_size + 3, 100 + i, device)
        yield Check("write_latent", describe(layout), 1, not why, why)
    for page_size in (64, 66560, 1097728) if not quick else (66560,):
        why = check_copy(page_size, 8 if page_size < 1 << 20 else 2, page_size, device)
        yield Check("copy_blocks", f"pages of {page_size} bytes", 1, not why, why)
    why = check_slots(4, 64, 16, 4096 if not quick else 64, seed=7, device=device)
    yield Check("slot_mapping", "4 tables of 64 blocks of 16", 1, not why, why)


def drawn_checks(quick: bool, device: str, examples: int) -> Iterator[Check]:
    """(b): Hypothesis over the family, derandomized (a fixed seed) and bounded."""
    from hypothesis import HealthCheck, given, settings  # noqa: PLC0415 - the test extra
    from hypothesis import strategies as st  # noqa: PLC0415

    bounded = settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    attention = grid_layouts(quick)
    found: dict[str, str] = {}

    def record(name: str) -> Callable[[str], None]:
        def note(why: str) -> None:
            if why and name not in found:
                found[name] = why
            assert not why, why

        return note

    @bounded
    @given(st.sampled_from(attention), st.integers(1, 300), st.integers(0, 1 << 20))
    def writes(layout: PageLayout, tokens: int, seed: int) -> None:
        record("write_kv")(check_write(layout, tokens, seed, device))

    @bounded
    @given(
        st.sampled_from(attention),
        st.lists(st.integers(1, 700), min_size=1, max_size=6),
        st.sampled_from([0, 0, 1, 17, 300]),
        st.sampled_from([1, 2, 4, 8]),
        st.integers(0, 1 << 20),
    )
    def decodes(layout: PageLayout, lengths: list[int], window: int, group: int, seed: int) -> None:
        record("paged_decode")(
            check_decode(layout, lengths, window, group, seed=seed, device=device)
        )

    @bounded
    @given(st.integers(1, 5000), st.integers(1, 16), st.integers(0, 1 << 20))
    def copies(page_size: int, pairs: int, seed: int) -> None:
        record("copy_blocks")(check_copy(page_size, pairs, seed, device))

    @bounded
    @given(
        st.integers(1, 8),
        st.integers(1, 40),
        st.sampled_from([1, 16, 64, 1024]),
        st.integers(1, 2000),
        st.integers(0, 1 << 20),
    )
    def slots(requests: int, width: int, block: int, tokens: int, seed: int) -> None:
        record("slot_mapping")(
            check_slots(requests, width, block, tokens, seed=seed, device=device)
        )

    for name, test in (
        ("write_kv", writes),
        ("paged_decode", decodes),
        ("copy_blocks", copies),
        ("slot_mapping", slots),
    ):
        try:
            test()
        except AssertionError as error:
            found.setdefault(name, str(error)[:300])
        detail = found.get(name, "")
        yield Check(name, "Hypothesis over the family (derandomized)", examples, not detail, detail)


# --- bandwidth --------------------------------------------------------------------------------


def _median_seconds(run: Callable[[], Any]) -> float:
    from triton.testing import do_bench  # type: ignore[import-untyped]  # noqa: PLC0415 - after TRITON_INTERPRET is settled

    return float(do_bench(run, warmup=25, rep=200, return_mode="median")) / 1000


def copy_bandwidth() -> float:
    """The device's copy bandwidth, bytes read plus written per second (1 GiB, median)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    return 2 * src.numel() / _median_seconds(lambda: dst.copy_(src))


def _pool(blocks: int, layout: PageLayout) -> torch.Tensor:
    return torch.zeros(blocks, layout.page_size, dtype=torch.uint8, device="cuda")


def _fitted(block: int, heads: int, head: int, dtype: str) -> PageLayout:
    """An attention page holding exactly its data (no padding to move)."""
    data = attention_layout(block, heads, head, head, dtype, page_size=1 << 40).data_bytes
    return attention_layout(block, heads, head, head, dtype, page_size=_page(data, dtype, 0))


Timed = tuple[str, str, Callable[[], Any], traffic.Traffic]  # kernel, case, run, bytes


def _write_run(dtype: str, source: torch.dtype) -> Timed:
    layout, tokens = _fitted(16, 8, 128, dtype), 1 << 16
    pages = _pool(1 + tokens // layout.block_size, layout)
    slots = torch.randperm(tokens, device="cuda") + layout.block_size
    key = torch.randn(tokens, 8, 128, device="cuda").to(source)
    value = torch.randn(tokens, 8, 128, device="cuda").to(source)
    write_k = functools.partial(ops.launch_write, key, pages, slots, layout, "k")
    write_v = functools.partial(ops.launch_write, value, pages, slots, layout, "v")
    moved = traffic.write_kv(tokens, 0, layout, torch.finfo(source).bits // 8)
    case = f"{tokens:,} tokens, {describe(layout)}, from {str(source).removeprefix('torch.')}"
    return "write_kv", case, lambda: (write_k(), write_v()), moved


def _decode_run(dtype: str, source: torch.dtype, block: int) -> Timed:
    """32 requests of 8,192 tokens, each on blocks of its own (1 GiB of fp16 KV: from memory,
    not from the 50-60 MB L2)."""
    layout, requests, length, group = _fitted(block, 8, 128, dtype), 32, 8192, 4
    width = length // block
    pages = _pool(1 + requests * width, layout)
    tables = (torch.randperm(requests * width, device="cuda") + 1).to(torch.int32)
    query = torch.randn(requests, 8 * group, 128, device="cuda").to(source)
    lens = torch.full((requests,), length, dtype=torch.int32, device="cuda")
    table = tables.reshape(requests, width)
    scale = reference.softmax_scale(128)
    run = functools.partial(
        ops.launch_decode,
        query,
        pages,
        table,
        lens,
        layout,
        window=0,
        sm_scale=scale,
        max_tokens=length,
    )
    moved = traffic.paged_decode([length] * requests, layout, 8 * group, 2)
    case = f"{requests} x {length:,} tokens, GQA {group}, {describe(layout)}"
    return "paged_decode", case, run, moved


def _latent_run() -> Timed:
    layout, tokens = latent_layout(64, 576, "bf16", page_size=64 * 576 * 2), 1 << 16
    pages = _pool(1 + tokens // 64, layout)
    slots = torch.randperm(tokens, device="cuda") + 64
    rows = torch.randn(tokens, 1, 576, device="cuda").to(torch.bfloat16)
    minimum = tokens * 576 * 2 * 2  # read once, written once
    run = functools.partial(ops.launch_write, rows, pages, slots, layout, "k")
    return (
        "write_latent",
        f"{tokens:,} tokens, {describe(layout)}",
        run,
        traffic.Traffic(minimum + 8 * tokens, minimum),
    )


def _copy_run() -> Timed:
    layout, count = attention_layout(16, 8, 256, 256, "int8_per_token_head", page_size=66560), 8192
    pool = _pool(1 + 2 * count, layout)
    pairs = (torch.randperm(2 * count, device="cuda") + 1).reshape(-1, 2)
    case = f"{count:,} pages of {layout.page_size:,} bytes"
    return (
        "copy_blocks",
        case,
        functools.partial(ops.launch_copy, pool, pairs),
        (traffic.copy_blocks(count, layout)),
    )


def _slots_run() -> Timed:
    tokens = 1 << 22
    tables = torch.randint(1, 1 << 20, (64, 4096), dtype=torch.int32, device="cuda")
    ids = torch.randint(0, 64, (tokens,), device="cuda")
    positions = torch.randint(0, 4096 * 16, (tokens,), device="cuda")
    run = functools.partial(ops.launch_slots, tables, ids, positions, 16)
    return "slot_mapping", f"{tokens:,} tokens", run, traffic.slot_mapping(tokens)


def speeds(copy: float) -> Iterator[Speed]:
    """(c): each kernel on a large input, against the copy bandwidth."""
    runs: list[Callable[[], Timed]] = [
        functools.partial(_write_run, "fp16", torch.float16),
        functools.partial(_write_run, "int8_per_token_head", torch.bfloat16),
        functools.partial(_decode_run, "fp16", torch.float16, 16),
        functools.partial(_decode_run, "int8_per_token_head", torch.bfloat16, 16),
        functools.partial(_decode_run, "fp16", torch.float16, 256),
        _latent_run,
        _copy_run,
        _slots_run,
    ]
    for make in runs:
        kernel, case, run, moved = make()
        seconds = _median_seconds(run)
        rate = moved.moved / seconds
        roofline = moved.minimum / copy / seconds
        yield Speed(kernel, case, seconds, moved.moved, moved.minimum, rate, rate / copy, roofline)
        torch.cuda.empty_cache()


# --- the command ------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import triton  # type: ignore[import-untyped]  # noqa: PLC0415 - after TRITON_INTERPRET is settled

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
    }


def render(report: Report) -> str:
    """The short table: checks per kernel, then bandwidth."""
    lines = [
        f"kvcert kernels on {report.device} ({report.mode}), {report.date}: "
        f"{sum(c.equal for c in report.checks)} of {len(report.checks)} checks equal"
    ]
    for check in report.checks:
        if not check.equal:
            lines.append(f"  DIFFERS {check.kernel}: {check.layout}: {check.detail}")
    kernels = sorted({c.kernel for c in report.checks})
    for kernel in kernels:
        mine = [c for c in report.checks if c.kernel == kernel]
        lines.append(
            f"  {kernel:14} {sum(c.equal for c in mine)}/{len(mine)} layouts or "
            f"draws equal, {sum(c.examples for c in mine)} runs"
        )
    if report.speeds:
        lines.append(f"copy bandwidth {report.copy_bandwidth / 1e12:.2f} TB/s (read + written)")
        lines.append("| kernel | case | time | bandwidth | of copy | of roofline |")
        lines.append("|---|---|---|---|---|---|")
        for s in report.speeds:
            lines.append(
                f"| {s.kernel} | {s.case} | {s.seconds * 1e6:,.1f} us | "
                f"{s.bandwidth / 1e12:.2f} TB/s | {s.copy_ratio:.2f} | "
                f"{s.roofline_ratio:.2f} |"
            )
    else:
        lines.append("bandwidth: not measured (the interpreter runs on the CPU)")
    lines.append(f"{'ALL EQUAL' if report.ok else 'DIFFERENCES FOUND'} in {report.seconds:.0f} s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvcert.kernels.certify", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small, under the interpreter")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--examples", type=int, help="Hypothesis examples per kernel")
    args = parser.parse_args(argv)
    started = time.monotonic()
    gpu = torch.cuda.is_available() and not args.quick
    if not gpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--quick needs TRITON_INTERPRET=1 before Triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"
    device = "cuda" if gpu else "cpu"
    examples = args.examples or (30 if gpu else 3)
    report = Report(
        torch.cuda.get_device_name() if gpu else platform.processor() or "cpu",
        "gpu" if gpu else "interpreter --quick",
        versions(),
        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    )
    report.checks.extend(fixed_checks(not gpu, device))
    report.checks.extend(drawn_checks(not gpu, device, examples))
    if gpu:
        report.copy_bandwidth = copy_bandwidth()
        report.speeds.extend(speeds(report.copy_bandwidth))
    report.seconds = time.monotonic() - started
    if args.json is not None:
        body = asdict(report) | {"ok": report.ok}
        args.json.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    print(render(report), end="")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
