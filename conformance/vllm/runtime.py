"""vLLM wired the way its EngineCore wires a served model: config, planner, scheduler, hasher.

Runs inside a vLLM release venv; the one place that imports vLLM. Shared by the adapter, its
planned modes and the scheduler campaign, so that all of them hand vLLM's own code the same
things a real model would: per-layer KV-cache specs go through the release's
own planner (`get_global_kv_cache_groups` on 0.33, `get_kv_cache_groups` before), speculative
decoding comes from a real `SpeculativeConfig` (method "eagle", the weightless model as its
draft), the scheduler class from `SchedulerConfig.get_scheduler_cls()`, block sizes from
`resolve_kv_cache_block_sizes` and request hashes from `get_request_block_hasher`. Which group
gets EAGLE handling, whether blocks are dropped or hashed with lookahead, is then decided by
vLLM, never by kvcert.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Vllm:
    """vLLM's modules and the release-dependent functions the adapter, the planned modes
    and the campaign call (one import of vLLM, about 6 s, for all of them)."""

    torch: Any
    SamplingParams: Any
    LoRARequest: Any
    CacheConfig: Any
    DeviceConfig: Any
    ParallelConfig: Any
    SchedulerConfig: Any
    SpeculativeConfig: Any
    VllmConfig: Any
    kvi: Any  # vllm.v1.kv_cache_interface
    KVCacheManager: Any
    sha256: Any
    utils: Any  # vllm.v1.core.kv_cache_utils
    groups_of: Any  # the release's planner of KV-cache groups
    planner: str  # its name: get_global_kv_cache_groups (0.33) or get_kv_cache_groups
    config_of: Any  # get_kv_cache_config_from_groups
    record_layout: Any  # records the KV layout before planning (0.33; a no-op before)
    ModelRunnerOutput: Any
    EMPTY: Any  # EMPTY_MODEL_RUNNER_OUTPUT
    DraftTokenIds: Any
    Request: Any
    RequestStatus: Any
    StructuredOutputManager: Any


@cache
def vllm() -> Vllm:
    """vLLM's modules, imported once; every place that drives vLLM asks here."""
    import torch
    from vllm import SamplingParams
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.lora.request import LoRARequest
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.attention.backends import utils as backends
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.outputs import (
        EMPTY_MODEL_RUNNER_OUTPUT,
        DraftTokenIds,
        ModelRunnerOutput,
    )
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    try:
        from vllm.utils.hashing import sha256
    except ImportError:  # releases before the utils split
        from vllm.utils import sha256
    try:  # the planner moved out of kv_cache_utils after 0.28
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:
        planning = kv_cache_utils
    # 0.33 groups the whole model and flags EAGLE groups in get_global_kv_cache_groups; before,
    # get_kv_cache_groups did both (its flagging only for DeepSeek-V4's MTP layer)
    groups_of = getattr(planning, "get_global_kv_cache_groups", None)
    planner = "get_global_kv_cache_groups"
    if groups_of is None:
        groups_of, planner = planning.get_kv_cache_groups, "get_kv_cache_groups"
    logging.getLogger("vllm").setLevel(logging.ERROR)
    kv_cache_utils.init_none_hash(sha256)
    _keep_hybrid_manager()
    return Vllm(
        torch, SamplingParams, LoRARequest, CacheConfig, DeviceConfig, ParallelConfig,
        SchedulerConfig, SpeculativeConfig, VllmConfig, kvi, KVCacheManager, sha256,
        kv_cache_utils, groups_of, planner, planning.get_kv_cache_config_from_groups,
        getattr(backends, "record_kv_cache_layout", lambda *_: None), ModelRunnerOutput,
        EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, Request, RequestStatus,
        StructuredOutputManager,
    )  # fmt: skip


def _keep_hybrid_manager() -> None:
    """Let VllmConfig keep the hybrid KV-cache manager, as on every platform models are served on.

    Without vllm._C (a CPU-only install of a CUDA wheel) vLLM falls back to its
    UnspecifiedPlatform, the one platform whose `support_hybrid_kv_cache()` is False; then
    VllmConfig turns the hybrid manager off and the planner promotes every sliding-window layer
    to full attention, one group for the whole model. CUDA, ROCm, XPU and CPU platforms all
    answer True, so this stands in for them; VllmConfig's own rules (chunked local attention,
    KV connectors) still decide."""
    from vllm.platforms import current_platform

    if not current_platform.support_hybrid_kv_cache():
        current_platform.support_hybrid_kv_cache = lambda: True


def marks_draft_layers() -> bool:
    """Whether this release's layer specs can say "this layer is the drafter's" (`is_draft`,
    0.33), so that its planner flags only the groups holding draft layers."""
    return "is_draft" in {f.name for f in dataclasses.fields(vllm().kvi.KVCacheSpec)}


def has_lookahead_hashes() -> bool:
    """Whether this release can hash each block together with the tokens the drafter reads
    after it (0.33's default for EAGLE, instead of dropping the last matched block)."""
    fields = inspect.signature(vllm().SpeculativeConfig).parameters
    return "disable_lookahead_block_hashes" in fields


