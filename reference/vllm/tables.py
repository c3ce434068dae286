"""What vLLM reads of a request's block tables through the drop-in (kvcert.reference.vllm.
KVCacheManager): its blocks as vLLM's KVCacheBlocks of PoolBlock views, per group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks

from kvcert.reference.config import Kind
from kvcert.reference.native import native
from kvcert.reference.vllm.layout import CutError

if TYPE_CHECKING:
    from kvcert.reference.manager import KVCacheManager as Core
    from kvcert.reference.vllm.blocks import PoolBlock


_compiled = native("_decodelane")
_wrap_blocks = None if _compiled is None else _compiled.wrap_blocks


class BlockTableViews:
    """The drop-in's block-table answers (a mixin: the manager holds what they read)."""

    core: Core
    blocks: list[PoolBlock]
    empty_kv_cache_blocks: Any
    num_kv_cache_groups: int

    def _wrap(self, tables: Sequence[Sequence[int]]) -> Any:
        """vLLM's KVCacheBlocks of the tables' blocks (the empty one when they hold none);
        compiled where the tables are lists or tuples of ids (`wrap_blocks`)."""
        if _wrap_blocks is not None:
            wrapped = _wrap_blocks(self.blocks, tables, KVCacheBlocks, self.empty_kv_cache_blocks)
            if wrapped is not None:
                return wrapped
        if not any(tables):
            return self.empty_kv_cache_blocks
        view = self.blocks.__getitem__
        return KVCacheBlocks(tuple(list(map(view, t)) for t in tables))

    def get_blocks(self, request_id: str) -> Any:
        if not self.core.is_running(request_id):
            return self.empty_kv_cache_blocks
        return self._wrap(self.core.block_tables(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        if not self.core.is_running(request_id):
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple(list(t) for t in self.core.block_tables(request_id))

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """The blocks covering the first `num_computed_tokens` tokens, per group."""
        return tuple(
            ids[: -(-num_computed_tokens // group.block_size)]
            for ids, group in zip(
                self.get_block_ids(request_id), self.core.config.groups, strict=True
            )
        )

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def create_kv_cache_blocks(self, blocks: tuple[list[Any], ...]) -> Any:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """A lookup result cut at `num_computed_tokens` (a multiple of every block size); an
        attention group holding fewer blocks than the cut needs is refused (a state group's
        list may be shorter: it names only the blocks a hit reads)."""
        cut = []
        for group_blocks, group in zip(blocks.blocks, self.core.config.groups, strict=True):
            count, rest = divmod(num_computed_tokens, group.block_size)
            if rest or (group.kind is not Kind.MAMBA and len(group_blocks) < count):
                raise CutError(
                    f"cannot cut a hit at {num_computed_tokens} tokens: group of block size "
                    f"{group.block_size} holds {len(group_blocks)} blocks, and the cut needs "
                    f"a multiple of the block size within them"
                )
            cut.append(list(group_blocks[:count]))
        return self.create_kv_cache_blocks(tuple(cut))
