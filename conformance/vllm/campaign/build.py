"""A workload's scheduler, wired as vLLM's EngineCore wires a served model.

The KV-cache groups come from the release's own planner applied to the bundled model's
layers, block sizes from `resolve_kv_cache_block_sizes`, the scheduler class from
`SchedulerConfig.get_scheduler_cls()`, request hashes from `get_request_block_hasher`
(kvcert.conformance.vllm.runtime); only the pool is made small, so the scheduler preempts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from kvcert.conformance.campaign.workload import Workload, state_block_size
from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.conformance.tools.catalog import load_model
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.campaign.fix import fixed
from kvcert.conformance.vllm.campaign.ledger import Group
from kvcert.conformance.vllm.campaign.mutants import KVCERT_MUTANTS, MUTANTS
from kvcert.conformance.vllm.campaign.owed import Profiles
from kvcert.conformance.vllm.layers import kind_of, spec_of, state_spec_of
from kvcert.reference.config import Retention as KvcertRetention
from kvcert.reference.vllm import AsyncScheduler, Scheduler, Settings, UnsupportedConfigError
from kvcert.reference.vllm.hasher import engine_hasher
from kvcert.spec.alloc import Visibility
from kvcert.spec.layers import AttentionKind, StateLayer
from kvcert.spec.layout import Speculative
from kvcert.spec.retention import Retention


class Unreachable(Exception):
    """The release refuses the workload's configuration (as `vllm serve` would)."""


def keying_of(workload: Workload) -> str | None:
    """How the release keys draft blocks for this workload: `exact` where it has lookahead
    hashes and the workload keeps them (0.33's default), else `drop` (every earlier release,
    and 0.33 with disable_lookahead_block_hashes)."""
    if not workload.spec_tokens:
        return None
    lookahead = runtime.has_lookahead_hashes() and workload.spec_keying != "drop"
    return "exact" if lookahead else "drop"


