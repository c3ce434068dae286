"""A hit case as a state of the radix tree SGLang's server builds for the case's model.

SGLang keeps every layer kind in one tree of token runs over one page size: from 0.5.19 the
unified tree (components FULL, SWA, MAMBA), up to 0.5.15 one tree per model kind
(RadixCache, SWARadixCache, MambaRadixCache). A node holds the full-attention KV of its run,
the SWA KV of it (or a tombstone) and, for Mamba, the recurrent state at its end (or a
tombstone). A hit case's cached blocks become that tree the way finished requests leave it,
through SGLang's own operations only:

    the full group's cached prefix            inserted up to the last place a hit can end
    a live sliding-window run [a, b)          an insert of [0, b) with the SWA slots below a
                                              already released (`component_evicted_seqlens`,
                                              `swa_evicted_seqlen` before 0.5.23)
    a state checkpoint at e                   an insert of [0, e) carrying a Mamba slot
    each insert                               a request that computed its whole key in slots
                                              of its own; the tree frees the duplicates
    states an SWA insert had to carry         evicted through the tree's own Mamba LRU
    the lookup                                a `Req` whose `init_next_round_input` matches
                                              it, as the scheduler's prefill step does

Every insert carries a Mamba slot when the tree has a Mamba state (SGLang asserts it), so a
leaf always holds a state: full-attention blocks past the last state no hit can read are
left out. The tree is read back after the set-up and compared with the state wanted; a
difference is reported as a case the release cannot express, never as an answer.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import types
from array import array
from dataclasses import dataclass
from functools import cache
from typing import Any

# SGLang's extra-buffer strategy is the only one that runs Mamba over pages > 1.
NO_BUFFER_PAGE = 1
# Request slots in the pools (the lookup's request and room to spare); each also gets this
# many Mamba state slots besides the ones the inserts carry.
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


# The trees SGLang's server picks from (module under sglang.srt.mem_cache, class); a release
# holds some of them: 0.5.15 and 0.5.19 all five, 0.5.9 no unified or pure-SWA tree, 0.5.23
# no per-model SWA or Mamba tree.
TREE_CLASSES = (
    ("unified_radix_cache", "UnifiedRadixCache"),
    ("pure_swa_radix_cache", "PureSWARadixCache"),
    ("radix_cache", "RadixCache"),
    ("swa_radix_cache", "SWARadixCache"),
    ("mamba_radix_cache", "MambaRadixCache"),
)


def _optional(module: str, name: str) -> Any:
    """sglang.srt.mem_cache.MODULE.NAME, or None where this release has no such module."""
    try:
        loaded = importlib.import_module(f"sglang.srt.mem_cache.{module}")
    except ModuleNotFoundError:
        return None
    return getattr(loaded, name, None)


def _unified_by_default() -> bool:
    """Whether the server builds the unified tree for full, SWA and Mamba models.

    Up to 0.5.15 its tree factory builds it only under SGLANG_ENABLE_UNIFIED_RADIX_TREE and
    otherwise picks RadixCache, SWARadixCache or MambaRadixCache per model; from 0.5.19 the
    unified tree is the default (`sglang.srt.mem_cache.registry`).
    """
    try:
        registry = importlib.import_module("sglang.srt.mem_cache.registry")
    except ModuleNotFoundError:  # 0.5.9: the scheduler picks the tree itself; no unified one
        return False
    return "SGLANG_ENABLE_UNIFIED_RADIX_TREE.get()" not in inspect.getsource(registry)


@cache
def api() -> types.SimpleNamespace:
    """The release's trees, its pools, the scheduler's request and its server arguments."""
    from kvcert.conformance.sglang.adapter import prepare_import

    prepare_import()
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache import allocator
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
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
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    trees = {name: _optional(module, name) for module, name in TREE_CLASSES}
    component_type = _optional("unified_cache.components", "ComponentType")
    # allocator.swa since 0.5.15; swa_memory_pool in 0.5.9
    swa_allocator = _optional("allocator.swa", "SWATokenToKVPoolAllocator") or _optional(
        "swa_memory_pool", "SWATokenToKVPoolAllocator"
    )

    return types.SimpleNamespace(
        torch=torch,
        Mamba2CacheParams=Mamba2CacheParams,
        Mamba2StateShape=Mamba2StateShape,
        envs=envs,
        Req=Req,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        # the campaign's allocator at pages > 1 (build_serving); None where a release lacks it
        PagedTokenToKVPoolAllocator=getattr(allocator, "PagedTokenToKVPoolAllocator", None),
        SWATokenToKVPoolAllocator=swa_allocator,
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
        ComponentType=component_type,
        unified_by_default=_unified_by_default(),
        **trees,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
        set_global_server_args_for_scheduler=set_global_server_args_for_scheduler,
    )


def server_args(sg: types.SimpleNamespace, page: int, **chosen: Any) -> None:
    """Publish the scheduler's server arguments: SGLang's defaults but the page size (and
    what `chosen` sets, the way a command-line flag does).

    The Mamba chunk size comes from the model's config in a real server; 64 (FLA's chunk) is
    what SGLang's own fixtures preset. It moves only where a branching state would be saved,
    never what a lookup matches.
    """
    # "dummy" is SGLang's own no-model path: nothing is looked up on the Hub.
    args = sg.ServerArgs(model_path="dummy", page_size=page, **chosen)
    args._mamba_cache_chunk_size = max(64, page)
    sg.set_global_server_args_for_scheduler(args)


def build(shape: Shape, tokens: int, states: int) -> tuple[Any, Any]:
    """(tree, request pool) over CPU pools of `tokens` KV slots and room for `states` Mamba
    states besides the requests' own, one tiny layer per kind."""
    sg = api()
    if not sg.unified_by_default and shape.exclusive_window and shape.state_grid:
        raise Inexpressible(
            "this release's server builds SWARadixCache for an SWA + Mamba model: no state"
        )
    server_args(sg, shape.page)
    capacity = tokens + shape.page
    extra_buffer = shape.state_grid is not None and shape.page > NO_BUFFER_PAGE
    if shape.state_grid is not None:
        requests = hybrid_request_pool(
            sg,
            rows=STATE_SLOTS_PER_REQUEST,
            states=states + STATE_SLOTS_PER_REQUEST * STATE_SLOTS_PER_REQUEST,
            capacity=capacity,
            extra_buffer=extra_buffer,
            draft_tokens=3 if shape.eagle else None,
        )
    else:
        requests = _request_pool(sg, capacity)
    if shape.exclusive_window is not None:
        allocator = swa_allocator(sg, capacity, capacity, shape.page)
    else:
        if shape.state_grid is not None:
            pool = hybrid_attention_pool(sg, capacity, shape.page, requests)
        else:
            pool = attention_pool(sg, capacity, shape.page)
        allocator = token_allocator(sg, capacity, pool)
    fields = {
        "disable": False,
        "req_to_token_pool": requests,
        "token_to_kv_pool_allocator": allocator,
        "page_size": shape.page,
        "sliding_window_size": shape.exclusive_window,
        "enable_mamba_extra_buffer": extra_buffer,
        "is_eagle": shape.eagle,
    }
    if sg.unified_by_default:
        components = [sg.ComponentType.FULL]  # SGLang's order: full, SWA, Mamba
        if shape.exclusive_window is not None:
            components.append(sg.ComponentType.SWA)
        if shape.state_grid is not None:
            components.append(sg.ComponentType.MAMBA)
        fields["tree_components"] = tuple(components)
        tree_class = sg.UnifiedRadixCache
    elif shape.exclusive_window is not None:
        tree_class = sg.SWARadixCache
    elif shape.state_grid is not None:
        tree_class = sg.MambaRadixCache
    else:
        tree_class = sg.RadixCache
    params = sg.CacheInitParams(**fields)
    return tree_class(params), requests


