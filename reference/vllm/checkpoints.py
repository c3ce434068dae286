"""Where vLLM's model runner saves state inside a prefill chunk, as kvcert checkpoints.

vLLM 0.33.0's Mamba2 layers (and FlashInfer GDN layers that export) plan their KV-cache spec
with `num_prefill_checkpoint_blocks=1`: while computing a prefill chunk the kernel also writes
the state at one position inside it (a multiple of the hit alignment), into the block-table
column `cdiv(chunk_end, B) - 2`, unless that column holds the null block. The runner decides
with `compute_mamba_prefill_checkpoints`, for every chunk, from the chunk alone; vLLM's own
manager reserves the column on the chunk that ends the prompt and, on a chunk inside it, where
its retention keeps the position. This module asks the runner's own function what it will
write and turns the answer into the reference allocator's `checkpoint=` (CKPT-INNER-1, -2),
or into 0 when kvcert's table must keep that column null:
- the state saved must be the one kvcert's column holds: the state after `(column + 1) * B`
  tokens (CKPT-INNER-1), or, where kvcert serves hits inside blocks (`unit U`), a multiple of
  U inside a block, saved in the column before the running one (CKPT-INNER-2: vLLM's runner
  saves the state at a multiple of the hash block there); an EAGLE block drop or another
  alignment moves it elsewhere;
- every state group must save it (the reference checkpoints all align state groups at once);
- a chunk inside the prompt saves only what its retention keeps (under dense retention
  everything, under sparse the block boundaries at multiples of the interval), as vLLM's own
  manager reserves them, so a prompt diverging inside that chunk's last block hits it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcert.reference.vllm.layout import vllm_hits_inside


def _runner() -> Any:
    """vLLM's runner-side rule (imported on use: it brings torch and triton)."""
    from vllm.model_executor.layers.mamba import checkpoint  # noqa: PLC0415

    return checkpoint.compute_mamba_prefill_checkpoints


@dataclass(frozen=True)
class RunnerCheckpoints:
    """The runner's inputs that do not change per chunk (all from vLLM's configuration)."""

    hash_block_size: int
    alignment_tokens: int  # kv_cache_config.cache_hit_alignment_tokens, as the runner reads it
    drop_eagle_block: bool  # the scheduler's use_eagle_block_drop (the manager's use_eagle)
    hash_lookahead_tokens: int
    # per state group: (block size, prefill_checkpoint_alignment) when it saves checkpoints
    state_groups: tuple[tuple[int, int | None] | None, ...]

    @classmethod
    def of(
        cls,
        kv_cache_config: Any,
        *,
        hash_block_size: int,
        scheduler_block_size: int,
        drop_eagle_block: bool,
        hash_lookahead_tokens: int,
        state_types: tuple[type, ...],
    ) -> RunnerCheckpoints | None:
        """None when no state group saves checkpoints (the runner then writes none)."""
        groups: list[tuple[int, int | None] | None] = []
        for group in kv_cache_config.kv_cache_groups:
            spec: Any = group.kv_cache_spec
            if type(spec) not in state_types:  # exact types, as the layout reads them
                continue
            saves = getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0
            groups.append(
                (spec.block_size, getattr(spec, "prefill_checkpoint_alignment", None))
                if saves
                else None
            )
        if not any(groups):
            return None
        _runner()  # imported now, not in the first step that needs it (torch, triton)
        alignment = getattr(kv_cache_config, "cache_hit_alignment_tokens", None)
        if alignment is None:  # unresolved (vLLM's tests): what vLLM's engine core sets
            inside = vllm_hits_inside(kv_cache_config.kv_cache_groups, hash_block_size)
            alignment = hash_block_size if inside else scheduler_block_size
        return cls(
            hash_block_size,
            alignment,
            drop_eagle_block,
            hash_lookahead_tokens,
            tuple(groups),
        )

    def written(self, start: int, end: int) -> list[tuple[int, int]]:
        """Per state group that saves checkpoints, the (position, column) the runner writes
        for the chunk [start, end) when that column holds a block; (0, -1) for none."""
        if end - start <= self.hash_block_size:  # the runner needs start + hash <= position
            return [(0, -1)] * len(self.state_groups)
        compute = _runner()
        out = []
        for group in self.state_groups:
            if group is None:
                out.append((0, -1))
                continue
            block_size, alignment = group
            offsets, columns = compute(
                [end],
                [end - start],
                hash_block_size=self.hash_block_size,
                mamba_block_size=block_size,
                checkpoint_alignment=alignment,
                drop_eagle_block=self.drop_eagle_block,
                cache_hit_alignment_tokens=self.alignment_tokens,
                num_hash_lookahead_tokens=self.hash_lookahead_tokens,
            )
            out.append((start + offsets[0] if offsets[0] else 0, columns[0]))
        return out

    def checkpoint(
        self, request: Any, start: int, end: int, unit: int | None, retention: int | None
    ) -> int:
        """The reference's `checkpoint=` for vLLM `request`'s chunk [start, end): the runner's
        position when kvcert can hold it (module docstring), else 0 (the column stays null).
        `unit`: kvcert's hit unit where it serves hits inside blocks (a state there is keyed,
        CKPT-INNER-2), else None; `retention`: the retention interval in vLLM's meaning (None
        dense, 0 latest-only, N also every multiple of N), which says what a chunk inside the
        prompt saves: under dense retention anything, else a boundary it keeps."""
        if None in self.state_groups:
            return 0
        saved = self.written(start, end)
        positions = {position for position, _ in saved}
        if len(positions) != 1 or 0 in positions:
            return 0
        ((position, column), *_) = saved
        sizes = {size for size, _ in filter(None, self.state_groups)}
        if len(sizes) != 1:
            return 0
        size = sizes.pop()
        boundary = position == (column + 1) * size  # CKPT-INNER-1
        inside = unit is not None and position % size != 0 and position % unit == 0  # -2
        if not (boundary or (inside and column == -(-end // size) - 2)):
            return 0
        if end < max(request.num_prompt_tokens, request.num_tokens - 1):  # inside the prompt
            kept = retention is None or (retention > 0 and boundary and position % retention == 0)
            return position if kept else 0
        return position
