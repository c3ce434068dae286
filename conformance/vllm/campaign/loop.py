"""Play a workload through vLLM's real scheduler, the ledger as its model runner.

EngineCore's loop, step by step: the client's arrivals, aborts and resets; `schedule()`;
the ledger's forward pass (which stops the run at the first unsound read); the runner's
output back through `update_from_output()` (one step late under async scheduling) and the
drafter's drafts. What vLLM raises while serving a workload it accepted is a crash finding.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvcert.conformance.campaign.workload import Workload
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.campaign.build import (
    Unreachable,
    build,
    declared_profiles,
    drafter_modules,
    first_line,
    keying_of,
)
from kvcert.conformance.vllm.campaign.ledger import Ledger
from kvcert.conformance.vllm.campaign.owed import Oracle

MAX_STEPS = 400


@dataclass
class Outcome:
    """What one run of a workload showed."""

    violation: str | None = None  # the first unsound read, in words
    # what it read: the served model's KV ("target") or recurrent state ("state"), both wrong
    # outputs, or the drafter's KV ("draft": acceptance only)
    role: str | None = None
    keying: str | None = None  # the EAGLE keying played: exact | drop (None: no drafter)
    steps: int = 0
    preemptions: int = 0
    hit_tokens: int = 0  # tokens the scheduler took from the prefix cache
    served_tokens: int = 0  # hit tokens of every admission, resumed requests' included
    owed_tokens: int = 0  # tokens the spec owed the same admissions (`campaign.owed`)
    beyond_tokens: int = 0  # tokens served past what was owed (not a finding)
    lost: str | None = None  # the first lost hit, in words (a finding when sound otherwise)
    lost_hits: int = 0  # admissions served less than they were owed
    stalled: bool = False  # MAX_STEPS reached with requests left (not a violation)
    drafts: int = 0  # draft tokens the scheduler sent for verification
    accepted: int = 0  # of which the runner accepted
    state_copies: int = 0  # passes whose accepted drafts crossed a state block boundary
    unreachable: str | None = None  # the release refuses this configuration: not played
    crash: str | None = None  # the engine raised while serving the workload (a finding)

    @property
    def finding(self) -> str | None:
        """What this run found, in words (None: sound and complete, or not played): an
        unsound read or a crash first, else the first lost hit."""
        return self.violation or self.crash or self.lost

    def found(self, kind: str = "unsound") -> bool:
        """Whether the run has a finding a regression file of `kind` records: an unsound
        read or a crash (soundness: every file from before lost hits), or a lost hit."""
        if kind == "lost":
            return self.lost is not None
        return self.violation is not None or self.crash is not None

    @property
    def kind(self) -> tuple[str, str | None] | None:
        """The finding's class, which shrinking keeps: ("unsound", role), ("crash", None) or
        ("lost", None)."""
        if self.violation is not None:
            return ("unsound", self.role)
        if self.crash is not None:
            return ("crash", None)
        return ("lost", None) if self.lost is not None else None


class EngineCrash(Exception):
    """vLLM raised while serving a workload it accepted at start-up: EngineCore would die."""


@contextmanager
def _engine(step: int, call: str) -> Iterator[None]:
    """Marks vLLM's own calls, so that what they raise is reported as the engine's crash and
    the ledger's own errors are not."""
    try:
        yield
    except Exception as error:
        raise EngineCrash(
            f"step {step}: {call} raised {type(error).__name__}: {first_line(error)}"
        ) from error


def _client(
    scheduler: Any,
    workload: Workload,
    arrivals: list[Any],
    step: int,
    hasher: Any,
    *,
    oracle: Oracle,
    sent: dict[str, Any],
) -> None:
    """What the API server hands EngineCore before `step`: new requests (a follow-up once
    the request it follows has finished), aborts, resets. `sent`: the requests sent so far."""
    v = runtime.vllm()
    for arrival in [a for a in arrivals if a.step <= step]:
        history: list[int] = []
        if arrival.follows in sent:
            source = sent[arrival.follows]
            if source.request_id in scheduler.requests:  # still answering: the turn waits
                continue
            history = list(source.all_token_ids)  # its prompt and the answer it was given
        elif arrival.follows is not None and any(a.rid == arrival.follows for a in arrivals):
            continue  # what it follows has not arrived yet
        arrivals.remove(arrival)
        params = v.SamplingParams(max_tokens=arrival.max_tokens, ignore_eos=True)
        options = {"priority": arrival.priority, "block_hasher": hasher}
        if "eos_token_id" in inspect.signature(v.Request.__init__).parameters:
            options["eos_token_id"] = None  # <= 0.16
        prompt = [*history, *arrival.prompt]
        request = v.Request(arrival.rid, prompt, params, None, **options)
        sent[arrival.rid] = request
        with _engine(step, "add_request()"):
            scheduler.add_request(request)
    for when, rid in workload.aborts:
        if when == step and rid in scheduler.requests:
            with _engine(step, "finish_requests()"):
                scheduler.finish_requests(rid, v.RequestStatus.FINISHED_ABORTED)
    if step in workload.resets:
        with _engine(step, "reset_prefix_cache()"):
            if scheduler.reset_prefix_cache() is not False:  # it refuses while blocks are used
                oracle.reset()


