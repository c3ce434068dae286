"""vLLM 0.33.0's KVCacheManager interface, backed by kvcert.reference.

What differs from vLLM's own manager, on purpose (kvcert's rules):
- Blocks become hittable when the step that writes them has run (ALLOC-VIS-1, ALLOC-COMMIT-1):
  the scheduler calls `end_step()` when the model's output for the step arrives
  (`kvcert.reference.vllm.Scheduler` does; a manager driven alone, as vLLM's synchronous
  scheduler drives its own, at `new_step_starts`), not at allocation. `cache_blocks` is a
  no-op; vLLM's manager registers blocks before their KV exists. With same-pass visibility
  (kvcert's scheduler picks it under vLLM's fcfs policy, `Settings.for_policy`) attention
  blocks serve hits from their chunk's scheduling on, as vLLM's do, and state checkpoints
  still wait for the step's output (ALLOC-VIS-2).
- Hits follow the hybrid hit (HIT-HYB-1) and the eviction profile of `Settings`.
- A waiting request whose hit the steps in flight are extending may wait a step instead of
  being admitted without those blocks (`Settings.hold_back`; vLLM does so for state groups).

Block ids are indices into vLLM's KV tensors: the same `num_blocks`, block 0 the null block, group
i's table is vLLM's group i. Unsupported here (each refused with a typed error): KV connectors
(external tokens, delayed caching, evicting by id), encoder-decoder models, decode/prefill context
parallelism, state (Mamba/GDN) groups outside vLLM's align cache mode
(`kvcert.reference.vllm.layout`), hits inside blocks (`--prefix-match-unit`, or vLLM's own choice)
where the spec's `unit U` is not defined (ALLOC-UNIT-1). KV events name blocks as they become
hittable.

Asynchronous scheduling (step N+1 scheduled before step N's output arrives): the scheduler numbers
its steps (`start_step`) and ends them one by one (`end_step(step)`), so a step's output registers
only what that step wrote. A request scheduled in step N+1 while its step-N chunk runs gets its
blocks at once (the allocator's `reserve`: slots, nothing computed); that chunk becomes the
allocator's chunk in flight once step N has ended and its sampled token is known (`start_pending`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import RequestStatus

from kvcert.reference.config import Kind
from kvcert.reference.manager import KVCacheManager as Core
from kvcert.reference.manager import Progress, Prompt, Scheduled, Waiting
from kvcert.reference.vllm.blocks import PoolBlock
from kvcert.reference.vllm.checkpoints import RunnerCheckpoints
from kvcert.reference.vllm.events import UNNAMED, Announcer, Publishing
from kvcert.reference.vllm.extras import request_extras, token_view
from kvcert.reference.vllm.hasher import RequestHasher, attached_prompt
from kvcert.reference.vllm.lane import install
from kvcert.reference.vllm.layout import (
    IntegrationError,
    UnsupportedConfigError,
    cache_config,
    refuse_unsupported,
    retention_profile,
    state_spec_types,
    unit_config,
)
from kvcert.reference.vllm.parts import HashView, PoolView, coordinator_view
from kvcert.reference.vllm.settings import HoldBack, Settings
from kvcert.reference.vllm.tables import BlockTableViews


@dataclass(slots=True)  # slots: the compiled decode calls read them directly
class _Tracked:
    """What the facade keeps per request beside the allocator's record of it."""

    prompt: Prompt | None = None  # a lookup's digests, for the admission that follows
    # per group, the table lengths vLLM's worker holds, and the slots keeping them whole
    seen: list[int] = field(default_factory=list)
    keep: int = 0
    # chunks scheduled while its chunk is in flight (asynchronous scheduling), oldest
    # first: vLLM's token count at the end of each, the slots it holds, the step it runs
    # in and its inner checkpoint (or 0)
    pending: deque[tuple[int, int, int, int]] = field(default_factory=deque)
    publishing: Publishing | None = None  # what its BlockStored events name (with events on)
    inner: int = 0  # the inner checkpoint its latest chunk reserves (0: none)


