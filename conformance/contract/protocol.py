"""What an engine is to kvcert: two JSON methods, the features and profiles it may claim.

An engine is any object with `describe() -> dict` and `run(case) -> dict`, both plain JSON:

    describe() -> {"name": ..., "version": ..., "features": [...], "profiles": [...]}
    run({"suite": "hit", "layout": {...}, "num_tokens": n, "cached": [[[start, stop], ...], ...],
         "partial": [[position, ...], ...]})     (partial: only under a layout's hit_unit)
        -> {"hit": L, "blocks": [[j or null, ...], ...]}
    run({"suite": "alloc", "layout": {...}, "num_blocks": N, "ops": [{...}, ...]})
        -> {"observations": [{...} or {"refused": true}, ...]}
    run({"suite": "page", "plan": {...}})   (kvcert.conformance.contract.plans)
        -> {"page_size": P, "num_blocks": N, "token_capacity": T, "hit_alignment": A,
            "groups": [{"kind", "layers", "block_size", "page_bytes", "draft"}, ...]}

Any answer may instead be {"unsupported": "why"}: a combination the engine cannot express
although it claims each feature (the runner records it as skipped, with the reason).

An engine may also offer `open(case) -> Session` for alloc cases, a session answering one
operation at a time (`apply(op) -> observation`); the shipped state machine then drives it
step by step instead of replaying the whole trace at every step. Out-of-process engines speak
the same messages over stdio (kvcert.conformance.contract.stdio); engines/template.py is a
documented adapter to start from.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Protocol, runtime_checkable

from kvcert.conformance.contract.codec import JSON

FEATURES = (
    "kind.full",
    "kind.sliding_window",
    "kind.chunked_local",
    "kind.mamba.none",
    "kind.mamba.align",
    "kind.mamba.all",
    "kind.cross",
    "speculative.exact",
    "speculative.drop",
    "speculative.reach",  # draft_reach > 1: drafters of several MTP modules
    "extras.cache_salt",
    "extras.lora",
    "extras.encoder_input",
    "extras.multimodal",
    "extras.prompt_embeds",
    "alloc.lookahead",
    "alloc.state_checkpoint",
    "alloc.speculative_state",
    "alloc.preempt",
    "alloc.reset_cache",
    "page.plan",
)
# Eviction order is compared only under a profile the engine claims (spec ALLOC-EVICT-1,
# ALLOC-FREE-1/2, EVICT-HYB-1): which block a new allocation takes is otherwise the engine's.
# Visibility (ALLOC-VIS-1, ALLOC-VIS-2) likewise: a case whose answer depends on when a
# block becomes hittable runs only under the profile the engine claims. Retention (RET-*)
# too: which blocks stay cached; `retention.sparse-interval` is sparse retention with a
# positive `retention_interval`, claimed by engines whose interval can be set. `hit.unit`: the
# hit-granularity profile `unit U` (HIT-UNIT-1..4), hits that may end inside a block.
PROFILES = (
    "eviction.lru",
    "eviction.hybrid",
    "eviction.lru-unkeyed-first",
    "eviction.radix",  # SGLang's tree (spec §13); page ids compared as lifetimes (RADIX-ID-1)
    "visibility.step-end",
    "visibility.same-pass",
    "retention.dense",
    "retention.sparse",
    "retention.sparse-interval",
    "hit.unit",
)


def claims_everything(name: str) -> JSON:
    """The description of an engine claiming every feature and every profile (kvcert's own)."""
    return {
        "name": name,
        "version": version("kvcert"),
        "features": list(FEATURES),
        "profiles": list(PROFILES),
    }


class EngineError(Exception):
    """The engine could not be loaded or answered outside the protocol."""


class EngineDead(EngineError):
    """The engine cannot run any more cases (it failed to start, or failed case after case);
    the runner reports every remaining case as an engine error."""


@runtime_checkable
class Engine(Protocol):
    """What the runner drives."""

    def describe(self) -> JSON: ...

    def run(self, case: JSON) -> JSON: ...


@runtime_checkable
class Session(Protocol):
    """One alloc case, an operation at a time (optional; see the module docstring)."""

    def apply(self, op: JSON) -> JSON: ...
