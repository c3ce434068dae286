"""Deliberately broken engines: each reproduces one real bug class on top of the reference.

Shipped so anyone can see the checkers have teeth: each must fail at least one vector (and
the report must name the rule it broke), and `kvcert check` times how long the shipped state
machine takes to find and shrink each one. Never use them for anything else.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import Session
from kvcert.conformance.engines import reference_engine
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.reference import commit, coordinator, groups, manager, retention, tables
from kvcert.reference.config import DraftKeying, Kind


@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    original = inspect.getattr_static(obj, name)  # keeps a staticmethod wrapped on restore
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


class Mutant(ReferenceEngine):
    """The reference with one bug injected whenever it answers, by run() or by a session."""

    # the visibility and retention profiles the mutant claims, when its bug is one only
    # under that profile
    visibility: str | None = None
    retention: str | None = None

    def describe(self) -> JSON:
        described = super().describe()
        for family in ("visibility", "retention"):
            claimed = getattr(self, family)
            if claimed is not None:
                described["profiles"] = [
                    p
                    for p in described["profiles"]
                    if not p.startswith(f"{family}.") or p == f"{family}.{claimed}"
                ]
        return described

    def injected(self) -> AbstractContextManager[None]:
        """The patches that make the bug (none by default)."""
        return nullcontext()

    def rewrite(self, op: JSON) -> JSON:
        """An operation as the buggy engine sees it (unchanged by default)."""
        return op

    def run(self, case: JSON) -> JSON:
        if case["suite"] == "alloc":
            case = {**case, "ops": [self.rewrite(op) for op in case["ops"]]}
        with self.injected():
            return super().run(case)

    def open(self, case: JSON) -> MutantSession:
        with self.injected():  # a bug in how the engine is built shows from the start
            return MutantSession(self, super().open(case))


class MutantSession:
    """A reference session answering with the mutant's bug injected."""

    def __init__(self, mutant: Mutant, session: Session) -> None:
        self.mutant = mutant
        self.session = session

    def apply(self, op: JSON) -> JSON:
        with self.mutant.injected():
            return self.session.apply(self.mutant.rewrite(op))


class PerGroupDropEngine(Mutant):
    """vLLM #32802 / #40624: the speculative drop applied once per group, cascading."""

    @contextmanager
    def injected(self) -> Iterator[None]:
        original = coordinator.find_hit

        def per_group(config: Any, num_tokens: int, keys: Any, served: Any, **kw: Any) -> Any:
            if config.speculative is not DraftKeying.DROP:
                return original(config, num_tokens, keys, served, **kw)
            plain = dataclasses.replace(
                config,
                speculative=None,
                groups=tuple(dataclasses.replace(g, draft=False) for g in config.groups),
            )
            hit, _ = original(plain, num_tokens, keys, served, **kw)
            lowered = max(0, hit - config.alignment * len(config.groups))
            return original(plain, lowered + 1, keys, served, **kw)

        with (
            patched(reference_engine, "find_hit", per_group),
            patched(manager.KVCacheManager, "search", staticmethod(per_group)),
        ):
            yield


