"""kvcert.spec: the executable specification of hybrid KV-cache prefix caching.

Normative. Pure, typed, no I/O, no randomness; clarity over speed. Each rule is one function
whose docstring opens with its tag; `kvcert.spec.rules.all_rules()` lists them and RULES.md
is their generated index. Sections:

    §1 layout      groups, kinds, speculative profile           kvcert.spec.layout
    §2 view        what each group has cached for a request     kvcert.spec.view
    §3 acceptance  which lengths one group can serve            kvcert.spec.acceptance
    §4 hybrid      the hit every group can serve                kvcert.spec.hybrid
    §5 hashing     the abstract key chain behind "cached"       kvcert.spec.hashing
    §6 alloc       the allocator: step(state, op)               kvcert.spec.alloc
    §6b retention  which blocks a request leaves cached         kvcert.spec.retention
    §7 invariants  what every reachable state satisfies         kvcert.spec.invariants
    §8 layers      what one layer stores per block, in bytes    kvcert.spec.layers
    §9 plan        groups, block sizes, one shared page size    kvcert.spec.plan
    §10 page       where each element and scale lives           kvcert.spec.page_layout
    §11 eviction   which cached blocks matter; the hybrid profile kvcert.spec.eviction
    §12 checkpoints where state checkpoints go (placement)      kvcert.spec.checkpoints
    §13 radix      the radix profile: a tree of page runs        kvcert.spec.radix
"""

from kvcert.spec.acceptance import NULL, group_accepts, group_blocks, needed_blocks
from kvcert.spec.errors import (
    AlignmentImpossible,
    InvalidLayout,
    InvalidOp,
    InvalidPlan,
    InvalidRequest,
    NoPageLayout,
    SpecError,
    UncacheableLayout,
)
from kvcert.spec.hashing import Extra, ExtraKind, block_keys, matched_blocks
from kvcert.spec.hybrid import HybridHit, common_lengths, hybrid_hit, max_hit_length
from kvcert.spec.layout import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    hit_alignment,
)
from kvcert.spec.view import CacheView

SPEC_VERSION = "0.13.0"

__all__ = [
    "NULL",
    "SPEC_VERSION",
    "AlignmentImpossible",
    "CacheView",
    "ChunkedLocal",
    "CrossAttention",
    "Extra",
    "ExtraKind",
    "FullAttention",
    "Group",
    "HybridHit",
    "InvalidLayout",
    "InvalidOp",
    "InvalidPlan",
    "InvalidRequest",
    "Layout",
    "MambaMode",
    "MambaState",
    "NoPageLayout",
    "SlidingWindow",
    "SpecError",
    "Speculative",
    "UncacheableLayout",
    "block_keys",
    "common_lengths",
    "group_accepts",
    "group_blocks",
    "hit_alignment",
    "hybrid_hit",
    "matched_blocks",
    "max_hit_length",
    "needed_blocks",
]
