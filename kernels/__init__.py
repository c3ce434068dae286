"""kvcert.kernels: Triton kernels on the KV data path, certified against kvcert.spec's layout.

    write_kv, write_latent   new K/V (or MLA latents) into their slots, quantizing per
                             (token, head) for the *_per_token_head dtypes
    paged_decode             one decode step through block tables (GQA, sliding window)
    copy_blocks              whole-page copies: state checkpoints, copy-on-write
    slot_mapping             token positions -> slots through block tables

Pages are raw bytes laid out as spec §10 says (kvcert.kernels.layout computes the offsets on
its own; tests compare every byte with kvcert.kernels.reference, which asks the spec). The
kernels need the `kernels` extra and a GPU or TRITON_INTERPRET=1; without them the wrappers
run the torch reference.
"""

from kvcert.kernels.errors import KernelInputError
from kvcert.kernels.layout import PageLayout, attention_layout, latent_layout
from kvcert.kernels.ops import (
    copy_blocks,
    paged_decode,
    slot_mapping,
    use_triton,
    write_kv,
    write_latent,
)

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
