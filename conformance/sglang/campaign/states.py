"""The Mamba states of SGLang's request pool as the campaign's ledger reads them: each state
carries the identity of what it was computed from in its own values (float32 holds the
integer exactly), so SGLang's copies and clears move identities the loop can check."""

from __future__ import annotations

from typing import Any

from kvcert.conformance.sglang import unified


class States:
    """A view of `requests` (SGLang's HybridReqToTokenPool) by physical state slot."""

    def __init__(self, requests: Any) -> None:
        self.requests = requests

    def slot(self, req: Any) -> int:
        """The physical slot of the request's running state."""
        logical = req.kv.mamba_pool_idx.reshape(1)
        return int(self.requests.translate_mamba_indices(logical)[0])

    def values(self) -> Any:
        """Per physical state slot, the identity its values carry (layer 0's first value)."""
        temporal = self.requests.mamba_pool.mamba_cache.temporal[0]
        return temporal.reshape(temporal.shape[0], -1)[:, 0].to(unified.api().torch.int64)

    def write(self, slot: int, ident: int) -> None:
        self.requests.mamba_pool.mamba_cache.temporal[0, slot] = float(ident)

    def physical(self, logical: Any) -> set[int]:
        """The physical state slots of logical state indices."""
        return set(self.requests.translate_mamba_indices(logical.reshape(-1)).tolist())

    def copy_and_clear(self, batch: Any, *, copy: bool = True) -> None:
        """What the model runner does to states before an extend pass: clear a fresh
        request's, copy a matched one's from the tree (ModelRunner's deferred Mamba ops;
        `copy` False is the broken twin no-state-copy)."""
        pool = self.requests
        clear = batch.mamba_clear_indices
        if clear is not None and len(clear) > 0:
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(clear))
        source, target = batch.mamba_cow_src_indices, batch.mamba_cow_dst_indices
        if source is not None and len(source) > 0 and copy:
            pool.copy_mamba_state(
                pool.translate_mamba_indices(source), pool.translate_mamba_indices(target)
            )
        batch.mamba_clear_indices = batch.mamba_cow_src_indices = None
