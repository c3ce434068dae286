"""The manager's decode fast path against its general path, on decode-heavy workloads.

`extend` skips the table arithmetic when a one-token step provably changes no table (the
request's `quiet_end`), and `end_step` skips requests that complete no block (`commit_at`).
The spec machine (test_allocator) rarely draws long decodes, so this test drives them: every
layout kind, mamba mode and speculative profile, prompts sharing prefixes, chunked prefills,
lookahead switched on and off, requests finishing and arriving. The same operations go to a
manager whose shortcuts are disabled; every answer, table and counter must be identical.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.conformance.checks.stateful import layouts
from kvcert.conformance.contract.codec import layout_to_json
from kvcert.conformance.contract.protocol import FEATURES
from kvcert.conformance.engines.reference_engine import config_from_json
from kvcert.reference.errors import KVCacheError
from kvcert.reference.manager import KVCacheManager, _Request
from tests.tiers import tiered

SHORTCUTS = {"fast": 0, "calls": 0}


class GeneralPathOnly(KVCacheManager):
    """The manager with both shortcuts disabled."""

    def _plan_quiet(self, request: _Request) -> None:
        request.quiet_end = 0

    def _commit_at(self, request: _Request) -> int:
        return 0


def both(managers: tuple[KVCacheManager, KVCacheManager], call: str, *args: Any) -> Any:
    answers = []
    for m in managers:
        try:
            answers.append(getattr(m, call)(*args))
        except KVCacheError as error:
            answers.append((type(error), str(error)))
    assert answers[0] == answers[1], (call, args, answers)
    if call == "extend":
        SHORTCUTS["calls"] += 1
        SHORTCUTS["fast"] += answers[0] is managers[0]._decode_step
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
    config = config_from_json(layout_to_json(layout), blocks, eviction)
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
