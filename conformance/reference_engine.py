"""Drive kvcert.reference with the spec's operations and report the spec's observations.

The translation is mechanical (names and types only), so a difference between the two is a
difference in behaviour. The conformance runner and the differential tests both use it.
"""

from __future__ import annotations

from kvcert.reference import config as ref
from kvcert.reference.errors import KVCacheError
from kvcert.reference.hashing import ExtraKey
from kvcert.reference.hashing import ExtraKind as RefExtraKind
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.reference.manager import Waiting as RefWaiting
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    Extra,
    FullAttention,
    Group,
    Layout,
    MambaState,
    SlidingWindow,
)
from kvcert.spec import alloc as spec


def group_config(group: Group) -> ref.GroupConfig:
    """A spec group as the reference's GroupConfig."""
    match group:
        case FullAttention():
            return ref.GroupConfig(
                ref.Kind.FULL, group.block_size, draft=group.draft, name=group.name
            )
        case SlidingWindow():
            return ref.GroupConfig(
                ref.Kind.SLIDING_WINDOW,
                group.block_size,
                window=group.window,
                draft=group.draft,
                name=group.name,
            )
        case ChunkedLocal():
            return ref.GroupConfig(
                ref.Kind.CHUNKED_LOCAL,
                group.block_size,
                chunk=group.chunk,
                draft=group.draft,
                name=group.name,
            )
        case MambaState():
            return ref.GroupConfig(
                ref.Kind.MAMBA,
                group.block_size,
                mode=ref.MambaMode(group.mode.value),
                name=group.name,
            )
        case CrossAttention():
            return ref.GroupConfig(ref.Kind.CROSS, group.block_size, name=group.name)


def cache_config(layout: Layout, num_blocks: int) -> ref.CacheConfig:
    """A spec layout and pool size as the reference's CacheConfig."""
    speculative = ref.DraftKeying(layout.speculative.value) if layout.speculative else None
    return ref.CacheConfig(
        tuple(group_config(g) for g in layout.groups),
        num_blocks,
        speculative=speculative,
        max_model_len=layout.max_model_len,
    )


def extra_key(extra: Extra) -> ExtraKey:
    """A spec extra key as the reference's."""
    return ExtraKey(RefExtraKind(extra.kind.value), extra.value, extra.start, extra.end)


class ReferenceSession:
    """One reference allocator answering spec operations with spec observations."""

    def __init__(self, config: spec.PoolConfig) -> None:
        self.manager = KVCacheManager(cache_config(config.layout, config.num_blocks))

    def apply(self, op: spec.Op) -> spec.Observation:
        """Run one operation; reference misuse errors propagate as KVCacheError."""
        manager = self.manager
        match op:
            case spec.Admit():
                result = manager.admit(
                    op.rid,
                    op.tokens,
                    op.budget,
                    tuple(extra_key(e) for e in op.extras),
                    op.lookahead,
                )
                if isinstance(result, RefWaiting):
                    return spec.Waiting(result.needed, result.free)
                return spec.Admitted(result.hit, result.scheduled, result.tables)
            case spec.Extend():
                extended = manager.extend(op.rid, op.budget, op.appended, op.lookahead)
                if isinstance(extended, RefWaiting):
                    return spec.Waiting(extended.needed, extended.free)
                return spec.Extended(extended.scheduled, extended.tables)
            case spec.EndStep():
                return spec.StepEnded(manager.end_step())
            case spec.Finish():
                return spec.Released(manager.finish(op.rid))
            case spec.Preempt():
                return spec.Released(manager.preempt(op.rid))
            case spec.ResetCache():
                return spec.CacheReset(manager.reset_prefix_cache())
        raise KVCacheError(f"unsupported operation {op!r}")  # pragma: no cover


__all__ = ["ReferenceSession", "Scheduled", "cache_config", "extra_key", "group_config"]
