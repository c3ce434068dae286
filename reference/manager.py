"""The request-level allocator an engine calls: admit, extend, end_step, finish, preempt.

Implements the spec's allocator (§6, kvcert.spec.alloc) under every eviction profile (the
free queue and the release order are the profile's, kvcert.reference.eviction):
ALLOC-TWO-PHASE-1 (hits are taken before anything is allocated), ALLOC-VIS-1 (blocks are
registered at the end of the step that wrote them), ALLOC-RESET-1. Each operation reads in
one place here; the work it delegates has a module of its own: `inputs` (argument checks),
`hit_queries` (the lookups, which take nothing), `lookup` (keys), `tables` (which positions
a step writes, keeps and releases), `commit` (what becomes hittable), `block_pool` (blocks,
references, keys). kvcert.reference.rules lists which function implements which rule;
tests/differential runs the manager against the spec step by step.

Cost per call: a prompt is validated and encoded once in C and digested once per block
boundary (kvcert.reference.hashing), except for the whole blocks it shares with a recent
prompt, whose digests the memo gives back after a byte comparison; a lookup scans keys in C;
an extension touches only the positions it adds or releases (each group remembers the first
position it still holds), and returns only the blocks it added, as an engine's allocator
does; `block_tables(rid)` gives a whole table on request. Engines that hash prompts as they
arrive pass a `Prompt`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from operator import itemgetter

from kvcert.reference import inputs
from kvcert.reference.block_pool import NULL_BLOCK, BlockPool
from kvcert.reference.commit import MapsAfterSteps, Registrar
from kvcert.reference.config import CacheConfig, DraftKeying, Kind, Retention, Visibility
from kvcert.reference.coordinator import Keys, longest_single_group
from kvcert.reference.decode_lane import decode_lane, registers
from kvcert.reference.errors import (
    ConfigError,
    MaxLengthError,
    RequestStateError,
    UnknownRequestError,
)
from kvcert.reference.events import Event
from kvcert.reference.hashing import DigestMemo, ExtraKey, hasher
from kvcert.reference.hit_queries import HitQueries
from kvcert.reference.inputs import LIST_OR_TUPLE, TOKEN_LIMIT
from kvcert.reference.keyindex import ServedMap
from kvcert.reference.lookup import Keying
from kvcert.reference.refcounts import count_free
from kvcert.reference.requests import Progress, Prompt, Request, Scheduled, Stats, Waiting
from kvcert.reference.tables import Released, TablePlanner, held_from, wanted_count
from kvcert.reference.tails import Source, Tails, copies, unit_refusal, with_targets

__all__ = ["KVCacheManager", "Progress", "Prompt", "Scheduled", "Stats", "Waiting"]

_Fit = tuple[int, int | None, int]  # admit's keep_free, fit_tokens, fit_keep_free


class KVCacheManager(HitQueries):
    """A hybrid KV-cache allocator with prefix caching over one shared block pool."""

    __slots__ = ("_in_flight", "_lane", "_step")  # read per decode chunk by _decodelane*.c

    def __init__(self, config: CacheConfig) -> None:
        if all(g.kind is Kind.CROSS for g in config.groups):
            raise ConfigError("every group is cross attention: there is no prefix to cache")
        self.config = config
        unit = config.hit_unit is not None
        if unit and (refusal := unit_refusal(config)):
            raise ConfigError(refusal)
        self.pool = BlockPool(
            config.num_blocks,
            config.eviction,
            len(config.groups),
            track_liveness=config.count_dead_evictions,
            record_events=config.record_events,
            tail_keys=unit,
        )
        budget = config.digest_memo_bytes
        self._memo = DigestMemo(budget) if budget else None
        self._requests: dict[str, Request] = {}
        # running requests with a chunk in flight -> the step it was scheduled in
        self._in_flight: dict[str, int] = {}
        self._step = 0  # the step being scheduled (start_step); 0 until an engine pipelines
        exact = config.speculative is DraftKeying.EXACT
        # per group, the tokens past a block its keys cover (HASH-DRAFT-1) and the computed
        # tokens past a block it waits for before registering it (ALLOC-COMMIT-1)
        lookahead = [config.draft_reach if exact and g.draft else 0 for g in config.groups]
        commit_delay = [config.draft_reach - 1 if g.draft else 0 for g in config.groups]
        self._tails = Tails(config, self.pool, lookahead) if unit else None  # ALLOC-UNIT-2..4
        self._keying = Keying(config, hasher(config.hash_algorithm), lookahead)
        self._planner = TablePlanner(config)
        self._commits = Registrar(config, lookahead, commit_delay)
        self._after_steps = MapsAfterSteps(self._commits)  # the maps once steps end
        self._same_pass = config.visibility is Visibility.SAME_PASS
        self._junctions = config.retention is Retention.SPARSE  # RET-JUNCTION-1 is kept
        self._published_in_step = 0  # blocks published (ALLOC-VIS-2) since the last end_step
        self._admissions = self._admitted_tokens = self._hit_tokens = self._probes = 0
        self._no_blocks: tuple[tuple[int, ...], ...] = ((),) * len(config.groups)
        self._decode_step = Scheduled(0, 1, self._no_blocks)  # immutable, so shared
        self._quiet_steps = {1: self._decode_step}  # what a quiet step of n tokens returns
        answers = (self._no_blocks, self._quiet_steps)
        self._lane = decode_lane(config, self.pool, self._commits, answers)  # or None
        self._lane_registers = self._lane is not None and registers(config, self._commits)

    # -- keys and lookup -------------------------------------------------------------------

    def prompt(self, tokens: Sequence[int], extras: Sequence[ExtraKey] = ()) -> Prompt:
        """Validate and digest a prompt for this manager, once (see `Prompt`)."""
        encoded = inputs.encoded_token_ids(tokens, "a prompt's tokens")
        keys = inputs.extra_keys(extras)
        chains = self._keying.chains(keys)
        for chain in {id(c): c for c in chains if c is not None}.values():
            chain.extend_encoded(encoded, self._memo)
        return Prompt(self, encoded, keys, chains)

    def _prepared(self, tokens: Sequence[int] | Prompt, extras: Sequence[ExtraKey]) -> Prompt:
        if not isinstance(tokens, Prompt):
            return self.prompt(tokens, extras)
        if tokens.owner is not self:
            raise RequestStateError("this Prompt was prepared by another KVCacheManager")
        if extras:
            raise RequestStateError("a Prompt carries its extras: pass none beside it")
        return tokens

    def _junction(self, prompt: Prompt, hit: int) -> int:
        """Where the prompt's longest single-group match ends, when past its hit (else 0):
        what sparse retention keeps for the next request sharing it. RET-JUNCTION-1."""
        keys = self._keying.keys(prompt.chains)
        longest = longest_single_group(self.config, len(prompt), keys, self.pool.served)
        return longest if longest > hit else 0

    def _served_after_steps(self, keys: Keys[bytes] | None = None) -> list[ServedMap[bytes]] | None:
        """The served maps once every step in flight has ended (None: they complete none, or
        with `keys` given, none of those: a search for them reads the pool's maps alone)."""
        chunks = [(r, r.computed, r.scheduled) for r in self._chunks_in_flight()]
        return self._after_steps.served(self.pool, chunks, keys)

    # -- allocation -------------------------------------------------------------------------

    def _fill(
        self, request: Request, wanted: list[Sequence[int]], kept: Sequence[Source] = ()
    ) -> tuple[tuple[int, ...], ...]:
        """Give every wanted position a new block, then each keyed state block `kept` one to
        be copied out into (ALLOC-UNIT-4); returns the new blocks per group."""
        count = wanted_count(wanted)
        if not count + len(kept):
            return self._no_blocks
        fresh = self.pool.allocate(count + len(kept))
        request.keeps = [(g, j, f) for (g, j, _), f in zip(kept, fresh[count:], strict=True)]
        added: list[tuple[int, ...]] = []
        used = 0
        for g, positions in enumerate(wanted):
            if not positions:
                added.append(())
                continue
            blocks = fresh[used : used + len(positions)]
            used += len(positions)
            added.append(tuple(blocks))
            table = request.tables[g]
            if len(table) <= positions[-1]:
                table.extend([NULL_BLOCK] * (positions[-1] + 1 - len(table)))
            if type(positions) is range:  # a run: one slice (a prompt's new blocks)
                table[positions.start : positions.stop] = blocks
            else:
                for j, block in zip(positions, blocks, strict=True):
                    table[j] = block
            request.held_from[g] = min(request.held_from[g], positions[0])
        return tuple(added)

    def admit(
        self,
        rid: str,
        tokens: Sequence[int] | Prompt,
        budget: int,
        extras: Sequence[ExtraKey] = (),
        lookahead: int = 0,
        *,
        max_hit: int | None = None,
        keep_free: int = 0,
        fit_tokens: int | None = None,
        fit_keep_free: int = 0,
        checkpoint: int = 0,
        verifies_drafts: bool = False,
    ) -> Scheduled | Waiting:
        """Look a new request up, take its hit, allocate for its first chunk.

        Implements ALLOC-TWO-PHASE-1: the hit blocks are taken before anything is allocated,
        and free hit blocks count against the capacity.

        An engine's admission policy may ask for less or more than the allocator needs:
        `max_hit` caps the hit (the largest length up to it that every group accepts, when
        the hit is longer); `keep_free` blocks must stay free after this call's allocation;
        `fit_tokens` admits only if, beside `fit_keep_free` blocks, the blocks the request
        holds at once while computing its first `fit_tokens` tokens in chunks of `budget` fit
        now (vLLM's whole-prompt admission gate; windows recycle their blocks). `checkpoint`:
        a block boundary inside the first chunk whose state the engine's kernel saves in
        passing (CKPT-INNER-1), or 0. `verifies_drafts`: the first chunk ends at the last
        known token and the engine also runs draft rows in it (vLLM pads a one-token prefill
        with them), so it is a decode chunk whose state groups hold ALLOC-SPEC-1's positions
        for those drafts' states."""
        inputs.request_id(rid)
        prompt = self._prepared(tokens, extras)
        if rid in self._requests:
            raise RequestStateError(
                f"request {rid!r} is already running; extend it, or "
                "finish/preempt it before admitting it again"
            )
        if not len(prompt):
            raise RequestStateError("a request needs at least one token")
        inputs.budget_and_lookahead(budget, lookahead)
        inputs.counts(max_hit=max_hit, keep_free=keep_free, fit_keep_free=fit_keep_free)
        limit = self.config.max_model_len
        if limit is not None and len(prompt) > limit:
            raise MaxLengthError(f"{len(prompt)} tokens exceed max_model_len={limit}")
        if prompt.extras and any(e.end is not None and e.end > len(prompt) for e in prompt.extras):
            raise RequestStateError(
                "a positioned extra (multimodal item, prompt embeddings) "
                "lies beyond the prompt; its span must be within the tokens"
            )
        hit, tables = self._hit(prompt, max_hit, spend=True)
        request = Request(prompt)
        if self._tails is not None:  # ALLOC-UNIT-3: the blocks the hit ends inside are copied
            tables, request.sources = self._tails.split(hit, tables)
        # distinct: a block is registered in one group under one key
        hits = list(filter(None, itertools.chain.from_iterable(tables)))  # NULL_BLOCK is 0
        hits += [b for _, _, b in request.sources]
        # free hit blocks (an entry of 0 or less) count against the capacity
        reviving = count_free(self.pool.ref_count, hits)
        if self._junctions:
            request.junction = self._junction(prompt, hit)
        request.computed = hit
        request.scheduled = min(budget, len(prompt) - hit)
        request.lookahead = lookahead
        request.decoding = verifies_drafts and hit + request.scheduled == len(prompt)
        if checkpoint:
            self._planner.check_checkpoint(
                hit, hit + request.scheduled, checkpoint, request.decoding, prefill=True
            )
            request.checkpoints = [checkpoint]
        request.tables = tables
        request.registered = [len(t) for t in tables]
        request.commit_at = self._commits.commit_at(request)
        request.held_from = [held_from(t) for t in tables]
        fit = (keep_free, fit_tokens, fit_keep_free)
        done = self._first_chunk(rid, request, hits, reviving, fit)
        if isinstance(done, Waiting):
            return done
        self._admissions += 1
        self._admitted_tokens += len(prompt)
        self._hit_tokens += hit
        return done

    def _first_chunk(
        self, rid: str, request: Request, hits: list[int], reviving: int, fit: _Fit
    ) -> Scheduled | Waiting:
        """An admission's first chunk once its hit is known (`hits`, not taken yet, `reviving`
        of them free; `fit`: admit's keep_free, fit_tokens, fit_keep_free): the fit checks,
        then ALLOC-TWO-PHASE-1's order; compiled where the lane serves it (decode_lane)."""
        if self._lane is not None and not request.checkpoints:
            running = (self._requests, self._in_flight, self._step)
            done = self._lane.admit(request, rid, hits, reviving, *fit, *running)
            if done is not None:
                return done
        keep_free, fit_tokens, fit_keep_free = fit
        _, wanted = self._planner.changes(request)  # a lookup table holds nothing to release
        wanted = with_targets(wanted, request.sources)
        count = wanted_count(wanted)
        free = self.pool.num_free
        if fit_tokens is not None:
            whole = self._planner.to_hold(request, fit_tokens) + fit_keep_free
            if whole > free - reviving:
                return self._waiting(whole + reviving, free, whole + len(set(hits)))
        if count + keep_free > free - reviving:
            return self._waiting(count + keep_free + reviving, free, count + len(set(hits)))
        added = self._take_then_fill(hits, request, wanted)
        self._planner.plan_quiet(request)
        self._requests[rid] = request
        self._launch(rid, request, None)
        tables_after = tuple(map(tuple, request.tables))
        return Scheduled(request.computed, request.scheduled, added, tables_after, copies(request))

    def _waiting(self, needed: int, free: int, held: int) -> Waiting:
        """Waiting, saying so when the request would hold `held` blocks at once, more than
        the pool's usable blocks: then no later step can serve it as asked."""
        usable = self.config.num_blocks - 1
        if held <= usable:
            return Waiting(needed, free)
        return Waiting(
            needed,
            free,
            f"can never fit: the request would hold {held} blocks at once and the pool has "
            f"{usable}; raise num_blocks or schedule fewer tokens per step",
        )

    @staticmethod
    def _held_after(request: Request, released: Released, added: int) -> int:
        """Blocks `request` would hold after a step that releases `released` and adds `added`."""
        held = {b for t in request.tables for b in t if b != NULL_BLOCK}
        return len(held - {block for _, _, block in released}) + added

    def blocks_to_reach(self, rid: str, tokens: int) -> int:
        """How many free blocks running request `rid` still needs to hold its first `tokens`
        tokens (beyond the known ones: lookahead slots); 0 when it holds them."""
        return self._planner.to_reach(self._running(rid), tokens)

    def is_running(self, rid: str) -> bool:
        """Whether `rid` holds blocks (admitted and not yet finished or preempted)."""
        return rid in self._requests

    def in_flight(self, rid: str) -> bool:
        """Whether running request `rid` has a chunk scheduled whose step has not ended."""
        return self._running(rid).scheduled > 0

    def rename(self, rid: str, new_rid: str) -> None:
        """Keep running request `rid`'s blocks under `new_rid`, so that `rid` can be admitted
        again while they wait for a deferred release (an engine frees a request's blocks
        only once the step that may still write them has ended)."""
        inputs.request_id(new_rid)
        request = self._running(rid)
        if new_rid in self._requests:
            raise RequestStateError(f"request {new_rid!r} is already running")
        self._requests[new_rid] = request
        del self._requests[rid]
        if rid in self._in_flight:
            self._in_flight[new_rid] = self._in_flight.pop(rid)

    def reserve(
        self, rid: str, tokens: int, chunk_end: int = 0, checkpoint: int = 0
    ) -> Scheduled | Waiting:
        """Hold slots for the first `tokens` tokens of running request `rid` while its chunk
        is in flight: lookahead beyond that chunk, allocated now (ALLOC-WRITE-1's positions),
        never shrunk. An engine that schedules the next step before the current one's output
        arrives gives that step its blocks this way, and `extend`s it once the step in flight
        has ended, with the same slots; nothing is computed or registered here. `chunk_end`:
        where the chunk so scheduled will end its computation, so that a state group holds
        the running state's position there too (its table's ALLOC-WRITE-1 position); state
        groups hold no slots for lookahead. That chunk ends within the slots held and within
        max_model_len (else RequestStateError, MaxLengthError). `checkpoint`: that chunk's
        inner checkpoint (CKPT-INNER-1; it starts where the chunks before it end), held from
        now on."""
        if self._tails is not None:
            self._tails.refuse("reserve")
        request = self._running(rid)
        inputs.token_count(tokens)
        inputs.token_count(chunk_end, "a chunk end")
        lookahead = max(request.lookahead, tokens - request.computed - request.scheduled)
        limit = self.config.max_model_len
        if limit is not None and chunk_end > limit:
            raise MaxLengthError(
                f"a chunk ending at token {chunk_end} exceeds max_model_len={limit}; "
                "schedule no token past it"
            )
        slots_end = request.computed + request.scheduled + lookahead
        if chunk_end > slots_end:
            raise RequestStateError(
                f"request {rid!r}: a chunk ending at token {chunk_end} computes tokens past "
                f"the {slots_end} it holds slots for; reserve tokens >= chunk_end"
            )
        pipelined = max(request.pipelined, chunk_end)
        start = max(request.computed + request.scheduled, request.pipelined)
        # a chunk that starts past every known token appends sampled ones: a decode chunk,
        # whose state groups hold ALLOC-SPEC-1's positions from now on
        decoding = request.decoding or (
            self._planner.drafting_states and chunk_end > start >= len(request.tokens)
        )
        if checkpoint:
            self._planner.check_checkpoint(start, chunk_end, checkpoint, decoding)
        adding = bool(checkpoint) and checkpoint not in request.checkpoints
        if decoding != request.decoding or adding:
            before = (request.decoding, list(request.checkpoints))
            request.decoding = decoding
            if adding:
                request.checkpoints.append(checkpoint)
            result = self._reserve_slow(request, lookahead, pipelined)
            if isinstance(result, Waiting):
                request.decoding, request.checkpoints = before
            return result
        if lookahead == request.lookahead and pipelined == request.pipelined:
            return Scheduled(0, 0, self._no_blocks)
        end = request.computed + request.scheduled + lookahead
        if self._planner.holds_slots(request, end, pipelined):
            # releases nothing, changes no table: the quiet bounds stand
            request.lookahead, request.pipelined = lookahead, pipelined
            return Scheduled(0, 0, self._no_blocks)
        return self._reserve_slow(request, lookahead, pipelined)

    def _reserve_slow(
        self, request: Request, lookahead: int, pipelined: int
    ) -> Scheduled | Waiting:
        """`reserve`'s allocation: release what the new slots no longer need, fill the rest."""
        before = (request.lookahead, request.pipelined)
        request.lookahead, request.pipelined = lookahead, pipelined
        released, wanted = self._planner.changes(request)
        count = wanted_count(wanted)
        if count > self.pool.num_free + self._freed_by(released):
            held = self._held_after(request, released, count)
            request.lookahead, request.pipelined = before
            return self._waiting(count, self.pool.num_free + self._freed_by(released), held)
        self._drop(request, released)
        added = self._fill(request, wanted)
        self._planner.plan_quiet(request)
        return Scheduled(0, 0, added)

    def progress_of(self, rid: str) -> Progress | None:
        """Where request `rid` stands, or None when it is not running (`is_running`,
        `in_flight` and `progress` in one question)."""
        request = self._requests.get(rid) if type(rid) is str else None
        if request is None:
            return None
        return Progress(request.computed, request.scheduled, len(request.tokens))

    def progress(self, rid: str) -> tuple[int, int]:
        """(tokens computed, tokens known) of running request `rid`."""
        request = self._running(rid)
        return request.computed + request.scheduled, len(request.tokens)

    def _take_then_fill(
        self, hits: list[int], request: Request, wanted: list[Sequence[int]]
    ) -> tuple[tuple[int, ...], ...]:
        """ALLOC-TWO-PHASE-1's order: hold the hit blocks, only then allocate."""
        self.pool.take(hits)
        return self._fill(request, wanted)

    def _running(self, rid: str) -> Request:
        request = self._requests.get(rid) if isinstance(rid, str) else None
        if request is None:
            raise UnknownRequestError(f"unknown request {rid!r}; it is not running")
        return request

    def extend(
        self,
        rid: str,
        budget: int,
        appended: Sequence[int] = (),
        lookahead: int = 0,
        *,
        step: int | None = None,
        checkpoint: int = 0,
    ) -> Scheduled | Waiting:
        """Schedule the next chunk (prefill) or token (decode, with the sampled `appended`).
        `step`: the step the chunk runs in, when it is not the one being scheduled (a chunk
        an engine scheduled while the request's previous one ran; see `reserve`).
        `checkpoint`: a block boundary inside the chunk whose state the engine's kernel
        saves in passing (CKPT-INNER-1), or 0."""
        if self._lane is not None and (  # a decode step or prompt chunk, compiled (decode_lane)
            done := self._lane.extend(
                self._requests,
                rid,
                budget,
                appended,
                lookahead,
                step,
                checkpoint,
                self._in_flight,
                self._step,
            )
        ):
            return done
        request = self._requests.get(rid) if type(rid) is str else None
        if (
            request is not None  # the decode fast path: sampled tokens that change no table
            and (computed := request.computed) == len(request.tokens)  # nothing in flight
            and type(appended) in LIST_OR_TUPLE
            and (end := computed + (count := len(appended))) <= request.quiet_end
            and request.pipelined <= request.quiet_state  # a chunk reserved may end later
            and type(budget) is int
            and 0 < count <= budget
            and type(lookahead) is int
            and (
                request.quiet_slots_floor <= end  # quiet_end bounds end + 0 from above
                if not lookahead
                else lookahead > 0
                and request.quiet_slots_floor <= end + lookahead <= request.quiet_slots
            )
            and (step is None or (type(step) is int and 0 <= step <= self._step))
            and not checkpoint
            and (
                (type(token := appended[0]) is int and 0 <= token < TOKEN_LIMIT)
                if count == 1
                else all(type(t) is int and 0 <= t < TOKEN_LIMIT for t in appended)
            )
        ):
            if count == 1:
                request.tokens.append(token)
            else:
                request.tokens.extend(appended)
            request.scheduled = count
            request.lookahead = lookahead
            request.decoding = True  # as the general path sets it; the bounds assumed it
            self._launch(rid, request, step)
            return self._decode_step if count == 1 else self._quiet_step(count)
        request = self._running(rid)
        if not (type(appended) in LIST_OR_TUPLE and (not appended or inputs.one_token(appended))):
            # one token is checked just there
            appended = inputs.token_ids(appended, "appended tokens")
        if request.scheduled:
            raise RequestStateError(f"request {rid!r} has a chunk in flight; end the step first")
        inputs.budget_and_lookahead(budget, lookahead)
        self._check_step(step)
        if appended and request.computed != len(request.tokens):
            raise RequestStateError(
                f"request {rid!r} still has prompt tokens to compute; "
                "append sampled tokens only after them"
            )
        length = len(request.tokens) + len(appended)
        limit = self.config.max_model_len
        if limit is not None and length > limit:
            raise MaxLengthError(
                f"{length} tokens exceed max_model_len={limit}; finish the request"
            )
        if request.computed >= length:
            raise RequestStateError(
                f"request {rid!r} has no token left to compute; append the sampled token"
            )
        before = (request.scheduled, request.lookahead, request.checkpoints, request.decoding)
        request.scheduled, request.lookahead, request.decoding = (
            min(budget, length - request.computed),
            lookahead,
            request.decoding or bool(appended),
        )
        if checkpoint:
            try:
                self._planner.check_checkpoint(
                    request.computed,
                    request.computed + request.scheduled,
                    checkpoint,
                    request.decoding,
                )
            except RequestStateError:
                request.scheduled, request.lookahead, _, request.decoding = before
                raise
            if checkpoint not in request.checkpoints:
                request.checkpoints = [*request.checkpoints, checkpoint]
        released, wanted = self._planner.changes(request)  # written positions are never released
        kept = self._tails.keep(request) if self._tails is not None else []  # ALLOC-UNIT-4
        count = wanted_count(wanted) + len(kept)
        freed = self._freed_by(released)
        if count > self.pool.num_free + freed:
            held = self._held_after(request, released, count)
            request.scheduled, request.lookahead, request.checkpoints, request.decoding = before
            return self._waiting(count, self.pool.num_free + freed, held)
        self._drop(request, released)
        added = self._fill(request, wanted, kept)
        if appended:
            request.tokens.extend(appended)  # digested when a block of them commits
        self._planner.plan_quiet(request)
        self._launch(rid, request, step)
        return Scheduled(0, request.scheduled, added, None, copies(request))

    def _launch(self, rid: str, request: Request, step: int | None) -> None:
        """`request`'s chunk is scheduled in `step` (None: the one being scheduled); under
        same-pass visibility the attention blocks it completes are hittable from now on."""
        self._in_flight[rid] = self._step if step is None else step
        if self._same_pass and request.computed + request.scheduled >= request.commit_at:
            self._published_in_step += self._publish(rid, request)
            if self._tails is not None:  # HIT-UNIT-5: no copy reads them before the pass
                self._tails.flying.update(self._commits.withdrawn(self.pool, request))

    def _freed_by(self, released: Released) -> int:
        """How many blocks releasing `released` returns to the free queue."""
        if not released:
            return 0
        ref = self.pool.ref_count
        return len({b for _, _, b in released if ref[b] == 1})

    def _drop(self, request: Request, released: Released) -> None:
        """Release `released` table entries mid-request (ALLOC-SKIP-1, a shrunk lookahead)."""
        if not released:
            return
        tables, held_from = request.tables, request.held_from
        for g, j, _ in released:
            tables[g][j] = NULL_BLOCK
        for g in {g for g, _, _ in released}:
            table = tables[g]
            while held_from[g] < len(table) and table[held_from[g]] == NULL_BLOCK:
                held_from[g] += 1
        self._give_back(released, cold=True)

    def _quiet_step(self, count: int) -> Scheduled:
        """What a decode step of `count` tokens that changes no table returns (shared)."""
        scheduled = self._quiet_steps.get(count)
        if scheduled is None:
            scheduled = self._quiet_steps[count] = Scheduled(0, count, self._no_blocks)
        return scheduled

    # -- steps, commit and release -----------------------------------------------------------

    def _check_step(self, step: object) -> None:
        if step is not None and (type(step) is not int or not 0 <= step <= self._step):
            raise RequestStateError(
                f"step must be a number start_step returned (0..{self._step}), got {step!r}"
            )

    def start_step(self) -> int:
        """Begin scheduling a new step while earlier ones may still run (an engine that
        schedules step N+1 before step N's output arrives); returns its number, for
        `end_step`. Chunks scheduled from now on belong to it. A synchronous engine never
        calls this: all its chunks belong to the one step `end_step()` ends."""
        self._step += 1
        return self._step

    @property
    def step(self) -> int:
        """The number of the step being scheduled (0 before any `start_step`)."""
        return self._step

    def end_step(self, step: int | None = None) -> int:
        """The step's KV is written: commit scheduled tokens, register full blocks.

        Implements ALLOC-VIS-1: nothing is registered before this call (under same-pass
        visibility the attention blocks were, when their chunks were scheduled); under `unit U`
        it then releases the blocks the ending chunks copied (ALLOC-UNIT-3). `step` (a number
        from `start_step`) ends the chunks scheduled in that step and earlier ones, and
        leaves later steps' chunks in flight; None ends every chunk in flight. Returns how
        many blocks became hittable since the last call (same-pass publications included)."""
        if self._lane is not None and self._tails is None:  # compiled (decode_lane)
            done: int | None = self._lane.end_step(self, step)
            if done is not None:
                return done
        self._check_step(step)
        registered, self._published_in_step = self._published_in_step, 0
        if self._lane is not None:  # what its launches published (same-pass)
            registered += self._lane.take_published()
        if step is None or step == self._step:  # every chunk in flight ends
            ending, self._in_flight = list(self._in_flight), {}
        else:
            ending = [rid for rid, s in self._in_flight.items() if s <= step]
            for rid in ending:
                del self._in_flight[rid]
        if self._lane is not None:  # _end_chunks, compiled (decode_lane)
            committing = self._lane.end_chunks(ending, self._requests)
        else:
            committing = self._end_chunks(ending)
        committing.sort(key=itemgetter(0))
        if self._tails is not None:  # ALLOC-UNIT-4: kept checkpoints take their tail keys
            self._give_back(self._tails.move_kept(r for _, r, _ in committing))
        for rid, request, before in committing:
            if self._tails is not None:  # ALLOC-UNIT-2, before `register` ends the checkpoints
                registered += self._tails.register(request, before)
            registered += self._register(rid, request, before)
        for _, request, _ in committing:  # copy sources: the pass that read them has run
            if request.sources:
                self._give_back(request.sources)
                request.sources = []
        if self._tails is not None and self._tails.flying:  # what is still in flight
            self._tails.land(self.pool, [self._requests[r] for r in self._in_flight])
        return registered

    def _end_chunks(self, ending: list[str]) -> list[tuple[str, Request, int]]:
        """The ending chunks' tokens count as computed; (rid, request, computed before) of
        the requests that may commit a block now (all of them under `unit U`)."""
        committing = []
        for rid in ending:
            request = self._requests.get(rid)
            if request is None:
                continue
            before = request.computed
            request.computed += request.scheduled
            request.scheduled = 0
            request.published = None
            if request.computed >= request.commit_at or self._tails is not None:  # else none
                committing.append((rid, request, before))
        return committing

    def _register(self, rid: str, request: Request, before: int) -> int:
        """Register what `request`'s step completed (commit.Registrar.register), compiled
        where the lane registers for this manager (decode_lane)."""
        if self._lane_registers and self._lane is not None:
            registered = self._lane.register(request, before)
            if registered is not None:
                return registered
        return self._commits.register(self.pool, rid, request, before)

    def _publish(self, rid: str, request: Request) -> int:
        """Publish what `request`'s chunk just scheduled completes (commit.Registrar.publish),
        compiled where the lane registers for this manager (decode_lane)."""
        if self._lane_registers and self._lane is not None:
            published = self._lane.publish(request)
            if published is not None:
                return published
        return self._commits.publish(self.pool, rid, request)

    def accept(self, rid: str, tokens: Sequence[int]) -> int:
        """`tokens` come right after running request `rid`'s known tokens, and a step that
        has ended computed them into slots the request holds (draft tokens it verified and
        accepted): they count as computed now, and the blocks they complete are registered
        (ALLOC-COMMIT-1), as if the chunk had held them. Returns how many blocks became
        hittable. Only with no chunk in flight and every known token computed."""
        if self._tails is not None:
            self._tails.refuse("accept")
        request = self._running(rid)
        checked = inputs.token_ids(tokens, "accepted tokens")
        if any(g.kind is Kind.MAMBA for g in self.config.groups):
            raise RequestStateError(
                "accept is for attention groups: a state group checkpoints only where a "
                "step's chunk ends, so accepted drafts are counted by the next step"
            )
        if request.scheduled or request.computed != len(request.tokens):
            raise RequestStateError(
                f"request {rid!r} has tokens in flight or not computed yet; accept drafts only "
                "after the step that verified them has ended"
            )
        end = request.computed + len(checked)
        limit = self.config.max_model_len
        if limit is not None and end > limit:
            raise MaxLengthError(f"{end} tokens exceed max_model_len={limit}")
        g = self._planner.lacks_slot(request, end)
        if g is not None:
            raise RequestStateError(
                f"request {rid!r} holds no slot for token {end - 1} in group {g}: "
                "accepted tokens must have been computed into the request's slots"
            )
        if not checked:
            return 0
        before = request.computed
        request.tokens.extend(checked)
        request.computed = end
        registered = self._commits.register(self.pool, rid, request, before)
        self._planner.plan_quiet(request)
        return registered

    def take_events(self) -> list[Event]:
        """What became hittable, was evicted or cleared since the last call, in order (empty
        unless `CacheConfig.record_events`)."""
        events = self.pool.events
        if not events:
            return []
        self.pool.events = []
        return events

    def _release(self, rid: str, dispatched: bool = False) -> int:
        request = self._running(rid)
        if dispatched and request.keeps:  # its pass overwrites a keyed block: not defined
            Tails.refuse("finish or preempt with dispatched=True of a chunk keeping a checkpoint")
        if request.published is not None and not dispatched:
            self._withdraw(rid, request)
        del self._requests[rid]
        self._in_flight.pop(rid, None)
        if request.sources or request.keeps:  # a chunk copying blocks: they go after its table
            held = [(g, j, b) for g, t in enumerate(request.tables)
                    for j in range(len(t) - 1, -1, -1) if (b := t[j]) != NULL_BLOCK]  # fmt: skip
            return self._give_back([*held, *request.sources, *request.keeps])
        return self.pool.release_request(self.config.groups, request.tables, request.held_from)

    def _withdraw(self, rid: str, request: Request) -> None:
        """Implements ALLOC-VIS-3: the blocks published for a chunk that will not run lose
        their keys, unless another request took one as a hit: then the release is refused."""
        blocks = self._commits.withdrawn(self.pool, request)
        sourced = self._tails.sourced(self._requests.values()) if self._tails else {}
        read = [b for b in blocks if self.pool.ref_count[b] - sourced.get(b, 0) > 1]
        if read:
            raise RequestStateError(
                f"request {rid!r} has a chunk in flight whose block {read[0]} another request "
                "took as a same-pass hit (ALLOC-VIS-2); releasing it now leaves that KV "
                "unwritten: end the step first"
            )
        for block in blocks:
            self.pool.withdraw(block)
        if self._tails is not None:
            self._tails.flying.difference_update(blocks)

    def _give_back(self, held: Released, cold: bool = False) -> int:
        """Release (group, position, block) entries in the order the eviction profile sets
        (ALLOC-FREE-1, ALLOC-FREE-2, EVICT-ORDER-1); `cold`: released mid-request."""
        pool, freed = self.pool, 0
        for batch in pool.queue.release_batches(self.config.groups, held):
            freed += pool.release(batch, cold)
        return freed

    def finish(self, rid: str, *, dispatched: bool = False) -> int:
        """Release a finished or aborted request; returns how many blocks became free.
        `dispatched`: its chunk in flight was handed to the executor and runs whatever
        happens now (an engine that schedules step N+1 while step N runs), so the blocks it
        published under same-pass visibility keep their keys (ALLOC-VIS-3 withdraws only a
        chunk that will not run)."""
        return self._release(rid, dispatched)

    def preempt(self, rid: str, *, dispatched: bool = False) -> int:
        """Release a preempted request, which may be admitted again (`dispatched`: see `finish`)."""
        return self._release(rid, dispatched)

    def reset_prefix_cache(self) -> bool:
        """Forget every key; refused (False) while any request holds blocks (ALLOC-RESET-1)."""
        if self._requests:
            return False
        self.pool.reset()
        return True

    # -- counters -----------------------------------------------------------------------

    def stats(self) -> Stats:
        """Pool and hit counters."""
        return Stats(
            self.config.num_blocks,
            self.pool.num_free,
            self.pool.num_registered,
            len(self._requests),
            self._admissions,
            self._admitted_tokens,
            self._hit_tokens,
            self._probes,
        )
