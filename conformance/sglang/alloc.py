"""The alloc suite on SGLang: each operation as the scheduler's own request steps.

SGLang's tree is held to the spec's radix profile (§13, `eviction.radix`). One alloc case is
one tree and pools as the server builds them for a full-attention model
(`serving.build_serving`); each operation is what the scheduler does for one request:

    admit        Req.init_next_round_input (the lookup), the adder's commit (extend_end,
                 tree.lock), ScheduleBatch.init_new + prepare_for_extend (evicting)
    extend       a chunk: init_next_round_input + a new batch's prepare_for_extend
                 a decode token: output_ids.append + the request's batch's prepare_for_decode
    end_step     the result step: checkpoint_kv_cache (before 0.5.23 cache_unfinished_req)
                 for each request whose chunk ran (a decode step publishes nothing)
    finish       release_kv_cache(checkpoint=True) (is_insert=True) of a request finished
                 by length
    preempt      release_kv_cache(checkpoint=False) (is_insert=False), as a retraction
                 releases a request
    reset_cache  the flush: tree.reset, request and token pools cleared, when idle

Each admission or chunk is a batch of its own; the server batches the requests of a step
(one allocation for all, which evicts for all at once). Whether a request waits is the
allocator's answer (the pages it needs against the free and evictable ones), not the
PrefillAdder's token budget, which also reserves decode room; the campaign drives that.
What SGLang's scheduler never does is answered unsupported, per case: a release while the
request's chunk is in flight (results are processed after the pass), a retraction of a
request still prefilling, more than one token per decode step.
"""

from __future__ import annotations

import importlib
import math
from array import array
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeGuard

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang import serving, unified
from kvcert.conformance.sglang.campaign import steps
from kvcert.conformance.sglang.request_steps import (
    RequestKeys,
    committed,
    pool_row,
    request_steps,
)

REFUSED: JSON = {"refused": True}
# the reason a draft group of another kind is inexpressible, in the hit and alloc suites alike
DRAFT_NOT_FULL = "SGLang's draft layers are full attention over the target's token slots"
ROWS = 64  # request rows: more than any case runs at once
BIG = 1 << 20  # max_new_tokens: requests finish when the case says so


class Unsupported(Exception):
    """The case asks for something SGLang's scheduler never does."""


def scope_problem(case: JSON) -> str | None:
    """Why the case lies outside what SGLang's tree and pools can answer, or None.

    SGLang's tree is held to the radix profile (RADIX-SCOPE-1): one full-attention group at
    step-end visibility and dense retention. A trace of several groups counts one block pool
    shared by every group (§6); SGLang has no such pool, so no hybrid trace maps, whatever
    its eviction profile.
    """
    if case.get("visibility", "step-end") != "step-end":
        return "SGLang's tree publishes as the radix profile does (RADIX-SCOPE-1, PUB-1/2)"
    if case.get("retention", "dense") != "dense" or case.get("retention_interval"):
        return "SGLang's tree keeps every page it publishes (RADIX-SCOPE-1)"
    layout = case.get("layout")
    groups: list[Any] = layout.get("groups", []) if isinstance(layout, dict) else []
    if not isinstance(layout, dict) or not isinstance(groups, list) or not groups:
        return "the alloc suite drives SGLang's full-attention tree only (RADIX-SCOPE-1)"
    why = _shared_pool_problem(groups)
    if why is not None:
        return why
    if groups[0].get("draft") or set(layout) - {"groups", "max_model_len"}:
        return "the alloc suite drives SGLang without EAGLE and at page granularity"
    return None


def _shared_pool_problem(groups: list[Any]) -> str | None:
    """Why a trace of these groups, all drawing on one block pool, has no SGLang
    counterpart, or None for one full-attention group."""
    if len(groups) == 1 and isinstance(groups[0], dict) and groups[0].get("kind") == "full":
        return None
    if not all(isinstance(g, dict) for g in groups):
        return "the alloc suite drives SGLang's full-attention tree only (RADIX-SCOPE-1)"
    if any(g.get("draft") and g.get("kind") != "full" for g in groups):
        return DRAFT_NOT_FULL
    if any(g.get("draft") for g in groups):
        return (
            "SGLang's draft layers write the target's token slots (one allocation serves "
            "both): a trace whose draft group holds blocks of its own has no counterpart"
        )
    if {g.get("kind") for g in groups} != {"full"}:
        return (
            "SGLang keeps each component in a pool of its own (full-attention tokens, SWA "
            "tokens, Mamba states): a trace counting one shared block pool has no counterpart"
        )
    return "one full-attention component: every full layer shares one page and one table"


@dataclass
class _Running:
    req: Any
    batch: Any  # the batch its last chunk or decode step ran in
    scheduled: bool = False  # a chunk is in flight
    prefilling: bool = True  # its step's result is a prefill's (checkpointed)


