"""`kvcert simulate`: replay a request trace on a model's planned layout under several eviction
profiles and checkpoint placements, and report what each one hits.

The engine model is deliberately plain, so differences come from the cache policy alone:
requests run one after another; a prompt is prefilled in chunks of at most `budget` tokens
(cut by the placement policy, spec §12), then its output is decoded one token per step, then
it finishes. Every run is replayed twice: in the pool under test and in an unbounded pool,
whose hits are the most any policy could get (the "cacheable" hits).

The replay drives kvcert.reference; the operations it issued can be re-run through any
conformance engine (`--engine`), and its hits compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.tools.simulate.traces import TraceRequest
from kvcert.reference.config import CacheConfig, Eviction, Kind, MambaMode
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Waiting
from kvcert.reference.scheduling import Placement, next_chunk


@dataclass(frozen=True)
class Policy:
    """One column of the comparison."""

    eviction: Eviction
    placement: Placement
    stateful: bool = True  # the layout has state groups, so the placement matters

    @property
    def label(self) -> str:
        if not self.stateful:
            return self.eviction.value
        return f"{self.eviction.value}/{self.placement.value}"


@dataclass
class Run:
    """What one replay observed."""

    policy: Policy
    num_blocks: int
    hits: list[int] = field(default_factory=list)  # per request, tokens served from the cache
    prompts: list[int] = field(default_factory=list)  # per request, prompt tokens
    skipped: list[str] = field(default_factory=list)  # requests the pool could not hold
    peak_blocks: int = 0  # most blocks one request held at once
    evictions: list[int] = field(default_factory=list)  # per group, registered blocks reused
    dead_evictions: list[int] = field(default_factory=list)  # of which provably dead
    ops: list[JSON] = field(default_factory=list)  # the allocator operations issued

    @property
    def hit_tokens(self) -> int:
        return sum(self.hits)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompts)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def configure(base: CacheConfig, policy: Policy, num_blocks: int) -> CacheConfig:
    """The allocator for one policy: its eviction profile, state groups in the placement's
    mode (all for `all`, align otherwise)."""
    mode = MambaMode.ALL if policy.placement is Placement.ALL else MambaMode.ALIGN
    groups = tuple(
        dataclasses.replace(g, mode=mode) if g.kind is Kind.MAMBA else g for g in base.groups
    )
    return dataclasses.replace(base, groups=groups, num_blocks=num_blocks, eviction=policy.eviction)


def state_block(config: CacheConfig) -> int:
    """The block size chunk ends must respect (the first state group's), else 1."""
    return next((g.block_size for g in config.groups if g.kind is Kind.MAMBA), 1)


def _held(tables: tuple[tuple[int, ...], ...]) -> int:
    return sum(1 for table in tables for b in table if b)


class _Replay:
    """One pass over a trace through one KVCacheManager, recording ops and observations."""

    def __init__(self, config: CacheConfig, policy: Policy, budget: int) -> None:
        self.manager = KVCacheManager(config)
        self.policy = policy
        self.budget = budget
        self.block = state_block(config)
        self.run = Run(policy, config.num_blocks)

    def _admit(self, rid: str, tokens: list[int], extras: list[ExtraKey], chunk: int) -> Any:
        op: JSON = {"op": "admit", "rid": rid, "tokens": tokens, "budget": chunk}
        if extras:
            op["extras"] = [{"kind": e.kind.value, "value": e.value} for e in extras]
        self.run.ops.append(op)
        return self.manager.admit(rid, tokens, chunk, extras)

    def _extend(self, rid: str, chunk: int, appended: list[int]) -> Any:
        op: JSON = {"op": "extend", "rid": rid, "budget": chunk}
        if appended:
            op["appended"] = appended
        self.run.ops.append(op)
        return self.manager.extend(rid, chunk, appended)

    def _end_step(self) -> None:
        self.run.ops.append({"op": "end_step"})
        self.manager.end_step()

    def _release(self, rid: str, preempt: bool = False) -> None:
        self.run.ops.append({"op": "preempt" if preempt else "finish", "rid": rid})
        (self.manager.preempt if preempt else self.manager.finish)(rid)

    def request(self, index: int, request: TraceRequest) -> None:
        rid = f"{index}:{request.rid}"
        tokens = list(request.prompt)
        extras = [ExtraKey(ExtraKind.CACHE_SALT, request.cache_salt)] if request.cache_salt else []
        hit, _ = self.manager.lookup(tokens, extras)
        branch = 0
        if self.policy.placement is Placement.BRANCH:
            branch = self.manager.branch_point(tokens, extras)
        placement, n = self.policy.placement, len(tokens)
        chunk = next_chunk(placement, hit, n, self.budget, self.block, branch=branch)
        result = self._admit(rid, tokens, extras, chunk)
        if isinstance(result, Waiting):
            self.run.skipped.append(request.rid)
            return
        self.run.hits.append(result.hit)
        self.run.prompts.append(n)
        peak = _held(self.manager.block_tables(rid))
        self._end_step()
        computed = result.hit + result.scheduled
        steps: list[tuple[int, list[int]]] = []
        while computed < n:
            chunk = next_chunk(placement, computed, n, self.budget, self.block, branch=branch)
            steps.append((chunk, []))
            computed += chunk
        steps.extend((1, [token]) for token in request.output)
        for chunk, appended in steps:
            extended = self._extend(rid, chunk, appended)
            if isinstance(extended, Waiting):
                self.run.skipped.append(request.rid)
                self._release(rid, preempt=True)
                return
            peak = max(peak, _held(self.manager.block_tables(rid)))
            self._end_step()
        self.run.peak_blocks = max(self.run.peak_blocks, peak)
        self._release(rid)


def replay(
    base: CacheConfig,
    trace: Sequence[TraceRequest],
    policy: Policy,
    num_blocks: int,
    budget: int,
) -> Run:
    """Serve the trace one request at a time under `policy` in a pool of `num_blocks`."""
    if budget < 1:
        raise InputError(f"the chunk budget must be >= 1 token, got {budget}")
    runner = _Replay(configure(base, policy, num_blocks), policy, budget)
    for index, request in enumerate(trace):
        runner.request(index, request)
    pool = runner.manager.pool
    runner.run.evictions = list(pool.evictions)
    runner.run.dead_evictions = list(pool.dead_evictions)
    return runner.run


def unbounded_blocks(base: CacheConfig, trace: Sequence[TraceRequest]) -> int:
    """A pool no trace request can exhaust: every token of every request in every group."""
    total = sum(len(r.prompt) + len(r.output) for r in trace)
    return 1 + sum(-(-total // g.block_size) + len(trace) for g in base.groups)


@dataclass
class Comparison:
    """Every policy's run in the pool under test and in an unbounded pool."""

    trace: Sequence[TraceRequest]
    runs: list[Run]
    unbounded: list[Run]  # same order as runs
    working_set: int  # most blocks one request held (unbounded pool, first policy)


def compare(
    base: CacheConfig,
    trace: Sequence[TraceRequest],
    policies: Sequence[Policy],
    *,
    num_blocks: int | None = None,
    pool_requests: float | None = None,
    budget: int = 8192,
) -> Comparison:
    """Run every policy; the pool is `num_blocks`, or `pool_requests` working sets (the most
    blocks one request holds, measured in the unbounded pool), or the plan's own."""
    if not trace:
        raise InputError("the trace holds no requests")
    big = unbounded_blocks(base, trace)
    unbounded = [replay(base, trace, p, big, budget) for p in policies]
    working_set = max(u.peak_blocks for u in unbounded)
    if pool_requests is not None:
        if pool_requests <= 0:
            raise InputError(f"--pool-requests must be > 0, got {pool_requests}")
        num_blocks = 1 + int(pool_requests * working_set)
    blocks = base.num_blocks if num_blocks is None else num_blocks
    if blocks < 2:
        raise InputError(f"the pool needs at least 2 blocks, got {blocks}")
    runs = [replay(base, trace, p, blocks, budget) for p in policies]
    return Comparison(trace, runs, unbounded, working_set)


def group_labels(config: CacheConfig) -> list[str]:
    """A short label per group; groups of one kind and block size share a label."""
    labels = []
    for g in config.groups:
        detail = {Kind.SLIDING_WINDOW: f" W={g.window}", Kind.CHUNKED_LOCAL: f" C={g.chunk}"}
        labels.append(
            f"{g.kind.value}{'*' if g.draft else ''} B={g.block_size}" + detail.get(g.kind, "")
        )
    return labels


def by_label(config: CacheConfig, values: Sequence[int]) -> dict[str, int]:
    """Per-group counters summed over groups sharing a label."""
    out: dict[str, int] = {}
    for label, value in zip(group_labels(config), values, strict=True):
        out[label] = out.get(label, 0) + value
    return out


def group_counts(config: CacheConfig) -> dict[str, int]:
    """How many groups carry each label."""
    return by_label(config, [1] * len(config.groups))


def layout_json(config: CacheConfig, policy: Policy) -> JSON:
    """The layout a policy ran on, in the vectors' format (for re-running on an engine)."""
    groups = []
    for g in configure(config, policy, config.num_blocks).groups:
        entry: JSON = {"kind": g.kind.value, "block_size": g.block_size, "name": g.name}
        if g.kind is Kind.SLIDING_WINDOW:
            entry["window"] = g.window
        if g.kind is Kind.CHUNKED_LOCAL:
            entry["chunk"] = g.chunk
        if g.mode is not None:  # state groups only
            entry["mode"] = g.mode.value
        if g.draft:
            entry["draft"] = True
        groups.append(entry)
    out: JSON = {"groups": groups}
    if config.speculative is not None:
        out["speculative"] = config.speculative.value
    if config.max_model_len is not None:
        out["max_model_len"] = config.max_model_len
    return out
