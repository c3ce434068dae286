"""The manager's decode fast path against its general path, on decode-heavy workloads.

`extend` skips the table arithmetic when a decode step provably changes no table (the
request's `quiet_*` bounds), and `end_step` skips requests that complete no block (`commit_at`).
The spec machine (test_allocator) rarely draws long decodes, so this test drives them: every
layout kind, mamba mode and speculative profile, prompts sharing prefixes, chunked prefills,
lookahead switched on and off, requests finishing and arriving. The same operations go to a
manager whose shortcuts are disabled; every answer, table and counter must be identical.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.conformance.checks.stateful import layouts
from kvcert.conformance.contract.codec import layout_to_json
from kvcert.conformance.contract.protocol import FEATURES
from kvcert.conformance.engines.reference_engine import config_from_json
from kvcert.reference.commit import Registrar
from kvcert.reference.config import CacheConfig, GroupConfig, Kind, MambaMode
from kvcert.reference.errors import KVCacheError
from kvcert.reference.manager import KVCacheManager
from kvcert.reference.requests import Request
from kvcert.reference.tables import TablePlanner
from tests.tiers import tiered

SHORTCUTS = {"fast": 0, "calls": 0}


class NoQuietSteps(TablePlanner):
    def plan_quiet(self, request: Request) -> None:
        request.quiet_end = 0


class CommitCheckedEveryStep(Registrar):
    def commit_at(self, request: Request) -> int:
        return 0


class GeneralPathOnly(KVCacheManager):
    """The manager with its shortcuts disabled (the compiled decode lane too)."""

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self._lane = None
        commits = self._commits
        self._planner = NoQuietSteps(config)
        self._commits = CommitCheckedEveryStep(config, commits.lookahead, commits.commit_delay)


def both(
    managers: tuple[KVCacheManager, KVCacheManager], call: str, *args: Any, **kwargs: Any
) -> Any:
    answers = []
    for m in managers:
        try:
            answers.append(getattr(m, call)(*args, **kwargs))
        except KVCacheError as error:
            answers.append((type(error), str(error)))
    assert answers[0] == answers[1], (call, args, answers)
    if call == "extend":
        SHORTCUTS["calls"] += 1
        SHORTCUTS["fast"] += any(answers[0] is s for s in managers[0]._quiet_steps.values())
    return answers[0]


@settings(max_examples=tiered(300, 5000), deadline=None)
@given(
    layout=layouts(frozenset(FEATURES)),
    blocks=st.integers(8, 80),
    eviction=st.sampled_from(["lru", "hybrid"]),
    script=st.lists(
        st.tuples(st.integers(0, 9), st.integers(0, 2), st.integers(1, 30)),
        min_size=20,
        max_size=120,
    ),
)
def decode_workload(layout, blocks, eviction, script):
    config = config_from_json(layout_to_json(layout), blocks, {"eviction": eviction})
    pair = (KVCacheManager(config), GeneralPathOnly(config))
    running: dict[str, int] = {}
    serial = 0
    for roll, token, size in script:
        if roll == 0 or not running:  # a new request; prompts share a prefix
            rid = f"r{serial}"
            serial += 1
            answer = both(pair, "admit", rid, [*range(size), token], 1 + size % 7)
            if hasattr(answer, "hit"):
                running[rid] = 0
        elif roll == 1:  # a request finishes
            rid = sorted(running)[size % len(running)]
            both(pair, "finish", rid)
            del running[rid]
        else:  # one step: every running request computes its next chunk or token
            for rid in sorted(running):
                request = pair[0]._requests[rid]
                decoding = request.computed == len(request.tokens)
                lookahead = 1 if roll == 9 else 0
                appended = [token] if decoding else []
                both(pair, "extend", rid, 1 if decoding else size, appended, lookahead)
            both(pair, "end_step")
        for rid in running:
            assert pair[0].block_tables(rid) == pair[1].block_tables(rid)
        assert pair[0].stats() == pair[1].stats()


def test_decode_shortcuts_change_no_answer():
    """...and they are taken (hundreds of times: block sizes 1 to 4 make most steps cross a
    boundary), or this proves nothing."""
    SHORTCUTS.update(fast=0, calls=0)
    decode_workload()
    assert SHORTCUTS["fast"] >= SHORTCUTS["calls"] // 20, SHORTCUTS


SIZES = st.sampled_from([4, 8, 16])
GROUPS = st.one_of(
    st.builds(GroupConfig, st.just(Kind.FULL), SIZES),
    st.builds(
        lambda size, window: GroupConfig(Kind.SLIDING_WINDOW, size, window=window),
        SIZES,
        st.integers(1, 40),
    ),
    st.builds(
        lambda size, chunk: GroupConfig(Kind.CHUNKED_LOCAL, size, chunk=chunk),
        SIZES,
        st.integers(1, 40),
    ),
    st.builds(
        lambda size, mode, spare: GroupConfig(
            Kind.MAMBA, size, mode=mode, speculative_blocks=spare if mode is MambaMode.ALIGN else 0
        ),
        SIZES,
        st.sampled_from(list(MambaMode)),
        st.integers(0, 3),
    ),
)


@settings(max_examples=tiered(200, 3000), deadline=None)
@given(
    groups=st.lists(GROUPS, min_size=1, max_size=3),
    blocks=st.integers(12, 120),
    limit=st.one_of(st.none(), st.integers(40, 160)),
    pipelined=st.booleans(),
    script=st.lists(
        st.tuples(st.integers(0, 9), st.integers(1, 4), st.integers(0, 4), st.integers(1, 40)),
        min_size=20,
        max_size=100,
    ),
)
def drafting_workload(groups, blocks, limit, pipelined, script):
    config = CacheConfig((*groups, GroupConfig(Kind.FULL, 8)), blocks, max_model_len=limit)
    pair = (KVCacheManager(config), GeneralPathOnly(config))
    aligned = [g.block_size for g in groups if g.kind is Kind.MAMBA and g.mode is MambaMode.ALIGN]
    unit = math.lcm(*aligned) if aligned else 0
    running: set[str] = set()
    serial, token = 0, 1000
    for roll, count, lookahead, size in script:
        if roll == 0 or not running:  # a new request; prompts share a prefix
            rid = f"r{serial}"
            serial += 1
            if hasattr(both(pair, "admit", rid, [*range(size), serial], size), "hit"):
                running.add(rid)
        elif roll == 1:  # a request finishes
            rid = sorted(running)[size % len(running)]
            both(pair, "finish", rid)
            running.discard(rid)
        else:  # a step: a chunk of prompt, or the sampled token and accepted drafts
            step = None
            if pipelined:  # scheduled while the previous step runs, as an async engine does
                step = pair[0].start_step()
                pair[1].start_step()
            chunks = {}
            for rid in sorted(running):
                computed, known = pair[0].progress(rid)
                if computed < known:
                    chunk = (size, [], 0)
                else:  # roll 6: a budget short of the tokens appended
                    budget = max(1, count - 1) if roll == 6 else count
                    chunk = (budget, list(range(token, token + count)), lookahead)
                    token += count
                end = computed + chunk[0]
                # roll 8: a block boundary inside the chunk saves state (CKPT-INNER-1 or,
                # decoding, ALLOC-SPEC-2); invalid ones are refused alike by both managers
                boundary = (end - 1) // unit * unit if unit and roll == 8 else 0
                checkpoint = boundary if boundary > computed else 0
                chunks[rid] = (*chunk, checkpoint)
                if pipelined:  # roll 7: drafts the step in flight rejects end the chunk early
                    reach = end + (lookahead if roll == 7 else 0)
                    both(pair, "reserve", rid, reach + chunk[2], reach, checkpoint)
            if pipelined:
                both(pair, "end_step", step - 1)
            for rid, (budget, appended, slots, checkpoint) in chunks.items():
                both(pair, "extend", rid, budget, appended, slots, step=step, checkpoint=checkpoint)
            if not pipelined:
                both(pair, "end_step")
        for rid in running:
            assert pair[0].block_tables(rid) == pair[1].block_tables(rid)
        assert pair[0].stats() == pair[1].stats()
    both(pair, "end_step")
    for rid in running:
        assert pair[0].block_tables(rid) == pair[1].block_tables(rid)


def test_drafting_shortcuts_change_no_answer():
    """Decode steps of several tokens (a sampled one and accepted drafts) holding lookahead
    slots for the next drafts, with and without pipelining: the fast path, taken often,
    leaves every answer as the general path does."""
    SHORTCUTS.update(fast=0, calls=0)
    drafting_workload()
    assert SHORTCUTS["fast"] >= SHORTCUTS["calls"] // 10, SHORTCUTS