def hybrid_request_pool(
    sg: types.SimpleNamespace,
    *,
    rows: int,
    states: int,
    capacity: int,
    extra_buffer: bool,
    draft_tokens: int | None = None,
    ssm_dtype: str = "bfloat16",
    overlap: bool | None = None,
    lazy: bool = False,
) -> Any:
    """The requests' token tables and a pool of `states` Mamba states, one tiny Mamba2 layer.

    `ssm_dtype` float32 holds integers exactly (the campaign writes identities into states).
    `overlap` is the server's scheduling (it sizes the extra buffer's track slots: two under
    overlap, one without); None leaves the release's default. `lazy`: the extra buffer's
    lazy variant, whose second track slot is allocated at a checkpoint boundary.
    """
    scheduling = {} if overlap is None else {"enable_overlap_schedule": overlap}
    if lazy:
        scheduling["enable_mamba_extra_buffer_lazy"] = True
    with sg.envs.SGLANG_MAMBA_SSM_DTYPE.override(ssm_dtype):
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
    return _on_cpu(
        sg.HybridReqToTokenPool,
        size=rows,
        mamba_size=states,
        mamba_spec_state_size=rows,
        max_context_len=capacity,
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache_params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=extra_buffer,
        # EAGLE's verify pass keeps a state per draft token; without drafts, none (the
        # server passes its --speculative-num-draft-tokens, unset without a drafter).
        speculative_num_draft_tokens=draft_tokens,
        **scheduling,
    )