def _runner_output(ids: list[str], sampled: list[list[int]]) -> Any:
    return runtime.vllm().ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )


def _take(scheduler: Any, ledger: Ledger, oracle: Oracle, step: int, done: Any) -> Any:
    """Give the scheduler one step's runner output back (`done`: that step, its scheduler
    output, the runner's output); returns the runner's output."""
    done_step, done_output, done_runner = done
    with _engine(step, "update_from_output()"):
        scheduler.update_from_output(done_output, done_runner)
    ledger.applied(done_runner)
    oracle.applied = done_step
    return done_runner


def play(
    workload: Workload, fix: bool = False, mutant: str | None = None, kvcert: bool = False
) -> Outcome:
    """Run the workload to the end (or MAX_STEPS); stop at the first violation. `kvcert`:
    through kvcert.reference.vllm's Scheduler (see `build`)."""
    v = runtime.vllm()
    try:
        scheduler, groups, hasher, checkpoints = build(workload, fix, mutant, kvcert)
    except Unreachable as why:
        return Outcome(unreachable=str(why))
    ledger = Ledger(
        groups, workload.seed, workload.spec_tokens, checkpoints=checkpoints,
        modules=drafter_modules(workload),
    )  # fmt: skip
    oracle = Oracle(groups, declared_profiles(scheduler, workload, kvcert), ledger.modules)
    outcome = Outcome(keying=keying_of(workload))
    # (step, output, runner output) not yet given back: async scheduling
    pending: list[Any] = []
    depth = 2 if workload.async_scheduling else 1
    arrivals = list(workload.arrivals)
    sent: dict[str, Any] = {}
    try:
        for step in range(MAX_STEPS):
            outcome.steps = step
            _client(scheduler, workload, arrivals, step, hasher, oracle=oracle, sent=sent)
            if not scheduler.has_requests():  # EngineCore steps only while there is work
                while pending:
                    _take(scheduler, ledger, oracle, step, pending.pop(0))
                if not scheduler.has_requests():
                    if not arrivals:
                        return outcome
                    continue
            with _engine(step, "schedule()"):
                output = scheduler.schedule()
            for new in output.scheduled_new_reqs:
                outcome.hit_tokens += new.num_computed_tokens
            for lost in oracle.judge(scheduler, output, step, ledger.slots, ledger.tokens):
                outcome.lost = outcome.lost or lost.text
            outcome.preemptions += len(getattr(output, "preempted_req_ids", ()) or ())
            executed = output.total_num_scheduled_tokens > 0
            runner_output = v.EMPTY
            if executed:
                sampled, violation = ledger.forward(scheduler, output, step)
                runner_output = _runner_output(list(output.num_scheduled_tokens), sampled)
                if violation is not None:
                    outcome.violation, outcome.role = violation.text, violation.role
                    return outcome
            pending.append((step, output, runner_output))
            # EngineCore.step_with_batch_queue: keep the queue filling while work goes on
            if len(pending) < depth and (executed or scheduler.has_requests()):
                continue
            done_runner = _take(scheduler, ledger, oracle, step, pending.pop(0))
            if workload.spec_tokens and depth == 1 and executed:  # EngineCore.post_step
                drafts = ledger.draft_ids(done_runner)
                with _engine(step, "update_draft_token_ids()"):
                    scheduler.update_draft_token_ids(drafts)
        outcome.stalled = True
        return outcome
    except EngineCrash as crash:
        outcome.crash = str(crash)
        return outcome
    finally:
        outcome.drafts, outcome.accepted, outcome.state_copies = (
            ledger.drafts,
            ledger.accepted,
            ledger.state_copies,
        )
        outcome.served_tokens, outcome.owed_tokens = oracle.served_tokens, oracle.owed_tokens
        outcome.beyond_tokens = oracle.beyond_tokens
        outcome.lost_hits = len(oracle.lost)
