"""kvcert.kernels: Triton kernels on the KV data path, certified against kvcert.spec's layout.

    write_kv, write_latent   new K/V (or MLA latents) into their slots, quantizing per
                             (token, head) for the *_per_token_head dtypes
    paged_decode             one decode step through block tables (GQA, sliding window)
    copy_blocks              whole-page copies: state checkpoints, copy-on-write
    slot_mapping             token positions -> slots through block tables

Pages are raw bytes laid out as spec §10 says (kvcert.kernels.layout computes the offsets on
its own; tests compare every byte with kvcert.kernels.reference, which asks the spec). The
operations need the `kernels` extra (torch, triton: `pip install -c constraints.txt
'kvcert[kernels]'`) and a GPU or TRITON_INTERPRET=1; without a GPU or the interpreter the
wrappers run the torch reference. The page layouts, errors and traffic model import without
torch; the operations load on first use and say what to install when torch is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcert.kernels.errors import KernelInputError
from kvcert.kernels.layout import PageLayout, attention_layout, latent_layout

if TYPE_CHECKING:
    from kvcert.kernels.ops import (
        copy_blocks,
        paged_decode,
        slot_mapping,
        use_triton,
        write_kv,
        write_latent,
    )

OPERATIONS = (
    "copy_blocks",
    "paged_decode",
    "slot_mapping",
    "use_triton",
    "write_kv",
    "write_latent",
)


def __getattr__(name: str) -> Any:
    if name not in OPERATIONS:
        raise AttributeError(f"module 'kvcert.kernels' has no attribute {name!r}")
    try:
        from kvcert.kernels import ops  # noqa: PLC0415 - torch loads on first use only
    except ModuleNotFoundError as error:
        raise ImportError(
            f"kvcert.kernels.{name} needs {error.name}: install the kernels extra, "
            "pip install -c constraints.txt 'kvcert[kernels]' (torch 2.13.0 CPU, triton 3.7.1)"
        ) from error
    return getattr(ops, name)


__all__ = [
    "KernelInputError",
    "PageLayout",
    "attention_layout",
    "copy_blocks",
    "latent_layout",
    "paged_decode",
    "slot_mapping",
    "use_triton",
    "write_kv",
    "write_latent",
]
