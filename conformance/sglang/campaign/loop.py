"""One workload through SGLang's own request steps, its scheduler's loop played around them.

SGLang's `Scheduler` does not build on CPU (docs/engines.md), so this module plays its
event loop (FCFS or by priority, mixed chunks, EAGLE: as the workload's flags say) as
0.5.23 runs it, either synchronously (`event_loop_normal`) or overlapped, the server's default
(`event_loop_overlap`: a batch's result is processed after the next batch is scheduled and
launched; a decode skips the requests its queued result finishes), through
`get_next_batch_to_run`, `_get_new_batch_prefill_raw`, `update_running_batch` and the batch
result processor, and calls SGLang's own code for everything that touches the cache:

    a waiting request's lookup            Req.init_next_round_input (the tree's match)
    admission, chunking, token budget     PrefillAdder.add_one_req / add_chunked_req
    state slots set aside for a round     alloc_group_begin / alloc_group_end
    a prefill's slots (evicting)          ScheduleBatch.init_new + prepare_for_extend
    a chunk or prefill that ended         checkpoint_kv_cache (the tree's insert)
    a request finished by its prefill     release_kv_cache(checkpoint=True)
    a decode step's slots, retraction     check_decode_mem, retract_decode,
                                          prepare_for_decode (under SWA also each
                                          running request's window release)
    the admission ratio                   NewTokenRatioTracker (decay, retract, reset)
    a decoded token's result              _handle_finish_state_updated_req (the extra
                                          buffer's bookkeeping, the release at finish)
    the running batch                     filter_batch, merge_batch

The forward pass is the ledger's, run when a batch is launched: it runs the model runner's
deferred state copies (`copy_mamba_state`, `clear_slots`), checks what each request reads
through its row of `req_to_token` and the state it starts from, and writes the KV identities
of what it computes into the slots SGLang gave it, its state into the request's state slot
and, under the extra buffer, the checkpoints the GDN kernel would write into the track
slots; under SWA it reads the window before its first token through SGLang's full-to-SWA
slot map and writes its own SWA slots. Its sampled token is `workload.next_token`, committed
to the request when the batch's result is processed. Where SGLang raises, the run reports
it.
"""

from __future__ import annotations

import types
from array import array
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.sglang import serving, unified
from kvcert.conformance.sglang.campaign import (
    diagnosis,
    eagle,
    oracle,
    steps,
    variants,
    waiting,
)
from kvcert.conformance.sglang.campaign.ledger import Ledger, Window, identities
from kvcert.conformance.sglang.campaign.places import (
    Published,
)
from kvcert.conformance.sglang.campaign.states import States
from kvcert.conformance.sglang.campaign.workload import (
    MAMBA_MODELS,
    Workload,
    next_token,
    runs_extra_buffer,
)

# Steps a workload may take after its last arrival before the run calls it stuck.
DRAIN_STEPS = 400


@dataclass
class Findings:
    """What one run found: unsound reads, lost hits, SGLang raising; and its counts."""

    unsound: list[str] = field(default_factory=list)
    # under EAGLE: reads whose slot holds the target's KV of the reader's prefix but the
    # draft layer's of another next token (campaign.eagle.stale_drafts)
    draft_stale: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    lost_causes: dict[str, int] = field(default_factory=dict)
    crashed: str | None = None
    stalled: str | None = None  # SGLang's SWA admission livelock: the queue never moves
    admissions: int = 0
    owed_tokens: int = 0
    served_tokens: int = 0  # of the owed ones
    served_early: int = 0  # served beyond what was owed
    finished: int = 0
    retracted: int = 0
    preempted: int = 0  # running requests priority scheduling preempted
    aborted: int = 0  # requests SGLang aborted out of memory (retract_decode's last resort)
    steps: int = 0
    finishing_inflight: int = 0  # overlap: decodes skipped, the queued result finishing them
    mixed_decodes: int = 0  # mixed chunks: decode rows carried by prefill batches
    # mixed chunks under the extra buffer: decode rows at a checkpoint boundary, which a
    # mixed step does not track ("Decode tails are not tracked in a mixed step")
    mixed_untracked: int = 0
    dropped: int = 0  # sampled tokens no result committed (finished or retracted since launch)


