"""Play a workload through vLLM's real scheduler, with a ledger for a model runner.

Runs inside a vLLM release venv (`scripts/engine-venv.sh vllm VERSION`). Everything the
scheduler sees is what a served model gives it: the KV-cache groups come from vLLM's own
planner (`get_kv_cache_groups`, `get_kv_cache_config_from_groups`) applied to the bundled
model's per-layer specs, the scheduler class from `SchedulerConfig.get_scheduler_cls()` (the
AsyncScheduler when `async_scheduling` is on), block sizes from
`resolve_kv_cache_block_sizes` (for a Mamba/GDN hybrid, `--mamba-cache-mode align` and the
attention block vLLM's platform picks so that its page holds one state:
`workload.state_block_size`), and request hashes from `get_request_block_hasher`, as
EngineCore wires them. Only the pool is made small, so the scheduler has to preempt.

The model runner is a ledger: each forward pass writes, for every scheduled position and
every group, the identity of the KV it computes (a digest of the request's tokens up to that
position) into the slot the group's block table names. Before writing, it checks what the
pass reads: the positions below the chunk that each group's attention needs (all of them for
full attention, the last `window - 1` for a sliding window, the current chunk's earlier
tokens for chunked local attention) must hold KV computed from the same token prefix. A
position that does not is a soundness violation: the engine told the request that KV exists
which no forward pass wrote for it.

A Mamba/GDN group (a state hybrid in prefix-caching align mode) holds no KV per position but
one running state per request, in one block, as vLLM's runner keeps it (`preprocess_mamba`):

    before a pass   the state moves from the block the runner left it in (for a request
                    sent to it whole: the block of its last computed token, i.e. the hit's
                    checkpoint) to block cdiv(end, B) - 1, all copies reading before any write
    the pass        reads that state, which must be the state after position start - 1 of
                    the same token prefix; writes the state after position end - 1 there

so a cached block holds the checkpoint at its boundary only if a pass ended there, which is
what vLLM's aligned prefill split is for.

The runner's block tables are its own: built from the scheduler's outputs as vLLM's runner
builds them (a new or resumed request's tables whole, a running one's new blocks appended).
Before a pass, wherever the manager's table names a block at a position the pass computes
or reads, the runner's must name the same one; a manager that hands out blocks the runner
would file in other columns sends KV or state to the wrong block.

A workload with `state_checkpoints` plays a backend that also saves state inside a prefill
pass (0.33's FlashInfer GDN and Mamba2 kernels: the state group's spec has
`num_prefill_checkpoint_blocks=1`): the pass also writes the state after the position vLLM's
`compute_mamba_prefill_checkpoints` names into the block-table column it names, unless that
column holds the null block, as the runner does. Without it the backend saves state at pass
ends only (Mamba1, e.g. Jamba; GDN on its Triton prefill kernel).

A state hybrid decoding with drafts (`num_speculative_blocks` = the drafts per step, as vLLM's
Mamba layers plan it) follows 0.33's align-mode runner for drafts: a pass that verifies d
drafts writes the state after its last known token into block cdiv(end, B) - 1 and the state
after draft i into the block i further on; the next pass starts from the accepted one (the
last accepted draft's, copied to its running block when that moved, else read in place); and
after sampling, the state at the last boundary the accepted tokens reached, when past the
running state's, is copied into that boundary's block (`postprocess_mamba`).

With speculative decoding (a model whose file declares a draft layer, served with a real
EAGLE `SpeculativeConfig`; 0.33 marks that layer `is_draft` as its drafter does) the ledger
is the drafter and the rejection sampler too, and keeps two identities per position:

    target KV at p   a digest of tokens[0..p]     the tokens the pass ran on, drafts included
    draft KV at p    a digest of tokens[0..p+1]   EAGLE feeds the next token: the next prompt
                                                  token, an accepted draft or the bonus token;
                                                  past a rejected draft the next token is
                                                  unknown and the KV is garbage

A pass that reaches a request's last token accepts a random number of its scheduled drafts
(seeded by workload, step and request) and samples one bonus token after them; the drafter
then proposes `spec_tokens` new drafts, its extra passes writing draft KV after the bonus
token from them. Under async scheduling the scheduler schedules placeholders and counts them
as accepted until the output returns; the runner, like vLLM's GPU runner, substitutes its own
drafts and computes from its own count: the scheduler's start less the drafts rejected in
outputs the scheduler has not taken yet.

A multi-module MTP drafter (`--speculative-config '{"method": "mtp", ...}'` on a model file
declaring k > 1 modules, k drafts per step: 0.33's `MultiModuleMTPSpeculator`, with
`num_prefill_lookahead_tokens` = k) has a layer per module, and the ledger one identity per
module and position:

    module s's KV at p   a digest of tokens[0..p+1+s]   module s reads the token s after the
                                                        one EAGLE reads: the next prompt tokens
                                                        mid-prefill, past the known tokens the
                                                        drafts modules 0..s-1 just sampled

After a pass that rejected r drafts, the drafter runs every module over the pass's positions
less the rejected ones plus the r - 1 positions before them (re-prefilled from the inputs it
cached last pass: the later modules' KV there was computed from a rejected draft), and first
checks that each module's KV below them is what it computes for the tokens now known.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.campaign.workload import VOCAB, Workload, state_block_size
from kvcert.spec.layers import AttentionKind, StateLayer

MAX_STEPS = 400
UNKNOWN = -1  # a token the pass could not know: KV computed from it is garbage


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
    stalled: bool = False  # MAX_STEPS reached with requests left (not a violation)
    drafts: int = 0  # draft tokens the scheduler sent for verification
    accepted: int = 0  # of which the runner accepted
    state_copies: int = 0  # passes whose accepted drafts crossed a state block boundary
    unreachable: str | None = None  # the release refuses this configuration: not played
    crash: str | None = None  # the engine raised while serving the workload (a finding)

    @property
    def finding(self) -> str | None:
        """What this run found, in words (None: sound, or not played)."""
        return self.violation or self.crash

    @property
    def kind(self) -> tuple[str, str | None] | None:
        """The finding's class, which shrinking keeps: ("unsound", role) or ("crash", None)."""
        if self.violation is not None:
            return ("unsound", self.role)
        return ("crash", None) if self.crash is not None else None


