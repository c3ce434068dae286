"""SGLang as a conformance engine: the hit and alloc suites through SGLang's own radix trees.

Runs inside a venv holding SGLang (`scripts/engine-venv.sh sglang VERSION`; 0.5.9, 0.5.15,
0.5.19 and 0.5.23 are pinned). SGLang keeps the KV cache as a radix tree of token runs, not
as per-group block tables, so only part of the suite maps (docs/engines.md has the table):

    full attention, + one sliding window W, + one     the tree the release's server builds
    Mamba state (mode all or align), one page B       (unified.py): UnifiedRadixCache from
                                                      0.5.19, RadixCache / SWARadixCache /
                                                      MambaRadixCache before, over CPU pools,
                                                      page B, sliding_window_size W - 1,
                                                      Mamba's extra buffer where B > 1
    full groups (target and draft) cached alike       the one full component (one pool)
    full + one chunked-local group of chunk C         Llama 4 as the server runs it: the SWA
                                                      component, window C (chunked.py)
    draft groups under the exact profile, reach 1     is_eagle: bigram keys
    hits at multiples of U (`unit U`, block B)        page U, each block B / U pages, the
                                                      units held looked up (units.py)
    the cached blocks                                 inserts as finished requests leave them
                                                      (unified.py), read back before lookup
    a lookup of n tokens                              Req.init_next_round_input: the
                                                      scheduler's prefill match (cap n - 1)
    an alloc trace, one full-attention group          the scheduler's request steps
    (the radix profile, spec §13)                     (alloc.py), as each release names
                                                      them (request_steps.py)
    anything else (other kinds, layouts the tree      {"unsupported": why}: accounted for as
    cannot hold, other alloc layouts, page plans)     skipped, never as passed

Importing `sglang.srt.mem_cache` pulls in modules that need what cannot be installed beside
CPU torch 2.13.0: vision-model configs that import torchvision, torchvision itself (up to
0.5.19) and 0.5.9's CUDA-only sgl_kernel. `prepare_import` stands in for exactly those
(`VISION_MODULES`, `MISSING_PACKAGES`); nothing on the radix-cache path calls them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from array import array
from importlib.metadata import version
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang import alloc, unified, units
from kvcert.conformance.sglang.chunked import CHUNKED, as_window, chunked_problem

REFUSED: JSON = {"refused": True}
# The layout's speculative profiles (absent: no draft layers).
SPECULATIVE = (None, "exact", "drop")
# sglang modules that import torchvision at import time and are off the radix-cache path.
VISION_MODULES = (
    "sglang.srt.multimodal.internvl_utils",
    "sglang.srt.configs.deepseek_ocr",
    "sglang.srt.configs.utils",
)
# Packages releases import at start-up for work off the radix-cache path, stood in for where
# they are not installed: torchvision (up to 0.5.19, `sglang.srt.utils.common` imports
# `torchvision.io.decode_jpeg` for image requests; no torchvision on the index runs beside CPU
# torch 2.13.0) and sgl_kernel (0.5.9's host-memory pool imports its CUDA copy kernels; it has
# no CPU build). Nothing on the radix-cache path calls them.
MISSING_PACKAGES = ("torchvision", "sgl_kernel")


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


class _PlaceholderClass(type):
    """The class of a stand-in class: its class attributes (enum members, ...) are stand-ins."""

    def __getattr__(cls, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


def _stand_in(name: str) -> Any:
    """A class for class-like names (configs get registered by type), else a value.

    Module attributes Python itself reads (`__file__`, `__path__`, ...) stay absent.
    """
    if name.startswith("__"):
        raise AttributeError(name)
    if name[:1].isupper():
        return _PlaceholderClass(name, (_Placeholder,), {"model_type": f"kvcert-replaced-{name}"})
    return _Placeholder()


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.missing = {p for p in MISSING_PACKAGES if importlib.util.find_spec(p) is None}
        self.vision_missing = "torchvision" in self.missing

    def find_spec(self, fullname: str, path: object, target: object = None) -> Any:
        package = fullname.partition(".")[0] in self.missing
        if fullname in VISION_MODULES or package:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=package)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, "replaced by kvcert: imports torchvision")
        module.__getattr__ = _stand_in  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def prepare_import() -> None:
    """Stand in for the vision modules that import torchvision, and for a missing torchvision.

    transformers caches whether torchvision is installed the first time it is asked; asking
    before the stand-in exists keeps its answer "no", so it never reaches for the stand-in.
    """
    if any(isinstance(f, _StandIns) for f in sys.meta_path):
        return
    # Before 0.5.23 the paged allocator runs its Triton kernel on every device (0.5.23 asks
    # `use_triton_kernels`); without an accelerator only Triton's interpreter runs it. It
    # must be chosen before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    finder = _StandIns()
    if finder.vision_missing:
        importlib.import_module("transformers.utils.import_utils").is_torchvision_available()
    sys.meta_path.insert(0, finder)


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
            "features": [
                "kind.full",
                "kind.sliding_window",
                "kind.chunked_local",  # Llama 4's, cached as the model's window (chunked.py)
                "kind.mamba.align",
                "kind.mamba.all",
                "speculative.exact",
                "alloc.preempt",
                "alloc.reset_cache",
                # a request's cache salt and LoRA adapter key its tree path (RequestKeys)
                "extras.cache_salt",
                "extras.lora",
            ],
            # hits at multiples of its page: `unit U` is a model run with page U (units.py);
            # its tree is the spec's radix profile (§13), driven as alloc.py says, which
            # publishes a prefill chunk when its step ends (a case whose answer depends on
            # visibility and not on eviction answers alike under radix: it needs step-end)
            "profiles": ["hit.unit", "eviction.radix", "visibility.step-end"],
        }

    def run(self, case: JSON) -> JSON:
        if case.get("suite") == "alloc":
            return alloc.run(case)
        if case.get("suite") != "hit":
            return {"unsupported": "SGLang plans no pages of several layer kinds"}
        layout = case["layout"]
        groups = layout.get("groups")
        if (
            not isinstance(groups, list)
            or not groups
            or not all(isinstance(g, dict) for g in groups)
        ):
            return REFUSED
        given = [_positive(g.get("block_size")) for g in groups]
        sizes = [size for size in given if size is not None]
        n = _positive(case.get("num_tokens"))
        if n is None or len(sizes) != len(groups) or len(case["cached"]) != len(groups):
            return REFUSED
        limit = layout.get("max_model_len")
        if limit is not None and (_positive(limit) is None or n > limit):
            return REFUSED
        unit = units.unit_of(layout)
        if isinstance(unit, str) or units.partial_problem(case, groups, sizes, unit):
            return REFUSED
        drafts = [g.get("draft", False) for g in groups]
        problem = _speculation_problem(layout, drafts)
        if problem is not None:
            return problem
        chunks = {i: g.get("chunk") for i, g in enumerate(groups) if g.get("kind") == CHUNKED}
        if chunks:
            if not all(_positive(c) for c in chunks.values()):
                return REFUSED
            why = chunked_problem(groups)
            if why is not None:
                return {"unsupported": why}
            groups = [as_window(g) for g in groups]  # as the server caches Llama 4's
        roles: dict[str, list[int]] = {}
        for index, group in enumerate(groups):
            roles.setdefault(str(group.get("kind")), []).append(index)
        cached = [_ranges(c) for c in case["cached"]]
        if unit is not None:
            # `unit U`: the same lookup over pages of U, its answer read back per block
            partial = case.get("partial") or [[] for _ in groups]
            groups, cached = units.in_units(groups, cached, partial, unit)
        why = _inexpressible(groups, roles, cached)
        if why is not None:
            return {"unsupported": why}
        if "full" not in roles:
            answer = self._all_swa(case, groups, cached)
        else:
            answer = self._unified(case, groups, roles, cached, any(drafts), chunks=chunks)
        return answer if unit is None else units.to_blocks(answer, sizes, unit)

    def _all_swa(self, case: JSON, groups: list[JSON], cached: list[set[int]]) -> JSON:
        """An all-SWA model: PureSWARadixCache holds its finished requests' prefill portion,
        a plain prefix; a hit reads the window's blocks before it."""
        n = case["num_tokens"]
        page = groups[0]["block_size"]
        window = _positive(groups[0].get("window"))
        if window is None:
            return REFUSED
        if window < 2:
            return {"unsupported": "SGLang's window excludes the query (W - 1 tokens): W >= 2"}
        prefix = _cached_prefix(cached[0])
        if prefix * page > n:
            return REFUSED
        if any(prefix < j < (n - 1) // page for j in cached[0]):
            return {"unsupported": "a radix tree holds a prefix: SWA blocks after a gap"}
        try:
            tree, requests = unified.build_pure_swa(page, window - 1, prefix * page + n)
        except unified.Inexpressible as why:
            return {"unsupported": str(why)}
        tokens = array("q", range(1, max(n, prefix * page) + 1))
        # PureSWARadixCache keeps a finished request's prefill portion as a plain prefix:
        # inserted as such, with no SWA released and no state.
        plain = unified.Shape(page=page, exclusive_window=None, state_grid=None)
        differs = unified.populate(tree, requests, plain, unified.Wanted(prefix, (), ()), tokens)
        if differs is not None:
            return {"unsupported": differs}
        hit = unified.scheduler_match(tree, requests, tokens[:n])
        first = max(0, hit - (window - 1)) // page
        reads = [j if first <= j else None for j in range(hit // page)]
        return {"hit": hit, "blocks": [list(reads) for _ in groups]}

    def _unified(
        self,
        case: JSON,
        groups: list[JSON],
        roles: dict[str, list[int]],
        cached: list[set[int]],
        eagle: bool,
        *,
        chunks: dict[int, Any],
    ) -> JSON:
        """The case as a unified tree's state, looked up by the scheduler's prefill step;
        `chunks` names the chunked-local group cached as the window (its chunk C)."""
        n = case["num_tokens"]
        sizes = [g["block_size"] for g in groups]
        full = roles["full"][0]
        page = sizes[full]
        sliding = roles.get("sliding_window", [None])[0]
        state = roles.get("mamba", [None])[0]
        window = None if sliding is None else _positive(groups[sliding].get("window"))
        if sliding is not None and window is None:
            return REFUSED
        if window is not None and window < 2:
            return {"unsupported": "SGLang's window excludes the query (W - 1 tokens): W >= 2"}
        shape = unified.Shape(
            page=page,
            exclusive_window=None if window is None else window - 1,
            state_grid=None if state is None else unified.state_grid(page, sizes[state]),
            eagle=eagle,
        )
        prefix = _cached_prefix(cached[full])
        if prefix * page > n:
            return REFUSED
        if state is None:
            states: tuple[int, ...] = ()
            pages = prefix
        else:
            states = _state_pages(cached[state], sizes[state], shape, prefix)
            pages = states[-1] if states else 0
        live = () if sliding is None else tuple(_live_runs(cached[sliding], pages))
        wanted = unified.Wanted(pages, live, states)
        try:
            needed = unified.slots_needed(shape, wanted, n)
            tree, requests = unified.build(shape, needed, len(unified.insert_ends(wanted)))
        except unified.Inexpressible as why:
            return {"unsupported": str(why)}
        tokens = array("q", range(1, max(n, pages * page) + 2))
        differs = unified.populate(tree, requests, shape, wanted, tokens)
        if differs is not None:
            return {"unsupported": differs}
        hit = unified.scheduler_match(tree, requests, tokens[:n])
        blocks: list[list[int | None]] = [[] for _ in groups]
        for index in roles["full"]:
            blocks[index] = list(range(hit // page))
        if sliding is not None and window is not None:
            # The blocks SGLang's attention reads: those overlapping the W - 1 tokens before
            # the hit, where the tree holds their SWA KV.
            held = {j for a, b in live for j in range(a, b)}
            first = max(0, hit - (window - 1)) // page
            if sliding in chunks:  # Llama 4's local attention reads the hit's chunk only
                first = hit // chunks[sliding] * chunks[sliding] // page
            blocks[sliding] = [j if first <= j and j in held else None for j in range(hit // page)]
        if state is not None:
            size = sizes[state]
            blocks[state] = [j if (j + 1) * size == hit else None for j in range(hit // size)]
        return {"hit": hit, "blocks": blocks}


def _speculation_problem(layout: JSON, drafts: list[object]) -> JSON | None:
    """The answer for a speculative set-up SGLang has no counterpart for, or None.

    SGLang keys the tree by bigrams under EAGLE (a position by its token and the next), so
    every layer, the draft model's included, is keyed exactly one token ahead.
    """
    speculative = layout.get("speculative")
    if not all(isinstance(d, bool) for d in drafts) or speculative not in SPECULATIVE:
        return REFUSED
    if speculative == "drop":
        return {"unsupported": "SGLang keys a draft position by the token after it (bigram "
                "keys): the exact profile, never the drop"}  # fmt: skip
    if any(drafts) != (speculative is not None):
        return {"unsupported": "draft groups and a speculative profile come together"}
    if layout.get("draft_reach", 1) != 1:
        return {"unsupported": "SGLang's bigram keys reach one token past a position: "
                "draft_reach 1 (EAGLE, one MTP module)"}  # fmt: skip
    return None


def _inexpressible(
    groups: list[JSON], roles: dict[str, list[int]], cached: list[set[int]]
) -> str | None:
    """Why SGLang's tree cannot hold this layout and cached state, or None.

    One tree serves every layer over one page size: one full-attention component (a draft
    model's layers are full attention over the target's token slots), at most one sliding
    window and at most one Mamba state.
    """
    other = sorted(set(roles) - {"full", "sliding_window", "mamba"})
    if other:
        return f"SGLang's tree has full, SWA and Mamba components, no {', '.join(other)} group"
    if "full" not in roles and set(roles) != {"sliding_window"}:
        return "one full-attention group: a Mamba state without one is not driven"
    if "full" not in roles:
        return _all_swa_problem(groups, cached)
    for group in groups:
        if group.get("draft") and group.get("kind") != "full":
            return alloc.DRAFT_NOT_FULL
    fulls = roles["full"]
    if all(groups[i].get("draft") for i in fulls):
        return "a draft model rides on the target's full-attention slots: the target has none"
    if len({groups[i].get("block_size") for i in fulls}) > 1:
        return "one full-attention component: every full layer shares one page size"
    if len({frozenset(cached[i]) for i in fulls}) > 1:
        return "one full-attention component: every full layer (and draft layer) is cached alike"
    if len(roles.get("sliding_window", ())) > 1:
        return "one sliding window size per model"
    if len(roles.get("mamba", ())) > 1:
        return "one Mamba state per request"
    for index in roles.get("mamba", ()):
        if groups[index].get("mode") not in ("align", "all"):
            return "a Mamba state is always cached: there is no mode that serves only the empty hit"
    page = groups[fulls[0]].get("block_size")
    for index in roles.get("sliding_window", ()):
        if groups[index].get("block_size") != page:
            return "one page size for every layer: the block sizes differ"
    return None


def _all_swa_problem(groups: list[JSON], cached: list[set[int]]) -> str | None:
    """Why an all-SWA layout does not map to one PureSWARadixCache, or None."""
    if len({(g.get("window"), g.get("block_size")) for g in groups}) > 1:
        return "one sliding window size and page for every layer of an all-SWA model"
    if len({frozenset(c) for c in cached}) > 1:
        return "one tree for every layer of an all-SWA model: every group is cached alike"
    return None


def _state_pages(cached: set[int], size: int, shape: unified.Shape, prefix: int) -> tuple[int, ...]:
    """Pages at whose end the state group holds a checkpoint a hit can end at.

    A checkpoint off the grid (the lcm of the page and the state block) ends no hit (HIT-
    GROUP-1); one past the full-attention prefix cannot be reached: neither is inserted.
    """
    grid = shape.state_grid or size
    ends = ((j + 1) * size for j in cached)
    return tuple(
        sorted(e // shape.page for e in ends if e % grid == 0 and e // shape.page <= prefix)
    )


def make_engine() -> SglangEngine:
    """Entry point `sglang`: only where SGLang is installed (its own venv)."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "SGLang is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh sglang VERSION` and run that venv's kvcert"
        )
    unified.api()  # import now (5 s), not inside the first case's time limit
    return SglangEngine()
