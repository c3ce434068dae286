"""A template adapter: copy this file to certify your own engine.

Here "your engine" is kvcert.reference, driven through its public API only; replace the
marked calls (YOUR ENGINE) with your allocator's. The adapter is the whole contract an engine
meets (kvcert.conformance.contract.protocol):

* `describe()` names the engine and claims features and at most a few eviction profiles; a
  case needing anything unclaimed is skipped, with the reason, never failed;
* `run(case)` answers one case as plain JSON: a hit, a list of observations, or
  {"refused": true} where the input breaks the protocol, {"unsupported": "why"} where the
  engine cannot express the case;
* block ids are the engine's own: the runner compares tables up to a renaming.

Register it (`[project.entry-points."kvcert.engines"] my-engine = "my_pkg.kv:make_engine"`)
and run `kvcert certify --engine my-engine`, or pass `--engine my_pkg.kv:make_engine`. This
template passes every case it claims (`kvcert certify --engine template`).
"""

from __future__ import annotations

from typing import Any

from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.coordinator import find_hit
from kvcert.reference.errors import KVCacheError
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Scheduled

JSON = dict[str, Any]
KINDS = ("full", "sliding_window", "chunked_local", "mamba.none", "mamba.align", "mamba.all")


def config(layout: JSON, num_blocks: int) -> CacheConfig:
    """The layout JSON as the engine's configuration (YOUR ENGINE: build its cache here)."""
    groups = tuple(
        GroupConfig(
            Kind(g["kind"]),
            g["block_size"],
            window=g.get("window", 0),
            chunk=g.get("chunk", 0),
            mode=MambaMode(g["mode"]) if "mode" in g else None,
            draft=g.get("draft", False),
            speculative_blocks=g.get("speculative_blocks", 0),
        )
        for g in layout["groups"]
    )
    speculative = layout.get("speculative")
    return CacheConfig(
        groups,
        num_blocks,
        speculative=DraftKeying(speculative) if speculative else None,
        max_model_len=layout.get("max_model_len"),
    )


class TemplateEngine:
    """kvcert.reference behind the adapter an engine author would write."""

    def describe(self) -> JSON:
        return {
            "name": "template (kvcert.reference through its public API)",
            "version": "1",
            "features": [f"kind.{k}" for k in KINDS]
            + ["speculative.exact", "speculative.drop", "extras.cache_salt", "extras.lora"]
            + ["alloc.lookahead", "alloc.preempt", "alloc.reset_cache"],
            "profiles": ["eviction.lru"],
        }

    def run(self, case: JSON) -> JSON:
        try:
            if case["suite"] == "hit":
                return self.hit(case)
            if case["suite"] == "alloc":
                return self.alloc(case)
        except (KVCacheError, KeyError, TypeError, ValueError):
            return {"refused": True}  # the input breaks the protocol
        return {"unsupported": "this template plans no pages"}

    def hit(self, case: JSON) -> JSON:
        """The lookup over a cache holding exactly the listed blocks per group (YOUR ENGINE:
        seed its cache, or give its search a "which blocks are cached" callback like this)."""
        cfg = config(case["layout"], 2)
        KVCacheManager(cfg)  # validates the layout as the engine would
        if case["num_tokens"] < 1:
            raise ValueError("a request has at least one token")
        cached = [{j for start, stop in r for j in range(start, stop)} for r in case["cached"]]
        if len(cached) != len(cfg.groups):
            raise ValueError("one cached list per group")
        keys = [range(case["num_tokens"]) for _ in cfg.groups]  # block j keyed by its index
        served = [{j: j + 1 for j in blocks} for blocks in cached]  # its block id: j + 1
        length, tables = find_hit(cfg, case["num_tokens"], keys, served)
        blocks = [[b - 1 if b else None for b in t] for t in tables]  # 0 is the null block
        return {"hit": length, "blocks": blocks}

    def alloc(self, case: JSON) -> JSON:
        """Each operation as the engine's own call (YOUR ENGINE: one method per operation)."""
        engine = KVCacheManager(config(case["layout"], case["num_blocks"]))
        observations = []
        for op in case["ops"]:
            try:
                observations.append(self.apply(engine, op))
            except (KVCacheError, KeyError, TypeError, ValueError):
                observations.append({"refused": True})
        return {"observations": observations}

    def apply(self, engine: KVCacheManager, op: JSON) -> JSON:
        kind, rid = op["op"], str(op.get("rid"))
        if kind == "admit":
            extras = [ExtraKey(ExtraKind(e["kind"]), e["value"]) for e in op.get("extras", ())]
            done = engine.admit(rid, op["tokens"], op["budget"], extras, op.get("lookahead", 0))
            if not isinstance(done, Scheduled):
                return {"waiting": {"needed": done.needed, "free": done.free}}
            tables = [list(t) for t in engine.block_tables(rid)]
            return {"admitted": {"hit": done.hit, "scheduled": done.scheduled, "tables": tables}}
        if kind == "extend":
            done = engine.extend(rid, op["budget"], op.get("appended", ()), op.get("lookahead", 0))
            if not isinstance(done, Scheduled):
                return {"waiting": {"needed": done.needed, "free": done.free}}
            tables = [list(t) for t in engine.block_tables(rid)]  # an extension returns only
            return {"extended": {"scheduled": done.scheduled, "tables": tables}}  # new blocks
        if kind == "end_step":
            return {"step_ended": {"registered": engine.end_step()}}
        if kind in ("finish", "preempt"):
            freed = engine.finish(rid) if kind == "finish" else engine.preempt(rid)
            return {"released": {"blocks": freed}}
        if kind == "reset_cache":
            return {"cache_reset": {"done": engine.reset_prefix_cache()}}
        raise ValueError(f"unknown operation {kind!r}")


def make_engine() -> TemplateEngine:
    """Entry point `template`."""
    return TemplateEngine()
