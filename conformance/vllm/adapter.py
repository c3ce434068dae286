"""vLLM as a conformance engine: the vectors drive vLLM's own v1 `KVCacheManager`.

Runs inside a venv that holds a vLLM release (`scripts/engine-venv.sh vllm VERSION`); nothing
here is imported by kvcert otherwise. The adapter plays vLLM's scheduler, no more: it builds
the manager from a layout, turns each operation into the calls the scheduler makes, and reads
the observations back. Which features a release supports is probed, not assumed (`describe`).

docs/engines.md has the mapping, one line per concept (layout group -> KVCacheSpec and
KVCacheGroupSpec, admit -> Request, get_computed_blocks and allocate_slots, end_step -> the
scheduler's update and new_step_starts, ...).

Protocol misuse (an unknown request, a chunk still in flight, ...) is refused by the adapter
before vLLM sees it, as vLLM's scheduler never issues such calls. What a release cannot
express is answered `{"unsupported": why}` (the runner records it as skipped), and the free
order is probed into an eviction profile (`free_order_profile`).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import version
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.planned import planned
from kvcert.conformance.vllm.runtime import Unsupported

REFUSED: JSON = {"refused": True}
HUGE_MODEL_LEN = 1 << 20


def _accepts(function: Any, name: str) -> bool:
    return name in inspect.signature(function).parameters


def _spec(api: runtime.Vllm, group: JSON) -> Any:
    kind = group.get("kind")
    size = group["block_size"]
    common = {"block_size": size, "num_kv_heads": 1, "head_size": 1, "dtype": api.torch.float32}
    if kind == "full":
        return api.kvi.FullAttentionSpec(**common)
    if kind == "sliding_window":
        return api.kvi.SlidingWindowSpec(**common, sliding_window=group["window"])
    if kind == "chunked_local":
        if group["chunk"] % size:
            # vLLM's attention backends assert this at start-up (backends/utils.py); the
            # manager alone would serve hits inside a chunk whose start it never computed.
            raise ValueError(f"vLLM needs block_size {size} to divide the chunk {group['chunk']}")
        return api.kvi.ChunkedLocalAttentionSpec(**common, attention_chunk_size=group["chunk"])
    if kind == "mamba":
        mode = group.get("mode", "all")
        cls = api.kvi.MambaSpec
        fields = inspect.signature(cls).parameters
        if "mamba_cache_mode" not in fields:
            raise Unsupported("this release has no Mamba prefix-cache modes")
        if mode == "none":
            raise Unsupported("mamba mode none disables prefix caching for the whole model")
        return cls(
            block_size=size, shapes=((1,),), dtypes=(api.torch.float32,), mamba_cache_mode=mode
        )
    raise ValueError(f"unknown group kind {kind!r}")


def _check_layout(layout: JSON) -> None:
    if layout.get("speculative") == "exact":
        raise Unsupported("vLLM keys draft layers like target layers (no exact keying)")
    unit = layout.get("hit_unit")
    groups = layout["groups"]
    if unit is None or unit >= max(g["block_size"] for g in groups):
        return
    if len(groups) == 1:
        raise Unsupported(
            "vLLM hashes a one-group model at its block size (UnitaryKVCacheCoordinator): "
            "it has no hits inside a block"
        )
    if not any(
        g.get("kind") == "mamba" and g.get("mode") == "align" and g["block_size"] > unit
        for g in groups
    ):
        raise Unsupported(
            "vLLM serves hits inside a block (hash_block_size below a block size) only with an "
            "align-mode Mamba group whose block exceeds the hash block (partial_hash_hits_enabled)"
        )


@dataclass
class _Running:
    request: Any
    scheduled: int = 0  # tokens allocated this step, committed at end_step
    # Sampled tokens already appended by an extend that then had to wait: vLLM appends a
    # sampled token once (when the step's output arrives) and retries the allocation.
    pending: tuple[int, ...] = ()


@dataclass
class Session:
    """One vLLM KVCacheManager answering the alloc suite's operations."""

    layout: JSON
    num_blocks: int
    kv_events: bool = True  # BlockStored events count registrations (benchmarks turn them off)
    mode: str = "hand"  # hand, or a planned mode of `planned` (marked | unmarked)
    flags: tuple[tuple[str, str, Any], ...] = ()  # planned modes: other engine arguments
    running: dict[str, _Running] = field(default_factory=dict)
    lora_ids: dict[str, int] = field(default_factory=dict)
    # owner[i]: the index of the manager's group that holds layout group i
    owner: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.api = runtime.vllm()
        self.max_model_len = self.layout.get("max_model_len") or HUGE_MODEL_LEN
        if self.mode == "hand":
            self._build_by_hand()
        else:
            built = planned(self.layout, self.num_blocks, self.mode, self.kv_events, self.flags)
            self.manager, self.hasher, self.owner = built.manager, built.hasher, built.owner
        self.pool = self.manager.block_pool

    def _build_by_hand(self) -> None:
        """One KVCacheGroupSpec per layout group, draft groups flagged by the adapter."""
        api = self.api
        _check_layout(self.layout)
        groups = self.layout["groups"]
        sizes = [g["block_size"] for g in groups]
        # under the hit-granularity profile `unit U`, vLLM hashes every U tokens (its
        # --prefix-match-unit); otherwise every gcd of the block sizes
        self.hash_block_size = self.layout.get("hit_unit") or math.gcd(*sizes)
        self.owner = list(range(len(groups)))
        eagle = self.layout.get("speculative") == "drop"
        group_specs: list[Any] = []
        marks_drafts = _accepts(api.kvi.KVCacheGroupSpec, "is_eagle_group")
        for index, g in enumerate(groups):
            flags: JSON = {"is_eagle_group": True} if g.get("draft") and marks_drafts else {}
            layer = f"{g.get('name') or g['kind']}.{index}"  # layer names are unique in vLLM
            group_specs.append(api.kvi.KVCacheGroupSpec([layer], _spec(api, g), **flags))
        config = api.kvi.KVCacheConfig(
            num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=group_specs
        )
        init = api.KVCacheManager.__init__
        kwargs: JSON = {"enable_caching": True, "use_eagle": eagle}
        reach = self.layout.get("draft_reach", 1)
        if reach != 1:
            if not runtime.has_multi_module_mtp():
                raise Unsupported("this release has no multi-module MTP (a drafter reading "
                                  "more than one token ahead)")  # fmt: skip
            kwargs["num_prefill_lookahead"] = reach
        if _accepts(init, "enable_kv_cache_events"):
            kwargs["enable_kv_cache_events"] = self.kv_events
        if _accepts(init, "scheduler_block_size"):
            kwargs["scheduler_block_size"] = math.lcm(*sizes)
        self.manager = api.KVCacheManager(
            config, max_model_len=self.max_model_len, hash_block_size=self.hash_block_size, **kwargs
        )
        self.hasher = self._hasher()
        fine = getattr(self.manager.coordinator, "enable_partial_hash_hits", False)
        if "hit_unit" in self.layout and self.hash_block_size < max(sizes) and not fine:
            raise Unsupported(
                "vLLM turns hits inside a block off for this layout: a prefix-cacheable group's "
                "manager needs block-aligned lookups (partial_hash_hits_enabled is false)"
            )

    # --- vLLM calls --------------------------------------------------------------------------

    def _hasher(self) -> Any:
        api = self.api
        return api.utils.get_request_block_hasher(self.hash_block_size, api.sha256)

    def new_request(self, rid: str, tokens: list[int], extras: list[JSON]) -> Any:
        api = self.api
        params = api.SamplingParams(max_tokens=self.max_model_len)
        update = params.update_from_generation_config  # sets the stop tokens Request reads
        eos = "eos_token_id" if _accepts(update, "eos_token_id") else "model_eos_token_id"
        update({}, **{eos: -1})
        kwargs: JSON = {"block_hasher": self.hasher}
        if _accepts(api.Request.__init__, "eos_token_id"):
            kwargs["eos_token_id"] = -1
        for extra in extras:
            kind, value = extra.get("kind"), extra.get("value")
            if extra.get("end") is not None:
                raise Unsupported(f"positioned extra {kind!r} needs multimodal inputs")
            if kind == "cache_salt":
                kwargs["cache_salt"] = str(value)
            elif kind == "lora":
                name = str(value)
                lora_id = self.lora_ids.setdefault(name, len(self.lora_ids) + 1)
                kwargs["lora_request"] = api.LoRARequest(name, lora_id, f"/lora/{name}")
            else:
                raise Unsupported(f"extra key kind {kind!r}")
        return api.Request(rid, list(tokens), params, None, **kwargs)

    def allocate(
        self, request: Any, chunk: int, hit: int = 0, blocks: Any = None, lookahead: int = 0
    ) -> tuple[bool, int, int]:
        """allocate_slots; on refusal also the (needed, free) vLLM compared."""
        coordinator = self.manager.coordinator
        original = coordinator.get_num_blocks_to_allocate
        seen: list[int] = []

        def recording(*args: Any, **kwargs: Any) -> int:
            needed = original(*args, **kwargs)
            seen.append(needed)
            return int(needed)

        coordinator.get_num_blocks_to_allocate = recording
        free = self.pool.get_num_free_blocks()
        try:
            kwargs: JSON = {"num_lookahead_tokens": lookahead}
            if blocks is not None:
                kwargs.update(num_new_computed_tokens=hit, new_computed_blocks=blocks)
            out = self.manager.allocate_slots(request, chunk, **kwargs)
        finally:
            del coordinator.get_num_blocks_to_allocate
        return out is not None, (seen[-1] if seen else 0), free

    def tables(self, rid: str) -> list[list[int]]:
        """The request's block table per layout group."""
        tables = self.manager.get_block_ids(rid)
        return [list(tables[g]) for g in self.owner]

    def registrations(self) -> int:
        """Blocks vLLM gave a hash (made hittable) since the last call, from its KV events."""
        events = self.manager.take_events() if hasattr(self.manager, "take_events") else []
        return sum(
            len(event.block_hashes) for event in events if type(event).__name__ == "BlockStored"
        )

    # --- operations --------------------------------------------------------------------------

    def apply(self, op: JSON) -> JSON:
        """One alloc-suite operation, as the scheduler would issue it."""
        handler = {
            "admit": self._admit,
            "extend": self._extend,
            "end_step": self._end_step,
            "finish": self._release,
            "preempt": self._release,
            "reset_cache": self._reset,
        }.get(str(op.get("op")))
        if handler is None:
            return REFUSED
        return handler(op)

    def _admit(self, op: JSON) -> JSON:
        rid, tokens = str(op["rid"]), list(op["tokens"])
        budget, lookahead = op["budget"], op.get("lookahead", 0)
        if rid in self.running or not tokens or budget < 1 or lookahead < 0:
            return REFUSED
        if len(tokens) > self.max_model_len:
            return REFUSED
        request = self.new_request(rid, tokens, list(op.get("extras", ())))
        found = self.manager.get_computed_blocks(request)
        blocks, hit = found[:2]
        if hasattr(request, "shared_prefix_boundary"):  # 0.33: the scheduler keeps the
            request.shared_prefix_boundary = found[2]  # junction sparse retention pins
        chunk = min(budget, len(tokens) - hit)
        ok, needed, free = self.allocate(request, chunk, hit, blocks, lookahead)
        if not ok:
            return {"waiting": {"needed": needed, "free": free}}
        request.num_computed_tokens = hit
        self.running[rid] = _Running(request, chunk)
        return {"admitted": {"hit": hit, "scheduled": chunk, "tables": self.tables(rid)}}

    def _extend(self, op: JSON) -> JSON:
        rid, budget, lookahead = str(op["rid"]), op["budget"], op.get("lookahead", 0)
        appended = list(op.get("appended", ()))
        entry = self.running.get(rid)
        if entry is None or entry.scheduled or budget < 1 or lookahead < 0:
            return REFUSED
        request = entry.request
        computed = request.num_computed_tokens
        retry = bool(appended) and tuple(appended) == entry.pending
        if appended and computed != request.num_tokens - (len(appended) if retry else 0):
            return REFUSED
        total = request.num_tokens + (0 if retry else len(appended))
        if total > self.max_model_len or computed >= total:
            return REFUSED
        if not retry:
            for token in appended:
                request.append_output_token_ids(token)
        chunk = min(budget, total - computed)
        ok, needed, free = self.allocate(request, chunk, lookahead=lookahead)
        if not ok:
            entry.pending = tuple(appended)
            return {"waiting": {"needed": needed, "free": free}}
        entry.scheduled, entry.pending = chunk, ()
        return {"extended": {"scheduled": chunk, "tables": self.tables(rid)}}

    def _end_step(self, _: JSON) -> JSON:
        for entry in self.running.values():
            entry.request.num_computed_tokens += entry.scheduled
            entry.scheduled = 0
        if hasattr(self.manager, "new_step_starts"):
            self.manager.new_step_starts()
        return {"step_ended": {"registered": self.registrations()}}

    def _release(self, op: JSON) -> JSON:
        entry = self.running.pop(str(op["rid"]), None)
        if entry is None:
            return REFUSED
        before = self.pool.get_num_free_blocks()
        self.manager.free(entry.request)
        return {"released": {"blocks": self.pool.get_num_free_blocks() - before}}

    def _reset(self, _: JSON) -> JSON:
        done = bool(self.manager.reset_prefix_cache())
        return {"cache_reset": {"done": done}}

    # --- the hit suite -----------------------------------------------------------------------

    def _write(self, tokens: list[int], step: int, held: dict[int, tuple[int, int]]) -> None:
        """Compute `tokens` as one request, `step` tokens per step, and finish it, noting in
        `held` where each block it held sat."""
        writer = self.new_request("writer", tokens, [])
        done = 0  # no hit taken: every writer computes (and so caches) its own blocks
        while done < len(tokens):
            chunk = min(step, len(tokens) - done)
            ok, _, _ = self.allocate(writer, chunk)
            if not ok:
                raise RuntimeError("the writer request did not fit; the adapter sized the pool")
            for g, table in enumerate(self.manager.get_block_ids("writer")):
                for j, block_id in enumerate(table):
                    if block_id:
                        held[block_id] = (g, j)
            writer.num_computed_tokens += chunk
            done += chunk
            if hasattr(self.manager, "new_step_starts"):
                self.manager.new_step_starts()
        self.manager.free(writer)

    def hit_by_keys(
        self, num_tokens: int, cached: list[set[int]], partial: list[list[int]]
    ) -> JSON:
        """Under `unit U`: register exactly the view's keys, then look the request up.

        Each key goes through vLLM's own registration of a prefix boundary on a block
        (BlockPool.cache_partial_block, which its managers call for prompt tails); a block
        end's key is the prefix hash there, the one a whole-block lookup reads. One fresh
        block per (group, block index) holds all of that index's keys, registered longest
        first (a longer key registered later would drop the shorter ones, vLLM's promotion),
        and is freed, as a finished request leaves its cached blocks."""
        tokens = list(range(1, num_tokens + 1))
        keyer = self.new_request("keyer", tokens, [])
        groups = self.layout["groups"]
        position: dict[tuple[int, int], int] = {}
        fresh = []
        for g, group in enumerate(groups):
            size = group["block_size"]
            ends = {(j + 1) * size for j in cached[g]} | set(partial[g])
            by_block: dict[int, list[int]] = {}
            for end in ends:
                by_block.setdefault((end - 1) // size, []).append(end)
            for j, block_ends in sorted(by_block.items()):
                block = self.pool.get_new_blocks(1)[0]
                fresh.append(block)
                position[(self.owner[g], block.block_id)] = j
                for end in sorted(block_ends, reverse=True):
                    self.pool.cache_partial_block(
                        request=keyer, block=block, num_tokens=end,
                        kv_cache_group_id=self.owner[g], block_size=size,
                    )  # fmt: skip
        self.pool.free_blocks(fresh)
        reader = self.new_request("reader", tokens, [])
        blocks, hit = self.manager.get_computed_blocks(reader)[:2]
        lists = [
            [None if b.block_id == 0 else position.get((g, b.block_id), -1) for b in group_blocks]
            for g, group_blocks in enumerate(blocks.blocks)
        ]
        return {"hit": hit, "blocks": [lists[g] for g in self.owner]}

    def hit(self, num_tokens: int, cached: list[set[int]]) -> JSON:
        """Make exactly `cached` hittable, then look a request of `num_tokens` tokens up."""
        groups = self.layout["groups"]
        tokens = list(range(1, num_tokens + 2))
        step = math.lcm(*(g["block_size"] for g in groups))
        # block id -> (group, position) where the writer last held it: a block one group
        # released uncached may come back in another group, and only its last place names
        # what it caches
        held: dict[int, tuple[int, int]] = {}
        # The hit suite judges the lookup, given what is cached; what a request leaves cached
        # is the retention profile's question, which the alloc suite judges (alloc/owed.json).
        # Under sparse retention a writer leaves its bounded groups' blocks cached only around
        # its own replay lengths (spec RET-SPARSE-1), so a view such as every window of a
        # 374k-token prompt would take one writer per aligned length, each computing the
        # whole prefix. The writer therefore caches densely (the coordinator's retention
        # interval is read only when blocks are cached or allocated, never by the lookup),
        # and the reader looks up under the release's own retention setting.
        coordinator = self.manager.coordinator
        sparse = getattr(coordinator, "retention_interval", None) is not None
        retention = coordinator.retention_interval if sparse else None
        if sparse:
            coordinator.retention_interval = None
        try:
            self._write(tokens, step, held)
        finally:
            if sparse:
                coordinator.retention_interval = retention
        position = {(g, block_id): j for block_id, (g, j) in held.items()}
        wanted: dict[int, set[int]] = {}  # manager group -> the blocks its layout groups keep
        for i, g in enumerate(self.owner):
            if wanted.setdefault(g, cached[i]) != cached[i]:
                raise Unsupported(
                    f"vLLM's planner keeps layout groups {self.owner.index(g)} and {i} in one "
                    "block table, so a block cannot be cached in one and evicted in the other"
                )
        doomed = {b for (g, b), j in position.items() if j not in wanted[g]}
        for block_id in doomed:
            self.pool._maybe_evict_cached_block(self.pool.blocks[block_id])
        reader = self.new_request("reader", tokens[:num_tokens], [])
        blocks, hit = self.manager.get_computed_blocks(reader)[:2]
        lists = []
        for g, group_blocks in enumerate(blocks.blocks):
            lists.append(
                [
                    None if b.block_id == 0 else position.get((g, b.block_id), -1)
                    for b in group_blocks
                ]
            )
        return {"hit": hit, "blocks": [lists[g] for g in self.owner]}


class VllmEngine:
    """The conformance engine: describe() probes the release, run() drives it. `mode` is how
    the layout reaches vLLM: `hand` (one manager group per layout group, drafts flagged by the
    adapter) or a planned mode of `planned` (`marked`, `unmarked`: through vLLM's planner)."""

    def __init__(self, mode: str = "hand", flags: tuple[tuple[str, str, Any], ...] = ()) -> None:
        self.mode = mode
        self.flags = flags  # planned modes: engine arguments other than vLLM's defaults

    def describe(self) -> JSON:
        name = "vllm" if self.mode == "hand" else f"vllm-planned-{self.mode}"
        return {
            "name": name,
            "version": version("vllm"),
            "features": probe_features(self.mode),
            "profiles": [
                *([profile] if (profile := free_order_profile(self.mode)) else []),
                visibility_profile(self.mode),
                retention_profile(self.mode),
                *(["hit.unit"] if unit_hits_profile(self.mode) else []),
            ],
        }

    def run(self, case: JSON) -> JSON:
        try:
            return self._run(case)
        except Unsupported as error:
            return {"unsupported": str(error)}

    def _run(self, case: JSON) -> JSON:
        suite = case.get("suite")
        if suite not in ("hit", "alloc"):
            raise Unsupported(f"suite {suite!r} is not driven by the vLLM adapter")
        layout = case["layout"]
        try:
            valid_shape(layout)
            if suite == "hit":
                n = case["num_tokens"]
                if not isinstance(n, int) or n < 1 or len(case["cached"]) != len(layout["groups"]):
                    return REFUSED
                room = sum(n // g["block_size"] + 3 for g in layout["groups"]) * 2 + 2
                session = Session(layout, room, mode=self.mode, flags=self.flags)
            else:
                if "hit_unit" in layout:
                    raise Unsupported(
                        "the adapter does not drive vLLM's allocator under `unit U` yet: "
                        "its tail registrations (cache_partial_block) and the copies "
                        "take_kv_cache_block_copies hands out are not mapped to the "
                        "vectors' observations (ALLOC-UNIT-2..4)"
                    )
                session = Session(layout, case["num_blocks"], mode=self.mode, flags=self.flags)
                if len(set(session.owner)) < len(session.owner):
                    raise Unsupported(
                        "vLLM's planner merges layout groups into one block table "
                        f"(owners {session.owner}); the case counts blocks per group"
                    )
        except Unsupported:
            raise
        except Exception as error:
            print(f"vllm refused the layout: {type(error).__name__}: {error}", file=sys.stderr)
            return REFUSED
        if suite == "hit":
            cached = [_from_ranges(r) for r in case["cached"]]
            if "hit_unit" not in layout and any(case.get("partial") or []):
                return REFUSED  # partial keys exist only under a hit_unit (format /5)
            if "hit_unit" in layout:
                partial = case.get("partial") or [[] for _ in cached]
                if not _valid_partial(layout, case["num_tokens"], partial):
                    return REFUSED  # a view no cache can hold: the adapter's to refuse
                return session.hit_by_keys(case["num_tokens"], cached, partial)
            return session.hit(case["num_tokens"], cached)
        return {"observations": [session.apply(op) for op in case["ops"]]}


def valid_shape(layout: JSON) -> None:
    """JSON the adapter cannot even translate (a protocol error, refused as such)."""
    groups = layout.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ValueError("layout.groups must be a non-empty list")
    if layout.get("speculative") not in (None, "drop", "exact"):
        raise ValueError(f"unknown speculative profile {layout.get('speculative')!r}")
    unit = layout.get("hit_unit", 1)
    if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1:
        raise ValueError(f"hit_unit must be a positive integer, got {unit!r}")
    for group in groups:
        for name in ("block_size", "window", "chunk"):
            value = group.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(group.get("draft", False), bool):
            raise ValueError(f"draft must be a boolean, got {group.get('draft')!r}")
        if group.get("kind") == "cross":
            raise Unsupported("cross attention (encoder-decoder) is not driven by this adapter")


def _valid_partial(layout: JSON, num_tokens: int, partial: Any) -> bool:
    """A view's partial keys name positions a group can key: one list per group, each a
    multiple of the unit inside a block, within the request (the vectors' format /5)."""
    groups, unit = layout["groups"], layout["hit_unit"]
    if not isinstance(partial, list) or len(partial) != len(groups):
        return False
    return all(
        type(p) is int and 0 < p <= num_tokens and not p % unit and p % g["block_size"]
        for g, positions in zip(groups, partial, strict=True)
        for p in positions
    )


def _from_ranges(ranges: list[list[int]]) -> set[int]:
    return {j for start, stop in ranges for j in range(start, stop)}


@cache
def probe_features(mode: str = "hand") -> list[str]:
    """The features this release can express, found by building the managers they need."""
    features = [
        "alloc.lookahead",
        "alloc.preempt",
        "alloc.reset_cache",
        "extras.cache_salt",
        "extras.lora",
    ]
    trials = {
        "kind.full": [{"kind": "full", "block_size": 4}],
        "kind.sliding_window": [
            {"kind": "full", "block_size": 4},
            {"kind": "sliding_window", "block_size": 4, "window": 8},
        ],
        "kind.chunked_local": [
            {"kind": "full", "block_size": 4},
            {"kind": "chunked_local", "block_size": 4, "chunk": 8},
        ],
        "kind.mamba.align": [
            {"kind": "full", "block_size": 4},
            {"kind": "mamba", "block_size": 4, "mode": "align"},
        ],
        "kind.mamba.all": [
            {"kind": "full", "block_size": 4},
            {"kind": "mamba", "block_size": 4, "mode": "all"},
        ],
    }
    for feature, groups in trials.items():
        try:
            Session({"groups": groups}, 16, mode=mode)
        except Exception:
            continue
        features.append(feature)
    for profile in ("drop", "exact"):
        draft = [{"kind": "full", "block_size": 4, "draft": True}]
        try:
            Session({"groups": draft, "speculative": profile}, 16, mode=mode)
        except Exception:
            continue
        features.append(f"speculative.{profile}")
    if "speculative.drop" in features:
        draft = [{"kind": "full", "block_size": 4, "draft": True}]
        try:
            Session({"groups": draft, "speculative": "drop", "draft_reach": 2}, 16, mode=mode)
        except Exception:
            pass
        else:
            features.append("speculative.reach")
    return sorted(features)


@cache
def free_order_profile(mode: str = "hand") -> str | None:
    """The eviction profile this release's free queue follows, found by a probe: a request
    leaves one keyed and one unkeyed block; which block does the next request get?
    The `eviction.lru` tail (block 3) or, from 0.25, the unkeyed block at the head (block 2,
    spec ALLOC-FREE-2; vLLM's BlockPool.free_blocks prepends blocks without a hash)."""
    session = Session({"groups": [{"kind": "full", "block_size": 4}]}, 8, mode=mode)
    session.apply({"op": "admit", "rid": "x", "tokens": [1, 2, 3, 4, 5, 6], "budget": 6})
    session.apply({"op": "end_step"})
    session.apply({"op": "finish", "rid": "x"})
    answer = session.apply({"op": "admit", "rid": "y", "tokens": [7, 8, 9], "budget": 3})
    return {"[[3]]": "eviction.lru", "[[2]]": "eviction.lru-unkeyed-first"}.get(
        str(answer["admitted"]["tables"])
    )


def visibility_profile(mode: str = "hand") -> str:
    """The visibility profile this release follows, found by a probe: is a block hittable
    in the step that schedules its writer? (`visibility.same-pass`, ALLOC-VIS-2: vLLM
    registers blocks in `allocate_slots`; else `visibility.step-end`, ALLOC-VIS-1.)"""
    session = Session({"groups": [{"kind": "full", "block_size": 4}]}, 16, mode=mode)
    session.apply({"op": "admit", "rid": "x", "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "budget": 8})
    answer = session.apply(
        {"op": "admit", "rid": "y", "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9], "budget": 9}
    )
    served = answer.get("admitted", {}).get("hit", 0)
    return "visibility.same-pass" if served else "visibility.step-end"


@cache
def unit_hits_profile(mode: str = "hand") -> bool:
    """Whether this release serves hits inside a block (the profile `hit.unit`), found by a
    probe: 16-token blocks of full attention and an align-mode Mamba group hashed every 4
    tokens; does the coordinator turn its fine-grained lookups on? (vLLM 0.26+, hand mode:
    the planned modes take vLLM's own block sizes, with no unit of the vectors' choosing.)"""
    if mode != "hand":
        return False
    layout = {
        "groups": [
            {"kind": "full", "block_size": 16},
            {"kind": "mamba", "block_size": 16, "mode": "align"},
        ],
        "hit_unit": 4,
    }
    try:
        Session(layout, 16, mode=mode)
    except Exception:
        return False
    return True


@cache
def retention_profile(mode: str = "hand") -> str:
    """The retention profile this release follows, found by a probe: a writer computes 13
    tokens (blocks of 4, a window of 8) and finishes; does a sibling sharing its first 5
    tokens hit 4? Under dense retention (RET-DENSE-1) the window block it needs stays cached;
    under sparse (RET-SPARSE-2) only the blocks of the writer's re-send and extension do, and
    the sibling hits 0 (vLLM's default prefix_cache_retention_interval=0 in planned modes)."""
    window = {"kind": "sliding_window", "block_size": 4, "window": 8}
    layout = {"groups": [{"kind": "full", "block_size": 4}, window]}
    session = Session(layout, 32, mode=mode)
    prompt = list(range(100, 113))
    session.apply({"op": "admit", "rid": "w", "tokens": prompt, "budget": 13})
    session.apply({"op": "end_step"})
    session.apply({"op": "finish", "rid": "w"})
    sibling = [*prompt[:5], *range(900, 910)]
    answer = session.apply({"op": "admit", "rid": "s", "tokens": sibling, "budget": 15})
    served = answer.get("admitted", {}).get("hit", 0)
    return "retention.dense" if served else "retention.sparse"


def make_engine() -> VllmEngine:
    """Entry point `vllm`: only where vLLM is installed (its own venv, never kvcert's)."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(
            "vLLM is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh vllm VERSION` and run that venv's kvcert "
            "(scripts/engine-certify.sh vllm VERSION does both)"
        )
    return VllmEngine()


def make_planned_engine() -> VllmEngine:
    """Entry point `vllm-planned`: layouts through vLLM's own planner, draft layers marked."""
    make_engine()
    return VllmEngine("marked")


def make_planned_unmarked_engine() -> VllmEngine:
    """Entry point `vllm-planned-unmarked`: as `vllm-planned`, draft layers left unmarked."""
    make_engine()
    return VllmEngine("unmarked")