@dataclass(frozen=True)
class Violation:
    """An unsound read: which pass read which position, and whose KV it was."""

    text: str
    role: str  # "target" / "state": the served model's KV / Mamba state (wrong outputs);
    # "draft": the drafter's KV


class Unreachable(Exception):
    """The release refuses the workload's configuration (as `vllm serve` would)."""


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
            f"step {step}: {call} raised {type(error).__name__}: {_first_line(error)}"
        ) from error


@dataclass
class _Group:
    block_size: int
    kind: str  # full | sliding_window | chunked_local | mamba
    window: int = 0
    chunk: int = 0
    target: bool = True  # holds layers of the served model
    draft: bool = False  # holds the drafter's layers
    # a state group whose kernel saves checkpoints inside a pass: their alignment (else 0)
    checkpoint_alignment: int = 0
    # a state group with MTP/EAGLE drafts: the blocks after the running state's that hold
    # the states after each draft (vLLM's num_speculative_blocks)
    speculative_blocks: int = 0

    def needs(self, start: int) -> range:
        """Positions below `start` that attention at `start` reads (a state group reads its
        running state instead: `Ledger._carry_states`)."""
        if self.kind == "mamba":
            return range(0)
        if self.kind == "sliding_window":
            return range(max(0, start - self.window + 1), start)
        if self.kind == "chunked_local":
            return range(start - start % self.chunk, start)
        return range(start)


def _vllm() -> Any:
    """vLLM's modules, imported once (shared with the conformance adapter's planned modes)."""
    from kvcert.conformance.engines.vllm_wiring import modules  # noqa: PLC0415

    return modules()


def keying_of(workload: Workload) -> str | None:
    """How the release keys draft blocks for this workload: `exact` where it has lookahead
    hashes and the workload keeps them (0.33's default), else `drop` (every earlier release,
    and 0.33 with disable_lookahead_block_hashes)."""
    from kvcert.conformance.engines import vllm_wiring as wiring  # noqa: PLC0415

    if not workload.spec_tokens:
        return None
    lookahead = wiring.has_lookahead_hashes() and workload.spec_keying != "drop"
    return "exact" if lookahead else "drop"


