"""Play a workload through vLLM's real scheduler, with a ledger for a model runner.

Runs inside a vLLM release venv (`scripts/engine-venv.sh vllm VERSION`). Everything the
scheduler sees is what a served model gives it: the KV-cache groups come from vLLM's own
planner (`get_kv_cache_groups`, `get_kv_cache_config_from_groups`) applied to the bundled
model's per-layer specs, the scheduler class from `SchedulerConfig.get_scheduler_cls()` (the
AsyncScheduler when `async_scheduling` is on), block sizes from
`resolve_kv_cache_block_sizes`, and request hashes from `get_request_block_hasher`, as
EngineCore wires them. Only the pool is made small, so the scheduler has to preempt.

The model runner is a ledger: each forward pass writes, for every scheduled position and
every group, the identity of the KV it computes (a digest of the request's tokens up to that
position) into the slot the group's block table names. Before writing, it checks what the
pass reads: the positions below the chunk that each group's attention needs (all of them for
full attention, the last `window - 1` for a sliding window, the current chunk's earlier
tokens for chunked local attention) must hold KV computed from the same token prefix. A
position that does not is a soundness violation: the engine told the request that KV exists
which no forward pass wrote for it.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.campaign.workload import Workload

MAX_STEPS = 400


@dataclass
class Outcome:
    """What one run of a workload showed."""

    violation: str | None = None  # the first unsound read, in words
    steps: int = 0
    preemptions: int = 0
    hit_tokens: int = 0  # tokens the scheduler took from the prefix cache
    stalled: bool = False  # MAX_STEPS reached with requests left (not a violation)


@dataclass
class _Group:
    block_size: int
    kind: str  # full | sliding_window | chunked_local
    window: int = 0
    chunk: int = 0

    def needs(self, start: int) -> range:
        """Positions below `start` that attention at `start` reads."""
        if self.kind == "sliding_window":
            return range(max(0, start - self.window + 1), start)
        if self.kind == "chunked_local":
            return range(start - start % self.chunk, start)
        return range(start)


def _vllm() -> Any:
    """vLLM's modules, imported once (shared with the conformance adapter's planned modes)."""
    from kvcert.conformance.engines.vllm_wiring import modules  # noqa: PLC0415

    return modules()


def build(workload: Workload, fix: bool = False) -> tuple[Any, list[_Group], Any]:
    """(scheduler, groups, block hasher) for the workload, wired as EngineCore wires them;
    `fix` swaps in the scheduler subclass of `vllm_fix`."""
    from kvcert.conformance.contract.plans import plan_input_from_json  # noqa: PLC0415
    from kvcert.conformance.engines import vllm_wiring as wiring  # noqa: PLC0415
    from kvcert.conformance.engines.vllm_layers import kind_of, spec_of  # noqa: PLC0415
    from kvcert.conformance.tools.catalog import load_model  # noqa: PLC0415

    longest = max(len(a.prompt) + a.max_tokens for a in workload.arrivals)
    settings = wiring.Settings(
        max_len=max(256, -(-longest // 256) * 256),
        budget=workload.budget,
        policy=workload.policy,
        async_scheduling=workload.async_scheduling,
        long_prefill=workload.long_prefill,
    )
    config = wiring.engine_config(settings)
    model = load_model(workload.model)
    plan_input = plan_input_from_json(
        {"layers": list(model.layers), "kv_cache_dtype": "bf16", "memory_bytes": 1 << 30}
    )
    specs = {
        f"model.layers.{i}.attn": spec_of(layer, plan_input.dtype, settings.block_size)
        for i, layer in enumerate(plan_input.layers)
    }
    kv_groups = wiring.plan(config, specs)
    cls = None
    if fix:
        from kvcert.conformance.campaign.vllm_fix import fixed  # noqa: PLC0415

        cls = fixed(config.scheduler_config.get_scheduler_cls())
    wired = wiring.wire(config, kv_groups, workload.usable_blocks, cls)
    groups = []
    for g in wired.groups:
        spec = g.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        first = next(iter(inner.values())) if inner else spec
        groups.append(
            _Group(
                spec.block_size,
                kind_of(spec),
                getattr(first, "sliding_window", 0) or 0,
                getattr(first, "attention_chunk_size", 0) or 0,
            )
        )
    return wired.scheduler, groups, wired.hasher


@dataclass
class Ledger:
    """The model runner: slot (group, block, offset) -> identity of the KV written there."""

    groups: list[_Group]
    slots: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    unapplied: dict[str, list[int]] = field(default_factory=dict)  # sampled, not yet returned

    def tokens(self, request: Any) -> list[int]:
        """The request's tokens as the runner knows them: the scheduler's, then the ones this
        runner sampled whose outputs the scheduler has not taken yet (async scheduling)."""
        return [*request.all_token_ids, *self.unapplied.get(request.request_id, ())]

    @staticmethod
    def identities(tokens: list[int], end: int) -> list[bytes]:
        """identity[p]: a digest of tokens[0..p], what the KV at position p is a function of."""
        out, previous = [], b""
        for token in tokens[:end]:
            previous = hashlib.sha256(previous + token.to_bytes(4, "little", signed=True)).digest()
            out.append(previous)
        return out

    def forward(self, scheduler: Any, output: Any, step: int) -> tuple[Any, str | None]:
        """Check every read of the pass, write its KV, sample one token where a request's
        scheduled tokens reach its end. Returns (ModelRunnerOutput, first violation or None)."""
        v = _vllm()
        ids = list(output.num_scheduled_tokens)
        violation = None
        sampled = []
        for rid in ids:
            request = scheduler.requests[rid]
            count = output.num_scheduled_tokens[rid]
            start = request.num_computed_tokens - count  # the scheduler advanced it already
            tokens = self.tokens(request)
            identity = self.identities(tokens, min(start + count, len(tokens)))
            tables = scheduler.kv_cache_manager.get_block_ids(rid)
            for g, (group, table) in enumerate(zip(self.groups, tables, strict=True)):
                for p in group.needs(start):
                    slot = (g, table[p // group.block_size], p % group.block_size)
                    if violation is None and self.slots.get(slot) != identity[p]:
                        violation = (
                            f"step {step}: {rid} computes [{start}, {start + count}) but "
                            f"position {p} of group {g} ({group.kind}, block {slot[1]}) holds "
                            "KV that no forward pass wrote for this prefix"
                        )
                for p in range(start, min(start + count, len(identity))):
                    block = table[p // group.block_size]
                    if block:  # a null block (outside a window) is never written
                        self.slots[(g, block, p % group.block_size)] = identity[p]
            if start + count >= len(tokens):
                token = (7 * step + 13 * len(tokens)) % 900
                self.unapplied.setdefault(rid, []).append(token)
                sampled.append([token])
            else:
                sampled.append([])
        result = v["ModelRunnerOutput"](
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        return result, violation

    def applied(self, runner_output: Any) -> None:
        """The scheduler took these outputs: their tokens are in all_token_ids now (or were
        dropped with a preempted or finished request)."""
        for rid, tokens in zip(runner_output.req_ids, runner_output.sampled_token_ids,
                               strict=True):  # fmt: skip
            if tokens and self.unapplied.get(rid):
                self.unapplied[rid].pop(0)


def play(workload: Workload, fix: bool = False) -> Outcome:
    """Run the workload to the end (or MAX_STEPS); stop at the first violation."""
    v = _vllm()
    scheduler, groups, hasher = build(workload, fix)
    ledger = Ledger(groups)
    outcome = Outcome()
    pending: list[Any] = []  # (output, runner output) not yet given back: async scheduling
    depth = 2 if workload.async_scheduling else 1
    arrivals = list(workload.arrivals)
    for step in range(MAX_STEPS):
        outcome.steps = step
        for arrival in [a for a in arrivals if a.step <= step]:
            arrivals.remove(arrival)
            params = v["SamplingParams"](max_tokens=arrival.max_tokens, ignore_eos=True)
            options = {"priority": arrival.priority, "block_hasher": hasher}
            if "eos_token_id" in inspect.signature(v["Request"].__init__).parameters:  # <= 0.16
                options["eos_token_id"] = None
            request = v["Request"](arrival.rid, list(arrival.prompt), params, None, **options)
            scheduler.add_request(request)
        for when, rid in workload.aborts:
            if when == step and rid in scheduler.requests:
                scheduler.finish_requests(rid, v["RequestStatus"].FINISHED_ABORTED)
        if step in workload.resets:
            scheduler.reset_prefix_cache()
        if not scheduler.has_requests():  # EngineCore steps only while there is work
            while pending:
                done_output, done_runner = pending.pop(0)
                scheduler.update_from_output(done_output, done_runner)
                ledger.applied(done_runner)
            if not scheduler.has_requests():
                if not arrivals:
                    return outcome
                continue
        output = scheduler.schedule()
        for new in output.scheduled_new_reqs:
            outcome.hit_tokens += new.num_computed_tokens
        outcome.preemptions += len(getattr(output, "preempted_req_ids", ()) or ())
        executed = output.total_num_scheduled_tokens > 0
        runner_output = v["EMPTY"]
        if executed:
            runner_output, violation = ledger.forward(scheduler, output, step)
            if violation is not None:
                outcome.violation = violation
                return outcome
        pending.append((output, runner_output))
        # EngineCore.step_with_batch_queue: keep the queue filling while work goes on
        if len(pending) < depth and (executed or scheduler.has_requests()):
            continue
        done_output, done_runner = pending.pop(0)
        scheduler.update_from_output(done_output, done_runner)
        ledger.applied(done_runner)
    outcome.stalled = True
    return outcome