def has_multi_module_mtp() -> bool:
    """Whether this release's KV-cache manager knows a drafter that reads more than one token
    ahead (multi-module MTP, vllm#50062: `num_prefill_lookahead`); before it an MTP drafter
    of k tokens is one module run k times, whose draft KV depends on the next token only."""
    init = vllm().KVCacheManager.__init__
    return "num_prefill_lookahead" in inspect.signature(init).parameters


@cache
def _model_config(max_len: int, attention_chunk_size: int | None = None) -> Any:
    """One weightless model config per shape (older releases probe the hub on every build,
    with retries that cost seconds)."""
    return weightless_model(max_len, attention_chunk_size)


class Unsupported(Exception):
    """The case needs something this vLLM release cannot express."""


class NoSuchFlag(Exception):
    """The release has no flag for the speculative behaviour asked for."""


def speculative_config(settings: Settings) -> Any:
    """The drafter's config, built once per model shape, profile and flags: building one loads
    the draft's model config, which older releases look up on the hub with retries that cost
    seconds."""
    return _speculative_config(
        settings.max_len, settings.attention_chunk_size, settings.speculative,
        settings.spec_tokens, tuple(sorted(settings.flags_for("speculative").items())),
        settings.drafter,
    )  # fmt: skip


@cache
def _speculative_config(  # noqa: PLR0917 - one cache key per argument
    max_len: int,
    attention_chunk_size: int | None,
    profile: str | None,
    spec_tokens: int,
    flags: tuple[tuple[str, Any], ...],
    drafter: str = "eagle",
) -> Any:
    """An EAGLE drafter as a user configures one (`--speculative-config '{"method": "eagle",
    "model": ..., "num_speculative_tokens": N}'`), the weightless model as its draft; with
    `drafter` "mtp", a multi-module MTP drafter (method "mtp", a weightless draft model file
    declaring one module per draft token, so module i drafts token i).
    `drop`: the last matched block is dropped (0.33: `disable_lookahead_block_hashes`, the
    release's documented fallback; before 0.33 the only behaviour). `exact`: the drafter's
    tokens after each block are in the block's hash (0.33's default), else NoSuchFlag."""
    v = vllm()
    model = _model_config(max_len, attention_chunk_size)
    options: dict[str, Any] = {}
    if has_lookahead_hashes():
        options["disable_lookahead_block_hashes"] = profile == "drop"
    elif profile == "exact":
        raise NoSuchFlag("this release has no lookahead block hashes (exact draft keying)")
    draft = model.model
    if drafter == "mtp":
        draft = weightless_mtp_drafter(max_len, spec_tokens)
    return v.SpeculativeConfig(
        method=drafter,
        model=draft,
        num_speculative_tokens=spec_tokens,
        target_model_config=model,
        target_parallel_config=v.ParallelConfig(),
        **{**options, **dict(flags)},
    )


@dataclass(frozen=True)
class Settings:
    """The engine arguments the campaign and the adapter vary."""

    max_len: int
    budget: int = 2048  # max_num_batched_tokens
    block_size: int = 16  # --block-size: the attention layers' block before page unification
    policy: str = "fcfs"
    async_scheduling: bool | None = False  # None: left to vLLM (its SchedulerConfig default)
    long_prefill: int = 0
    speculative: str | None = None  # None | drop | exact (a kvcert profile)
    spec_tokens: int = 1  # num_speculative_tokens, with `speculative`
    drafter: str = "eagle"  # the method: eagle, or mtp (one MTP module per draft token)
    max_num_seqs: int = 8
    attention_chunk_size: int | None = None  # the model's, when it has chunked local layers
    # other engine arguments by config ("cache", "scheduler", "speculative", or "env" for a
    # VLLM_* variable) and field: how kvcert.conformance.vllm.trace_causes finds the flag a
    # difference follows
    flags: tuple[tuple[str, str, Any], ...] = ()

    def flags_for(self, config: str) -> dict[str, Any]:
        return {name: value for where, name, value in self.flags if where == config}


def engine_config(settings: Settings) -> Any:
    """The VllmConfig `vllm serve` builds from these arguments."""
    v = vllm()
    extra: dict[str, Any] = {}
    if settings.speculative is not None:
        extra["speculative_config"] = speculative_config(settings)
    with environment(settings.flags_for("env")):
        config = _vllm_config(settings, extra)
    # the engine core resolves one layout from the attention backends; the page math and the
    # scheduler ignore which
    v.record_layout(config.cache_config, "LBNHC")
    return config