def build(
    workload: Workload, fix: bool = False, mutant: str | None = None, kvcert: bool = False
) -> tuple[Any, list[_Group], Any, Callable[[int, int], tuple[int, int]] | None]:
    """(scheduler, groups, block hasher, the runner's prefill checkpoints) for the workload,
    wired as EngineCore wires them;
    `fix` swaps in the scheduler subclass of `vllm_fix`, `mutant` applies one of
    `vllm_mutants`, `kvcert` serves it with kvcert.reference.vllm's Scheduler (vLLM's
    scheduling over kvcert's allocator). Unreachable where the release (or the kvcert
    manager) refuses the configuration."""
    from kvcert.conformance.campaign.vllm_mutants import KVCERT_MUTANTS, MUTANTS  # noqa: PLC0415

    if kvcert and (fix or (mutant is not None and mutant not in KVCERT_MUTANTS)):
        raise ValueError("kvcert serves the workload with its own manager: no fix or vLLM twin")
    if not kvcert and mutant in KVCERT_MUTANTS:
        raise ValueError(f"{mutant} is a twin of kvcert's manager: serve with kvcert")
    from kvcert.conformance.contract.plans import plan_input_from_json  # noqa: PLC0415
    from kvcert.conformance.engines import vllm_wiring as wiring  # noqa: PLC0415
    from kvcert.conformance.engines.vllm_layers import (  # noqa: PLC0415
        kind_of,
        spec_of,
        state_spec_of,
    )
    from kvcert.conformance.tools.catalog import load_model  # noqa: PLC0415

    model = load_model(workload.model)
    plan_input = plan_input_from_json(
        {"layers": list(model.layers), "kv_cache_dtype": "bf16", "memory_bytes": 1 << 30}
    )
    modules = _modules(workload)
    layers = _served_layers(plan_input.layers, workload.spec_tokens > 0, modules)
    stateful = any(isinstance(x, StateLayer) for x in layers)
    block_size = state_block_size(workload.model) if stateful else 16
    settings = wiring.Settings(
        max_len=workload.max_model_len,
        budget=workload.budget,
        block_size=block_size,
        policy=workload.policy,
        async_scheduling=workload.async_scheduling,
        long_prefill=workload.long_prefill,
        speculative=keying_of(workload),
        spec_tokens=max(workload.spec_tokens, 1),
        drafter=workload.drafter,
        attention_chunk_size=next((x.chunk for x in layers if getattr(x, "chunk", None)), None),
        # a hybrid with state layers caches prefixes in align mode (what vLLM picks for a model
        # without Mamba `all` support, e.g. Qwen3.5's GDN; the only mode from 0.33)
        flags=(("cache", "mamba_cache_mode", "align"), ("cache", "mamba_block_size", block_size))
        if stateful
        else (),
    )
    try:
        config = wiring.engine_config(settings)
    except (ValueError, NotImplementedError) as why:  # pydantic's errors are ValueErrors
        raise Unreachable(f"vLLM refuses the engine arguments: {_first_line(why)}") from None
    marks = wiring.marks_draft_layers()
    specs, drafter = {}, set()
    for i, layer in enumerate(layers):
        if isinstance(layer, StateLayer):
            continue
        name = f"model.layers.{i}.attn"
        spec = spec_of(layer, plan_input.dtype, settings.block_size)
        if _is_draft(layer):
            drafter.add(name)
            if marks:  # 0.33's drafters mark their layers
                spec = dataclasses.replace(spec, is_draft=True)
        specs[name] = spec
    page = max(spec.page_size_bytes for spec in specs.values())
    for i, layer in enumerate(layers):
        if isinstance(layer, StateLayer):
            specs[f"model.layers.{i}.mixer"] = _drafting(
                _saving(state_spec_of(layer, block_size, page), workload.state_checkpoints),
                workload.spec_tokens,
            )
    specs = dict(sorted(specs.items(), key=lambda item: int(item[0].split(".")[2])))
    kv_groups = wiring.plan(config, specs)
    cls = None
    if fix:
        from kvcert.conformance.campaign.vllm_fix import fixed  # noqa: PLC0415

        cls = fixed(config.scheduler_config.get_scheduler_cls())
    wired = (_wire_kvcert if kvcert else wiring.wire)(
        config, kv_groups, workload.usable_blocks, cls
    )
    if mutant is not None:
        {**MUTANTS, **KVCERT_MUTANTS}[mutant](wired)
    groups = []
    for g in wired.groups:
        spec = g.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        first = next(iter(inner.values())) if inner else spec
        names = set(g.layer_names)
        groups.append(
            _Group(
                spec.block_size,
                kind_of(spec),
                getattr(first, "sliding_window", 0) or 0,
                getattr(first, "attention_chunk_size", 0) or 0,
                target=bool(names - drafter),
                draft=bool(names & drafter),
                checkpoint_alignment=(getattr(spec, "prefill_checkpoint_alignment", 0) or 0)
                if getattr(spec, "num_prefill_checkpoint_blocks", 0)
                else 0,
                speculative_blocks=getattr(spec, "num_speculative_blocks", 0) or 0,
            )
        )
    return wired.scheduler, groups, wired.hasher, _runner_checkpoints(config, wired, groups)


def _runner_checkpoints(
    config: Any, wired: Any, groups: list[_Group]
) -> Callable[[int, int], tuple[int, int]] | None:
    """vLLM's runner rule for the prefill checkpoints of a pass [start, end), its inputs
    bound as the runner reads them: (the position whose state it saves, the block-table
    column it saves it in), (0, -1) for none."""
    saving = {(g.block_size, g.checkpoint_alignment) for g in groups if g.checkpoint_alignment}
    if not saving:
        return None
    from vllm.model_executor.layers.mamba.checkpoint import (  # type: ignore[import-not-found]  # noqa: PLC0415
        compute_mamba_prefill_checkpoints,
    )

    ((size, grid),) = saving  # one state spec in a model
    alignment = wired.scheduler.kv_cache_config.cache_hit_alignment_tokens
    lookahead = getattr(config, "num_hash_lookahead_tokens", 0) or 0
    speculative = config.speculative_config
    drop = speculative is not None and speculative.use_eagle_block_drop() and not lookahead

    def saved(start: int, end: int) -> tuple[int, int]:
        offsets, columns = compute_mamba_prefill_checkpoints(
            [end],
            [end - start],
            hash_block_size=wired.hash_block,
            mamba_block_size=size,
            checkpoint_alignment=grid,
            drop_eagle_block=drop,
            cache_hit_alignment_tokens=alignment,
            num_hash_lookahead_tokens=lookahead,
        )
        return (start + offsets[0], columns[0]) if offsets[0] else (0, -1)

    return saved


def _saving(spec: Any, checkpoints: bool) -> Any:
    """The state spec as a backend that saves checkpoints inside a prefill plans it (0.33's
    FlashInfer GDN: one checkpoint block, offsets on the block grid), when `checkpoints`."""
    if not checkpoints:
        return spec
    if "num_prefill_checkpoint_blocks" not in {f.name for f in dataclasses.fields(spec)}:
        raise Unreachable("this release's state layers save no checkpoints inside a prefill")
    return dataclasses.replace(
        spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=spec.block_size
    )


def _drafting(spec: Any, spec_tokens: int) -> Any:
    """The state spec as vLLM's Mamba layers plan it under speculative decoding: one block
    per draft token for the states after them (`num_speculative_blocks`)."""
    if not spec_tokens:
        return spec
    return dataclasses.replace(spec, num_speculative_blocks=spec_tokens)


