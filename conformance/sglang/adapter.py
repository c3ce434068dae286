"""SGLang as a conformance engine: the hit suite through SGLang's own radix trees.

Runs inside a venv holding SGLang (`scripts/engine-venv.sh sglang 0.5.23`). SGLang keeps
the KV cache as a radix tree of token runs, not as per-group block tables, so only part of
the suite maps (docs/engines.md has the table):

    one full-attention group, block size B                RadixCache(page_size=B)
    full + sliding window W, one block size B             UnifiedRadixCache (FULL, SWA) over
                                                          CPU pools, sliding_window_size W - 1
    the full group's cached blocks                        the longest cached prefix is inserted
                                                          (a tree holds prefix-closed sets only)
    the sliding group's cached blocks                     one insert per cached run [a, b) with
                                                          SWA evicted below a*B (tombstones),
                                                          read back and checked before lookup
    a lookup of n tokens                                  match_prefix(first n-1 tokens), the
                                                          scheduler's own cap (a request always
                                                          computes its last token)
    anything else (other kinds, drafts, the alloc and     {"unsupported": why}: accounted for as
    page suites)                                          skipped, never as passed

Importing `sglang.srt.mem_cache` pulls in `sglang.srt.configs`, whose vision-model configs
import torchvision; no torchvision on the index runs beside CPU torch 2.13.0. Those two
image-preprocessing modules are replaced by empty ones (`prepare_import`); nothing on the
radix-cache path calls them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from array import array
from functools import cache
from importlib.metadata import version
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import EngineError

REFUSED: JSON = {"refused": True}
# sglang modules that import torchvision at import time and are off the radix-cache path.
VISION_MODULES = ("sglang.srt.multimodal.internvl_utils", "sglang.srt.configs.deepseek_ocr")


class _Placeholder:
    """Stands in for any name a replaced vision module exports (never called here)."""

    def __getattr__(self, name: str) -> _Placeholder:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Placeholder:
        return self

    def __getitem__(self, key: object) -> _Placeholder:
        return self

    def __iter__(self) -> Any:
        return iter(())


def _stand_in(name: str) -> Any:
    """A class for class-like names (configs get registered by type), else a value."""
    if name[:1].isupper():
        return type(name, (_Placeholder,), {"model_type": f"kvcert-replaced-{name}"})
    return _Placeholder()


class _VisionModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> Any:
        if fullname in VISION_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, "replaced by kvcert: imports torchvision")
        module.__getattr__ = _stand_in  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def prepare_import() -> None:
    """Replace the two torchvision-importing vision modules (idempotent)."""
    if not any(isinstance(f, _VisionModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _VisionModules())


@cache
def sglang_api() -> Any:
    """SGLang's radix cache module, imported once (5 s)."""
    prepare_import()
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.base_prefix_cache import (
        InsertParams,
        MatchPrefixParams,
    )

    return radix_cache, InsertParams, MatchPrefixParams


@cache
def unified_api() -> types.SimpleNamespace:
    """SGLang's unified radix tree with its full and SWA components, and their pools."""
    prepare_import()
    import torch
    from sglang.srt.mem_cache.allocator.swa import (
        SWATokenToKVPoolAllocator,
    )
    from sglang.srt.mem_cache.cache_init_params import (
        CacheInitParams,
    )
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import (
        ComponentType,
    )
    from sglang.srt.mem_cache.unified_radix_cache import (
        UnifiedRadixCache,
    )

    return types.SimpleNamespace(
        torch=torch,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator,
        CacheInitParams=CacheInitParams,
        ReqToTokenPool=ReqToTokenPool,
        SWAKVPool=SWAKVPool,
        ComponentType=ComponentType,
        UnifiedRadixCache=UnifiedRadixCache,
    )


class _Allocator:
    """What RadixCache.create_simulated needs from a KV allocator (no memory behind it)."""

    device = "cpu"

    def free(self, indices: object) -> None:
        return None

    def free_segment(self, indices: object, start_pos: int = 0) -> None:
        return None


