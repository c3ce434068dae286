"""Which code of kvcert.reference implements each behavioural rule of kvcert.spec.

ethereum/execution-specs pairs each optimised function with the specification's by name; here
the pairing is this table, keyed by rule tag (kvcert.reference never imports the spec, so the
tags are plain strings). Every function listed says `Implements TAG` in its docstring, and
tests/differential/test_rules_table.py checks that every HIT-, HASH-, ALLOC-, RET-, EVICT-,
CKPT-, BRANCH-, PAGE- and RADIX- rule of the spec (bar the byte-address rules, which
kvcert.kernels implements, and RADIX-ID-1 and RADIX-INV-1, which name the spec's pages
and states: engines' page ids are physical, compared as lifetimes) has an entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcert.reference import (
    coordinator,
    groups,
    hashing,
    planner,
    radix,
    retention,
    scheduling,
    tails,
    unit_hits,
)
from kvcert.reference.block_pool import BlockPool
from kvcert.reference.commit import Registrar
from kvcert.reference.config import CacheConfig
from kvcert.reference.eviction import FreeQueue, HybridQueue, UnkeyedFirstQueue
from kvcert.reference.lookup import Keying
from kvcert.reference.manager import KVCacheManager
from kvcert.reference.radix import RadixCacheManager
from kvcert.reference.tables import TablePlanner

IMPLEMENTED_BY: dict[str, tuple[Callable[..., Any], ...]] = {
    "HIT-FULL-1": (groups.first_needed,),
    "HIT-SW-1": (groups.first_needed,),
    "HIT-CHUNK-1": (groups.first_needed,),
    "HIT-MAMBA-1": (groups.first_needed,),
    "HIT-MAMBA-2": (coordinator.find_hit,),
    "HIT-CROSS-1": (coordinator.find_hit,),
    "HIT-GROUP-1": (coordinator.find_hit,),
    "HIT-GROUP-2": (coordinator.find_hit,),
    "HIT-LEN-1": (coordinator.find_hit,),
    "HIT-HYB-1": (coordinator.find_hit,),
    "HIT-SPEC-1": (coordinator.find_hit,),
    "HIT-SPEC-2": (coordinator.find_hit, unit_hits.find_unit_hit),
    "HIT-UNIT-1": (CacheConfig._check_hit_unit, unit_hits.find_unit_hit),
    "HIT-UNIT-2": (unit_hits.find_unit_hit,),
    "HIT-UNIT-3": (unit_hits.find_unit_hit,),
    "HIT-UNIT-4": (unit_hits.find_unit_hit,),
    "HIT-UNIT-5": (unit_hits.find_unit_hit, tails.Tails.land),
    "HASH-EXTRA-1": (hashing.encode_extras,),
    "HASH-CHAIN-1": (hashing.Chain.extend,),
    "HASH-UNIT-1": (Keying.unit_keys,),
    "HASH-DRAFT-1": (Keying.chains,),
    "HASH-MATCH-1": (Keying.keys,),
    "ALLOC-INIT-1": (BlockPool.__init__,),
    "ALLOC-LOOKUP-1": (BlockPool.lookup,),
    "ALLOC-HOLD-1": (
        groups.first_read,
        groups.first_release,
        TablePlanner.changes,
        TablePlanner.plan_quiet,
    ),
    "ALLOC-WRITE-1": (groups.first_written, TablePlanner.changes),
    "ALLOC-SPEC-1": (groups.table_end, TablePlanner.plan_quiet),
    "ALLOC-SPEC-2": (TablePlanner.check_checkpoint,),
    "ALLOC-TWO-PHASE-1": (KVCacheManager.admit,),
    "ALLOC-SKIP-1": (TablePlanner.changes, groups.first_release),
    "ALLOC-EVICT-1": (FreeQueue.pop,),
    "ALLOC-FREE-1": (FreeQueue.release_batches,),
    "ALLOC-FREE-2": (UnkeyedFirstQueue.release_batches,),
    "ALLOC-COMMIT-1": (Registrar.committed,),
    "ALLOC-VIS-1": (KVCacheManager.end_step,),
    "ALLOC-VIS-2": (Registrar.publish,),
    "ALLOC-VIS-3": (KVCacheManager._withdraw,),
    "RET-DENSE-1": (retention.dense_lengths, retention.keeps_less),
    "RET-SPARSE-1": (retention.retained_lengths,),
    "RET-SPARSE-2": (retention.keeps, Registrar.kept),
    "RET-SPARSE-3": (retention.keeps_checkpoint, tails.Tails._tails_of),
    "RET-JUNCTION-1": (coordinator.longest_single_group, KVCacheManager._junction),
    "ALLOC-RESET-1": (KVCacheManager.reset_prefix_cache,),
    "ALLOC-UNIT-1": (tails.unit_refusal,),
    "ALLOC-UNIT-2": (tails.Tails.register,),
    "ALLOC-UNIT-3": (tails.Tails.split, KVCacheManager.end_step),
    "ALLOC-UNIT-4": (tails.Tails.keep,),
    "EVICT-LIVE-1": (BlockPool.is_dead,),
    "EVICT-DEAD-1": (BlockPool.is_dead, Registrar.prerequisites),
    "EVICT-HYB-1": (HybridQueue.pop,),
    "EVICT-ORDER-1": (HybridQueue.release_batches,),
    "BRANCH-1": (KVCacheManager.branch_point,),
    "CKPT-ALL-1": (scheduling.next_chunk,),
    "CKPT-ALIGN-1": (scheduling.next_chunk,),
    "CKPT-BRANCH-1": (scheduling.next_chunk,),
    "CKPT-INNER-1": (TablePlanner.changes, Registrar.register_inner),
    "CKPT-INNER-2": (TablePlanner.check_checkpoint, tails.Tails.register),
    "PAGE-BYTES-1": (planner.page_bytes,),
    "PAGE-ANCHOR-1": (planner._anchor,),
    "PAGE-SIZE-1": (planner._anchor,),
    "PAGE-FIT-1": (planner._fit,),
    "PAGE-STATE-1": (planner._capped,),
    "PAGE-GROUP-1": (planner._group_size,),
    "PAGE-SPLIT-1": (planner._capped,),
    "PAGE-POOL-1": (planner._capped,),
    "PAGE-CAP-1": (planner._capped,),
    "PAGE-ALIGN-1": (planner._fit, planner._capped),
    "PAGE-ALIGN-2": (planner._caps,),
    "PAGE-RECOMP-1": (planner.recompute_per_lookup,),
    "PAGE-OBJ-1": (planner.chosen_index,),
    "RADIX-SCOPE-1": (radix._check_scope,),
    "RADIX-HIT-1": (RadixCacheManager.admit,),
    "RADIX-LRU-1": (RadixCacheManager._lookup, RadixCacheManager._insert),
    "RADIX-SPLIT-1": (RadixCacheManager._split,),
    "RADIX-PUB-1": (RadixCacheManager.end_step,),
    "RADIX-PUB-2": (RadixCacheManager.end_step, RadixCacheManager.finish),
    "RADIX-DEDUP-1": (RadixCacheManager._insert,),
    "RADIX-EVICT-1": (RadixCacheManager._evict, RadixCacheManager._grow),
    "RADIX-FREE-1": (RadixCacheManager._release,),
    "RADIX-RESET-1": (RadixCacheManager.reset_prefix_cache,),
}