def _wire_kvcert(config: Any, kv_groups: list[Any], usable_blocks: int, _: Any) -> Any:
    """The scheduler wired with kvcert.reference.vllm's Scheduler, or its AsyncScheduler
    when the workload schedules asynchronously (its manager refuses what it does not serve:
    then the workload is unreachable, as at `vllm serve`)."""
    from kvcert.conformance.engines import vllm_wiring as wiring  # noqa: PLC0415
    from kvcert.reference.vllm import (  # noqa: PLC0415
        AsyncScheduler,
        Scheduler,
        UnsupportedConfigError,
    )

    cls = AsyncScheduler if config.scheduler_config.async_scheduling else Scheduler
    try:
        return wiring.wire(config, kv_groups, usable_blocks, cls)
    except UnsupportedConfigError as why:
        raise Unreachable(f"the kvcert manager refuses it: {why}") from None


def _served_layers(layers: tuple[Any, ...], drafter: bool, modules: int = 1) -> list[Any]:
    """The layers vLLM loads: without speculative decoding, none of the drafter's; with it,
    the model file's draft layer, or where the file declares none an EAGLE head of the
    target's own attention shape (as EAGLE drafters for Llama-style targets are built): one
    layer copying the first full-attention layer; a multi-module MTP drafter has one such
    layer per module."""
    if not drafter:
        return [x for x in layers if not _is_draft(x)]
    if any(_is_draft(x) for x in layers):
        if modules > 1:
            raise ValueError("a model file's own draft layer is not a multi-module MTP drafter")
        return list(layers)
    head = next(x for x in layers if getattr(x, "kind", None) is AttentionKind.FULL)
    return [*layers, *[dataclasses.replace(head, draft=True)] * modules]


def _modules(workload: Workload) -> int:
    """The drafter's modules: one per draft token for a multi-module MTP drafter (vLLM's
    `use_multi_module_mtp`: an MTP model file with more than one module and more than one
    draft token), else one head run once per draft."""
    return workload.spec_tokens if workload.drafter == "mtp" and workload.spec_tokens > 1 else 1


def _is_draft(layer: object) -> bool:
    return bool(getattr(layer, "draft", False))


