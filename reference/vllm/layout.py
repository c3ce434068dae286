"""vLLM's KV-cache groups as the reference allocator's configuration.

Supported group kinds (vLLM 0.33.0): full attention (`FullAttentionSpec`, `MLAAttentionSpec`),
sliding window (`SlidingWindowSpec`, `SlidingWindowMLASpec`), chunked local attention
(`ChunkedLocalAttentionSpec`), also when wrapped in `UniformTypeKVCacheSpecs`, and Mamba/GDN
state (`MambaSpec`) in vLLM's `align` cache mode, where the worker copies the state from the
previous step's column into this step's (kvcert mode align: ALLOC-HOLD-1 holds both), with
or without the state the kernel saves inside a prefill chunk (`num_prefill_checkpoint_blocks`,
CKPT-INNER-1: `kvcert.reference.vllm.checkpoints`), and with the blocks MTP/EAGLE drafts'
states are written into (`num_speculative_blocks`, ALLOC-SPEC-1). Every other spec (cross
attention, encoder-only, sink, replayed or circular windows, HiSparse) and every other state
setting (cache modes none and all) is refused by name: serving it would
need semantics this integration does not implement yet, and a silently wrong table would
corrupt outputs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    GroupConfig,
    Kind,
    MambaMode,
    Retention,
    Visibility,
    hit_alignment,
)
from kvcert.reference.errors import ConfigError, KVCacheError
from kvcert.reference.retention import BOUNDED
from kvcert.reference.tails import unit_refusal
from kvcert.reference.vllm.settings import Settings

_log = logging.getLogger(__name__)
_SAID: set[str] = set()  # the warnings already logged (`_say_once`)


class UnsupportedConfigError(ConfigError):
    """A vLLM configuration the kvcert-backed manager does not serve (it says what to change)."""


class IntegrationError(KVCacheError):
    """The scheduler asked for something the manager's state contradicts (a bug in the
    caller or here: never served silently)."""


class CutError(IntegrationError, AssertionError):
    """A lookup result cut where no hit can end (`truncate_computed_blocks`). Also an
    AssertionError: vLLM's manager asserts this precondition, so a caller written against
    it catches that; kvcert says which group and why."""


def _kinds() -> dict[type, Kind]:
    from vllm.v1 import kv_cache_interface as specs  # noqa: PLC0415

    return {
        specs.FullAttentionSpec: Kind.FULL,
        specs.MLAAttentionSpec: Kind.FULL,
        specs.SlidingWindowSpec: Kind.SLIDING_WINDOW,
        specs.SlidingWindowMLASpec: Kind.SLIDING_WINDOW,
        specs.ChunkedLocalAttentionSpec: Kind.CHUNKED_LOCAL,
        specs.MambaSpec: Kind.MAMBA,
    }


def state_spec_types() -> tuple[type, ...]:
    return tuple(t for t, kind in _kinds().items() if kind is Kind.MAMBA)


def _state_mode(index: int, spec: Any) -> MambaMode:
    """The reference mode of a vLLM state group, or why it is refused."""
    mode = getattr(spec, "mamba_cache_mode", "none")
    if mode != "align":
        raise UnsupportedConfigError(
            f"KV-cache group {index} is a state group in mamba_cache_mode={mode!r}; the kvcert "
            "manager serves mode 'align' only (vLLM's worker keeps a mode-'none' state in "
            "place in column 0, where kvcert moves it with the running state): enable prefix "
            "caching with --mamba-cache-mode align, or drop --scheduler-cls"
        )
    return MambaMode.ALIGN


def _members(spec: Any) -> list[Any]:
    inner = getattr(spec, "kv_cache_specs", None)
    return list(inner.values()) if isinstance(inner, dict) else [spec]


def group_config(index: int, group: Any, draft: bool) -> GroupConfig:
    """One vLLM KVCacheGroupSpec as a reference group (exact spec types: a subclass such as
    `RSWASpec` or `SinkFullAttentionSpec` changes what is read and is refused)."""
    kinds = _kinds()
    spec = group.kv_cache_spec
    members = _members(spec)
    unknown = sorted({type(m).__name__ for m in members if type(m) not in kinds})
    found = {kinds[type(m)] for m in members if type(m) in kinds}
    if unknown or len(found) != 1:
        raise UnsupportedConfigError(
            f"KV-cache group {index} holds {', '.join(unknown) or 'mixed kinds'}; the kvcert "
            "manager serves full attention, sliding window, chunked local attention and state "
            "(Mamba/GDN) groups only: drop --scheduler-cls to use vLLM's own manager for this "
            "model"
        )
    (kind,) = found
    cacheable = bool(getattr(spec, "prefix_cacheable", True))
    replayed = int(getattr(spec, "prefix_replay_tokens", 0))
    if not cacheable or replayed:
        raise UnsupportedConfigError(
            f"KV-cache group {index} is not prefix-cacheable in vLLM's terms (bounded replay): "
            "the kvcert manager would serve hits from it; drop --scheduler-cls for this model"
        )
    first = members[0]
    window = getattr(first, "sliding_window", None) if kind is Kind.SLIDING_WINDOW else None
    chunk = getattr(first, "attention_chunk_size", None) if kind is Kind.CHUNKED_LOCAL else None
    if any(
        getattr(m, "sliding_window", window) != window
        or getattr(m, "attention_chunk_size", chunk) != chunk
        for m in members
    ):
        raise UnsupportedConfigError(f"KV-cache group {index} mixes windows or chunk sizes")
    if kind is Kind.MAMBA and draft:
        raise UnsupportedConfigError(
            f"KV-cache group {index} is a state group marked as holding draft layers; kvcert "
            "keys draft layers in attention groups only: drop --scheduler-cls for this model"
        )
    return GroupConfig(
        kind,
        spec.block_size,
        window=window or 0,
        chunk=chunk or 0,
        mode=_state_mode(index, spec) if kind is Kind.MAMBA else None,
        draft=draft,
        name=f"vllm-group-{index}",
        # MTP/EAGLE on a state model: the runner writes each draft's state into a block of
        # its own after the running state's (ALLOC-SPEC-1)
        speculative_blocks=int(getattr(first, "num_speculative_blocks", 0) or 0)
        if kind is Kind.MAMBA
        else 0,
    )


def retention_profile(
    interval: object, groups: tuple[GroupConfig, ...], default: Retention | None
) -> dict[str, Any]:
    """vLLM's prefix-cache retention interval as kvcert's retention profile (RET-SPARSE-1).

    vLLM's meaning: None keeps every block (dense); 0 keeps only the blocks a replay or a
    junction needs; N > 0 also every multiple of N. `default` is what None and 0 become
    instead: the start-up value, where vLLM's default 0 cannot be told from a chosen one and
    kvcert's own default profile (the settings', dense unless chosen) applies. An interval
    that cannot take effect is refused, as vLLM refuses it: a positive one needs a
    sliding-window or state group (full attention and chunked local attention cache densely
    in vLLM)."""
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int) or interval < 0
    ):
        raise UnsupportedConfigError(
            f"prefix_cache_retention_interval must be None (dense) or a non-negative "
            f"integer, got {interval!r}"
        )
    alignment = hit_alignment(groups)
    if interval and interval % alignment:
        raise UnsupportedConfigError(
            f"prefix_cache_retention_interval={interval} must be a multiple of "
            f"scheduler_block_size ({alignment}, the lcm of the block sizes): no hit could "
            "end at it"
        )
    if interval and not any(g.kind in (Kind.SLIDING_WINDOW, Kind.MAMBA) for g in groups):
        raise UnsupportedConfigError(
            f"prefix_cache_retention_interval={interval} has no effect: the model has no "
            "sliding-window or Mamba group; set it to 0"
        )
    if interval:
        return {"retention": Retention.SPARSE, "retention_interval": interval}
    if default is not None:
        notice = retention_notice(interval, groups, default)
        if notice is not None:
            _say_once(notice)
        return {"retention": default, "retention_interval": 0}
    sparse = interval == 0
    return {"retention": Retention.SPARSE if sparse else Retention.DENSE, "retention_interval": 0}


def retention_notice(
    interval: object, groups: tuple[GroupConfig, ...], default: Retention
) -> str | None:
    """What the operator is told when vLLM's interval 0 (latest-only, vLLM's default) is
    served as dense retention, kvcert's default (None where retention changes nothing: no
    sliding-window, chunked local or state group), so the flag is never read silently."""
    if interval != 0 or default is not Retention.DENSE:
        return None
    if not any(g.kind in BOUNDED for g in groups):
        return None
    return (
        "vLLM's prefix_cache_retention_interval 0 (latest-only, its default) is served as "
        "kvcert's dense retention: every hit latest-only keeps and more, for more cached "
        "(evictable) window and state blocks; KVCERT_RETENTION=sparse chooses kvcert's sparse "
        "retention (RET-SPARSE-1)"
    )


def refuse_unsupported(
    *,
    shared_prefix_checkpoint: bool,
    dcp_world_size: int,
    pcp_world_size: int,
    metrics_collector: Any,
) -> None:
    """Refuse at start-up the manager settings the kvcert manager does not serve (typed, with
    the flag that turns each off), rather than run without them."""
    refused = {
        "shared-prefix state checkpoints": (
            shared_prefix_checkpoint,
            "turn --enable-mamba-shared-prefix-checkpoint off",
        ),
        "dcp_world_size > 1": (dcp_world_size > 1, "use decode context parallel size 1"),
        "pcp_world_size > 1": (pcp_world_size > 1, "use prefill context parallel size 1"),
        "a KV-cache metrics collector": (
            metrics_collector is not None,
            "turn KV-cache residency metrics off",
        ),
    }
    for what, (on, fix) in refused.items():
        if on:
            raise UnsupportedConfigError(f"the kvcert manager does not support {what}: {fix}")


def unit_config(
    config: CacheConfig, unit: int | None, hash_block_size: int, groups: Sequence[Any]
) -> CacheConfig:
    """`config` under the hit-granularity profile `unit U` where vLLM serves hits inside
    blocks: with `--prefix-match-unit` below the lcm of the block sizes (HIT-UNIT-1), served
    (HIT-UNIT-1..5, ALLOC-UNIT-1..4) or refused where the profile is not defined, never
    ignored; without it, where vLLM 0.33 hits every hash block on its own
    (`vllm_hits_inside`), served at the hash block wherever the profile is defined, so that
    a prompt shorter than such a block still hits. Where it is not, hits stay whole blocks,
    coarser than vLLM's, which is said once per process with the rule that stands in the
    way."""
    alignment = config.alignment
    if unit is not None and unit < alignment:
        served, why_not = _unit_served(config, unit)
        if why_not is not None:
            raise UnsupportedConfigError(
                f"--prefix-match-unit {unit}: {why_not}; unset it, set it to {alignment}, or "
                "drop --scheduler-cls"
            )
        return served
    if (
        unit is not None
        or hash_block_size >= alignment
        or not vllm_hits_inside(groups, hash_block_size)
    ):
        return config
    served, why_not = _unit_served(config, hash_block_size)
    if why_not is None:
        return served
    _say_once(
        f"vLLM would serve prefix-cache hits every {hash_block_size} tokens on this model; the "
        f"kvcert manager serves them at whole blocks of every group (every {alignment} "
        f"tokens): {why_not}"
    )
    return config


def _say_once(warning: str) -> None:
    """Logs `warning` the first time this process meets it (each manager built says it)."""
    if warning not in _SAID:
        _SAID.add(warning)
        _log.warning(warning)


def vllm_hits_inside(groups: Sequence[Any], hash_block_size: int) -> bool:
    """Whether vLLM's engine core resolves this model's hits to the hash block on its own (its
    `resolve_cache_hit_alignment_tokens`): several groups, an align-mode state group with
    longer blocks, and every other cacheable group's manager able to look up hash blocks
    (`partial_hash_hits_enabled` with the managers' classes)."""
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled  # noqa: PLC0415
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry  # noqa: PLC0415

    if len(groups) <= 1:
        return False
    classes = [
        KVCacheSpecRegistry.get_manager_class(g.kv_cache_spec, getattr(g, "role", None))
        for g in groups
    ]
    return bool(partial_hash_hits_enabled(groups, hash_block_size, manager_classes=classes))


def _unit_served(config: CacheConfig, unit: int) -> tuple[CacheConfig, str | None]:
    """`config` with hit_unit `unit`, and why the manager cannot serve it (None: it can)."""
    try:
        served = dataclasses.replace(config, hit_unit=unit)
    except ConfigError as why:
        return config, str(why)
    return served, unit_refusal(served)


def cache_config(
    kv_cache_config: Any,
    max_model_len: int,
    drafting: bool,
    settings: Settings,
    draft_reach: int = 1,
) -> CacheConfig:
    """The reference configuration for vLLM's planned groups: the same groups in the same
    order (group i's table is vLLM's group i), the same `num_blocks` (block 0 is the null
    block in both). Draft groups are the ones vLLM marks (`is_eagle_group`, or a spec's
    `is_draft`); when a drafter runs and nothing is marked, every group is treated as holding
    draft layers, as vLLM's EAGLE block drop does (`drafting`: a drafter runs). kvcert
    keys their blocks exactly (HIT-SPEC-1) whatever vLLM's flags
    say, unless `settings.speculative` asks for the drop: exact keys are sound for the
    drafter's KV, vLLM's drop is not (kvcert fuzz finds stale draft KV under it).
    `draft_reach`: the tokens after a position its draft KV reads (vLLM's
    `num_prefill_lookahead_tokens`: k for k MTP modules). A positive
    `--prefix-cache-retention-interval` is honoured as sparse retention with that interval;
    None and vLLM's default 0 leave the retention to `settings` (dense unless chosen;
    `retention_profile`). A max_model_len no hit fits under (at most the hit alignment) is
    served without reuse, with a warning: the limit is left to vLLM's scheduler."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise UnsupportedConfigError("the model has no KV-cache groups: nothing to manage")
    marked = [
        bool(getattr(g, "is_eagle_group", False))
        or any(getattr(m, "is_draft", False) for m in _members(g.kv_cache_spec))
        for g in groups
    ]
    if drafting and not any(marked):  # draft layers are attention layers: never a state group
        states = state_spec_types()
        marked = [not isinstance(g.kv_cache_spec, states) for g in groups]
    configs = tuple(
        group_config(i, g, draft) for i, (g, draft) in enumerate(zip(groups, marked, strict=True))
    )
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    retention = retention_profile(interval, configs, settings.retention)
    alignment = hit_alignment(configs)
    limit: int | None = max_model_len
    if max_model_len <= alignment:  # no request is long enough to reuse a whole block
        _say_once(
            f"every prefix hit is a multiple of {alignment} tokens and max_model_len is "
            f"{max_model_len}: prefix caching can never hit with these block sizes; the kvcert "
            "manager serves the model without reuse"
        )
        limit = None  # the spec refuses a limit no hit fits under; vLLM's scheduler keeps it
    try:
        return CacheConfig(
            configs,
            kv_cache_config.num_blocks,
            speculative=(settings.speculative or DraftKeying.EXACT) if any(marked) else None,
            draft_reach=draft_reach if any(marked) else 1,
            max_model_len=limit,
            hash_algorithm=settings.hash_algorithm,
            eviction=settings.eviction,
            visibility=settings.visibility or Visibility.STEP_END,
            **retention,
        )
    except ConfigError as why:
        raise UnsupportedConfigError(f"{why} (or drop --scheduler-cls)") from why