class Run:
    """One workload against a fresh tree and pools of the workload's size."""

    def __init__(
        self,
        workload: Workload,
        mutant: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.workload = workload
        self.overlap = overlap = workload.overlap
        self.mutant = variants.chosen("mutant", mutant, variants.MUTANTS)
        self.fix = variants.chosen("fix", fix, variants.FIXES)
        self.sg = steps.sglang()
        mamba = workload.model in MAMBA_MODELS
        self.extra_buffer = runs_extra_buffer(workload.model, workload.page, overlap=overlap)
        if workload.lazy and not self.extra_buffer:
            raise ValueError("the lazy strategy varies the extra buffer, which this model "
                             "and scheduling do not run")  # fmt: skip
        lazy = workload.lazy
        rows = workload.rows
        states = steps.states_per_row(self.extra_buffer, overlap, lazy) * rows if mamba else 0
        self.tree, self.requests = serving.build_serving(
            workload.page, workload.pool_tokens, rows, states, self.extra_buffer,
            exclusive_window=workload.window, overlap=overlap, lazy=lazy,
            priority=workload.priority,
            speculative=eagle.server_flags() if workload.eagle else None,
            bigram_keys=False if self.mutant == "eagle-plain-keys" else None,  # the twin
        )  # fmt: skip
        if workload.eagle:
            eagle.check_reserve()
        self.policy = waiting.policy(self)
        # under EAGLE the tree keys bigrams, but beside a Mamba component (SGLang's choice,
        # UnifiedTreeCore.is_eagle) and in the twin eagle-plain-keys it keys tokens
        core = getattr(self.tree, "tree_core", self.tree)
        self.bigram_keys = workload.eagle and bool(getattr(core, "is_eagle", False))
        self.hybrid = states > 0
        self.states = States(self.requests)  # read only when self.hybrid
        # the scheduler's admission ratio: from the published server arguments, decayed
        # each decode step, raised by a retraction, reset when the scheduler idles
        self.ratio = self.sg.NewTokenRatioTracker.from_config()
        self.results = steps.result_steps(self.sg, self.tree)
        # per request row, its extra buffer's track slots (logical)
        self.track_buffer: Any = getattr(
            self.requests, "req_index_to_mamba_ping_pong_track_buffer_mapping", None
        )
        self.allocator = self.tree.token_to_kv_pool_allocator
        self.model = steps.model_config(workload.pool_tokens)
        self.ledger = Ledger(workload.page)
        # a sliding-window model: what its SWA slots hold, and the window (W - 1 + 1 = W)
        self.window = None
        self.branched: set[int] = set()  # id() of requests admitted at an SWA branch point
        if workload.window is not None:
            self.window = Window(workload.window + 1, Ledger(workload.page))
        self.findings = Findings()
        if self._broken("swa-window-short"):
            variants.shorten_windows(self.tree, workload.page)
        if self._broken("swa-branch-ignores-state"):
            swa = unified.api().ComponentType.SWA
            component = next(c for c in self.tree._components_tuple if c.component_type == swa)
            variants.branch_without_state(self.tree, component)
        self.waiting: list[Any] = []
        self.running = self.sg.ScheduleBatch(reqs=[], batch_is_full=False)
        self.chunked: Any = None
        self.last: Any = None
        # overlap: the launched batch whose result is not processed yet (a copy, as
        # SGLang's result queue holds it), and per request the tokens its launched passes
        # sampled, appended when their results are processed
        self.queued: list[Any] = []
        self.sampled: dict[int, list[int]] = {}
        self.pending_runs: dict[int, list[int]] = {}  # EAGLE: per launched pass, its run's length
        self.judged: set[int] = set()  # id() of requests judged at their current admission
        self.checkpointed: set[int] = set()  # states the extra buffer has tracked
        self.published = Published()  # what the tree held, what retractions freed
        self.step = 0

    # --- the scheduler's loop -------------------------------------------------------------

    def play(self) -> Findings:
        if self.window is None:
            return self._play()
        interval = unified.api().envs.SGLANG_SWA_EVICTION_INTERVAL
        with interval.override(self.workload.swa_interval):
            return self._play()

    def _play(self) -> Findings:
        arrivals = list(self.workload.arrivals)
        last_arrival = max(a.step for a in arrivals)
        while arrivals or self.waiting or self.chunked or self.running_now():
            if self.step > last_arrival + DRAIN_STEPS:
                livelock = diagnosis.swa_livelock(self)
                if livelock is not None:
                    self.findings.stalled = livelock
                else:
                    self.findings.crashed = (
                        f"still running {DRAIN_STEPS} steps after the last arrival"
                    )
                break
            while arrivals and arrivals[0].step <= self.step:
                a = arrivals.pop(0)
                tokens = array("q", a.prompt)
                request = unified.new_request(a.rid, tokens, a.max_tokens)
                request.priority = a.priority if self.workload.priority else None
                # what the tokenizer manager does to every request (no tokenizer: no stops)
                request.sampling_params.normalize(None)
                waiting.enqueue(self, request)
            try:
                self._one_step()
            except Exception as error:  # SGLang raising on a workload it accepted
                self.findings.crashed = f"step {self.step}: {type(error).__name__}: {error}"
                break
            self.step += 1
        self.findings.steps = self.step
        return self.findings

    def running_now(self) -> bool:
        """Whether a request still runs: in the running batch, in the prefill batch just
        run (merged into the running batch by the next step), or in a launched batch whose
        result is still queued (overlap)."""
        last = self.last
        fresh = last is not None and last.forward_mode.is_extend() and not last.is_empty()
        return fresh or bool(self.queued) or not self.running.is_empty()

    def _one_step(self) -> None:
        """One turn of the scheduler's event loop. Synchronous (`event_loop_normal`): the
        next batch, its pass, its result. Overlapped (`event_loop_overlap`, the server's
        default): the next batch is scheduled and launched before the last one's result is
        processed (at once only for two prefills in a row, and only when
        SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP asks)."""
        batch = self._next_batch()
        if not self.overlap:
            if batch is None:
                self.ratio.reset()  # Scheduler.on_idle
            else:
                self._launch(batch)
                self._process(batch)
            self.last = batch
            return
        extends = (
            batch is not None
            and self.last is not None
            and all(b.forward_mode.is_extend() for b in (batch, self.last))
        )
        serial = extends and unified.api().envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP.get()
        if serial:
            self._process(self.queued.pop(0))
        if batch is not None:
            self._launch(batch)
            self.queued.append(batch.copy())
        if self.last is not None:
            if not serial:
                self._process(self.queued.pop(0))
        elif batch is None:
            self.ratio.reset()
        self.last = batch

    def _next_batch(self) -> Any:
        """Scheduler.get_next_batch_to_run: the last prefill merged into the running batch,
        then a new prefill, else the running batch's decode step (None: nothing to run)."""
        exclude = []
        if self.chunked is not None:
            exclude.append(self.chunked)
            if self.chunked.extend_end > self.chunked.prefix_len:  # stash_chunked_request
                self._checkpoint(self.chunked)
        last = self.last
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            size = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < size:
                self.running.batch_is_full = False
            if not last.is_empty() and last is not self.running:
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        size = self.running.batch_size()
        self.running.filter_batch()
        if self.running.batch_size() < size:
            self.running.batch_is_full = False
        batch = self._new_prefill()
        if batch is None and not self.running.is_empty():
            batch = self._update_running()
        return None if batch is None or batch.is_empty() else batch

    def _new_prefill(self) -> Any:
        """Scheduler._get_new_batch_prefill_raw (FCFS, or by priority), without LoRA,
        grammar or storage."""
        sg, running = self.sg, self.running
        if waiting.admission_shut(self):
            return None
        self.policy.calc_priority(self.waiting, running)  # the queue's order, LRU refresh
        adder = self.prefill_adder()
        if self.chunked is not None:
            self.chunked.init_next_round_input()
            self.chunked = adder.add_chunked_req(self.chunked)
        # Who holds what, as the round starts: the state allocator sets slots aside for the
        # round's matches (alloc_group_begin), free until a match takes one.
        holders = oracle.who_holds(self, adder.can_run_list)
        state_allocator = getattr(self.requests, "mamba_allocator", None)
        if state_allocator is not None:
            state_allocator.alloc_group_begin(len(self.waiting))
        for req in self.waiting:
            if adder.budget_state() == sg.AddReqResult.OTHER:
                break
            # get_num_allocatable_reqs: the free rows and those the round's requests hold
            held = sum(bool(r.kv.holds_kv) for r in adder.can_run_list)
            if len(adder.can_run_list) >= self.requests.available_size() + held:
                running.batch_is_full = True
            if running.batch_is_full:
                if not waiting.preempt(self, adder, req):
                    break
                holders = oracle.who_holds(self, adder.can_run_list)  # release_req evicts
            owed = oracle.owed(self, req, holders, oracle.state_slots(self, adder.can_run_list))
            req.init_next_round_input(self.tree)
            self._note_branch(req)
            result = adder.add_one_req(req, has_chunked_req=self.chunked is not None,
                                       truncation_align_size=None)  # fmt: skip
            added = bool(adder.can_run_list) and req is adder.can_run_list[-1]
            if added:
                oracle.judge(self, req, owed, holders)
            if result != sg.AddReqResult.CONTINUE:
                if result == sg.AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                if not added:
                    self._give_back_state(req)
                break
        if state_allocator is not None:
            state_allocator.alloc_group_end()
        admitted = adder.can_run_list
        self.waiting = [r for r in self.waiting if r not in admitted]
        waiting.requeue(self, adder)
        if not admitted:
            return None
        if adder.new_chunked_req is not None:
            waiting.one_in_flight(self, adder)
            self.chunked = adder.new_chunked_req
        if self.chunked is not None:
            self.chunked.inflight_middle_chunks += 1
        batch = sg.ScheduleBatch.init_new(
            admitted, self.requests, self.allocator, self.tree, self.model, self.overlap,
            sg.EAGLE if self.workload.eagle else sg.NONE, chunked_req=self.chunked,
        )  # fmt: skip
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        if self.workload.mixed and not running.is_empty():
            self._mix(batch)
        return batch

    def _mix(self, batch: Any) -> None:
        """Mixed chunked prefill (get_new_batch_prefill under --enable-mixed-chunk): the
        running requests' decode step rides in the prefill batch, when it fits (else they
        sit this step out, not retracted); the running batch is then empty until the mixed
        batch is merged back."""
        running = self.running
        finishing = self._finishing_inflight(running)
        running.filter_batch(reqs_to_exclude=finishing)
        if finishing:
            running.batch_is_full = False
        if running.is_empty() or not running.check_decode_mem():
            return
        with steps.host_memory_unpinned():
            running.prepare_for_decode()
        if self.extra_buffer:
            grid = self.sg.mamba_track_grid(self.workload.page)
            lengths = running.seq_lens_cpu.tolist()
            self.findings.mixed_untracked += sum(n % grid == 0 for n in lengths)
        batch.mix_with_running(running)
        batch.decoding_reqs = running.reqs
        self.findings.mixed_decodes += len(running.reqs)
        self.running = self.sg.ScheduleBatch(reqs=[], batch_is_full=running.batch_is_full)

    def _finishing_inflight(self, batch: Any) -> list[Any]:
        """Scheduler._reqs_finishing_inflight: under overlap, the requests of `batch` whose
        queued result reaches their max_new_tokens (none synchronously)."""
        queued = {id(r) for b in self.queued for r in b.reqs}
        return [r for r in batch.reqs if id(r) in queued and r.next_output_finishes_by_length()]

    def prefill_adder(self) -> Any:
        """The scheduler's PrefillAdder for this round (FCFS, no LoRA, grammar or storage)."""
        adder = self.sg.PrefillAdder(
            self.workload.page,
            self.tree,
            self.allocator,
            self.running,
            self.ratio.current,
            self.workload.max_prefill_tokens,
            self.workload.chunk,
            # mixed chunks: the running requests' decode tokens share the step's budget
            self.running.batch_size() if self.workload.mixed else 0,
            self.sg.get_schedule().priority_scheduling_preemption_threshold,
            max_running_requests=self.workload.rows,
        )
        if self.fix == "swa-decode-headroom":
            reserve = eagle.reserve() if self.workload.eagle else 0
            variants.keep_decode_headroom(adder, self.running, reserve)
        if self.fix == "single-chunked-request":
            variants.refuse_second_chunk(adder, self.sg.AddReqResult.OTHER)
        if self.fix == "mixed-chunk-page-align":
            variants.align_cut_chunks(adder, self.workload.page)
        return adder

    def _note_branch(self, req: Any) -> None:
        """Whether the request's lookup found full KV past its live window: SGLang's SWA
        tree then sets a branch point (`swa_branching_seqlen`), and the insert after its
        prefill stops there (the SWA component's prepare_for_caching_req)."""
        branch = getattr(req, "swa_branching_seqlen", None)
        if branch is not None and branch > req.kv.cache_protected_len:
            self.branched.add(id(req))
        else:
            self.branched.discard(id(req))

    def _give_back_state(self, req: Any) -> None:
        """A request the round did not admit gives back the state slot and copy its match
        staged (the scheduler's revert after add_one_req)."""
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False
        if req.kv.holds_mamba:
            self.requests.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
            req.kv.mamba_pool_idx = None

    def _update_running(self) -> Any:
        """Scheduler.update_running_batch: retract when the next decode does not fit. Under
        overlap a request whose queued result reaches its max_new_tokens is dropped from the
        batch first (`_reqs_finishing_inflight`), and if the rest does not fit the step
        waits for that result to free its KV."""
        batch = self.running
        finishing = self._finishing_inflight(batch)
        batch.filter_batch(reqs_to_exclude=finishing)
        self.findings.finishing_inflight += len(finishing)
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        fits = batch.check_decode_mem()
        if not fits and finishing:
            batch.batch_is_full = False
            return None
        if not fits:
            unpublished = {id(r): self.unpublished(r) for r in batch.reqs}
            retracted, self.ratio.current, aborted = batch.retract_decode()
            for req in retracted + aborted:  # freed without an insert (release_req)
                kv, state = unpublished[id(req)]
                self.published.retracted_kv |= kv
                self.published.retracted_states |= state
            # SGLang answers an aborted request with an error (its KV freed by the retract)
            self.findings.aborted += len(aborted)
            self.findings.retracted += len(retracted)
            for req in retracted:
                self.judged.discard(id(req))
                waiting.enqueue(self, req)
            batch.batch_is_full = False
        else:
            self.ratio.decay_step()
        if batch.is_empty():
            return None
        with steps.host_memory_unpinned():
            batch.prepare_for_decode()
        return batch

    def unpublished(self, req: Any) -> tuple[set[bytes], set[int]]:
        """The KV identities past the prefix the tree owns, and the states, of a request:
        its running state and what its extra buffer's track slots hold (checkpoints the
        tree has not adopted yet)."""
        length = len(self.tokens_of(req))
        row = self.row(req, length)[req.kv.cache_protected_len :]
        kv = {self.ledger.content[s] for s in row if s in self.ledger.content}
        if not self.hybrid:
            return kv, set()
        slots = {self.states.slot(req)}
        if self.extra_buffer:
            slots |= self.states.physical(self.track_buffer[req.kv.req_pool_idx])
        values = self.states.values()
        return kv, {int(values[slot]) for slot in slots}

    # --- the pass and its result ------------------------------------------------------------

    def row(self, req: Any, end: int) -> list[int]:
        table = self.requests.req_to_token[req.kv.req_pool_idx]
        return [int(s) for s in table[:end].tolist()]

    def read_and_write(self, req: Any, start: int, end: int, tokens: list[int]) -> None:
        """The pass of positions [start, end) of `tokens`: reads 0..start-1 (and the state
        after start - 1), writes start..end-1 (and the state after end - 1). Its KV serves
        a hit once its step has ended: at once synchronously, after the next step's
        scheduling under overlap (its result is processed then)."""
        plain = identities(tokens[:end])
        idents = plain
        if self.workload.eagle:  # the draft layer's KV at end - 1 reads the token after it
            idents = eagle.slot_identities(eagle.with_next(tokens, end))[:end]
        row = self.row(req, end)
        bad = self.ledger.unsound(row[:start], idents[:start])
        if bad:
            self._unsound_read(
                self.ledger, [row[p] for p in bad], [plain[p] for p in bad],
                f"step {self.step}: {req.rid} read position {bad[0]} from slot {row[bad[0]]}, "
                f"which does not hold the KV of its prefix (tokens {start}..{end} computed)",
            )  # fmt: skip
        self.ledger.write(row[start:end], idents[start:end], self.write_step())
        if self.workload.eagle:
            self.ledger.targets.update(zip(idents[start:end], plain[start:end], strict=True))
        if self.window is not None:
            span = range(start, end)
            self._read_and_write_window(self.window, req, row, idents, span, plain=plain)
        if self.hybrid:  # a state is the target model's: a function of the tokens up to it
            slot = self.states.slot(req)
            want = self.ledger.state_id(plain[start - 1]) if start else 0
            have = int(self.states.values()[slot])
            if have != want:
                self.findings.unsound.append(
                    f"step {self.step}: {req.rid} started from state {have} in slot {slot}, "
                    f"not the state after its {start} computed tokens ({want})"
                )
            self.states.write(slot, self.ledger.state_id(plain[end - 1]))

    def _unsound_read(
        self, ledger: Ledger, slots: list[int], targets: list[bytes], text: str
    ) -> None:
        """Report a pass's read of `slots` that do not hold its prefix's KV: a stale draft
        where only their draft-layer KV read another next token (eagle.stale_drafts), else
        unsound."""
        stale = eagle.stale_drafts(ledger, slots, targets)
        (self.findings.draft_stale if stale else self.findings.unsound).append(text)

    def write_step(self) -> int:
        """The step whose end the pass launched now ends with (the ledger's write step)."""
        return self.step + 1 if self.overlap else self.step

    def swa_slots(self, row: list[int]) -> list[int]:
        """The SWA slots SGLang maps the full-attention slots of `row` to (0: released)."""
        mapping = self.allocator.full_to_swa_index_mapping
        return [int(mapping[slot]) for slot in row]

    def _read_and_write_window(
        self, window: Window, req: Any, row: list[int], idents: list[bytes], span: range,
        *, plain: list[bytes],
    ) -> None:  # fmt: skip
        """The sliding-window layers of the pass over `span`: its first query reads the
        W - 1 positions before it through SGLang's full-to-SWA slot map; the pass writes its
        positions' SWA slots (`plain`: the target model's identities, as in the pass)."""
        start, end = span.start, span.stop
        first = max(0, start - (window.size - 1))
        swa = self.swa_slots(row[first:end])
        bad = window.ledger.unsound(swa[: start - first], idents[first:start])
        if bad:
            self._unsound_read(
                window.ledger, [swa[p] for p in bad], [plain[first + p] for p in bad],
                f"step {self.step}: {req.rid} read position {first + bad[0]} from SWA slot "
                f"{swa[bad[0]]}, which does not hold the KV of its prefix (window "
                f"{window.size}, tokens {start}..{end} computed)",
            )  # fmt: skip
        window.ledger.write(swa[start - first :], idents[start:end], self.write_step())
        if self.workload.eagle:
            window.ledger.targets.update(zip(idents[start:end], plain[start:end], strict=True))

    def _broken(self, name: str) -> bool:
        """Whether the run plays the broken twin `name`."""
        return self.mutant == name

    def _launch(self, batch: Any) -> None:
        """The batch's forward pass: what it reads, what it writes, what it samples."""
        if batch.forward_mode.is_extend():
            if self.hybrid:
                self.states.copy_and_clear(batch, copy=not self._broken("no-state-copy"))
            decoding = {id(r) for r in batch.decoding_reqs or ()}
            for req in batch.reqs:
                tokens = self.tokens_of(req)
                # a mixed batch's decode row computes its last token (mix_with_running)
                start = req.extend_end - 1 if id(req) in decoding else req.prefix_len
                self.read_and_write(req, start, req.extend_end, tokens)
                if req is not self.chunked:  # a middle chunk samples nothing
                    self._sample(req, tokens[: req.extend_end])
            if self.extra_buffer:
                self._track_prefill(batch)
            return
        if self.workload.eagle:
            return eagle.verify(self, batch)
        for i, req in enumerate(batch.reqs):
            tokens = self.tokens_of(req)
            if len(tokens) != int(batch.seq_lens_cpu[i]):
                raise RuntimeError(
                    f"the loop lost track of {req.rid}: {len(tokens)} tokens, SGLang's "
                    f"sequence length {int(batch.seq_lens_cpu[i])}"
                )
            self.read_and_write(req, len(tokens) - 1, len(tokens), tokens)
            self._sample(req, tokens)
        if self.extra_buffer:
            self._track_decode(batch)

    def tokens_of(self, req: Any) -> list[int]:
        """The request's tokens, with those its launched passes sampled (not yet processed)."""
        return [*req.origin_input_ids, *req.output_ids, *self.sampled.get(id(req), ())]

    def _sample(self, req: Any, tokens: list[int]) -> None:
        self.sampled.setdefault(id(req), []).append(next_token(tokens))

    def _sampled(self, req: Any) -> int | None:
        """The oldest token a launched pass sampled for the request, taken off its queue."""
        queue = self.sampled.get(id(req))
        token = queue.pop(0) if queue else None
        if not queue:
            self.sampled.pop(id(req), None)
        return token

    def _drop(self, req: Any) -> None:
        """A result that commits nothing: its request finished or was retracted since the
        pass was launched (under overlap), so the token the pass sampled is dropped."""
        if self._sampled(req) is not None:
            self.findings.dropped += 1

    def _committed(self, req: Any) -> int:
        """The token a launched pass sampled for the request, which its result commits."""
        token = self._sampled(req)
        if token is None:
            raise RuntimeError(f"the loop lost track of {req.rid}: no sampled token to commit")
        return token

    def _process(self, batch: Any) -> None:
        """BatchResultProcessor's result step for a batch whose pass was launched."""
        if batch.forward_mode.is_extend():
            self._process_prefill(batch)
        elif self.workload.eagle:
            eagle.commit(self, batch)
        else:
            self._process_decode(batch)

    def _process_prefill(self, batch: Any) -> None:
        """process_batch_result_prefill: the sampled token, then a release or a checkpoint."""
        decoding = {id(r) for r in batch.decoding_reqs or ()}
        for req in batch.reqs:
            if req.finished() or req.is_retracted:
                self._drop(req)
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            req.output_ids.append(self._committed(req))
            req.update_finish_state()
            if req.finished():
                self._release(req)
            elif id(req) not in decoding:  # a mixed batch's decode row is not re-inserted
                self._checkpoint(req)

    def _process_decode(self, batch: Any) -> None:
        """process_batch_result_decode's step for each request (SGLang's own
        `_handle_finish_state_updated_req`: the extra buffer's checkpoint bookkeeping, and
        the release of a finished request). Under overlap a request finished or retracted
        since the launch commits nothing."""
        outcome = types.SimpleNamespace(
            num_correct_drafts_per_req_cpu=None, grammar_retained_tokens=None
        )
        for i, req in enumerate(batch.reqs):
            if self.overlap and (req.finished() or req.is_retracted):
                self._drop(req)
                continue
            req.output_ids.append(self._committed(req))
            req.update_finish_state(1)
            shared = self.row(req, req.kv.cache_protected_len) if req.finished() else []
            self.results._handle_finish_state_updated_req(req, batch, outcome, i, None)
            self.note_adopted()
            if req.finished():
                self.released(req, shared)

    def _track_prefill(self, batch: Any) -> None:
        """The extra buffer's prefill checkpoints, as the GDN kernel writes them
        (`_init_track_ssm_indices`): a tracked length on the kernel's chunk grid takes the
        state after the whole chunk (its last state), any other the chunk-grid state
        before it (`h`); the destination is the batch's `mamba_track_indices`."""
        chunk = steps.MAMBA_CHUNK
        for i, req in enumerate(batch.reqs):
            if not batch.mamba_track_mask[i]:
                continue
            tracked = int(batch.mamba_track_seqlens[i]) - req.prefix_len
            end = req.prefix_len + tracked // chunk * chunk
            if tracked % chunk == 0 or self._broken("track-final-state"):
                end = req.extend_end  # the last state (the twin takes it in place of `h`)
            self.track(req, end, batch.mamba_track_indices[i])

    def _track_decode(self, batch: Any) -> None:
        """The extra buffer's decode checkpoints: where `mamba_track_mask` is set the kernel
        copies the state after the decoded token into the batch's `mamba_track_indices`."""
        for i, req in enumerate(batch.reqs):
            if batch.mamba_track_mask_cpu[i]:
                self.track(req, int(batch.seq_lens_cpu[i]), batch.mamba_track_indices[i])

    def track(self, req: Any, end: int, logical: Any) -> None:
        """Write the state after `end` tokens of the request into a track slot."""
        state = self.ledger.state_id(identities(self.tokens_of(req)[:end])[-1])
        physical = int(self.requests.translate_mamba_indices(logical.reshape(1))[0])
        self.states.write(physical, state)
        self.checkpointed.add(state)

    def _checkpoint(self, req: Any) -> None:
        if self._broken("no-checkpoint"):
            req.prefix_len = req.extend_end  # what checkpoint_kv_cache does besides the insert
            return
        self.sg.checkpoint_kv_cache(req, self.tree)
        self.note_adopted()

    def _release(self, req: Any) -> None:
        """release_kv_cache for a request that finished in a prefill pass."""
        shared = self.row(req, req.kv.cache_protected_len)
        last = eagle.last_owned(self, req) if self.workload.eagle else []
        self.sg.release_kv_cache(req, self.tree, checkpoint=True)
        eagle.note_dropped(self, last)
        self.note_adopted()
        self.released(req, shared)

    def note_adopted(self) -> None:
        """Remember the KV and states the tree holds now. Called after every step that can
        insert (only an insert gives the tree KV or a state), so what is freed later was
        either evicted from the tree or never reached it: places.Holders tells them apart."""
        content = self.ledger.content
        slots = self.tree.all_values_flatten().tolist()
        self.published.kv.update(content[s] for s in map(int, slots) if s in content)
        if self.hybrid:
            held = self.states.physical(self.tree.all_mamba_values_flatten())
            states = self.states.values().tolist()
            self.published.states.update(states[slot] for slot in held)

    def released(self, req: Any, shared: list[int]) -> None:
        self.findings.finished += 1
        self.judged.discard(id(req))
        if shared and self._broken("free-shared-prefix"):
            # the broken twin: the slots of the prefix the tree lent it freed as well
            torch = unified.api().torch
            self.allocator.free(torch.tensor(shared, dtype=torch.int64))
