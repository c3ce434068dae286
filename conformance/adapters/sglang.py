"""SGLang as a conformance engine: the hit suite through SGLang's own `RadixCache`.

Runs inside a venv holding SGLang (`scripts/engine-venv.sh sglang 0.5.23`). SGLang keeps
the KV cache as a radix tree of token runs, not as per-group block tables, so only part of
the suite maps (engines/README.md has the table):

    layout of one full-attention group, block size B     RadixCache(page_size=B)
    the group's cached blocks                             the longest cached prefix is inserted
                                                          (a tree holds prefix-closed sets only:
                                                          a block after a gap has no parent)
    a lookup of n tokens                                  match_prefix(first n-1 tokens), the
                                                          scheduler's own cap (a request always
                                                          computes its last token)
    anything else (several groups, other kinds, drafts,   {"unsupported": why}: accounted for as
    the alloc and page suites)                            skipped, never as passed

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
from functools import cache
from importlib.metadata import version
from typing import Any

from kvcert.conformance.engines import EngineError

JSON = dict[str, Any]
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
    from sglang.srt.mem_cache import radix_cache  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.base_prefix_cache import (  # type: ignore[import-not-found]
        InsertParams,
        MatchPrefixParams,
    )

    return radix_cache, InsertParams, MatchPrefixParams


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


def _cached_prefix(cached: list[list[int]]) -> int:
    """Blocks 0..k-1 all cached: the part of the set a radix tree can hold."""
    blocks = {j for start, stop in cached for j in range(start, stop)}
    count = 0
    while count in blocks:
        count += 1
    return count


class SglangEngine:
    """The conformance engine over SGLang's RadixCache."""

    def describe(self) -> JSON:
        return {
            "name": "sglang",
            "version": version("sglang"),
            "features": ["kind.full"],
            "profiles": [],
        }

    def run(self, case: JSON) -> JSON:
        if case.get("suite") != "hit":
            return {"unsupported": "SGLang keeps token runs in a tree, not block tables"}
        layout = case["layout"]
        groups = layout.get("groups")
        if not isinstance(groups, list) or not groups:
            return REFUSED
        if len(groups) != 1 or groups[0].get("kind") != "full":
            return {"unsupported": "one radix tree, one page size: a single full-attention group"}
        draft = groups[0].get("draft", False)
        if not isinstance(draft, bool):
            return REFUSED
        if layout.get("speculative") is not None or draft:
            return {"unsupported": "draft keying is not driven through the radix cache"}
        size, n = _positive(groups[0].get("block_size")), _positive(case.get("num_tokens"))
        if size is None or n is None:
            return REFUSED
        limit = layout.get("max_model_len")
        if limit is not None and (_positive(limit) is None or n > limit):
            return REFUSED
        if len(case["cached"]) != 1:
            return REFUSED
        radix_cache, insert_params, match_params = sglang_api()
        tree = radix_cache.RadixCache.create_simulated(mock_allocator=_Allocator(), page_size=size)
        tokens = list(range(1, n + 1))
        prefix = _cached_prefix(case["cached"][0]) * size
        if prefix > n:
            return REFUSED
        if prefix:
            key = radix_cache.RadixKey(tokens[:prefix])
            tree.insert(insert_params(key=key))
        match = tree.match_prefix(match_params(key=radix_cache.RadixKey(tokens[: n - 1])))
        hit = int(match.device_prefix_len)
        return {"hit": hit, "blocks": [list(range(hit // size))]}


def make_engine() -> SglangEngine:
    """Entry point `sglang`: only where SGLang is installed (its own venv)."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "SGLang is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh sglang VERSION` and run that venv's kvcert"
        )
    sglang_api()  # import now (5 s), not inside the first case's time limit
    return SglangEngine()