def _positive(value: object) -> int | None:
    """A positive integer, else None (JSON bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _ranges(ranges: list[list[int]]) -> set[int]:
    """Half-open [start, stop) ranges -> block positions."""
    return {j for start, stop in ranges for j in range(start, stop)}


def _cached_prefix(blocks: set[int]) -> int:
    """Blocks 0..k-1 all cached: the part of the set a radix tree can hold."""
    count = 0
    while count in blocks:
        count += 1
    return count


def _live_runs(live: set[int], prefix: int) -> list[tuple[int, int]]:
    """Maximal runs [a, b) of `live` positions below `prefix`, in order."""
    runs: list[tuple[int, int]] = []
    for j in range(prefix):
        if j not in live:
            continue
        if runs and runs[-1][1] == j:
            runs[-1] = (runs[-1][0], j + 1)
        else:
            runs.append((j, j + 1))
    return runs


class SglangEngine:
    """The conformance engine over SGLang's radix trees."""

    def describe(self) -> JSON:
        return {
            "name": "sglang",
            "version": version("sglang"),
            "features": ["kind.full", "kind.sliding_window"],
            "profiles": [],
        }

    def run(self, case: JSON) -> JSON:
        if case.get("suite") != "hit":
            return {"unsupported": "SGLang keeps token runs in a tree, not block tables"}
        layout = case["layout"]
        groups = layout.get("groups")
        if (
            not isinstance(groups, list)
            or not groups
            or not all(isinstance(g, dict) for g in groups)
        ):
            return REFUSED
        kinds = sorted(str(g.get("kind")) for g in groups)
        if kinds not in (["full"], ["full", "sliding_window"]):
            return {"unsupported": "one full-attention group, alone or with one sliding window"}
        drafts = [g.get("draft", False) for g in groups]
        if not all(isinstance(d, bool) for d in drafts):
            return REFUSED
        if layout.get("speculative") is not None or any(drafts):
            return {"unsupported": "draft keying is not driven through the radix cache"}
        sizes = [_positive(g.get("block_size")) for g in groups]
        n = _positive(case.get("num_tokens"))
        if n is None or None in sizes or len(case["cached"]) != len(groups):
            return REFUSED
        limit = layout.get("max_model_len")
        if limit is not None and (_positive(limit) is None or n > limit):
            return REFUSED
        if len(groups) == 1:
            return self._full(n, sizes[0] or 1, _ranges(case["cached"][0]))
        full, sliding = (0, 1) if groups[0]["kind"] == "full" else (1, 0)
        window = _positive(groups[sliding].get("window"))
        if window is None:
            return REFUSED
        if sizes[0] != sizes[1]:
            return {"unsupported": "one page size for every layer: the block sizes differ"}
        if window < 2:
            return {"unsupported": "SGLang's window excludes the query (W - 1 tokens): W >= 2"}
        cached = (_ranges(case["cached"][full]), _ranges(case["cached"][sliding]))
        answer = self._full_and_sliding(n, sizes[0] or 1, window, *cached)
        if "blocks" in answer and full == 1:
            answer["blocks"].reverse()
        return answer

    def _full(self, n: int, size: int, cached: set[int]) -> JSON:
        """RadixCache: insert the cached prefix, match the first n - 1 tokens."""
        radix_cache, insert_params, match_params = sglang_api()
        tree = radix_cache.RadixCache.create_simulated(mock_allocator=_Allocator(), page_size=size)
        tokens = list(range(1, n + 1))
        prefix = _cached_prefix(cached) * size
        if prefix > n:
            return REFUSED
        if prefix:
            tree.insert(insert_params(key=radix_cache.RadixKey(tokens[:prefix])))
        match = tree.match_prefix(match_params(key=radix_cache.RadixKey(tokens[: n - 1])))
        hit = int(match.device_prefix_len)
        return {"hit": hit, "blocks": [list(range(hit // size))]}

    def _full_and_sliding(
        self, n: int, size: int, window: int, full: set[int], sliding: set[int]
    ) -> JSON:
        """UnifiedRadixCache with the full and SWA components over real (CPU) pools.

        The cached state is built the way finished requests leave it: each insert of a prefix
        passes `component_evicted_seqlens[SWA]`, the point below which the request had already
        freed its SWA slots, so those nodes are tombstones. The state is read back from the
        tree and compared with the one wanted before the lookup.
        """
        radix_cache, insert_params, match_params = sglang_api()
        api = unified_api()
        prefix = _cached_prefix(full)
        if prefix * size > n:
            return REFUSED
        tree = self._unified_tree(api, size, window - 1, max(prefix * size, size))
        tokens = array("q", range(1, n + 1))
        inserts = _live_runs(sliding, prefix)
        if not inserts or inserts[-1][1] != prefix:
            inserts.append((prefix, prefix))
        node = None
        if prefix:
            span = prefix * size
            zero, full_span = api.torch.tensor([0]), api.torch.tensor([span])
            # One request's pages: prefix 0, length span, no previous page (last_loc -1).
            slots = tree.token_to_kv_pool_allocator.alloc_extend(
                zero, zero, full_span, full_span, api.torch.tensor([-1]), span
            )
            for a, b in inserts:
                result = tree.insert(
                    insert_params(
                        key=radix_cache.RadixKey(tokens[: b * size]),
                        value=slots[: b * size].clone(),
                        component_evicted_seqlens={api.ComponentType.SWA: a * size},
                    )
                )
            node = result.last_device_node
            live = self._live_blocks(tree, api, node, size)
            if live != {j for j in range(prefix) if j in sliding}:
                return {"unsupported": f"SGLang's inserts left SWA blocks {sorted(live)} live"}
        match = tree.match_prefix(match_params(key=radix_cache.RadixKey(tokens[: n - 1])))
        hit = int(match.device_prefix_len)
        live = self._live_blocks(tree, api, node, size) if node is not None else set()
        # The blocks SGLang's attention reads: those overlapping the W - 1 tokens before the hit.
        first = max(0, hit - (window - 1)) // size
        window_blocks = [j if first <= j and j in live else None for j in range(hit // size)]
        return {"hit": hit, "blocks": [list(range(hit // size)), window_blocks]}

    @staticmethod
    def _unified_tree(
        api: types.SimpleNamespace, size: int, exclusive_window: int, tokens: int
    ) -> Any:
        """A full + SWA unified tree over pools of `tokens` slots (one layer each, tiny heads)."""
        capacity = tokens + size
        dtype = api.torch.float16
        pool = api.SWAKVPool(
            size=capacity,
            size_swa=capacity,
            page_size=size,
            dtype=dtype,
            head_num=1,
            head_dim=1,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device="cpu",
        )
        allocator = api.SWATokenToKVPoolAllocator(
            size=capacity,
            size_swa=capacity,
            page_size=size,
            dtype=dtype,
            device="cpu",
            kvcache=pool,
            need_sort=False,
        )
        requests = api.ReqToTokenPool(
            size=1, max_context_len=capacity, device="cpu", enable_memory_saver=False
        )
        params = api.CacheInitParams(
            disable=False,
            req_to_token_pool=requests,
            token_to_kv_pool_allocator=allocator,
            page_size=size,
            sliding_window_size=exclusive_window,
            tree_components=(api.ComponentType.FULL, api.ComponentType.SWA),
        )
        return api.UnifiedRadixCache(params)

    @staticmethod
    def _live_blocks(tree: Any, api: types.SimpleNamespace, node: Any, size: int) -> set[int]:
        """Block positions on the path to `node` whose SWA value is present (not a tombstone)."""
        (path,) = tree.tree_core.collect_path_info([node])
        live: set[int] = set()
        for info in path:
            value = tree.tree_core.get_component_device_value(info.node_id, api.ComponentType.SWA)
            if value is not None:
                live.update(range(info.path_start // size, info.path_end // size))
        return live


def make_engine() -> SglangEngine:
    """Entry point `sglang`: only where SGLang is installed (its own venv)."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "SGLang is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh sglang VERSION` and run that venv's kvcert"
        )
    sglang_api()  # import now (5 s), not inside the first case's time limit
    return SglangEngine()
