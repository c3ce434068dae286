"""Where a page's regions start, computed independently of kvcert.spec (tests compare them).

A page of one layer (spec §10, PAGE-ADDR-1/3):

    attention  [K scales B.H x 4][V scales B.H x 4][K B.H.Dk x e][V B.H.Dv x e][padding]
    latent     [scales B x 4][entries B x (latent + rope) x e][padding]      (ratio 1)

Scales exist only for the per-token-head dtypes. A latent cache is an attention layout with
one head, no V region and one scale region, so one set of kernels serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcert.kernels.errors import KernelInputError

ELEMENT = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "int8_per_token_head": 1,
    "fp8_per_token_head": 1,
}
QUANTIZED = ("int8_per_token_head", "fp8_per_token_head")


@dataclass(frozen=True)
class PageLayout:
    """Byte offsets of one layer's regions inside its page, and the page size."""

    block_size: int
    heads: int
    head_k: int
    head_v: int  # 0 for a latent cache
    dtype: str
    page_size: int  # the shared page P (>= the data; the rest is padding)
    k_scale: int = 0
    v_scale: int = 0
    k_data: int = 0
    v_data: int = 0

    @property
    def element(self) -> int:
        return ELEMENT[self.dtype]

    @property
    def quantized(self) -> bool:
        return self.dtype in QUANTIZED

    @property
    def data_bytes(self) -> int:
        """Bytes of the page that hold KV and scales (the rest is padding)."""
        data = self.block_size * self.heads * (self.head_k + self.head_v) * self.element
        scales = (2 if self.head_v else 1) * self.block_size * self.heads * 4
        return data + (scales if self.quantized else 0)


def _check(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KernelInputError(f"{what} must be a positive integer, got {value!r}")


def _finish(layout: PageLayout) -> PageLayout:
    if layout.page_size < layout.data_bytes:
        raise KernelInputError(
            f"page_size {layout.page_size} is smaller than the {layout.data_bytes} bytes one "
            "block of this layer needs; plan the cache with `kvcert plan`"
        )
    alignment = 4 if layout.quantized else layout.element
    if layout.page_size % alignment:
        raise KernelInputError(
            f"page_size {layout.page_size} is not a multiple of {alignment}: pages after the "
            "first would start misaligned for their scales or elements; pad the page"
        )
    return layout


def attention_layout(
    block_size: int, heads: int, head_k: int, head_v: int, dtype: str, *, page_size: int
) -> PageLayout:
    """The layout of an attention layer's page."""
    for value, what in ((block_size, "block_size"), (heads, "heads"), (head_k, "head_k"),
                        (head_v, "head_v"), (page_size, "page_size")):  # fmt: skip
        _check(value, what)
    if dtype not in ELEMENT:
        raise KernelInputError(f"kv-cache dtype {dtype!r} is not one of {sorted(ELEMENT)}")
    scales = block_size * heads * 4 if dtype in QUANTIZED else 0
    k_data = 2 * scales
    v_data = k_data + block_size * heads * head_k * ELEMENT[dtype]
    layout = PageLayout(block_size, heads, head_k, head_v, dtype, page_size, 0, scales, k_data,
                        v_data)  # fmt: skip
    return _finish(layout)


def latent_layout(block_size: int, width: int, dtype: str, *, page_size: int) -> PageLayout:
    """The layout of a latent (MLA) page with one entry per token: width = latent + rope."""
    for value, what in ((block_size, "block_size"), (width, "width"), (page_size, "page_size")):
        _check(value, what)
    if dtype not in ELEMENT:
        raise KernelInputError(f"kv-cache dtype {dtype!r} is not one of {sorted(ELEMENT)}")
    scales = block_size * 4 if dtype in QUANTIZED else 0
    layout = PageLayout(block_size, 1, width, 0, dtype, page_size, 0, 0, scales, 0)
    return _finish(layout)
