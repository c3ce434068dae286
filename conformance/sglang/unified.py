"""A hit case as a state of SGLang's unified radix tree (full + SWA and/or Mamba components).

SGLang keeps every layer kind in one tree of token runs over one page size; a node holds
the full-attention KV of its run, the SWA KV of it (or a tombstone) and, for Mamba, the
recurrent state at its end (or a tombstone). A hit case's cached blocks become that tree
the way finished requests leave it, through SGLang's own operations only:

    the full group's cached prefix            inserted up to the last place a hit can end
    a live sliding-window run [a, b)          an insert of [0, b) with the SWA slots below a
                                              already released (`component_evicted_seqlens`)
    a state checkpoint at e                   an insert of [0, e) carrying a Mamba slot
    states an SWA insert had to carry         evicted through the tree's own Mamba LRU
    the lookup                                a `Req` whose `init_next_round_input` matches
                                              it, as the scheduler's prefill step does

Every insert carries a Mamba slot when the tree has the Mamba component (SGLang asserts
it), so a leaf always holds a state: full-attention blocks past the last state no hit can
read are left out. The tree is read back after the set-up and compared with the state
wanted; a difference is reported as a case SGLang cannot express, never as an answer.
"""

from __future__ import annotations

import math
import types
from array import array
from dataclasses import dataclass
from functools import cache
from typing import Any

# SGLang's extra-buffer strategy is the only one that runs Mamba over pages > 1.
NO_BUFFER_PAGE = 1
# The tree's sizes: every pool holds the case's tokens plus one page; a handful of requests.
STATE_SLOTS_PER_REQUEST = 3


@dataclass(frozen=True)
class Shape:
    """The tree a case needs: its page, the SWA window SGLang counts (W - 1), the state grid."""

    page: int
    exclusive_window: int | None
    state_grid: int | None  # tokens between possible checkpoints (lcm of page and state block)
    eagle: bool = False  # bigram keys: a position is keyed by its token and the next


@dataclass(frozen=True)
class Wanted:
    """What the tree must hold, in pages of the case's tokens."""

    pages: int  # the full-attention prefix inserted, in pages
    live_windows: tuple[tuple[int, int], ...]  # SWA runs [a, b) of pages holding KV
    states: tuple[int, ...]  # pages at whose end a Mamba state is held