class WindowOffByOneEngine(Mutant):
    """Sliding window without the -1: one token (often one block) too many is required."""

    def injected(self) -> AbstractContextManager[None]:
        original = groups.first_needed

        def needs_one_more(group: Any, length: int) -> int:
            if group.kind is Kind.SLIDING_WINDOW:
                return int(max(0, length - group.window) // group.block_size)
            return int(original(group, length))

        return patched(coordinator, "first_needed", needs_one_more)


class AllocateBeforeHitsEngine(Mutant):
    """vLLM #33775: new blocks are allocated before the hits are taken, so the request can
    evict its own hits from the free queue."""

    def injected(self) -> AbstractContextManager[None]:
        def fill_then_take(self: Any, hits: set[int], request: Any, wanted: Any) -> Any:
            added = self._fill(request, wanted)  # the bug: may pop this request's own hits
            self.pool.take(hits)
            return added

        return patched(manager.KVCacheManager, "_take_then_fill", fill_then_take)


class VisibleBeforeWrittenEngine(Mutant):
    """vLLM #41838: blocks are registered when scheduled, before their KV is written, by an
    engine that claims step-end visibility."""

    visibility = "step-end"

    def injected(self) -> AbstractContextManager[None]:
        original_admit = manager.KVCacheManager.admit

        def admit(
            self: Any,
            rid: str,
            tokens: Any,
            budget: int,
            extras: Any = (),
            lookahead: int = 0,
            **options: Any,
        ) -> Any:
            result = original_admit(self, rid, tokens, budget, extras, lookahead, **options)
            request = self._requests.get(rid)
            if request is not None:
                for g, group in enumerate(self.config.groups):
                    if group.kind is Kind.FULL:
                        done = (request.computed + request.scheduled) // group.block_size
                        for j in range(request.registered[g], done):
                            key = request.chains[g].key(group.block_size, j)
                            if key is not None and request.tables[g][j]:
                                self.pool.register(request.tables[g][j], g, key)
            return result

        return patched(manager.KVCacheManager, "admit", admit)


class SaltIgnoredEngine(Mutant):
    """Cache salts dropped from the keys: tenants share blocks."""

    def rewrite(self, op: JSON) -> JSON:
        if "extras" not in op:
            return op
        return {**op, "extras": [e for e in op["extras"] if e["kind"] != "cache_salt"]}


class CheckpointIgnoredEngine(Mutant):
    """Inner checkpoints dropped: the state a chunk saved in passing is never cached."""

    def rewrite(self, op: JSON) -> JSON:
        return {k: v for k, v in op.items() if k != "checkpoint"}


class SpeculativeBlocksIgnoredEngine(Mutant):
    """MTP/EAGLE on a state model without the drafts' state blocks (ALLOC-SPEC-1): a decode
    chunk holds its running state's block alone, so a verifying step's drafts' states land
    in blocks the request does not hold. Its managers run without the compiled decode lane,
    which plans a state group's decode steps with its own table_end."""

    @contextmanager
    def injected(self) -> Iterator[None]:
        def running_state_only(group: Any, end: int, decoding: bool, limit: Any = None) -> int:
            return groups.table_end(group, end, False, limit)  # every chunk as a prefill one

        with (
            patched(tables, "table_end", running_state_only),
            patched(manager, "decode_lane", lambda *_: None),
        ):
            yield


class DraftReachIgnoredEngine(Mutant):
    """A drafter of several MTP modules keyed and committed as an EAGLE head that reads one
    token ahead: draft KV computed from tokens a key never saw is served."""

    def injected(self) -> AbstractContextManager[None]:
        original = reference_engine.config_from_json

        def one_token(layout: JSON, num_blocks: int, profiles: Any = None) -> Any:
            return original({**layout, "draft_reach": 1}, num_blocks, profiles)

        return patched(reference_engine, "config_from_json", one_token)


class StatePublishedEngine(Mutant):
    """Same-pass visibility applied to state groups too: a request scheduled in the step that
    computes a checkpoint reads a state no kernel has written yet."""

    visibility = "same-pass"

    def injected(self) -> AbstractContextManager[None]:
        original = commit.Registrar.__init__

        def every_group(self: Any, *args: Any) -> None:
            original(self, *args)
            self._attention_groups = [
                g for g, group in enumerate(self.config.groups) if group.kind is not Kind.CROSS
            ]

        return patched(commit.Registrar, "__init__", every_group)


class WithdrawalForgottenEngine(Mutant):
    """A request preempted before its pass runs keeps its published blocks hittable: a later
    request hits KV that was never written."""

    visibility = "same-pass"

    def injected(self) -> AbstractContextManager[None]:
        return patched(manager.KVCacheManager, "_withdraw", lambda self, rid, request: None)


class RetentionShortEngine(Mutant):
    """Sparse retention keeping each retained length's blocks but the first one: a window one
    block short, so the re-send of a prompt finds its window incomplete and hits less."""

    retention = "sparse"

    def injected(self) -> AbstractContextManager[None]:
        original = retention.positions_read

        def one_short(group: Any, length: int) -> range:
            return original(group, length)[1:]  # each retained length's first block left out

        return patched(retention, "positions_read", one_short)


class JunctionForgottenEngine(Mutant):
    """Sparse retention without the junction: a request that found a shared prefix only a
    full-attention group kept leaves it uncached in its bounded groups, so every later
    request sharing that prefix misses it again (the spiral of 0% hits)."""

    retention = "sparse"

    def injected(self) -> AbstractContextManager[None]:
        return patched(manager.KVCacheManager, "_junction", lambda self, prompt, hit: 0)


BROKEN = {
    "per-group speculative drop": (PerGroupDropEngine, "HIT-SPEC-2"),
    "sliding window without -1": (WindowOffByOneEngine, "HIT-SW-1"),
    "allocation before hits": (AllocateBeforeHitsEngine, "ALLOC-TWO-PHASE-1"),
    "visible before written": (VisibleBeforeWrittenEngine, "ALLOC-VIS-1"),
    "salt ignored": (SaltIgnoredEngine, "HASH-EXTRA-1"),
    "inner checkpoint ignored": (CheckpointIgnoredEngine, "CKPT-INNER-1"),
    "speculative state blocks ignored": (SpeculativeBlocksIgnoredEngine, "ALLOC-SPEC-1"),
    "draft reach ignored": (DraftReachIgnoredEngine, "HASH-DRAFT-1"),
    "state published in the same pass": (StatePublishedEngine, "ALLOC-VIS-2"),
    "withdrawal forgotten": (WithdrawalForgottenEngine, "ALLOC-VIS-3"),
    "retention mask one block short": (RetentionShortEngine, "RET-SPARSE-2"),
    "junction forgotten": (JunctionForgottenEngine, "RET-JUNCTION-1"),
}