@contextmanager
def environment(variables: dict[str, Any]) -> Iterator[None]:
    """vLLM's environment variables (VLLM_*) set while its config reads them."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update({name: str(value) for name, value in variables.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _vllm_config(settings: Settings, extra: dict[str, Any]) -> Any:
    v = vllm()
    return v.VllmConfig(
        model_config=_model_config(settings.max_len, settings.attention_chunk_size),
        device_config=v.DeviceConfig(device="cpu"),
        cache_config=v.CacheConfig(
            block_size=settings.block_size,
            enable_prefix_caching=True,
            **settings.flags_for("cache"),
        ),
        scheduler_config=v.SchedulerConfig(
            max_model_len=settings.max_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=max(settings.budget, settings.max_num_seqs, 16),
            long_prefill_token_threshold=settings.long_prefill,
            max_num_seqs=settings.max_num_seqs,
            policy=settings.policy,
            **(
                {}
                if settings.async_scheduling is None
                else {"async_scheduling": settings.async_scheduling}
            ),
            **settings.flags_for("scheduler"),
        ),
        **extra,
    )


def plan(config: Any, specs: dict[str, Any]) -> list[Any]:
    """The release's own KV-cache groups (and EAGLE flags) for these per-layer specs."""
    v = vllm()
    if v.planner == "get_global_kv_cache_groups":
        return list(v.groups_of(config, [dict(specs)]))
    return list(v.groups_of(config, dict(specs)))


@dataclass
class Wired:
    """A scheduler as EngineCore builds it, and what a request needs to join it."""

    scheduler: Any
    groups: list[Any]  # the KVCacheGroupSpecs the scheduler's manager was given
    hasher: Any  # Request(block_hasher=...)
    hash_block: int = 16  # the tokens per block hash


def wire(
    config: Any, kv_groups: list[Any], usable_blocks: int, cls: Any = None, per_group: bool = True
) -> Wired:
    """A scheduler over a pool of `usable_blocks` blocks (per group unless `per_group` is
    false), plus the null block."""
    v = vllm()
    usable = usable_blocks * max(len(kv_groups), 1) if per_group else usable_blocks
    page = max(g.kv_cache_spec.page_size_bytes for g in kv_groups)
    size = max(len(g.layer_names) for g in kv_groups)
    kv = v.config_of(config, kv_groups, (usable + 1) * page * size)
    kv.num_blocks = usable + 1
    kv = v.utils.generate_scheduler_kv_cache_config([kv])  # as EngineCore hands it over
    config.cache_config.num_gpu_blocks = usable + 1  # what the engine core sets
    resolve = getattr(v.utils, "resolve_kv_cache_block_sizes", None)
    if resolve is not None:
        scheduler_block, hash_block = resolve(kv, config)
        extra = {"hash_block_size": hash_block}
    else:  # <= 0.19: one block size, cache_config's, for scheduling and hashing
        scheduler_block = hash_block = config.cache_config.block_size
        extra = {}
    alignment = getattr(v.utils, "resolve_cache_hit_alignment_tokens", None)
    if alignment is not None:  # 0.33: where hits land, read by the runner and connectors
        kv.hash_block_size = hash_block
        kv.cache_hit_alignment_tokens = alignment(kv, config, scheduler_block, hash_block)
    cls = cls or config.scheduler_config.get_scheduler_cls()
    scheduler = cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=v.StructuredOutputManager(config),
        block_size=scheduler_block,
        **extra,
    )
    lookahead = getattr(config, "num_hash_lookahead_tokens", None)  # an argument from 0.33
    hasher = v.utils.get_request_block_hasher(
        hash_block, v.sha256, *(() if lookahead is None else (lookahead,))
    )
    return Wired(scheduler, list(kv.kv_cache_groups), hasher, hash_block)


def weightless_model(max_model_len: int, attention_chunk_size: int | None = None) -> Any:
    """vLLM's ModelConfig for a one-layer Llama config with no weights, written to a temporary
    directory: vLLM's scheduler and page planner read only shapes, so the scripts under
    engines/vllm/ that drive them need no model download. `attention_chunk_size` is what a
    model with chunked local attention declares (VllmConfig's hybrid-manager rules read it)."""
    from vllm.config import ModelConfig

    extra = {} if attention_chunk_size is None else {"attention_chunk_size": attention_chunk_size}
    path = _weightless_file(max_model_len, "llama", **extra)
    return ModelConfig(
        model=path, skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32"
    )


def weightless_mtp_drafter(max_model_len: int, modules: int) -> str:
    """The path of a weightless model whose file declares `modules` MTP modules (a MiMo-style
    Qwen2 config, one of the architectures vLLM's SpeculativeConfig gives a multi-module MTP
    drafter), for `--speculative-config '{"method": "mtp", "model": PATH, ...}'`."""
    return _weightless_file(
        max_model_len,
        "mtp",
        architectures=["MiMoForCausalLM"],
        model_type="qwen2",
        num_nextn_predict_layers=modules,
    )


def _weightless_file(max_model_len: int, name: str, **overrides: Any) -> str:
    """A temporary directory holding a one-layer config.json with no weights."""
    shape = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 1000,
        "max_position_embeddings": max_model_len,
        **overrides,
    }
    path = Path(tempfile.mkdtemp(prefix=f"kvcert-weightless-{name}-"))
    (path / "config.json").write_text(json.dumps(shape), encoding="utf-8")
    return str(path)