def _first_line(error: BaseException) -> str:
    """What went wrong in one line (for pydantic's errors, the first error's message, not its
    count)."""
    details = getattr(error, "errors", None)
    if callable(details):
        try:
            return str(details()[0]["msg"])
        except (TypeError, LookupError):
            pass
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _state_block(end: int, block_size: int) -> int:
    """The block index holding a request's running state after a pass ending at `end`."""
    return -(-end // block_size) - 1


def _state_found(held: bytes | None, ident: list[bytes]) -> str:
    """What a state block held instead of the state a pass needed."""
    if held is None:
        return "holds no state any forward pass wrote"
    if held in ident:
        return f"holds the state after position {ident.index(held)}"
    return "holds the state of another token prefix"


def _readmitted_ids(output: Any) -> set[str]:
    """Requests the scheduler (re)sends whole this step: new ones, and ones resumed after a
    preemption (every pinned release lists them in `resumed_req_ids`)."""
    ids = {r.req_id for r in output.scheduled_new_reqs}
    return ids | set(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ())


def identities(tokens: list[int], end: int) -> list[bytes]:
    """identity[p]: a digest of tokens[0..p], what target KV at position p is a function of
    (and draft KV at p - 1)."""
    out, previous = [], b""
    for token in tokens[:end]:
        previous = hashlib.sha256(previous + token.to_bytes(4, "little", signed=True)).digest()
        out.append(previous)
    return out


@dataclass
class _Pending:
    """One output of the runner the scheduler has not taken yet."""

    tokens: list[int]  # accepted drafts, then the bonus token
    rejected: int  # drafts the scheduler still counts as computed
    live: bool = True  # false once the runner re-added the request (its state starts over)


@dataclass
class _Pass:
    """One request's share of a forward pass, as the runner computes it."""

    rid: str
    step: int
    start: int  # the first position computed
    count: int  # positions computed
    known: list[int]  # the request's tokens as the runner knows them
    drafts: list[int]  # the drafts the pass verifies (after the last known token)
    tables: Any  # the request's block table per group

    @property
    def end(self) -> int:
        return self.start + self.count


@dataclass
class Ledger:
    """The model runner: slot (group, role, block, offset) -> identity of the KV written
    there, role "t" for the served model's layers and "d" for the drafter's."""

    groups: list[_Group]
    seed: int = 0
    spec_tokens: int = 0
    slots: dict[tuple[int, str, int, int], bytes] = field(default_factory=dict)
    unapplied: dict[str, list[_Pending]] = field(default_factory=dict)
    proposed: dict[str, list[int]] = field(default_factory=dict)  # the drafter's last drafts
    # the runner's running-state block index per request (vLLM's `mamba_state_idx`)
    state_index: dict[str, int] = field(default_factory=dict)
    # with drafts on a state model: tokens the last pass accepted, bonus included (vLLM's
    # `num_accepted_tokens`, 1 once a copy moved the accepted state), and the block index
    # each pass reads its state from
    state_accepted: dict[str, int] = field(default_factory=dict)
    state_read: dict[str, int] = field(default_factory=dict)
    # the runner's block tables per request, as the scheduler's outputs build them: a new
    # or resumed request's tables whole, a running request's new blocks appended
    runner_tables: dict[str, list[list[int]]] = field(default_factory=dict)
    drafts: int = 0
    accepted: int = 0
    # passes verifying drafts on a state model whose accepted tokens crossed a block
    # boundary, the runner then copying the state there into the boundary's block
    state_copies: int = 0
    # the runner's prefill checkpoints of a pass (`_runner_checkpoints`), None: it saves none
    checkpoints: Callable[[int, int], tuple[int, int]] | None = None
    # the drafter's modules: 1 (EAGLE: one head, role "d"), else a multi-module MTP drafter
    # (roles "d0", "d1", ...: module s's KV at p reads the tokens up to p + 1 + s)
    modules: int = 1
    # requests whose row of the MTP drafter's input cache holds their own last inputs (what
    # it re-prefills from); a request (re)sent to the runner has not run the drafter yet
    mtp_cached: set[str] = field(default_factory=set)

    def tokens(self, request: Any) -> list[int]:
        """The request's tokens as the runner knows them: the scheduler's, then the ones this
        runner sampled whose outputs the scheduler has not taken yet (async scheduling)."""
        mine = [t for p in self.unapplied.get(request.request_id, ()) if p.live for t in p.tokens]
        return [*request.all_token_ids, *mine]

    def _optimism(self, rid: str) -> int:
        return sum(p.rejected for p in self.unapplied.get(rid, ()) if p.live)

    def _readmitted(self, rid: str) -> None:
        """The scheduler (re)sent the request whole: the runner starts from its tokens and
        count; outputs still in flight are the scheduler's to deliver or drop."""
        for pending in self.unapplied.get(rid, ()):
            pending.live = False
        self.proposed.pop(rid, None)
        self.mtp_cached.discard(rid)
        self.state_index.pop(rid, None)
        self.state_accepted.pop(rid, None)

    def forward(
        self, scheduler: Any, output: Any, step: int
    ) -> tuple[list[list[int]], Violation | None]:
        """Check every read of the pass, write its KV, sample where a request's scheduled
        tokens reach its end. Returns (the tokens sampled per scheduled request, in the
        output's order; the first violation or None)."""
        ids = list(output.num_scheduled_tokens)
        for rid in _readmitted_ids(output):
            self._readmitted(rid)
        self._follow_tables(output)
        passes = []
        for rid in ids:
            request = scheduler.requests[rid]
            count = output.num_scheduled_tokens[rid]
            passes.append(
                _Pass(
                    rid,
                    step,
                    # the scheduler advanced its count already, and counts in-flight drafts as
                    # accepted
                    request.num_computed_tokens - count - self._optimism(rid),
                    count,
                    self.tokens(request),
                    self._drafts(rid, output.scheduled_spec_decode_tokens.get(rid, ())),
                    scheduler.kv_cache_manager.get_block_ids(rid),
                )
            )
        self._carry_states(passes)
        violation = None
        sampled = []
        for one in passes:
            violation = violation or self._check_table(one) or self._check_reads(one)
            tokens, after = self._sample(one)
            sampled.append(tokens)
            # the target ran on the known tokens and the drafts; the drafter's next token is
            # known up to the bonus token (or the next prompt token), unknown past a rejection
            ran = one.known + one.drafts
            ran += [UNKNOWN] * (one.end - len(ran))  # positions no token is known for: garbage
            self._write(one, "t", identities(ran, one.end), 0)
            self._settle_state(one, len(tokens) if tokens else 1)
            drafts = self._propose(one, after) if tokens and self.spec_tokens else []
            if self.modules > 1:
                violation = violation or self._run_modules(one, tokens, after, drafts)
                continue
            nexts = after + [UNKNOWN] * (one.end + 1 - len(after))
            self._write(one, "d", identities(nexts, one.end + 1), 1)
            if drafts:
                self._write_draft_passes(one, after, drafts)
        return sampled, violation

    def _run_modules(
        self, one: _Pass, tokens: list[int], after: list[int], drafts: list[int]
    ) -> Violation | None:
        """A multi-module MTP drafter after the pass (0.33's `MultiModuleMTPSpeculator`): every
        module runs over the pass's positions less the rejected drafts, plus the last
        `rejected - 1` positions before them, whose KV in the later modules was computed from
        drafts now rejected (re-prefilled from the inputs it cached last pass; a request new to
        the runner has none of its own there). Module s at position p reads token p + 1 + s:
        the known tokens, then the drafts the modules before it sampled. Trailing slots of
        rejected drafts are padded (`pad_trailing_draft_slots`): not written. Before writing,
        each module's attention reads its own KV below the first position it computes, which
        must be what it computes for the tokens now known."""
        rejected = len(one.drafts) - (len(tokens) - 1) if tokens else 0
        reprefilled = max(0, rejected - 1)
        first, stop = max(0, one.start - reprefilled), one.end - rejected
        chain = [*after, *drafts]
        if reprefilled and one.rid not in self.mtp_cached:  # another request's cached inputs
            chain[first + 1 : one.start + 1] = [UNKNOWN] * (one.start - first)
        self.mtp_cached.add(one.rid)
        reach = max(stop, first + 1) + self.modules
        written = identities(chain + [UNKNOWN] * (reach - len(chain)), reach)
        known = identities(after + [UNKNOWN] * (reach - len(after)), reach)
        violation = None
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not group.draft:
                continue
            for module in range(self.modules):
                role = f"d{module}"
                for p in group.needs(first):
                    slot = (g, role, table[p // group.block_size], p % group.block_size)
                    if violation is None and self.slots.get(slot) != known[p + 1 + module]:
                        violation = Violation(
                            f"step {one.step}: {one.rid}'s MTP module {module} computes "
                            f"[{first}, {stop}) but position {p} of group {g} (draft layers, "
                            f"block {slot[2]}) holds KV that no forward pass wrote for this "
                            "prefix",
                            "draft",
                        )
                for p in range(first, stop):
                    block = table[p // group.block_size]
                    if block:
                        ident = written[p + 1 + module]
                        self.slots[(g, role, block, p % group.block_size)] = ident
        return violation

    def _carry_states(self, passes: list[_Pass]) -> None:
        """Before the forward pass, vLLM's runner (`preprocess_mamba`, align mode) moves each
        request's running state into the block of its pass's last token: from the block it
        left it in last pass, or for a request (re)sent to it, from the block of its last
        computed token (its prefix-cache hit's checkpoint). All copies read before any write,
        as one batched copy on the device does. With drafts the state left behind is the
        accepted one: `a - 1` blocks after the last pass's running state (a: the tokens it
        accepted, bonus included); a pass that stays in the same block reads it there."""
        states = [g for g, group in enumerate(self.groups) if group.kind == "mamba"]
        if not states:
            return
        size = self.groups[states[0]].block_size  # align mode: every state group's
        copies = []
        for one in passes:
            current = _state_block(one.end, size)
            previous = self.state_index.get(one.rid, (one.start - 1) // size)
            self.state_index[one.rid] = current
            accepted = self.state_accepted.pop(one.rid, 1)
            if previous in (-1, current):
                self.state_read[one.rid] = current + accepted - 1
                continue
            self.state_read[one.rid] = current
            source = previous + accepted - 1
            for g in states:
                table = one.tables[g]
                held = table[source] if source < len(table) else -1  # no such block
                # a null block (or none: the runner's row is zero-padded) holds no state
                if current < len(table) and table[current]:
                    copies.append(((g, "s", table[current], 0), self.slots.get((g, "s", held, 0))))
        for slot, state in copies:
            if state is None:
                self.slots.pop(slot, None)
            else:
                self.slots[slot] = state

    def _settle_state(self, one: _Pass, accepted: int) -> None:
        """After sampling, with drafts on a state model (vLLM's `postprocess_mamba`, align
        mode): where the accepted tokens reached a block boundary at or past the running
        state's, the state there is copied from the block holding it (the running state's or
        a draft's) into the boundary's own block, the one the prefix cache keys; a pass that
        copied within its running block leaves the accepted state there (`a` back to 1)."""
        copied = False
        for g, group in enumerate(self.groups):
            if group.kind != "mamba" or not group.speculative_blocks:
                continue
            size, table = group.block_size, one.tables[g]
            current = _state_block(one.end, size)
            running = one.end - len(one.drafts)  # tokens whose state the running block holds
            aligned = (running + accepted - 1) // size * size
            self.state_accepted[one.rid] = accepted
            if aligned < running:
                continue
            bias, dest = aligned - running, aligned // size - 1
            if dest == current:
                self.state_accepted[one.rid] = 1
                if not bias:
                    continue
            source = table[current + bias] if current + bias < len(table) else -1
            if dest < len(table) and table[dest]:
                copied = True
                state = self.slots.get((g, "s", source, 0))
                if state is None:
                    self.slots.pop((g, "s", table[dest], 0), None)
                else:
                    self.slots[(g, "s", table[dest], 0)] = state
        self.state_copies += copied

    def _drafts(self, rid: str, scheduled: Any) -> list[int]:
        """The drafts the pass verifies: the scheduler's (sync), this runner's own where the
        scheduler holds placeholders (async), and for a request the runner has no drafts for,
        padding (0.33 pads a new request's single token to 1 + num_speculative_tokens rows
        with -1 drafts, which the rejection sampler always rejects)."""
        drafts = [int(t) for t in scheduled]
        if all(t >= 0 for t in drafts):
            return drafts
        own = self.proposed.get(rid)
        if own is None:
            return [UNKNOWN] * len(drafts)
        if len(own) < len(drafts):
            raise RuntimeError(
                f"ledger out of step: {rid} has {len(drafts)} draft placeholders and the "
                f"runner proposed {len(own)} drafts"
            )
        return own[: len(drafts)]

    def _follow_tables(self, output: Any) -> None:
        """What the runner's block tables become from this output (vLLM's
        `_update_states`: new and resumed requests replace theirs, others append)."""
        for new in output.scheduled_new_reqs:
            self.runner_tables[new.req_id] = [list(ids) for ids in new.block_ids]
        cached = output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if ids is None:
                continue
            if rid in resumed or rid not in self.runner_tables:
                self.runner_tables[rid] = [list(more) for more in ids]
            else:
                for table, more in zip(self.runner_tables[rid], ids, strict=True):
                    table.extend(more)

    def _check_table(self, one: _Pass) -> Violation | None:
        """The runner's table must name the manager's block at every position the pass
        computes or reads (earlier positions the manager released may hold stale ids, which
        the runner never reads): a difference sends KV or state to another request's block."""
        runner = self.runner_tables.get(one.rid)
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            held = runner[g] if runner is not None else []
            needed = -(-one.end // group.block_size) + group.speculative_blocks
            for j, block in enumerate(table[:needed]):
                if block and (j >= len(held) or held[j] != block):
                    return Violation(
                        f"step {one.step}: {one.rid}'s block table in group {g} "
                        f"({group.kind}) names block {block} at position {j}; the runner's "
                        f"table, built from the scheduler's outputs, holds "
                        f"{held[j] if j < len(held) else 'nothing'} there",
                        "target",
                    )
        return None

    def _check_reads(self, one: _Pass) -> Violation | None:
        """The first read of the pass that finds KV no pass wrote for this prefix."""
        start = one.start
        # a position the runner knows no token for cannot hold KV any pass wrote for it
        ident = identities(one.known + [UNKNOWN] * (start + 1 - len(one.known)), start + 1)
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if group.kind == "mamba":
                held = self.slots.get(self._read_slot(g, one))
                if start and held != ident[start - 1]:
                    return Violation(
                        f"step {one.step}: {one.rid} computes [{start}, {one.end}) from the "
                        f"state in group {g} (mamba, block {self._read_slot(g, one)[2]}), "
                        f"which should be the state after position {start - 1} of this "
                        f"prefix but {_state_found(held, ident[:start])}",
                        "state",
                    )
                continue
            # an EAGLE head reads its KV as the pass starts; MTP modules after it
            # (`_run_modules`)
            eagle = group.draft and self.modules == 1
            for role, shift, present in (("t", 0, group.target), ("d", 1, eagle)):
                if not present:
                    continue
                for p in group.needs(start):
                    slot = (g, role, table[p // group.block_size], p % group.block_size)
                    if self.slots.get(slot) != ident[p + shift]:
                        layers = "draft layers" if role == "d" else group.kind
                        return Violation(
                            f"step {one.step}: {one.rid} computes [{start}, {one.end}) but "
                            f"position {p} of group {g} ({layers}, block {slot[2]}) holds KV "
                            "that no forward pass wrote for this prefix",
                            "draft" if role == "d" else "target",
                        )
        return None

    def _state_slot(self, g: int, one: _Pass, offset: int = 0) -> tuple[int, str, int, int]:
        """The slot of the running state's block (`offset` blocks on: a draft's state)."""
        table = one.tables[g]
        index = _state_block(one.end, self.groups[g].block_size) + offset
        return (g, "s", table[index] if index < len(table) else -1, 0)

    def _read_slot(self, g: int, one: _Pass) -> tuple[int, str, int, int]:
        """The slot the pass reads its state from (`_carry_states`)."""
        table = one.tables[g]
        index = self.state_read.get(one.rid, _state_block(one.end, self.groups[g].block_size))
        return (g, "s", table[index] if index < len(table) else -1, 0)

    def _sample(self, one: _Pass) -> tuple[list[int], list[int]]:
        """(tokens returned to the scheduler, the request's tokens as far as they are known
        after the pass). Nothing is sampled before a request's last token."""
        rid, step, known, drafts = one.rid, one.step, one.known, one.drafts
        if one.end < len(known):
            return [], known
        if not self.spec_tokens:  # the campaign's original stream of tokens, kept for its seeds
            token = (7 * step + 13 * len(known)) % VOCAB
            self.unapplied.setdefault(rid, []).append(_Pending([token], 0))
            return [token], [*known, token]
        rng = random.Random(f"{self.seed}:{step}:{rid}")
        real = drafts.index(UNKNOWN) if UNKNOWN in drafts else len(drafts)  # padding: rejected
        accepted = rng.randint(0, real)
        bonus = rng.randrange(VOCAB)
        if accepted < len(drafts) and bonus == drafts[accepted]:
            bonus = (bonus + 1) % VOCAB  # a draft the target samples is accepted
        tokens = [*drafts[:accepted], bonus]
        self.drafts += real
        self.accepted += accepted
        self.unapplied.setdefault(rid, []).append(_Pending(tokens, len(drafts) - accepted))
        return tokens, [*known, *tokens]

    def _write(self, one: _Pass, role: str, ident: list[bytes], shift: int) -> None:
        """Role `role`'s KV for the pass's positions; ident[p + shift] is position p's."""
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not (group.target if role == "t" else group.draft):
                continue
            if group.kind == "mamba":  # the state after the pass's last token
                # with drafts: after the last known token, then each draft's a block further
                drafts = len(one.drafts) if group.speculative_blocks else 0
                for offset in range(drafts + 1):
                    slot = self._state_slot(g, one, offset)
                    if slot[2] > 0:
                        self.slots[slot] = ident[one.end - 1 - drafts + offset + shift]
                if group.checkpoint_alignment and self.checkpoints is not None:
                    position, column = self.checkpoints(one.start, one.end)
                    if position and column < len(table) and table[column]:  # null: skipped
                        self.slots[(g, "s", table[column], 0)] = ident[position - 1 + shift]
                continue
            for p in range(one.start, one.end):
                block = table[p // group.block_size]
                if block:  # a null block (outside a window) is never written
                    self.slots[(g, role, block, p % group.block_size)] = ident[p + shift]

    def _propose(self, one: _Pass, after: list[int]) -> list[int]:
        """The drafter's next drafts."""
        rng = random.Random(f"{self.seed}:{one.step}:{one.rid}:drafts")
        drafts = [rng.randrange(VOCAB) for _ in range(self.spec_tokens)]
        self.proposed[one.rid] = drafts
        return drafts

    def _write_draft_passes(self, one: _Pass, after: list[int], drafts: list[int]) -> None:
        """The draft KV an EAGLE drafter's extra passes write after the bonus token (pass j
        reads draft j - 1), where the block table already reaches."""
        bonus = len(after) - 1
        ident = identities(after + drafts, len(after) + len(drafts))
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not group.draft:
                continue
            for p in range(bonus, bonus + self.spec_tokens - 1):
                index = p // group.block_size
                if index < len(table) and table[index]:
                    self.slots[(g, "d", table[index], p % group.block_size)] = ident[p + 1]

    def applied(self, runner_output: Any) -> None:
        """The scheduler took these outputs: their tokens are in all_token_ids now (or were
        dropped with a preempted or finished request)."""
        for rid, tokens in zip(runner_output.req_ids, runner_output.sampled_token_ids,
                               strict=True):  # fmt: skip
            if tokens and self.unapplied.get(rid):
                self.unapplied[rid].pop(0)

    def draft_ids(self, runner_output: Any) -> Any:
        """What EngineCore hands the scheduler after a synchronous step: the drafter's drafts
        for every request of the batch."""
        from vllm.v1.outputs import DraftTokenIds  # type: ignore[import-not-found]  # noqa: PLC0415

        ids = list(runner_output.req_ids)
        return DraftTokenIds(ids, [list(self.proposed.get(r, [])) for r in ids])


def _client(
    scheduler: Any, workload: Workload, arrivals: list[Any], step: int, hasher: Any
) -> None:
    """What the API server hands EngineCore before `step`: new requests, aborts, resets."""
    v = _vllm()
    for arrival in [a for a in arrivals if a.step <= step]:
        arrivals.remove(arrival)
        params = v["SamplingParams"](max_tokens=arrival.max_tokens, ignore_eos=True)
        options = {"priority": arrival.priority, "block_hasher": hasher}
        if "eos_token_id" in inspect.signature(v["Request"].__init__).parameters:
            options["eos_token_id"] = None  # <= 0.16
        request = v["Request"](arrival.rid, list(arrival.prompt), params, None, **options)
        with _engine(step, "add_request()"):
            scheduler.add_request(request)
    for when, rid in workload.aborts:
        if when == step and rid in scheduler.requests:
            with _engine(step, "finish_requests()"):
                scheduler.finish_requests(rid, v["RequestStatus"].FINISHED_ABORTED)
    if step in workload.resets:
        with _engine(step, "reset_prefix_cache()"):
            scheduler.reset_prefix_cache()


def _runner_output(ids: list[str], sampled: list[list[int]]) -> Any:
    return _vllm()["ModelRunnerOutput"](
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )


def play(
    workload: Workload, fix: bool = False, mutant: str | None = None, kvcert: bool = False
) -> Outcome:
    """Run the workload to the end (or MAX_STEPS); stop at the first violation. `kvcert`:
    through kvcert.reference.vllm's Scheduler (see `build`)."""
    v = _vllm()
    try:
        scheduler, groups, hasher, checkpoints = build(workload, fix, mutant, kvcert)
    except Unreachable as why:
        return Outcome(unreachable=str(why))
    ledger = Ledger(
        groups, workload.seed, workload.spec_tokens, checkpoints=checkpoints,
        modules=_modules(workload),
    )  # fmt: skip
    outcome = Outcome(keying=keying_of(workload))
    pending: list[Any] = []  # (output, runner output) not yet given back: async scheduling
    depth = 2 if workload.async_scheduling else 1
    arrivals = list(workload.arrivals)
    try:
        for step in range(MAX_STEPS):
            outcome.steps = step
            _client(scheduler, workload, arrivals, step, hasher)
            if not scheduler.has_requests():  # EngineCore steps only while there is work
                while pending:
                    done_output, done_runner = pending.pop(0)
                    with _engine(step, "update_from_output()"):
                        scheduler.update_from_output(done_output, done_runner)
                    ledger.applied(done_runner)
                if not scheduler.has_requests():
                    if not arrivals:
                        return outcome
                    continue
            with _engine(step, "schedule()"):
                output = scheduler.schedule()
            for new in output.scheduled_new_reqs:
                outcome.hit_tokens += new.num_computed_tokens
            outcome.preemptions += len(getattr(output, "preempted_req_ids", ()) or ())
            executed = output.total_num_scheduled_tokens > 0
            runner_output = v["EMPTY"]
            if executed:
                sampled, violation = ledger.forward(scheduler, output, step)
                runner_output = _runner_output(list(output.num_scheduled_tokens), sampled)
                if violation is not None:
                    outcome.violation, outcome.role = violation.text, violation.role
                    return outcome
            pending.append((output, runner_output))
            # EngineCore.step_with_batch_queue: keep the queue filling while work goes on
            if len(pending) < depth and (executed or scheduler.has_requests()):
                continue
            done_output, done_runner = pending.pop(0)
            with _engine(step, "update_from_output()"):
                scheduler.update_from_output(done_output, done_runner)
            ledger.applied(done_runner)
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
