"""Deliberately broken engines: each reproduces one real bug class on top of the reference.

Shipped so anyone can see the checkers have teeth: each must fail at least one vector (and
the report must name the rule it broke), and `kvcert check` times how long the shipped state
machine takes to find and shrink each one. Never use them for anything else.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvcert.conformance import engines
from kvcert.conformance.codec import JSON
from kvcert.conformance.engines import ReferenceEngine
from kvcert.reference import coordinator, groups, manager
from kvcert.reference.config import DraftKeying, Kind


@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    original = inspect.getattr_static(obj, name)  # keeps a staticmethod wrapped on restore
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


class PerGroupDropEngine(ReferenceEngine):
    """vLLM #32802 / #40624: the speculative drop applied once per group, cascading."""

    def run(self, case: JSON) -> JSON:
        original = coordinator.find_hit

        def per_group(config: Any, num_tokens: int, find: Any) -> Any:
            if config.speculative is not DraftKeying.DROP:
                return original(config, num_tokens, find)
            plain = dataclasses.replace(
                config,
                speculative=None,
                groups=tuple(dataclasses.replace(g, draft=False) for g in config.groups),
            )
            hit, _ = original(plain, num_tokens, find)
            lowered = max(0, hit - config.alignment * len(config.groups))
            return original(plain, lowered + 1, find)

        with (
            patched(engines, "find_hit", per_group),
            patched(manager.KVCacheManager, "search", staticmethod(per_group)),
        ):
            return super().run(case)


class WindowOffByOneEngine(ReferenceEngine):
    """Sliding window without the -1: one token (often one block) too many is required."""

    def run(self, case: JSON) -> JSON:
        original = groups.first_needed

        def needs_one_more(group: Any, length: int) -> int:
            if group.kind is Kind.SLIDING_WINDOW:
                return int(max(0, length - group.window) // group.block_size)
            return int(original(group, length))

        with patched(coordinator, "first_needed", needs_one_more):
            return super().run(case)


class AllocateBeforeHitsEngine(ReferenceEngine):
    """vLLM #33775: new blocks are allocated before the hits are taken, so the request can
    evict its own hits from the free queue."""

    def run(self, case: JSON) -> JSON:
        def admit(
            self: Any, rid: str, tokens: Any, budget: int, extras: Any = (), lookahead: int = 0
        ) -> Any:
            request = manager._Request(
                list(tokens), tuple(extras), self._chains(tokens, tuple(extras))
            )
            hit, tables = self._find(tokens, request.chains)
            request.computed, request.lookahead = hit, lookahead
            request.scheduled = min(budget, len(tokens) - hit)
            request.tables, request.registered = tables, [len(t) for t in tables]
            hits = {b for t in tables for b in t if b}
            wanted = self._wanted(request)
            count = sum(len(w) for w in wanted)
            if count > self.pool.num_free:
                return manager.Waiting(count, self.pool.num_free)
            self._fill(request, wanted)  # the bug: may pop this request's own hits
            self.pool.take(hits)
            self._requests[rid] = request
            self._in_flight.add(rid)
            return manager.Scheduled(
                hit, request.scheduled, tuple(tuple(t) for t in request.tables)
            )

        with patched(manager.KVCacheManager, "admit", admit):
            return super().run(case)


class VisibleBeforeWrittenEngine(ReferenceEngine):
    """vLLM #41838: blocks are registered when scheduled, before their KV is written."""

    def run(self, case: JSON) -> JSON:
        original_admit = manager.KVCacheManager.admit

        def admit(
            self: Any, rid: str, tokens: Any, budget: int, extras: Any = (), lookahead: int = 0
        ) -> Any:
            result = original_admit(self, rid, tokens, budget, extras, lookahead)
            request = self._requests.get(rid)
            if request is not None:
                for g, group in enumerate(self.config.groups):
                    if group.kind is Kind.FULL:
                        done = (request.computed + request.scheduled) // group.block_size
                        for j in range(request.registered[g], done):
                            key = self._key(request.chains, g, j)
                            if key is not None and request.tables[g][j]:
                                self.pool.register(request.tables[g][j], key)
            return result

        with patched(manager.KVCacheManager, "admit", admit):
            return super().run(case)


class SaltIgnoredEngine(ReferenceEngine):
    """Cache salts dropped from the keys: tenants share blocks."""

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "alloc":
            ops = [
                {**op, "extras": [e for e in op["extras"] if e["kind"] != "cache_salt"]}
                if "extras" in op
                else op
                for op in case["ops"]
            ]
            case = {**case, "ops": ops}
        return super().run(case)


BROKEN = {
    "per-group speculative drop": (PerGroupDropEngine, "HIT-SPEC-2"),
    "sliding window without -1": (WindowOffByOneEngine, "HIT-SW-1"),
    "allocation before hits": (AllocateBeforeHitsEngine, "ALLOC-TWO-PHASE-1"),
    "visible before written": (VisibleBeforeWrittenEngine, "ALLOC-VIS-1"),
    "salt ignored": (SaltIgnoredEngine, "HASH-EXTRA-1"),
}