class KVCacheManager(BlockTableViews):
    """vLLM 0.33.0's KVCacheManager, served by kvcert's reference allocator."""

    # read by the compiled decode calls on every chunk (reference/_decodelane_dropin.c), which
    # read a slot without the instance dict's lookup; every other attribute lives in __dict__
    __slots__ = ("core",)

    def __init__(  # noqa: PLR0917 - vLLM's signature, positional arguments included
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        settings: Settings | None = None,
        *,
        prefix_match_unit: int | None = None,
    ) -> None:
        del max_in_flight_tokens  # vLLM's own sizing
        refuse_unsupported(
            shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            metrics_collector=metrics_collector,
        )
        self.settings = Settings.from_env() if settings is None else settings
        self.hash_block_size = hash_block_size  # read back by the scheduler (block_pool)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.enable_kv_cache_events = enable_kv_cache_events
        self.mamba_shared_prefix_checkpoint = False
        drafting = use_eagle or num_hash_lookahead_tokens > 0  # vLLM runs a drafter
        # tokens a drafter's KV reads ahead (k MTP modules: k), as far as vLLM's hashes reach
        reach = max(1, num_prefill_lookahead, num_hash_lookahead_tokens)
        config = cache_config(kv_cache_config, max_model_len, drafting, self.settings, reach)
        config = dataclasses.replace(config, record_events=enable_kv_cache_events)
        groups = kv_cache_config.kv_cache_groups
        # kept for set_retention_interval, which rebuilds the profile under another retention
        self._unit_request = (prefix_match_unit, hash_block_size, groups)
        self.core = Core(unit_config(config, *self._unit_request))
        self.num_kv_cache_groups = len(groups)
        self.blocks = [PoolBlock(self, i) for i in range(kv_cache_config.num_blocks)]
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))
        self.coordinator = coordinator_view(self, groups)
        self.block_pool = PoolView(self)
        self._zeroed = bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False))
        self._new_ids: list[int] = []  # attention blocks handed out, for the worker to zero
        self._tracked: dict[str, _Tracked] = {}  # one record per request vLLM asked about
        # per group, the block size of an attention group (whose table the slots bound),
        # else 0: a state group's table follows its chunks' ends, never the slots
        self._slot_sizes = [
            0 if g.kind is Kind.MAMBA else g.block_size for g in self.core.config.groups
        ]
        self._has_state = any(g.kind is Kind.MAMBA for g in self.core.config.groups)
        # the block size of the state groups when each keeps blocks for drafts' states (the
        # runner then copies the state at a boundary accepted drafts cross), else 0
        self._state_groups = [
            (g, group)
            for g, group in enumerate(self.core.config.groups)
            if group.kind is Kind.MAMBA
        ]
        # per state group (index, block size, blocks kept for drafts' states), read every
        # step by _check_runner_columns
        self._state_columns = tuple(
            (g, group.block_size, group.speculative_blocks) for g, group in self._state_groups
        )
        sizes = {group.block_size for _, group in self._state_groups}
        spare = all(group.speculative_blocks for _, group in self._state_groups)
        self._draft_state_block = sizes.pop() if spare and len(sizes) == 1 else 0
        self._runner_checkpoints = RunnerCheckpoints.of(
            kv_cache_config,
            hash_block_size=hash_block_size,
            scheduler_block_size=scheduler_block_size,
            drop_eagle_block=use_eagle,
            hash_lookahead_tokens=num_hash_lookahead_tokens,
            state_types=state_spec_types(),
        )
        hold = self.settings.hold_back
        self._hold_back = hold is HoldBack.ALL or (hold is HoldBack.STATE and self._has_state)
        self._popped: dict[int, str] = {}  # a block handed out by pop_blocks_for_free -> owner
        self._events: list[Any] = []  # vLLM's KV events, converted as the allocator's happen
        self._announcer = Announcer(hash_block_size, num_hash_lookahead_tokens)
        self._copies: list[tuple[int, int, int]] = []  # `unit U`: this step's block copies
        # what vLLM's block hashes name, with settings.vllm_hash_view on (get_cached_block)
        self.hash_view = HashView(hash_block_size) if self.settings.vllm_hash_view else None
        install(self, KVCacheManager)  # decode chunks' calls, compiled where they are served

    def set_retention_interval(self, interval: int | None) -> None:
        """Change the retention profile as vLLM reads an interval (`retention_profile`; None
        dense, 0 sparse), before the first request: a cache built under one profile keeps
        blocks another would have released, so it is refused once anything ran or is held."""
        core = self.core
        stats = core.stats()
        if self._tracked or core.step or stats.admissions or stats.probes:
            raise IntegrationError(
                "the retention interval is fixed once requests have been looked up or "
                "admitted; set it before the first request (--prefix-cache-retention-interval)"
            )
        profile = retention_profile(interval, core.config.groups, None)
        config = dataclasses.replace(core.config, hit_unit=None, **profile)
        try:  # what --prefix-match-unit cannot serve is refused (ALLOC-UNIT-1)
            self.core = Core(unit_config(config, *self._unit_request))
        except UnsupportedConfigError as why:
            raise UnsupportedConfigError(f"retention interval {interval}: {why}") from why
        install(self, KVCacheManager)

    def reserved_inner_checkpoint(self, rid: str) -> int:
        """The inner checkpoint (CKPT-INNER-1) request `rid`'s latest chunk reserves, while
        that chunk is scheduled and not yet ended; 0 for none."""
        tracked = self._tracked.get(rid)
        if tracked is None or not tracked.inner or not self.core.is_running(rid):
            return 0
        pending = [checkpoint for *_, checkpoint in tracked.pending]
        held = (*self.core.scheduled_checkpoints(rid), *pending)
        return tracked.inner if tracked.inner in held else 0

    # -- stats ------------------------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> Any:
        """This interval's prefix-cache stats (None when stats are off); starts a new one."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    # -- lookup -----------------------------------------------------------------------------

    def _record(self, rid: str) -> _Tracked:
        """The facade's record of `rid`, made on first use (not built per call to be
        dropped, as a `setdefault` argument would be)."""
        tracked = self._tracked.get(rid)
        if tracked is None:
            tracked = self._tracked[rid] = _Tracked()
        return tracked

    def _prompt(self, request: Any) -> Prompt:
        """The request's tokens digested once per admission (lookup, then allocation)."""
        tracked = self._record(request.request_id)
        if tracked.prompt is not None and len(tracked.prompt) == request.num_tokens:
            return tracked.prompt
        # digested as vLLM built the request (`request_hasher`), else from vLLM's view of
        # the tokens now: `prompt` packs its own copy
        tracked.prompt = attached_prompt(request, self.core) or self.core.prompt(
            token_view(request), request_extras(request)
        )
        return tracked.prompt

    def request_hasher(self, vllm_hasher: Any) -> RequestHasher:
        """The block hasher vLLM's engine should build requests with (kvcert's scheduler has
        it swapped in): it digests a prompt as it arrives, outside the scheduler's step."""
        return RequestHasher(self, vllm_hasher)

    def get_computed_blocks(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int]:
        """The request's hit now (HIT-HYB-1), at most `max_cache_hit_length` tokens (default:
        all but the last token, which must be computed for its logits), and for a model with
        state groups its junction: where its attention groups' cached prefix ends (BRANCH-1),
        counting what the steps in flight are writing, when that lies past the hit, else 0.
        vLLM's scheduler ends a prefill chunk there, so the state where this request leaves a
        shared prefix is checkpointed for the next one (CKPT-BRANCH-1), as it does with
        vLLM's manager."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        cap = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        prompt = self._prompt(request)
        hit, tables = self.core.lookup(prompt, max_hit=max(cap, 0))
        junction = self.core.branch_point(prompt, after_steps=True) if self._has_state else 0
        blocks = self._wrap(tables) if hit else self.empty_kv_cache_blocks
        return blocks, hit, junction if junction > hit else 0

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        raise UnsupportedConfigError("the kvcert manager does not support KV connectors")

    def estimate_cached_tokens(self, request: Any) -> int:
        """How many of the request's tokens have their KV computed (its hittable prefix once
        the step ends)."""
        progress = self.core.progress_of(request.request_id)
        return 0 if progress is None else progress.computed + progress.scheduled

    # -- allocation -------------------------------------------------------------------------

    def allocate_slots(  # noqa: PLR0917 - vLLM's signature, positional arguments included
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """Admit (a new or preempted request) or extend (a running one); None when the blocks
        do not fit. vLLM counts draft tokens in `num_new_tokens`; kvcert computes only known
        tokens and holds slots for the drafts as lookahead."""
        del new_computed_blocks, skip_zeroing_group_ids  # the hit is re-derived and checked
        if self.hash_view is not None:
            self.hash_view.remember(request, self)
        if num_external_computed_tokens or delay_cache_blocks:
            raise UnsupportedConfigError("the kvcert manager does not support KV connectors")
        if num_encoder_tokens:
            raise UnsupportedConfigError("the kvcert manager does not serve encoder-decoder models")
        progress = self.core.progress_of(request.request_id)
        if progress is None:
            return self._admit(
                request,
                num_new_tokens=num_new_tokens,
                hit=num_new_computed_tokens,
                lookahead=num_lookahead_tokens,
                must_fit=full_sequence_must_fit,
                reserved=reserved_blocks,
                others_scheduled=has_scheduled_reqs,
            )
        return self._extend(request, progress, num_new_tokens, num_lookahead_tokens)

    def _admit(
        self,
        request: Any,
        *,
        num_new_tokens: int,
        hit: int,
        lookahead: int,
        must_fit: bool,
        reserved: int,
        others_scheduled: bool,
    ) -> Any:
        rid = request.request_id
        prompt = self._prompt(request)
        known = len(prompt)
        budget = min(num_new_tokens, known - hit)
        waiting = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        if waiting and self._held_back(request, prompt, hit):
            return None
        watermark = self.watermark_blocks if others_scheduled and waiting else 0
        checkpoint = self._checkpoint(request, hit, hit + num_new_tokens, hit + budget)
        self._tracked[rid].inner = checkpoint
        result = self.core.admit(
            rid,
            prompt,
            max(budget, 1),
            lookahead=lookahead + num_new_tokens - budget,
            max_hit=hit if self.enable_caching else 0,
            keep_free=reserved + watermark,
            fit_tokens=min(known, self.max_model_len) if must_fit else None,
            fit_keep_free=watermark,
            checkpoint=checkpoint,
            # vLLM pads a prefill that reaches the last token with draft rows, whose states
            # its runner puts after the running state's (ALLOC-SPEC-1)
            verifies_drafts=num_new_tokens > budget,
        )
        if not isinstance(result, Scheduled):
            self.pending_events()  # evictions an admission that did not fit never made
            return None
        tracked = self._tracked[rid]
        tracked.prompt = None
        if self.enable_kv_cache_events:
            lora = getattr(request, "lora_request", None)
            tracked.publishing = Publishing(
                lora.adapter_id if lora else None,
                lora.name if lora else None,
                getattr(request, "session_id", None),
                request,
            )
        if result.hit != hit:
            self.core.preempt(rid)
            raise IntegrationError(
                f"request {rid!r}: the scheduler adopted a {hit}-token hit, the cache serves "
                f"{result.hit} tokens now; look the request up again before allocating"
            )
        tables = result.tables or ()
        self._copies += result.copies  # `unit U`: the blocks a hit ends inside
        self._check_runner_columns(request, hit, hit + num_new_tokens, checkpoint)
        self._saw(rid, [len(t) for t in tables])
        self._note_new(result)
        start = [len(t) - len(n) for t, n in zip(tables, result.new_blocks, strict=True)]
        return self._wrap(
            [t[s:] for t, s in zip(tables, start, strict=True)] if any(result.new_blocks) else ()
        )

    def _held_back(self, request: Any, prompt: Prompt, hit: int) -> bool:
        """Whether the request waits a step (Settings.hold_back): it takes the whole hit the
        cache serves now, and the steps in flight complete a longer one for it. vLLM's
        scheduler then stops admitting for this step, as it does when its own manager holds a
        state group's request back; the request is admitted once those steps have ended."""
        if not (self._hold_back and self.prefix_cache_lookup_enabled(request)):
            return False
        cap = max(request.num_tokens - 1, 0)
        now = self.core.hit_length(prompt, max_hit=cap)
        return hit == now and self.core.lookup_after_steps(prompt, max_hit=cap) > now

    def _extend(self, request: Any, progress: Progress, num_new_tokens: int, lookahead: int) -> Any:
        rid = request.request_id
        tracked = self._tracked[rid]
        end = request.num_computed_tokens + num_new_tokens  # vLLM's, draft tokens included
        slots = min(max(end + lookahead, tracked.keep), self.max_model_len)
        self._check_no_rewind(request, progress)
        if progress.scheduled and not self.core.step:  # unnumbered: see new_step_starts
            self.end_step()
            progress = self._progress(rid)
        if progress.scheduled or tracked.pending:  # a chunk in flight, or one behind it
            return self._schedule_pending(request, end, slots)
        computed, known = progress.computed, progress.known
        real_end = min(end, request.num_tokens)
        # the tokens this step computes that kvcert has not seen (sampled or accepted ones)
        appended = list(request.all_token_ids[known:real_end]) if real_end > known else []
        budget = real_end - computed
        if budget < 1:  # only draft (or diffusion canvas) positions: slots, nothing computed
            tracked.inner = 0
            return self._handed_out(rid, self.core.reserve(rid, slots))
        start = request.num_computed_tokens
        tracked.inner = self._checkpoint(request, start, end, real_end)
        checkpoint = tracked.inner or self._crossed(computed, real_end, appended)
        result = self.core.extend(
            rid, budget, appended, max(slots - real_end, 0), checkpoint=checkpoint
        )
        if isinstance(result, Scheduled):
            self._check_runner_columns(request, start, end, checkpoint)
        return self._handed_out(rid, result)

    def _crossed(self, computed: int, end: int, appended: Sequence[int]) -> int:
        """ALLOC-SPEC-2: for a decode chunk [computed, end) holding drafts the last step
        accepted, the block boundary they crossed, whose state vLLM's runner copied into that
        boundary's block when it verified them (`postprocess_mamba`), as the reference's
        `checkpoint=`; 0 when they crossed none (or the state groups keep no draft blocks)."""
        size = self._draft_state_block
        if not (size and appended) or end - computed < 2:
            return 0
        boundary = (end - 1) // size * size
        return boundary if boundary > computed else 0

    def _checkpoint(self, request: Any, start: int, end: int, real_end: int) -> int:
        """The inner checkpoint of vLLM's chunk [start, end) (`kvcert.reference.vllm.
        checkpoints`), if kvcert computes that position in it (its chunk ends at real_end)."""
        if self._runner_checkpoints is None:
            return 0
        unit, kept = self.core.config.hit_unit, self.coordinator.retention_interval
        position = self._runner_checkpoints.checkpoint(request, start, end, unit, kept)
        return position if start < position < real_end else 0

    def _check_runner_columns(self, request: Any, start: int, end: int, checkpoint: int) -> None:
        """Where the runner will put state for the chunk [start, end) (vLLM's count, drafts
        included), kvcert's table holds a block of the request's own: the running state's
        and each scheduled draft's (ALLOC-SPEC-1), and at a prefill checkpoint's column the
        checkpoint block, the null block (the runner then skips) or a draft's scratch block
        (rewritten before it is ever registered); never a block that holds another
        position's state. A violation is a bug here, raised, never served."""
        rid = request.request_id
        if not self._has_state:
            return
        drafts = 0  # those vLLM schedules: what the chunk holds past known and in-flight tokens
        if any(kept for _, _, kept in self._state_columns):
            placeholders = getattr(request, "num_output_placeholders", 0) or 0
            drafts = max(0, end - request.num_tokens - placeholders)
        columns = [  # per state group, the running state's column and the drafts' kept
            (g, -(-end // size) - 1, min(drafts, kept)) for g, size, kept in self._state_columns
        ]
        lacking = self.core.first_unheld(rid, [(g, at, at + kept + 1) for g, at, kept in columns])
        if lacking is not None:
            _, running, kept = columns[lacking]
            raise IntegrationError(
                f"request {rid!r}: vLLM's runner puts the state of the chunk [{start}, "
                f"{end}) and of {kept} of its drafts in table columns {running}.."
                f"{running + kept}, where kvcert's table holds the null block"
            )
        if self._runner_checkpoints is None:
            return
        saved = self._runner_checkpoints.written(start, end)
        for (g, group), (position, column) in zip(self._state_groups, saved, strict=True):
            if column < 0:  # the runner saves nothing in this chunk
                continue
            block = self.core.block_at(rid, g, column)
            scratch = group.speculative_blocks and self.core.pool.key_of(block) is None
            if position and block and position != checkpoint and not scratch:
                raise IntegrationError(
                    f"request {rid!r}: vLLM's runner will save the state after {position} "
                    f"tokens into block {block} (table column {column}), which kvcert holds "
                    "for another position"
                )

    def _check_no_rewind(self, request: Any, progress: Progress) -> None:
        """vLLM must not resume a running request below the tokens the allocator computed or
        has in flight: their KV cannot be taken back (their blocks may be registered). Pending
        chunks are only slots: vLLM's count may fall below their ends (rejected drafts)."""
        rid = request.request_id
        scheduled = progress.computed + progress.scheduled
        if request.num_computed_tokens < scheduled:
            raise UnsupportedConfigError(
                f"request {rid!r} resumes at token {request.num_computed_tokens}, but steps "
                f"already computed or are computing its tokens up to {scheduled}: vLLM "
                "discarded tokens a step in flight computed (a streaming-input session resumed "
                "under asynchronous scheduling); the kvcert manager never takes computed KV "
                "back: run vLLM with --no-async-scheduling"
            )

    def _schedule_pending(self, request: Any, end: int, slots: int) -> Any:
        """A chunk of a request whose previous chunk is still in flight: its blocks now, its
        computation once the steps before it have ended (`start_pending`)."""
        rid, start = request.request_id, request.num_computed_tokens
        checkpoint = self._checkpoint(request, start, end, min(end, request.num_tokens))
        self._tracked[rid].inner = checkpoint
        result = self.core.reserve(rid, slots, chunk_end=end, checkpoint=checkpoint)
        if not isinstance(result, Scheduled):
            return None
        self._check_runner_columns(request, start, end, checkpoint)
        self._tracked[rid].pending.append((end, slots, self.core.step, checkpoint))
        return self._handed_out(rid, result)

    def start_pending(self, requests: Mapping[str, Any]) -> None:
        """A step has ended and its sampled tokens are appended to vLLM's `requests`: each
        request with no chunk in flight now starts its oldest pending chunk, to be registered
        when the step it runs in ends. Its tokens are known: the step before it sampled them."""
        ready = [
            (rid, tracked.pending, self._progress(rid))
            for rid, tracked in self._tracked.items()
            if tracked.pending
        ]
        for rid, chunks, progress in ready:
            if not progress.scheduled:  # else its chunk in flight runs in a later step
                self._start_chunk(rid, chunks, progress, requests.get(rid))

    def _start_chunk(
        self, rid: str, chunks: deque[tuple[int, int, int, int]], progress: Progress, request: Any
    ) -> None:
        """start_pending's chunk of `rid` (`request`: vLLM's, or None once it is not)."""
        end, slots, step, checkpoint = chunks.popleft()
        if chunks:  # keep the slots reserved for the later chunks (they only grow)
            slots = chunks[-1][1]
        if request is None:
            return  # not vLLM's request any more: free() releases its blocks
        computed, known = progress.computed, progress.known
        real_end = min(end, request.num_tokens)
        if real_end <= computed:
            return  # nothing left to compute (vLLM stopped the request); slots stay held
        appended = list(request.all_token_ids[known:real_end]) if real_end > known else []
        result = self.core.extend(
            rid,
            real_end - computed,
            appended,
            max(slots - real_end, 0),
            step=step,
            checkpoint=(checkpoint if computed < checkpoint < real_end else 0)
            or self._crossed(computed, real_end, appended),
        )
        self._check_started(rid, result)

    def _check_started(self, rid: str, result: Scheduled | Waiting) -> None:
        """A queued chunk's slots were reserved when it was scheduled: it takes no block."""
        if not isinstance(result, Scheduled) or any(result.new_blocks):
            raise IntegrationError(
                f"request {rid!r}: the chunk scheduled while its previous step ran did "
                f"not find the blocks reserved for it ({result})"
            )

    def _progress(self, rid: str) -> Progress:
        """Where a request the facade tracks as running stands in the allocator."""
        progress = self.core.progress_of(rid)
        if progress is None:
            raise IntegrationError(f"request {rid!r} has chunks pending but holds no blocks")
        return progress

    def _handed_out(self, rid: str, result: Any) -> Any:
        """What vLLM's allocate_slots returns for an extension: the new blocks per group,
        appended to the tables the worker holds; None when they did not fit."""
        if not isinstance(result, Scheduled):
            return None
        self._copies += result.copies  # `unit U`: run before the pass, new blocks or not
        if not any(result.new_blocks):
            return self.empty_kv_cache_blocks
        self._note_new(result)
        seen = self._tracked[rid].seen
        tails, lengths = self.core.table_tails(rid, seen)
        if sum(map(len, result.new_blocks)) != sum(len(t) - t.count(0) for t in tails):
            raise IntegrationError(  # never hand vLLM's worker a table it cannot append
                f"request {rid!r}: a new block landed inside the table vLLM's worker holds"
            )
        self._saw(rid, lengths)
        return self._wrap(tails)

    def _saw(self, rid: str, lengths: Sequence[int]) -> None:
        """Record the table lengths vLLM's worker now holds, and the slots that keep every
        attention table's last block. Never releasing one matters: the worker only appends
        to a block table, so a released tail position could not be handed a block again; an
        attention group keeps its last block while the slots reach past (len - 1) *
        block_size. A state group's table only grows with its chunks' ends (ALLOC-SPEC-1's
        positions included), whatever the slots: counting it would hold attention blocks for
        slots no draft reaches."""
        sizes = zip(lengths, self._slot_sizes, strict=True)
        keep = max(((n - 1) * size + 1 for n, size in sizes if n and size), default=0)
        tracked = self._record(rid)
        tracked.seen, tracked.keep = list(lengths), keep

    def _note_new(self, result: Scheduled) -> None:
        if self._zeroed:
            for group, new in zip(self.core.config.groups, result.new_blocks, strict=True):
                if group.kind is not Kind.MAMBA:
                    self._new_ids.extend(new)

    def start_step(self) -> int:
        """The scheduler begins a step, maybe before earlier ones have ended (asynchronous
        scheduling); returns its number for `end_step`."""
        return self.core.start_step()

    def end_step(self, step: int | None = None) -> int:
        """Step `step`'s KV is written (None: every step scheduled so far): register the
        full blocks it and earlier steps wrote (ALLOC-COMMIT-1), never a later step's.
        Returns how many blocks became hittable."""
        registered = self.core.end_step(step)
        if self.enable_kv_cache_events:  # converted while the requests' details are known
            self.pending_events()
        return registered

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """No-op: blocks are registered by `end_step`, once their KV is written."""

    def new_step_starts(self) -> None:
        """vLLM's scheduler begins a step. Under kvcert's schedulers (which number steps,
        `start_step`) steps end in `end_step`, when their output arrives. A manager nobody
        numbers steps for is driven as vLLM's synchronous scheduler drives its own: a step
        starts once the last one's output has been read, so every step so far has ended (as
        when such a manager is asked to extend a request whose chunk it holds in flight: a
        synchronous scheduler schedules a request once per step)."""
        if self.core.step == 0:
            self.end_step()

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """No-op: kvcert releases what no later token reads as it allocates (ALLOC-SKIP-1)."""

    # -- release ----------------------------------------------------------------------------

    def _forget(self, rid: str) -> None:
        self.pending_events()  # while the request's publishing details are known
        self._tracked.pop(rid, None)

    def free(self, request: Any) -> None:
        """Release a finished, aborted or preempted request (nothing when it holds nothing),
        after registering the blocks its verified drafts completed."""
        rid = request.request_id
        progress = self.core.progress_of(rid)
        running = getattr(request, "status", None) is RequestStatus.RUNNING  # a preemption
        if progress is not None and progress.scheduled and not self.core.step and not running:
            # unnumbered (see new_step_starts): a synchronous scheduler finishes a request
            # with a chunk in flight once that chunk's output has arrived, or aborts it
            # between steps, so every step so far has ended (it preempts one still RUNNING)
            self.end_step()
            progress = self.core.progress_of(rid)
        if progress is not None:
            self._accept_verified(request, progress)
        self._forget(rid)
        if progress is not None:
            # vLLM's fcfs policy (same-pass visibility needs it) never releases a chunk of the
            # step being scheduled, so a chunk in flight was handed to the executor: it runs
            self.core.finish(rid, dispatched=True)

    def _accept_verified(self, request: Any, progress: Progress) -> None:
        """Draft tokens the last step verified and accepted count as computed (the allocator
        counted only the tokens known when the step was scheduled), so a request released
        now leaves the blocks they complete hittable. Not for a state hybrid: its state
        groups checkpoint only where a chunk ends, and no chunk ended after those drafts."""
        rid = request.request_id
        if self._has_state:  # a state group keeps no state for them (the reference refuses)
            return
        tracked = self._tracked.get(rid)
        if progress.scheduled or (tracked is not None and tracked.pending):
            return  # a step still runs for it: its output decides
        computed, known = progress.computed, progress.known
        end = min(request.num_computed_tokens, request.num_tokens)
        if computed == known < end:
            self.core.accept(rid, list(request.all_token_ids[computed:end]))

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        """Hand out the request's blocks for a deferred release through
        `block_pool.free_blocks`; until then they stay held."""
        rid = request.request_id
        tracked = self._tracked.get(rid)
        publishing = None if tracked is None else tracked.publishing
        self._forget(rid)
        if not self.core.is_running(rid):
            return []
        ids = {b for t in self.core.block_tables(rid) for b in t if b}
        if not ids:
            self.core.finish(rid)
            return []
        parked = f"\x00popped:{rid}"  # no request id vLLM makes holds a NUL
        self.core.rename(rid, parked)
        if publishing is not None:  # its chunk in flight may still register blocks
            self._tracked[parked] = _Tracked(publishing=publishing)
        for b in ids:
            self._popped[b] = parked
        return [self.blocks[b] for b in sorted(ids)]

    def release_popped(self, block_ids: Iterable[int]) -> None:
        owners = {self._popped.get(b) for b in block_ids}
        if None in owners:
            raise IntegrationError(
                "block_pool.free_blocks got a block pop_blocks_for_free did not hand out; "
                "the kvcert manager releases requests with free()"
            )
        for owner in owners:
            for b in [b for b, o in self._popped.items() if o == owner]:
                del self._popped[b]
            if owner is not None and self.core.is_running(owner):
                self.core.finish(owner, dispatched=True)
                self._forget(owner)

    def evict_blocks(self, block_ids: set[int]) -> None:
        raise UnsupportedConfigError("the kvcert manager does not support KV connectors")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while a request holds blocks."""
        if not self.core.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    # -- what the worker is told ------------------------------------------------------------

    def take_events(self) -> list[Any]:
        """vLLM's KV events since the last call: BlockStored when a block becomes hittable
        (the end of the step that wrote it), BlockRemoved when one is evicted,
        AllBlocksCleared on a reset, naming vLLM's own block hashes (`events.Announcer`)."""
        events = self.pending_events() if self.enable_kv_cache_events else self._events
        if not events:
            return []
        self._events = []
        return events

    def pending_events(self) -> list[Any]:
        """The KV events not taken yet (vLLM's `kv_event_queue`), the allocator's since the
        last call converted first."""
        if self.enable_kv_cache_events:
            groups, now = self.kv_cache_config.kv_cache_groups, self.core.take_events()
            self._events += self._announcer.convert(now, self._publishing_of, groups)
        return self._events

    def _publishing_of(self, rid: str) -> Publishing:
        tracked = self._tracked.get(rid)
        return UNNAMED if tracked is None or tracked.publishing is None else tracked.publishing

    def take_new_block_ids(self) -> list[int]:
        """Attention blocks handed out since the last call, for the worker to zero."""
        ids, self._new_ids = self._new_ids, []
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        if not self._zeroed or not self.core.is_running(request_id):
            return
        for table, group in zip(
            self.core.block_tables(request_id), self.core.config.groups, strict=True
        ):
            if group.kind is not Kind.MAMBA:  # vLLM zeroes attention blocks only
                self._new_ids.extend(b for b in table[start_token // group.block_size :] if b)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        """The copies this step's chunks need before the pass (`unit U`: ALLOC-UNIT-3/4),
        as vLLM's (source, target) pairs; no block to retain: the allocator holds each
        source until the step ends."""
        copies = self._copies
        if not copies:  # every step but those admitting a hit inside a block
            return [], []
        self._copies = []
        return [KVCacheBlockCopy(src_block_id=s, dst_block_id=t) for _, s, t in copies], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}  # state offloads feed KV connectors, which this manager does not serve

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return []  # partial-tail offloads feed KV connectors, which this manager does not serve