def build(
    workload: Workload, fix: bool = False, mutant: str | None = None, kvcert: bool = False
) -> tuple[Any, list[Group], Any, Callable[[int, int], tuple[int, int]] | None]:
    """(scheduler, groups, block hasher, the runner's prefill checkpoints) for the workload,
    wired as EngineCore wires them;
    `fix` swaps in the scheduler subclass of `campaign.fix`, `mutant` applies one of
    `campaign.mutants`, `kvcert` serves it with kvcert.reference.vllm's Scheduler (vLLM's
    scheduling over kvcert's allocator). Unreachable where the release (or the kvcert
    manager) refuses the configuration."""
    if kvcert and (fix or (mutant is not None and mutant not in KVCERT_MUTANTS)):
        raise ValueError("kvcert serves the workload with its own manager: no fix or vLLM twin")
    if not kvcert and mutant in KVCERT_MUTANTS:
        raise ValueError(f"{mutant} is a twin of kvcert's manager: serve with kvcert")
    model = load_model(workload.model)
    plan_input = plan_input_from_json(
        {"layers": list(model.layers), "kv_cache_dtype": "bf16", "memory_bytes": 1 << 30}
    )
    modules = drafter_modules(workload)
    layers = _served_layers(plan_input.layers, workload.spec_tokens > 0, modules)
    settings = _engine_settings(workload, layers)
    try:
        config = runtime.engine_config(settings)
    except (ValueError, NotImplementedError) as why:  # pydantic's errors are ValueErrors
        raise Unreachable(f"vLLM refuses the engine arguments: {first_line(why)}") from None
    specs, drafter = _layer_specs(workload, layers, plan_input.dtype, settings.block_size)
    kv_groups = runtime.plan(config, specs)
    cls = None
    if fix:
        cls = fixed(config.scheduler_config.get_scheduler_cls())
    variables = _ask_retention(config, kv_groups, workload.retention_units)
    try:
        with runtime.environment(variables):  # 0.25-0.28 read the interval as the core starts
            wire = runtime.wire
            if kvcert:
                wire = functools.partial(_wire_kvcert, sparse=workload.retention_units == 0)
            wired = wire(config, kv_groups, workload.usable_blocks, cls)
    except ValueError as why:  # the coordinator's own check of the interval asked for
        if workload.retention_units is None:
            raise
        raise Unreachable(f"vLLM refuses the engine arguments: {first_line(why)}") from None
    if mutant is not None:
        {**MUTANTS, **KVCERT_MUTANTS}[mutant](wired)
    groups = []
    for g in wired.groups:
        spec = g.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        first = next(iter(inner.values())) if inner else spec
        names = set(g.layer_names)
        groups.append(
            Group(
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


def _layer_specs(
    workload: Workload, layers: list[Any], dtype: Any, block_size: int
) -> tuple[dict[str, Any], set[str]]:
    """(the release's KV-cache spec of every served layer by its name, in layer order; the
    names of the drafter's layers)."""
    marks = runtime.marks_draft_layers()
    specs, drafter = {}, set()
    for i, layer in enumerate(layers):
        if isinstance(layer, StateLayer):
            continue
        name = f"model.layers.{i}.attn"
        spec = spec_of(layer, dtype, block_size)
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
    return specs, drafter


def _engine_settings(workload: Workload, layers: list[Any]) -> runtime.Settings:
    """The engine arguments `vllm serve` is given for the workload."""
    stateful = any(isinstance(x, StateLayer) for x in layers)
    block_size = state_block_size(workload.model) if stateful else 16
    # a hybrid with state layers caches prefixes in align mode (what vLLM picks for a model
    # without Mamba `all` support, e.g. Qwen3.5's GDN; the only mode from 0.33)
    align = (("cache", "mamba_cache_mode", "align"), ("cache", "mamba_block_size", block_size))
    return runtime.Settings(
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
        flags=align if stateful else (),
    )


def _ask_retention(config: Any, kv_groups: list[Any], units: int | None) -> dict[str, Any]:
    """Ask this release for sparse retention with an interval of `units` hit-alignment
    units (`Workload.retention_units`; the alignment is the lcm of the groups' block sizes):
    0.33's `--prefix-cache-retention-interval` is set on `config`; for 0.25-0.28 the
    returned environment (VLLM_PREFIX_CACHE_RETENTION_INTERVAL) must be set as the
    scheduler is built. None asks nothing (the release's default). Unreachable on a release
    that has neither."""
    if units is None:
        return {}
    interval = units * math.lcm(*(g.kv_cache_spec.block_size for g in kv_groups))
    if hasattr(config.cache_config, "prefix_cache_retention_interval"):
        config.cache_config.prefix_cache_retention_interval = interval
        return {}
    import vllm.envs  # noqa: PLC0415 - a release venv's

    if "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in vllm.envs.environment_variables:
        return {"VLLM_PREFIX_CACHE_RETENTION_INTERVAL": interval}
    raise Unreachable(f"this vLLM has no prefix-cache retention interval (asked for {interval})")


def declared_profiles(scheduler: Any, workload: Workload, kvcert: bool) -> Profiles:
    """The profiles the manager serving the workload declares, which the completeness
    oracle holds it to. kvcert's manager: its configuration's. vLLM's: same-pass visibility
    (it registers blocks in `allocate_slots`; every pinned release's probe says so,
    docs/engines.md), sparse retention where its coordinator has a retention interval (0.33's
    default 0; 0.25-0.28 only when asked, their default None being dense), and the release's
    draft keying (`keying_of`)."""
    manager = scheduler.kv_cache_manager
    if kvcert:
        config = manager.core.config
        drafting = config.speculative is not None and workload.spec_tokens > 0
        return Profiles(
            Visibility(config.visibility.value),
            Retention(config.retention.value),
            config.retention_interval,
            Speculative(config.speculative.value) if drafting else None,
        )
    interval = getattr(getattr(manager, "coordinator", None), "retention_interval", None)
    keying = keying_of(workload)
    return Profiles(
        Visibility.SAME_PASS,
        Retention.DENSE if interval is None else Retention.SPARSE,
        interval or 0,
        Speculative(keying) if keying else None,
    )


def _runner_checkpoints(
    config: Any, wired: Any, groups: list[Group]
) -> Callable[[int, int], tuple[int, int]] | None:
    """vLLM's runner rule for the prefill checkpoints of a pass [start, end), its inputs
    bound as the runner reads them: (the position whose state it saves, the block-table
    column it saves it in), (0, -1) for none."""
    saving = {(g.block_size, g.checkpoint_alignment) for g in groups if g.checkpoint_alignment}
    if not saving:
        return None
    # only releases that save checkpoints inside a prefill (0.33) have this module
    from vllm.model_executor.layers.mamba.checkpoint import (  # noqa: PLC0415
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


def _wire_kvcert(
    config: Any, kv_groups: list[Any], usable_blocks: int, _: Any, *, sparse: bool = False
) -> Any:
    """The scheduler wired with kvcert.reference.vllm's Scheduler, or its AsyncScheduler
    when the workload schedules asynchronously (its manager refuses what it does not serve:
    then the workload is unreachable, as at `vllm serve`). A retention interval of 0 asks
    it for sparse retention (KVCERT_RETENTION=sparse): it takes vLLM's 0 for vLLM's
    default, which it leaves to its own settings (dense). Its requests are built with the
    block hasher kvcert's scheduler has the engine use (`engine_hasher`)."""
    cls = AsyncScheduler if config.scheduler_config.async_scheduling else Scheduler
    if sparse:
        sparse_settings = dataclasses.replace(Settings.from_env(), retention=KvcertRetention.SPARSE)
        cls = cls.configured(sparse_settings)
    try:
        wired = runtime.wire(config, kv_groups, usable_blocks, cls)
    except UnsupportedConfigError as why:
        raise Unreachable(f"the kvcert manager refuses it: {why}") from None
    # as the engine's hook swaps it in: requests digested for kvcert's manager as they are built
    wired.hasher = engine_hasher(wired.scheduler, wired.hasher)
    return wired


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


def drafter_modules(workload: Workload) -> int:
    """The drafter's modules: one per draft token for a multi-module MTP drafter (vLLM's
    `use_multi_module_mtp`: an MTP model file with more than one module and more than one
    draft token), else one head run once per draft."""
    return workload.spec_tokens if workload.drafter == "mtp" and workload.spec_tokens > 1 else 1


def _is_draft(layer: object) -> bool:
    return bool(getattr(layer, "draft", False))


def first_line(error: BaseException) -> str:
    """What went wrong in one line (for pydantic's errors, the first error's message, not its
    count)."""
    details = getattr(error, "errors", None)
    if callable(details):
        try:
            return str(details()[0]["msg"])
        except (TypeError, LookupError):
            pass
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
