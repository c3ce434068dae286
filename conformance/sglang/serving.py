"""The tree and pools SGLang's server builds for serving a model, as the campaign and the
alloc suite drive them: its own constructors, from the server arguments a deployment
publishes (its `auto` Mamba strategy, the SWA pool's share, priority scheduling, EAGLE)."""

from __future__ import annotations

import types
from typing import Any

from kvcert.conformance.sglang import unified


def build_serving(
    page: int,
    tokens: int,
    rows: int,
    states: int = 0,
    extra_buffer: bool = False,
    *,
    exclusive_window: int | None = None,
    overlap: bool = False,
    eviction_policy: str = "lru",
    lazy: bool = False,
    priority: bool = False,
    speculative: dict[str, Any] | None = None,
    bigram_keys: bool | None = None,
) -> tuple[Any, Any]:
    """(tree, request pool) as the server builds them for serving a full-attention model, or
    with `states` > 0 a full-attention + Mamba hybrid under the strategy SGLang's `auto`
    resolves to (synchronously: no buffer at page 1, the extra buffer above; under
    `overlap` scheduling, the extra buffer),
    or with `exclusive_window` a full-attention + sliding-window hybrid (SGLang's
    `sliding_window_size`, W - 1): `rows` request rows, `tokens` KV slots besides the
    padding page, the allocator its configurator picks (token slots at page 1, pages above;
    for SWA its two-pool allocator, the SWA pool `swa_full_tokens_ratio` of the full one)
    and the tree its registry picks (the unified tree with a FULL (+ MAMBA or SWA) component
    from 0.5.19, else RadixCache / MambaRadixCache / SWARadixCache), `priority`: the server's
    --enable-priority-scheduling, `speculative` its EAGLE flags (the tree keys bigrams unless
    `bigram_keys` says otherwise). States are float32: a state's value is an exact integer."""
    sg = unified.api()
    if states and extra_buffer != (overlap or page > unified.NO_BUFFER_PAGE):
        raise unified.Inexpressible(
            "SGLang's `auto` strategy runs a Mamba hybrid without the extra buffer only at "
            "page 1 and without overlap scheduling"
        )
    if lazy and not extra_buffer:
        raise unified.Inexpressible("the lazy strategy is a variant of the extra buffer")
    chosen = "extra_buffer_lazy" if lazy else "extra_buffer" if extra_buffer else "no_buffer"
    strategy = {"mamba_radix_cache_strategy": chosen}
    flags = {"disable_overlap_schedule": not overlap, "enable_priority_scheduling": priority}
    unified.server_args(sg, page, **flags, **(strategy if states else {}), **(speculative or {}))
    capacity = tokens + page
    drafts = (speculative or {}).get("speculative_num_draft_tokens")  # a state per draft
    fields: dict[str, Any] = {"disable": False, "page_size": page, "is_eagle": bool(speculative)}
    fields["is_eagle"] = fields["is_eagle"] if bigram_keys is None else bigram_keys
    if eviction_policy != "lru":  # `--radix-eviction-policy`, whose default is lru
        fields["eviction_policy"] = eviction_policy
    if exclusive_window is not None:
        return _swa_serving(
            sg, fields, capacity, rows, exclusive_window, states=states,
            extra_buffer=extra_buffer, overlap=overlap, lazy=lazy, drafts=drafts,
        )  # fmt: skip
    requests = _requests(
        sg, fields, rows=rows, states=states, capacity=capacity, extra_buffer=extra_buffer,
        overlap=overlap, lazy=lazy, drafts=drafts,
    )  # fmt: skip
    if states:
        pool = unified.hybrid_attention_pool(sg, capacity, page, requests)
    else:
        pool = unified.attention_pool(sg, capacity, page)
    if page == 1:
        allocator = unified.token_allocator(sg, capacity, pool)
    else:
        allocator = sg.PagedTokenToKVPoolAllocator(
            size=capacity, page_size=page, dtype=sg.torch.float16, device="cpu", kvcache=pool,
            need_sort=False,
        )  # fmt: skip
    fields["req_to_token_pool"] = requests
    fields["token_to_kv_pool_allocator"] = allocator
    if sg.unified_by_default:
        components = (sg.ComponentType.FULL,) + ((sg.ComponentType.MAMBA,) if states else ())
        fields["tree_components"] = components
        tree_class = sg.UnifiedRadixCache
    else:
        tree_class = sg.MambaRadixCache if states else sg.RadixCache
    return tree_class(sg.CacheInitParams(**fields)), requests


def _swa_serving(
    sg: types.SimpleNamespace,
    fields: dict[str, Any],
    capacity: int,
    rows: int,
    window: int,
    *,
    states: int,
    extra_buffer: bool = False,
    overlap: bool = False,
    lazy: bool = False,
    drafts: int | None = None,
) -> tuple[Any, Any]:
    """A full-attention + sliding-window hybrid (with `states` > 0 a Mamba state too, under
    the strategy build_serving resolved): the full pool of `capacity` slots, the SWA pool
    the configurator sizes (`swa_full_tokens_ratio` of it, whole pages), which it refuses
    below the prefill admission floor (window + page)."""
    page = fields["page_size"]
    ratio = unified.swa_full_tokens_ratio(sg)
    swa = int(capacity * ratio) // page * page
    if window + page >= swa:
        raise unified.Inexpressible(
            f"an SWA pool of {swa} slots admits no request (window {window})"
        )
    fields["token_to_kv_pool_allocator"] = unified.swa_allocator(sg, capacity, swa, page)
    if states and not sg.unified_by_default:
        raise unified.Inexpressible("this release's server builds SWARadixCache: no state")
    requests = _requests(
        sg, fields, rows=rows, states=states, capacity=capacity, extra_buffer=extra_buffer,
        overlap=overlap, lazy=lazy, drafts=drafts,
    )  # fmt: skip
    fields["req_to_token_pool"] = requests
    fields["sliding_window_size"] = window
    if sg.unified_by_default:
        components = (sg.ComponentType.FULL, sg.ComponentType.SWA)
        fields["tree_components"] = components + ((sg.ComponentType.MAMBA,) if states else ())
        return sg.UnifiedRadixCache(sg.CacheInitParams(**fields)), requests
    return sg.SWARadixCache(sg.CacheInitParams(**fields)), requests


def _requests(
    sg: types.SimpleNamespace,
    fields: dict[str, Any],
    *,
    rows: int,
    states: int,
    capacity: int,
    extra_buffer: bool,
    overlap: bool,
    lazy: bool,
    drafts: int | None,
) -> Any:
    """The requests' token tables: with `states` > 0 SGLang's hybrid pool (float32 states,
    a state per draft token under EAGLE) under the strategy resolved, whose extra-buffer
    flags the tree's `fields` take too; else the plain pool."""
    if not states:
        return sg.ReqToTokenPool(
            size=rows, max_context_len=capacity, device="cpu", enable_memory_saver=False
        )
    fields["enable_mamba_extra_buffer"] = extra_buffer
    if lazy:
        fields["enable_mamba_extra_buffer_lazy"] = True
    return unified.hybrid_request_pool(
        sg, rows=rows, states=states, capacity=capacity, extra_buffer=extra_buffer,
        ssm_dtype="float32", overlap=overlap, lazy=lazy, draft_tokens=drafts,
    )  # fmt: skip