@cache
def api() -> types.SimpleNamespace:
    """SGLang's unified tree, its pools, the scheduler's request and its server arguments."""
    from kvcert.conformance.sglang.adapter import prepare_import

    prepare_import()
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import (
        HybridLinearKVPool,
        HybridReqToTokenPool,
        MHATokenToKVPool,
        ReqToTokenPool,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    return types.SimpleNamespace(
        torch=torch,
        Mamba2CacheParams=Mamba2CacheParams,
        Mamba2StateShape=Mamba2StateShape,
        envs=envs,
        Req=Req,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator,
        EvictParams=EvictParams,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        HybridLinearKVPool=HybridLinearKVPool,
        HybridReqToTokenPool=HybridReqToTokenPool,
        MHATokenToKVPool=MHATokenToKVPool,
        ReqToTokenPool=ReqToTokenPool,
        RadixKey=RadixKey,
        SWAKVPool=SWAKVPool,
        ComponentType=ComponentType,
        UnifiedRadixCache=UnifiedRadixCache,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
        set_global_server_args_for_scheduler=set_global_server_args_for_scheduler,
    )


def _server_args(sg: types.SimpleNamespace, page: int) -> None:
    """Publish the scheduler's server arguments: SGLang's defaults but the page size.

    The Mamba chunk size comes from the model's config in a real server; 64 (FLA's chunk) is
    what SGLang's own fixtures preset. It moves only where a branching state would be saved,
    never what a lookup matches.
    """
    # "dummy" is SGLang's own no-model path: nothing is looked up on the Hub.
    args = sg.ServerArgs(model_path="dummy", page_size=page)
    args._mamba_cache_chunk_size = max(64, page)
    sg.set_global_server_args_for_scheduler(args)


def build(shape: Shape, tokens: int) -> tuple[Any, Any]:
    """(tree, request pool) over CPU pools of `tokens` slots, one tiny layer per kind."""
    sg = api()
    _server_args(sg, shape.page)
    capacity = tokens + shape.page
    dtype = sg.torch.float16
    components = [sg.ComponentType.FULL]
    extra_buffer = shape.state_grid is not None and shape.page > NO_BUFFER_PAGE
    if shape.state_grid is not None:
        with sg.envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            state = sg.Mamba2StateShape.create(
                tp_world_size=1,
                intermediate_size=16,
                n_groups=1,
                num_heads=1,
                head_dim=16,
                state_size=2,
                conv_kernel=2,
            )
            cache_params = sg.Mamba2CacheParams(shape=state, layers=[0])
        slots = capacity // shape.page + 2
        requests = sg.HybridReqToTokenPool(
            size=STATE_SLOTS_PER_REQUEST,
            mamba_size=slots * STATE_SLOTS_PER_REQUEST,
            mamba_spec_state_size=STATE_SLOTS_PER_REQUEST,
            max_context_len=capacity,
            device="cpu",
            enable_memory_saver=False,
            cache_params=cache_params,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=extra_buffer,
            speculative_num_draft_tokens=3,
        )
    else:
        requests = sg.ReqToTokenPool(
            size=STATE_SLOTS_PER_REQUEST,
            max_context_len=capacity,
            device="cpu",
            enable_memory_saver=False,
        )
    if shape.exclusive_window is not None:
        pool = sg.SWAKVPool(
            size=capacity,
            size_swa=capacity,
            page_size=shape.page,
            dtype=dtype,
            head_num=1,
            head_dim=1,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device="cpu",
        )
        allocator = sg.SWATokenToKVPoolAllocator(
            size=capacity,
            size_swa=capacity,
            page_size=shape.page,
            dtype=dtype,
            device="cpu",
            kvcache=pool,
            need_sort=False,
        )
        components.append(sg.ComponentType.SWA)
    else:
        if shape.state_grid is not None:
            pool = sg.HybridLinearKVPool(
                size=capacity,
                dtype=dtype,
                page_size=shape.page,
                head_num=1,
                head_dim=1,
                full_attention_layer_ids=[1],
                device="cpu",
                enable_memory_saver=False,
                mamba_pool=requests.mamba_pool,
            )
        else:
            pool = sg.MHATokenToKVPool(
                size=capacity,
                page_size=shape.page,
                dtype=dtype,
                head_num=1,
                head_dim=1,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
            )
        allocator = sg.TokenToKVPoolAllocator(
            size=capacity, dtype=dtype, device="cpu", kvcache=pool, need_sort=False
        )
    if shape.state_grid is not None:
        components.append(sg.ComponentType.MAMBA)  # SGLang's order: full, SWA, Mamba
    params = sg.CacheInitParams(
        disable=False,
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=shape.page,
        sliding_window_size=shape.exclusive_window,
        tree_components=tuple(components),
        enable_mamba_extra_buffer=extra_buffer,
        is_eagle=shape.eagle,
    )
    return sg.UnifiedRadixCache(params), requests


def _slots(tree: Any, shape: Shape, tokens: int) -> Any:
    """One request's KV slots for `tokens` tokens, as the allocator hands out pages."""
    sg = api()
    allocator = tree.token_to_kv_pool_allocator
    if shape.exclusive_window is None or shape.page == 1:
        return allocator.alloc(tokens)
    zero, span = sg.torch.tensor([0]), sg.torch.tensor([tokens])
    # prefix 0, length `tokens`, no previous page (last location -1).
    return allocator.alloc_extend(zero, zero, span, span, sg.torch.tensor([-1]), tokens)


def populate(
    tree: Any, requests: Any, shape: Shape, wanted: Wanted, tokens: array[int]
) -> str | None:
    """Insert `wanted` as finished requests leave it; None, or why the tree differs."""
    if wanted.pages == 0:
        return None
    sg = api()
    page = shape.page
    span = wanted.pages * page
    ahead = int(shape.eagle)  # a bigram key holds the token after its last position
    slots = _slots(tree, shape, span + ahead)
    released = {b: a for a, b in wanted.live_windows}
    ends = sorted(set(released) | set(wanted.states) | {wanted.pages})
    leaf = None
    for end in ends:
        extra: dict[str, Any] = {}
        if shape.exclusive_window is not None:
            below = released.get(end, end) * page
            extra["component_evicted_seqlens"] = {sg.ComponentType.SWA: below}
        if shape.state_grid is not None:
            extra["mamba_value"] = requests.mamba_allocator.alloc(1)
        leaf = tree.insert(
            sg.InsertParams(
                key=sg.RadixKey(tokens[: end * page + ahead]),
                value=slots[: end * page + ahead].clone(),
                **extra,
            )
        ).last_device_node
    surplus = [end for end in ends if shape.state_grid is not None and end not in wanted.states]
    if surplus:
        # Refresh the wanted states (a match ending at a state moves it to the front of
        # the Mamba LRU), then let the tree evict as many states as were carried in excess.
        for end in wanted.states:
            tree.match_prefix(_match_params(tokens[: end * page + ahead]))
        tree.evict(sg.EvictParams(num_tokens=0, mamba_num=len(surplus)))
    held = read_back(tree, shape, leaf)
    if held != wanted:
        return f"SGLang's inserts left {held}, not {wanted}"
    return None


def _match_params(key: array[int]) -> Any:
    sg = api()
    return sg.MatchPrefixParams(key=sg.RadixKey(key))


def read_back(tree: Any, shape: Shape, node: Any) -> Wanted:
    """The full prefix, SWA runs and states the tree holds on the path to `node`."""
    sg = api()
    page = shape.page
    core = tree.tree_core
    live: list[tuple[int, int]] = []
    states: list[int] = []
    pages = 0
    if node is not None and node != tree.root_node_handle():
        (path,) = core.collect_path_info([node])
        for info in path:
            start, end = info.path_start // page, info.path_end // page
            pages = max(pages, end)
            if shape.exclusive_window is not None and (
                core.get_component_device_value(info.node_id, sg.ComponentType.SWA) is not None
            ):
                if live and live[-1][1] == start:
                    live[-1] = (live[-1][0], end)
                else:
                    live.append((start, end))
            if shape.state_grid is not None and (
                core.get_component_device_value(info.node_id, sg.ComponentType.MAMBA) is not None
            ):
                states.append(end)
    return Wanted(pages, tuple(live), tuple(states))


def scheduler_match(tree: Any, requests: Any, tokens: array[int]) -> int:
    """The prefix the scheduler's prefill step takes for a request of `tokens`."""
    sg = api()
    request = sg.Req(
        rid="kvcert",
        origin_input_text="",
        origin_input_ids=tokens,
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=1),
    )
    requests.alloc([request])
    try:
        request.init_next_round_input(tree)
        return int(request.prefix_len)
    finally:
        requests.free(request)


def state_grid(page: int, state_block: int) -> int:
    """Where a hit can end on a state group: a multiple of its block and of the page."""
    return math.lcm(page, state_block)