@dataclass
class Session:
    """One SGLang tree answering the alloc suite's operations."""

    layout: JSON
    num_blocks: int
    running: dict[str, _Running] = field(default_factory=dict)
    in_step: list[str] = field(default_factory=list)
    eviction_policy: ClassVar[str] = "lru"  # the server's default `--radix-eviction-policy`

    def __post_init__(self) -> None:
        unified.api()  # SGLang imported with its stand-ins
        self.steps = request_steps()
        self.keys = RequestKeys()
        batches = importlib.import_module("sglang.srt.managers.schedule_batch")
        self.batch_class = batches.ScheduleBatch
        self.finished = batches.FINISH_LENGTH
        self.no_speculation = importlib.import_module(
            "sglang.srt.speculative.spec_info"
        ).SpeculativeAlgorithm.NONE
        self.page = int(self.layout["groups"][0]["block_size"])
        self.limit = self.layout.get("max_model_len")
        # build_serving adds a page to the slots it is given: the pool then hands out
        # num_blocks - 1 pages, ids 1.., as the spec's pool does (its block 0 is the null one)
        tokens = (self.num_blocks - 2) * self.page
        self.tree, self.requests = serving.build_serving(
            self.page, tokens, ROWS, eviction_policy=self.eviction_policy
        )
        self.allocator = self.tree.token_to_kv_pool_allocator
        if self.allocator.available_size() != (self.num_blocks - 1) * self.page:
            raise EngineError(
                f"the adapter built a pool that does not hold {self.num_blocks - 1} pages"
            )
        self.model = steps.model_config(tokens, vocab_size=1 << 62)  # any token id

    # --- what SGLang reports ------------------------------------------------------------------

    def _pages(self, tokens: int) -> int:
        return tokens // self.page

    def _reclaimable(self) -> int:
        """Pages free or evictable: what an allocation could have."""
        return self._pages(self.allocator.available_size() + self.tree.evictable_size())

    def _cached(self) -> int:
        return self._pages(self.tree.evictable_size() + self.tree.protected_size())

    def _table(self, req: Any, end: int) -> list[int]:
        row = self.requests.req_to_token[pool_row(req)]
        return [int(row[j * self.page]) // self.page for j in range(math.ceil(end / self.page))]

    # --- operations ---------------------------------------------------------------------------

    def apply(self, op: JSON) -> JSON:
        handler = {
            "admit": self._admit,
            "extend": self._extend,
            "end_step": self._end_step,
            "finish": self._finish,
            "preempt": self._preempt,
            "reset_cache": self._reset,
        }.get(str(op.get("op")))
        if handler is None:
            return REFUSED
        return handler(op)

    def _admit(self, op: JSON) -> JSON:
        rid, tokens = op.get("rid"), op.get("tokens")
        budget = op.get("budget")
        if not isinstance(rid, str) or not rid or rid in self.running:
            return REFUSED
        if not _token_ids(tokens) or not tokens or not _count(budget, 1):
            return REFUSED
        if op.get("lookahead", 0) or op.get("checkpoint", 0):
            raise Unsupported("lookahead and inner checkpoints are not driven")
        extras = _request_extras(op.get("extras", []), len(tokens))
        if extras is None or (self.limit is not None and len(tokens) > self.limit):
            return REFUSED
        keys = self.keys.for_request(extras.get("cache_salt"), extras.get("lora"))
        req = unified.new_request(rid, array("q", tokens), BIG, keys)
        req.init_next_round_input(self.tree)  # the lookup: stamps and splits even if it waits
        hit = unified.matched_length(req)
        chunk = min(budget, len(tokens) - hit)
        lock = self.steps.lock(self.tree, req)
        needed = math.ceil((hit + chunk) / self.page) - hit // self.page
        available = self._reclaimable()
        if needed > available:
            self.steps.unlock(self.tree, lock)
            return {"waiting": {"needed": needed, "free": available}}
        self.steps.keep_lock(req, lock)
        self.steps.set_range(req, hit, hit + chunk)
        batch = self._new_batch(req)
        batch.prepare_for_extend()
        self.running[rid] = _Running(req, batch, scheduled=True)
        self._scheduled(rid)
        return {
            "admitted": {"hit": hit, "scheduled": chunk, "tables": [self._table(req, hit + chunk)]}
        }

    def _extend(self, op: JSON) -> JSON:
        rid, budget = op.get("rid"), op.get("budget")
        appended = op.get("appended", [])
        entry = self.running.get(str(rid))
        if entry is None or entry.scheduled or not _count(budget, 1) or not _token_ids(appended):
            return REFUSED
        if op.get("lookahead", 0) or op.get("checkpoint", 0):
            raise Unsupported("lookahead and inner checkpoints are not driven")
        req = entry.req
        computed = committed(req)
        total = len(req.origin_input_ids) + len(req.output_ids) + len(appended)
        if appended and computed != total - len(appended):
            return REFUSED
        if computed >= total or (self.limit is not None and total > self.limit):
            return REFUSED
        if len(appended) > 1:
            raise Unsupported("SGLang decodes one token per step without speculative decoding")
        chunk = min(budget, total - computed)
        needed = math.ceil((computed + chunk) / self.page) - math.ceil(computed / self.page)
        available = self._reclaimable()
        if needed > available:
            return {"waiting": {"needed": needed, "free": available}}
        if appended:
            req.output_ids.append(int(appended[0]))
            entry.prefilling = False
            entry.batch.prepare_for_decode()
        else:
            req.init_next_round_input()
            self.steps.set_range(req, computed, computed + chunk)
            entry.batch = self._new_batch(req)
            entry.batch.prepare_for_extend()
        entry.scheduled = True
        self._scheduled(str(rid))
        return {"extended": {"scheduled": chunk, "tables": [self._table(req, computed + chunk)]}}

    def _end_step(self, _: JSON) -> JSON:
        before = self._cached()
        for rid in self.in_step:
            entry = self.running.get(rid)
            if entry is None:
                continue
            entry.scheduled = False
            if entry.prefilling:
                req = entry.req
                done = committed(req) >= len(req.origin_input_ids)
                self.steps.publish_prefill(req, self.tree, prompt_done=done)
        self.in_step = []
        return {"step_ended": {"registered": self._cached() - before}}

    def _finish(self, op: JSON) -> JSON:
        return self._release(op, checkpoint=True)

    def _preempt(self, op: JSON) -> JSON:
        entry = self.running.get(str(op.get("rid")))
        if entry is not None and committed(entry.req) < len(entry.req.origin_input_ids):
            raise Unsupported("SGLang retracts only requests whose prompt is computed")
        return self._release(op, checkpoint=False)

    def _release(self, op: JSON, *, checkpoint: bool) -> JSON:
        rid = str(op.get("rid"))
        entry = self.running.get(rid)
        if entry is None:
            return REFUSED
        if entry.scheduled:
            raise Unsupported("SGLang releases a request only after its batch's result")
        before = self._reclaimable()
        req = entry.req
        if checkpoint:
            req.finished_reason = self.finished(length=len(req.output_ids))
        self.steps.release(req, self.tree, insert=checkpoint)
        del self.running[rid]
        return {"released": {"blocks": self._reclaimable() - before}}

    def _reset(self, _: JSON) -> JSON:
        if self.running:
            return {"cache_reset": {"done": False}}
        self.tree.reset()
        self.requests.clear()
        self.allocator.clear()
        return {"cache_reset": {"done": True}}

    # --- the scheduler's pieces ----------------------------------------------------------------

    def _new_batch(self, req: Any) -> Any:
        return self.batch_class.init_new(
            [req], self.requests, self.allocator, self.tree, self.model, False,
            self.no_speculation,
        )  # fmt: skip

    def _scheduled(self, rid: str) -> None:
        if rid not in self.in_step:
            self.in_step.append(rid)


def _request_extras(extras: object, length: int) -> dict[str, str] | None:
    """A request's salt and LoRA adapter by kind, or None for extras the spec refuses (a
    value that is not a string, a request-wide key given a span, a span past the prompt, a
    kind it does not know)."""
    if not isinstance(extras, list):
        return None
    found: dict[str, str] = {}
    for extra in extras:
        if not isinstance(extra, dict) or not isinstance(extra.get("value"), str):
            return None
        kind = extra.get("kind")
        if kind == "multimodal":
            if not _span(extra, length):
                return None
            raise Unsupported(
                "multimodal items are not driven: SGLang keys them by pad values its model's "
                "processor writes into the prompt"
            )
        if kind not in ("cache_salt", "lora") or set(extra) - {"kind", "value", "start"}:
            return None
        if extra.get("start", 0) != 0:
            return None
        if kind in found:
            raise Unsupported(f"SGLang keys a request by one {kind}")
        found[str(kind)] = extra["value"]
    return found


def _span(extra: dict[str, Any], length: int) -> bool:
    start, end = extra.get("start", 0), extra.get("end")
    return _count(start, 0) and _count(end, 1) and start < end <= length


def _count(value: object, least: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _token_ids(tokens: object) -> bool:
    return isinstance(tokens, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 63 for t in tokens
    )


def run(case: JSON) -> JSON:
    """One alloc case: every observation, or {"unsupported": why}."""
    problem = scope_problem(case)
    if problem is not None:
        return {"unsupported": problem}
    blocks = case.get("num_blocks")
    limit = case["layout"].get("max_model_len")
    if not _count(blocks, 2) or not _count(case["layout"]["groups"][0].get("block_size"), 1):
        return REFUSED
    if limit is not None and not _count(limit, 1):
        return REFUSED
    try:
        session = Session(case["layout"], case["num_blocks"])
        return {"observations": [session.apply(op) for op in case["ops"]]}
    except Unsupported as why:
        return {"unsupported": str(why)}