def swa_allocator(sg: types.SimpleNamespace, capacity: int, swa: int, page: int) -> Any:
    """The two-pool allocator over one tiny SWA layer and one full-attention layer:
    `capacity` full-attention slots, `swa` SWA slots."""
    pool = _on_cpu(
        sg.SWAKVPool,
        size=capacity,
        size_swa=swa,
        page_size=page,
        dtype=sg.torch.float16,
        head_num=1,
        head_dim=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    return sg.SWATokenToKVPoolAllocator(
        size=capacity, size_swa=swa, page_size=page, dtype=sg.torch.float16, device="cpu",
        kvcache=pool, need_sort=False,
    )  # fmt: skip


def swa_full_tokens_ratio(sg: types.SimpleNamespace) -> float:
    """The published server arguments' SWA / full pool ratio, as the configurator reads it
    (0.5.23's runtime context resolves the unset default; earlier releases hold it)."""
    try:
        context = importlib.import_module("sglang.srt.runtime_context")
        return float(context.get_schedule().swa_full_tokens_ratio)
    except (ModuleNotFoundError, AttributeError):
        pass
    return float(sg.ServerArgs(model_path="dummy").swa_full_tokens_ratio)


def build_pure_swa(page: int, exclusive_window: int, tokens: int) -> tuple[Any, Any]:
    """(tree, request pool) for an all-SWA model: PureSWARadixCache, a plain radix tree of the
    prefill portion of finished requests (the server's pick since 0.5.15)."""
    sg = api()
    if sg.PureSWARadixCache is None:
        raise Inexpressible("this release has no tree for an all-SWA model (PureSWARadixCache)")
    server_args(sg, page)
    capacity = tokens + page
    requests = _request_pool(sg, capacity)
    allocator = token_allocator(sg, capacity, attention_pool(sg, capacity, page))
    params = sg.CacheInitParams(
        disable=False,
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        sliding_window_size=exclusive_window,
    )
    return sg.PureSWARadixCache(params), requests


def _request_pool(sg: types.SimpleNamespace, capacity: int) -> Any:
    """The requests' token tables, for a model without a Mamba state."""
    return sg.ReqToTokenPool(
        size=STATE_SLOTS_PER_REQUEST,
        max_context_len=capacity,
        device="cpu",
        enable_memory_saver=False,
    )


def token_allocator(sg: types.SimpleNamespace, capacity: int, pool: Any) -> Any:
    """Token slots over `pool`, handed out in the order they were freed."""
    return sg.TokenToKVPoolAllocator(
        size=capacity, dtype=sg.torch.float16, device="cpu", kvcache=pool, need_sort=False
    )


def hybrid_attention_pool(
    sg: types.SimpleNamespace, capacity: int, page: int, requests: Any
) -> Any:
    """The full-attention KV pool of a Mamba hybrid: one tiny layer beside the state pool."""
    return _on_cpu(
        sg.HybridLinearKVPool,
        size=capacity,
        dtype=sg.torch.float16,
        page_size=page,
        head_num=1,
        head_dim=1,
        full_attention_layer_ids=[1],
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=requests.mamba_pool,
    )


def attention_pool(sg: types.SimpleNamespace, capacity: int, page: int) -> Any:
    """One tiny attention layer's KV pool of `capacity` slots."""
    return _on_cpu(
        sg.MHATokenToKVPool,
        size=capacity,
        page_size=page,
        dtype=sg.torch.float16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )


class Inexpressible(Exception):
    """The case needs a tree this release's server does not build."""


# Pool arguments a release may not take yet (0.5.9 reads the Mamba layers off cache_params).
LATER_POOL_ARGUMENTS = ("mamba_layer_ids",)
# Pool arguments only an early release requires, with the server's default (0.5.9).
EARLY_POOL_ARGUMENTS = {"enable_kvcache_transpose": False}


def _on_cpu(build_pool: Any, **arguments: Any) -> Any:
    """A pool built on CPU with the arguments its release takes; Inexpressible where the
    release places part of it on CUDA."""
    taken = inspect.signature(build_pool).parameters
    for name in LATER_POOL_ARGUMENTS:
        if name in arguments and name not in taken:
            del arguments[name]
    for name, default in EARLY_POOL_ARGUMENTS.items():
        if name in taken:
            arguments.setdefault(name, default)
    try:
        return build_pool(**arguments)
    except (AssertionError, RuntimeError) as error:
        if "CUDA" not in str(error):
            raise
        raise Inexpressible(f"{build_pool.__name__} needs CUDA in this release: {error}") from None


def _slots(tree: Any, shape: Shape, tokens: int) -> Any:
    """One request's KV slots for `tokens` tokens, as the allocator hands out pages.

    The SWA allocator's paged `alloc_extend` takes a batch (and before 0.5.23 runs a Triton
    kernel, which needs a GPU); as SGLang's own test kit does, whole pages are taken from its
    full and SWA sub-allocators and mapped onto each other instead.
    """
    allocator = tree.token_to_kv_pool_allocator
    if shape.exclusive_window is None or shape.page == 1:
        return allocator.alloc(tokens)
    whole = -(-tokens // shape.page) * shape.page
    full = allocator.full_attn_allocator.alloc(whole)
    swa = allocator.swa_attn_allocator.alloc(whole)
    allocator.full_to_swa_index_mapping[full] = swa
    return full[:tokens]


def insert_ends(wanted: Wanted) -> list[int]:
    """The pages at which the set-up's inserts end: each live SWA run, state and the prefix."""
    runs = {b for _, b in wanted.live_windows}
    return sorted(runs | set(wanted.states) | {wanted.pages}) if wanted.pages else []


def slots_needed(shape: Shape, wanted: Wanted, num_tokens: int) -> int:
    """KV slots for every insert's own key and the request's lookup."""
    ahead = int(shape.eagle)
    return sum(end * shape.page + ahead for end in insert_ends(wanted)) + num_tokens + ahead


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
    released = {b: a for a, b in wanted.live_windows}
    leaf = None
    for end in insert_ends(wanted):
        # Each insert is a finished request that computed its whole key in slots of its own
        # (it matched nothing); the tree frees those it already holds, as duplicates.
        slots = _slots(tree, shape, end * page + ahead)
        extra: dict[str, Any] = {}
        if shape.exclusive_window is not None:
            extra.update(_released_below(released.get(end, end) * page))
        if shape.state_grid is not None:
            # 0.5.9 hands out state slots from the pool itself
            states = getattr(requests, "mamba_allocator", None) or requests.mamba_pool
            extra["mamba_value"] = states.alloc(1)
        result = tree.insert(
            sg.InsertParams(
                key=sg.RadixKey(as_request_holds(tokens[: end * page + ahead])),
                value=slots[: end * page + ahead].clone(),
                **extra,
            )
        )
        leaf = getattr(result, "last_device_node", None)  # 0.5.9's result has no node
    surplus = [
        end
        for end in insert_ends(wanted)
        if shape.state_grid is not None and end not in wanted.states
    ]
    if surplus:
        # Refresh the wanted states (a match ending at a state moves it to the front of
        # the Mamba LRU), then let the tree evict as many states as were carried in excess.
        for end in wanted.states:
            tree.match_prefix(_match_params(tokens[: end * page + ahead]))
        tree.evict(sg.EvictParams(num_tokens=0, mamba_num=len(surplus)))
    held = read_back(tree, shape, leaf, tokens[: span + ahead])
    if held != wanted:
        return (
            f"this release's tree cannot hold the cached state: inserting it left "
            f"{_described(held)} (wanted {_described(wanted)})"
        )
    return None


def _described(state: Wanted) -> str:
    return (
        f"a {state.pages}-page prefix, live SWA pages {list(state.live_windows)}, "
        f"states after pages {list(state.states)}"
    )


def _released_below(tokens: int) -> dict[str, Any]:
    """The insert field saying the request had released its SWA slots below `tokens`.

    SGLang 0.5.23 names it per component; earlier releases had one SWA field.
    """
    sg = api()
    fields = {field.name for field in dataclasses.fields(sg.InsertParams)}
    if "component_evicted_seqlens" in fields:
        return {"component_evicted_seqlens": {sg.ComponentType.SWA: tokens}}
    return {"swa_evicted_seqlen": tokens}


def _match_params(key: array[int]) -> Any:
    sg = api()
    return sg.MatchPrefixParams(key=sg.RadixKey(as_request_holds(key)))


def as_request_holds(tokens: array[int]) -> Any:
    """Tokens in the container the release's requests hold them in, which its tree compares
    slices of: a list in 0.5.9, an array("q") since."""
    return list(tokens) if _requests_hold_lists() else tokens


@cache
def _requests_hold_lists() -> bool:
    sg = api()
    probe = sg.Req(
        rid="kvcert-probe",
        origin_input_text="",
        origin_input_ids=array("q"),
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=1),
    )
    return isinstance(probe.output_ids, list)


def read_back(tree: Any, shape: Shape, node: Any, key: array[int]) -> Wanted:
    """The full prefix, SWA runs and states the tree holds on the path to `node` (`key`)."""
    page = shape.page
    live: list[tuple[int, int]] = []
    states: list[int] = []
    pages = 0
    for start_token, end_token, swa_held, state_held in path_runs(tree, shape, node, key):
        start, end = start_token // page, end_token // page
        pages = max(pages, end)
        if shape.exclusive_window is not None and swa_held:
            if live and live[-1][1] == start:
                live[-1] = (live[-1][0], end)
            else:
                live.append((start, end))
        if shape.state_grid is not None and state_held:
            states.append(end)
    return Wanted(pages, tuple(live), tuple(states))


def path_runs(
    tree: Any, shape: Shape, node: Any, key: array[int]
) -> list[tuple[int, int, bool, bool]]:
    """(start, end, SWA value held, Mamba state held) per node from the root to `node`.

    Only the components `shape` has are asked about (the Rust core refuses the others).

    SGLang 0.5.23's tree cores answer path queries by node id (the Rust core holds no Python
    nodes); 0.5.19's Python core hands out its nodes (`node_by_id`); the per-model trees of
    earlier releases are walked down along `key` from their root.
    """
    if not hasattr(tree, "tree_core"):
        return _per_model_runs(tree, key)
    sg = api()
    core = tree.tree_core
    if node is None or node == core.root_node_handle():
        return []
    swa, mamba = sg.ComponentType.SWA, sg.ComponentType.MAMBA
    if hasattr(core, "collect_path_info"):
        (path,) = core.collect_path_info([node])

        def held(node_id: Any, component: Any, present: object) -> bool:
            if present is None:
                return False
            return core.get_component_device_value(node_id, component) is not None

        return [
            (
                info.path_start,
                info.path_end,
                held(info.node_id, swa, shape.exclusive_window),
                held(info.node_id, mamba, shape.state_grid),
            )
            for info in path
        ]
    chain = []
    current = core.node_by_id(node)
    while current is not None and current.parent is not None:
        chain.append(current)
        current = current.parent
    runs, start = [], 0
    for item in reversed(chain):
        kept = {ct: item.component_data[ct].value is not None for ct in item.component_types}
        end = start + len(item.key)
        runs.append((start, end, kept.get(swa, False), kept.get(mamba, False)))
        start = end
    return runs


def _per_model_runs(tree: Any, key: array[int]) -> list[tuple[int, int, bool, bool]]:
    """Walk RadixCache, SWARadixCache or MambaRadixCache down along the raw tokens `key`."""
    runs: list[tuple[int, int, bool, bool]] = []
    node, start = tree.root_node, 0
    while True:
        step = next((c for c in node.children.values() if _continues(c.key, key, start)), None)
        if step is None:
            return runs
        # A bigram key's raw tokens run one past its positions; its length counts positions.
        end = start + len(step.key)
        swa_held = not getattr(step, "swa_tombstone", True)
        state_held = getattr(step, "mamba_value", None) is not None
        runs.append((start, end, swa_held, state_held))
        node, start = step, end


def matched_length(request: Any) -> int:
    """The prefix a request's prefill step matched: 0.5.23 keeps its length, earlier
    releases the matched slots."""
    if hasattr(request, "prefix_len"):
        return int(request.prefix_len)
    return len(request.prefix_indices)


def _continues(edge: Any, key: array[int], start: int) -> bool:
    """Whether a node's key is `key`'s continuation at position `start`.

    0.5.9 stores EAGLE keys as (token, next token) pairs; later releases keep raw tokens
    with a bigram view, whose raw tokens run one past its positions.
    """
    stored = list(edge.token_ids)
    if stored and isinstance(stored[0], tuple):
        pairs = zip(key[start:], key[start + 1 :], strict=False)
        return stored == [pair for pair, _ in zip(pairs, stored, strict=False)]
    return stored == list(key[start : start + len(stored)])


def new_request(
    rid: str, tokens: array[int], max_new_tokens: int = 1, keys: dict[str, Any] | None = None
) -> Any:
    """A scheduler request for the prompt `tokens`, greedy, held as the release holds ids;
    `keys` are its cache keys (`request_steps.RequestKeys`)."""
    sg = api()
    request = sg.Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=tokens,
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
        **(keys or {}),
    )
    request.origin_input_ids = as_request_holds(tokens)
    return request


def scheduler_match(tree: Any, requests: Any, tokens: array[int]) -> int:
    """The prefix the scheduler's prefill step takes for a request of `tokens`."""
    request = new_request("kvcert", tokens)
    requests.alloc([request])
    try:
        request.init_next_round_input(tree)
        return matched_length(request)
    finally:
        requests.free(request)


def state_grid(page: int, state_block: int) -> int:
    """Where a hit can end on a state group: a multiple of its block and of the page."""
    return math.lcm(page, state_block)
