"""What the kvcert manager keys and refuses, on vLLM 0.33.0's own Request and spec objects.

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.integration

vLLM's own tests exercise its hash utilities, not what kvcert.reference.vllm derives from a
Request: this checks that two requests with the same tokens share blocks only when every
extra input (cache salt, LoRA adapter name and path, multimodal item and its place, prompt
embeddings) is the same, that its KV events are vLLM's (BlockStored when a step's blocks
become hittable, BlockRemoved when they are evicted, AllBlocksCleared on a reset), that under
vLLM's AsyncScheduler a step's output makes only that step's blocks hittable, and that each
configuration the integration does not serve is refused with UnsupportedConfigError, and what
a state (Mamba/GDN) hybrid in align mode gets through kvcert's Scheduler: the block vLLM's
runner copies a request's state from is in its table, the junction where two prompts
diverge is checkpointed for a third, and the state a Mamba2-style kernel saves inside a prefill
chunk is held and hit. Also the retention interval vLLM's tests set on the coordinator
(honoured in vLLM's meaning before the first request, refused after), and the read-only views
of kvcert's state under the names vLLM's tests read (tables, hit alignment, the blocks cached
for one of vLLM's block hashes), and --prefix-match-unit served through `unit U` beside vLLM's
own manager (unit_serving), and kvcert's block hasher on vLLM's Request and EngineCore (hasher).
Prints one line per check; exit 1 on any failure.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.lora.request import LoRARequest
from vllm.model_executor.layers.mamba.checkpoint import compute_mamba_prefill_checkpoints
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.checks import unit_serving
from kvcert.conformance.vllm.checks.fixtures import (
    BLOCK,
    FULL,
    STATE,
    TOKENS,
    config,
    make_scheduler,
    refused,
    request,
    run_step,
    state_config,
)
from kvcert.conformance.vllm.checks.hasher import hasher_checks
from kvcert.conformance.vllm.checks.views import (
    block_field_checks,
    match_unit_scheduler,
    retention_checks,
    step_signal_checks,
    view_checks,
)
from kvcert.reference import tables as planning
from kvcert.reference.config import Visibility
from kvcert.reference.vllm import (
    AsyncScheduler,
    HoldBack,
    IntegrationError,
    KVCacheManager,
    Scheduler,
    Settings,
    checkpoints,
)


def feature(identifier: str, offset: int) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=8),
    )


def hit_after(first: dict[str, Any], second: dict[str, Any]) -> int:
    """The hit `second` gets after `first` was computed and finished."""
    manager = KVCacheManager(
        config(), max_model_len=256, scheduler_block_size=BLOCK, hash_block_size=BLOCK
    )
    a = request("a", **first)
    manager.allocate_slots(a, a.num_tokens)
    manager.end_step()
    manager.free(a)
    return int(manager.get_computed_blocks(request("b", **second))[1])


def lora(name: str, path: str) -> LoRARequest:
    return LoRARequest(lora_name=name, lora_int_id=1, lora_path=path)


EMBEDS = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4)
SHARED = 48  # what a request with identical inputs gets back

KEYING: list[tuple[str, dict[str, Any], dict[str, Any], int]] = [
    ("identical prompts", {}, {}, SHARED),
    ("same cache salt", {"cache_salt": "s"}, {"cache_salt": "s"}, SHARED),
    ("another cache salt", {"cache_salt": "s"}, {"cache_salt": "t"}, 0),
    ("salted vs not", {"cache_salt": "s"}, {}, 0),
    (
        "same LoRA adapter",
        {"lora_request": lora("x", "/a")},
        {"lora_request": lora("x", "/a")},
        SHARED,
    ),
    (
        "LoRA re-pointed at another path",
        {"lora_request": lora("x", "/a")},
        {"lora_request": lora("x", "/b")},
        0,
    ),
    ("LoRA vs the base model", {"lora_request": lora("x", "/a")}, {}, 0),
    (
        "same image at the same place",
        {"mm_features": [feature("img", 20)]},
        {"mm_features": [feature("img", 20)]},
        SHARED,
    ),
    (
        "another image at the same place",
        {"mm_features": [feature("img", 20)]},
        {"mm_features": [feature("other", 20)]},
        16,
    ),
    (
        "the same image elsewhere",
        {"mm_features": [feature("img", 20)]},
        {"mm_features": [feature("img", 36)]},
        16,
    ),
    (
        "same prompt embeddings",
        {"prompt_embeds": EMBEDS},
        {"prompt_embeds": EMBEDS.clone()},
        SHARED,
    ),
    ("other prompt embeddings", {"prompt_embeds": EMBEDS}, {"prompt_embeds": EMBEDS + 1}, 0),
]


def published(block_hashes: Any) -> list[Any]:
    """vLLM's block hashes as its KV events publish them (ints or bytes, as its settings say)."""
    return [maybe_convert_block_hash(h) for h in block_hashes]


def lookahead_events() -> tuple[list[Any], Request]:
    """A prompt computed where vLLM's block hashes read the token after each block (its hash
    lookahead for a drafter, whose draft KV reads it): the events once the step ends."""
    manager = KVCacheManager(
        config(), 256, BLOCK, BLOCK, enable_kv_cache_events=True, num_hash_lookahead_tokens=1
    )
    r = request("r", block_hasher=get_request_block_hasher(BLOCK, sha256, 1))
    manager.allocate_slots(r, r.num_tokens)
    manager.end_step()
    return manager.take_events(), r


def event_checks() -> list[tuple[str, bool, str]]:
    """A LoRA request computed, then another evicting most of its blocks, then a reset, in
    a pool of 5 usable blocks: what take_events() returns after each."""
    manager = KVCacheManager(
        KVCacheConfig(num_blocks=6, kv_cache_tensors=[], kv_cache_groups=config().kv_cache_groups),
        256,
        BLOCK,
        BLOCK,
        enable_kv_cache_events=True,
    )
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    a = request("a", lora_request=lora("adapter", "/adapters/a"), block_hasher=hasher)
    manager.allocate_slots(a, a.num_tokens)
    before = manager.take_events()
    manager.end_step()
    stored = manager.take_events()
    manager.free(a)
    b = request("b", tokens=list(range(500, 564)), block_hasher=hasher)
    manager.allocate_slots(b, b.num_tokens)
    removed = manager.take_events()
    manager.end_step()
    manager.free(b)
    manager.take_events()
    manager.reset_prefix_cache()
    cleared = manager.take_events()
    one = stored[0] if len(stored) == 1 and isinstance(stored[0], BlockStored) else None
    hashes = set(one.block_hashes) if one else set()
    ahead, r = lookahead_events()
    return [
        ("nothing announced before the step ends", before == [], f"{before}"),
        (
            "one BlockStored for the request's 4 blocks",
            one is not None
            and len(one.block_hashes) == 4
            and one.token_ids == TOKENS
            and one.block_size == BLOCK
            and one.parent_block_hash is None
            and one.group_idx == 0
            and one.kv_cache_spec_kind == "full_attention",
            f"{stored}",
        ),
        (
            "its hashes are vLLM's own block hashes of the request",
            one is not None and one.block_hashes == published(a.block_hashes),
            f"{one and one.block_hashes} vs {a.block_hashes}",
        ),
        (
            "with vLLM's hash lookahead of 1: the 3 blocks whose next token is known, each with it",
            len(ahead) == 1
            and isinstance(ahead[0], BlockStored)
            and ahead[0].block_hashes == published(r.block_hashes)
            and len(r.block_hashes) == 3
            and ahead[0].lookahead_token_ids == [[TOKENS[16]], [TOKENS[32]], [TOKENS[48]]],
            f"{ahead} vs {r.block_hashes}",
        ),
        (
            "BlockStored names the LoRA adapter",
            one is not None and one.lora_name == "adapter" and one.lora_id == 1,
            f"{one}",
        ),
        (
            "BlockRemoved for each evicted block of the first request",
            len(removed) == 3
            and all(isinstance(e, BlockRemoved) and e.block_hashes[0] in hashes for e in removed),
            f"{removed}",
        ),
        ("AllBlocksCleared on a reset", cleared == [AllBlocksCleared()], f"{cleared}"),
    ]


def async_checks(visibility: Visibility) -> list[tuple[str, bool, str]]:
    """kvcert's AsyncScheduler: step 1 prefills A (64 tokens); B (48 other tokens) arrives
    and step 2 (B's prefill; A, asked for one token, needs no other step) is scheduled before
    step 1's output is read. What a probe of each prompt hits after each output. Under
    step-end visibility ending every step at each output (a broken twin) fails the third
    check; under same-pass (fcfs's default) both prefixes are hittable once scheduled."""
    vllm_config = runtime.engine_config(
        runtime.Settings(
            max_len=256, block_size=BLOCK, budget=64, max_num_seqs=4, async_scheduling=True
        )
    )
    vllm_config.cache_config.num_gpu_blocks = 64
    scheduler = make_scheduler(
        AsyncScheduler.configured(Settings(visibility=visibility)), vllm_config
    )
    other = list(range(500, 548))

    def probe(tokens: list[int]) -> int:
        lookup = scheduler.kv_cache_manager.get_computed_blocks(request("probe", tokens=tokens))
        return int(lookup[1])

    def output(scheduled: Any) -> ModelRunnerOutput:
        ids = list(scheduled.num_scheduled_tokens)
        index = {r: i for i, r in enumerate(ids)}
        sampled = [[7] for _ in ids]  # every chunk here ends its prompt
        return ModelRunnerOutput(req_ids=ids, req_id_to_index=index, sampled_token_ids=sampled)

    scheduler.add_request(request("a"))
    first = scheduler.schedule()
    scheduler.add_request(request("b", tokens=other))
    second = scheduler.schedule()  # before the first output is read
    scheduled = (dict(first.num_scheduled_tokens), dict(second.num_scheduled_tokens))
    before = (probe(TOKENS), probe(other))
    scheduler.update_from_output(first, output(first))
    after_first = (probe(TOKENS), probe(other))
    scheduler.update_from_output(second, output(second))
    after_second = probe(other)
    steps = (
        "step 1 prefills A, step 2 prefills B",
        scheduled == ({"a": 64}, {"b": 48}),
        f"{scheduled}",
    )
    if visibility is Visibility.SAME_PASS:
        return [
            steps,
            ("both prefixes hittable once scheduled", before == (48, 32), f"{before}"),
            ("still after step 1's output", after_first == (48, 32), f"{after_first}"),
            ("still after step 2's output", after_second == 32, f"{after_second}"),
        ]
    return [
        steps,
        ("nothing hittable before an output", before == (0, 0), f"{before}"),
        (
            "step 1's output: A's blocks (48 tokens), none of B's (step 2 runs)",
            after_first == (48, 0),
            f"{after_first}",
        ),
        ("step 2's output: B's blocks (32 tokens)", after_second == 32, f"{after_second}"),
    ]


CHECKPOINTING_STATE = dataclasses.replace(
    STATE, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
)  # what vLLM 0.33.0's Mamba2 layers plan: the kernel saves state inside a prefill chunk


def state_scheduler(settings: Settings | None = None, state: MambaSpec = STATE) -> Any:
    """kvcert's Scheduler over a full-attention + Mamba (align) model, blocks of 16, a
    128-token step budget (the environment's settings unless `settings`)."""
    vllm_config = state_config()
    cls = Scheduler if settings is None else Scheduler.configured(settings)
    return make_scheduler(cls, vllm_config, FULL, state)


def routed_experts_scheduler() -> Any:
    """kvcert's Scheduler for a model served with --enable-return-routed-experts (vLLM's
    connector for it reads cached blocks from vLLM's own block pool)."""
    vllm_config = state_config()
    vllm_config.aux_output_config.enable_return_routed_experts = True
    return make_scheduler(Scheduler, vllm_config, FULL)


def connector_scheduler() -> Any:
    """kvcert's Scheduler for an engine configured with a KV connector (vLLM's example
    connector, which stores KV on local disk)."""
    vllm_config = state_config()
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True  # as it asks
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="ExampleConnector", kv_role="kv_both"
    )
    return make_scheduler(Scheduler, vllm_config, FULL)


def hold_back_checks() -> list[tuple[str, bool, str]]:
    """A (80 tokens) and B (A's first 64, then 16 others) arrive together. Step 1 prefills A
    up to its last block boundary (64); B would hit those 64 tokens once step 1 has ended, so
    kvcert holds it back (KVCERT_HOLD_BACK=state, the default for a state model) and vLLM's
    scheduler admits it in step 2 from the checkpoint. Under `never` (the twin) B is admitted
    in step 1 with no hit and computes the 64 tokens again."""
    out = []
    for hold, want in ((HoldBack.STATE, ([("a", 0)], [("b", 64)])), (HoldBack.NEVER, None)):
        scheduler = state_scheduler(Settings(hold_back=hold))
        first = list(range(100, 180))
        prompts = {"a": first, "b": first[:64] + list(range(500, 516))}
        for rid, tokens in prompts.items():
            scheduler.add_request(request(rid, tokens=tokens))
        steps = []
        for _ in range(2):
            scheduled = run_step(scheduler, prompts).scheduled_new_reqs
            steps.append([(new.req_id, new.num_computed_tokens) for new in scheduled])
        got = (steps[0], steps[1])
        if want is not None:
            out.append(("B waits a step and resumes from A's checkpoint (64)", got == want,
                        f"{got}"))  # fmt: skip
        else:
            out.append(("twin, never: B admitted at once with no hit",
                        got == ([("a", 0), ("b", 0)], []), f"{got}"))  # fmt: skip
    return out


def state_checks() -> list[tuple[str, bool, str]]:
    """kvcert's Scheduler over a full-attention + Mamba (align) model, blocks of 16, as vLLM's
    scheduler drives it (its block-aligned prefill split; the junction it ends a chunk at).
    A (80 tokens) is served; B shares A's first 40 tokens and C those 40 too. Broken twins:
    returning no junction fails the second and fourth checks (C then hits nothing); the
    ALLOC-HOLD-1 of before 2026-11-24 (the copy source released) fails the third."""
    scheduler = state_scheduler()
    manager = scheduler.kv_cache_manager
    first = list(range(100, 180))
    prompts = {"a": first, "b": first[:40] + list(range(500, 540))}
    prompts["c"] = first[:40] + list(range(700, 740))
    chunks: dict[str, list[tuple[int, int, list[int]]]] = {}

    def record(out: Any) -> None:
        """Each scheduled chunk's span and its state group's table."""
        for r, count in out.num_scheduled_tokens.items():
            start = scheduler.requests[r].num_computed_tokens - count
            chunks.setdefault(r, []).append((start, start + count, manager.get_block_ids(r)[1]))

    for rid, tokens in prompts.items():
        scheduler.add_request(request(rid, tokens=tokens))
        while rid in scheduler.requests:
            run_step(scheduler, prompts, record)

    def copy_sources_held(rid: str) -> bool:
        """Each chunk's table holds the block of the state it starts from (column
        (start - 1) // 16, what vLLM's runner copies) and of its running state."""
        return all(
            (start == 0 or table[(start - 1) // BLOCK]) and table[-(-end // BLOCK) - 1]
            for start, end, table in chunks[rid]
        )

    spans = {r: [(s, e) for s, e, _ in c] for r, c in chunks.items()}
    return [
        (
            "A's prefill stops at its last block boundary (vLLM's aligned split)",
            spans["a"] == [(0, 64), (64, 80)],
            f"{spans['a']}",
        ),
        (
            "B stops where its prompt leaves A's (the junction, 32)",
            spans["b"][0] == (0, 32),
            f"{spans['b']}",
        ),
        (
            "every chunk's table holds its state's copy source and its running state",
            all(copy_sources_held(r) for r in chunks),
            f"{chunks}",
        ),
        ("C resumes from the junction's checkpoint (32)", spans["c"][0][0] == 32, f"{spans['c']}"),
    ]


def serve_in_turn(
    scheduler: Any, prompts: dict[str, list[int]]
) -> tuple[list[tuple[str, int, int]], list[list[int]]]:
    """Each prompt served to the end before the next arrives: every chunk's (request, start,
    end) and its state group's table."""
    manager = scheduler.kv_cache_manager
    spans: list[tuple[str, int, int]] = []
    tables: list[list[int]] = []

    def record(out: Any) -> None:
        for r, count in out.num_scheduled_tokens.items():
            start = scheduler.requests[r].num_computed_tokens - count
            spans.append((r, start, start + count))
            tables.append(list(manager.get_block_ids(r)[1]))

    for rid, tokens in prompts.items():
        scheduler.add_request(request(rid, tokens=tokens))
        while rid in scheduler.requests:
            run_step(scheduler, prompts, record)
    return spans, tables


def checkpoint_checks() -> list[tuple[str, bool, str]]:
    """The Mamba group saves state inside a prefill chunk (num_prefill_checkpoint_blocks=1,
    what Mamba2 layers plan). A (80 tokens) is one chunk: vLLM's scheduler no longer splits
    it at 64, since the runner saves the state after 64 tokens into table column
    cdiv(80, 16) - 2 = 3 in passing, and kvcert holds a block there (CKPT-INNER-1). B (A's
    first 64, then 16 others) hits those 64 tokens. Broken twin: kvcert passes no checkpoint
    (column 3 null: the runner skips it) and B hits nothing, as the checks before this
    feature found."""

    out = []
    first = list(range(100, 180))
    prompts = {"a": first, "b": first[:64] + list(range(500, 516))}
    original = checkpoints.RunnerCheckpoints.checkpoint
    for twin in (False, True):
        if twin:
            checkpoints.RunnerCheckpoints.checkpoint = lambda *_: 0  # type: ignore[method-assign]
        try:
            spans, tables = serve_in_turn(state_scheduler(state=CHECKPOINTING_STATE), prompts)
        finally:
            checkpoints.RunnerCheckpoints.checkpoint = original  # type: ignore[method-assign]
        a_table = tables[0]
        b_start = next(start for r, start, _ in spans if r == "b")
        if not twin:
            out += [
                ("A's prompt is one chunk (the runner saves 64 in passing)",
                 spans[0] == ("a", 0, 80), f"{spans}"),
                ("A's state table holds a block at column 3 (the checkpoint) and 4",
                 len(a_table) == 5 and bool(a_table[3] and a_table[4]), f"{a_table}"),
                ("B resumes from A's checkpoint (64)", b_start == 64, f"{spans}"),
            ]  # fmt: skip
        else:
            out.append(("twin, no checkpoint passed: column 3 null, B hits nothing",
                        a_table[3] == 0 and b_start == 0, f"{a_table} {spans}"))  # fmt: skip
    return out


def async_checkpoint_checks() -> list[tuple[str, bool, str]]:
    """kvcert's AsyncScheduler, the Mamba group saving checkpoints: step 1 prefills A (80
    tokens, its checkpoint at 64) and step 2, scheduled before step 1's output, decodes A
    (kvcert reserves its blocks while step 1 runs). Once step 1's output is read a probe of
    A's first 64 tokens hits 64: the reservation for step 2 kept the checkpoint's block
    (before 2026-11-25 it released it, and the probe hit nothing)."""
    vllm_config = state_config(asynchronous=True)
    scheduler = make_scheduler(AsyncScheduler, vllm_config, FULL, CHECKPOINTING_STATE)
    first = list(range(100, 180))
    scheduler.add_request(Request("a", first, SamplingParams(max_tokens=4, ignore_eos=True), None))
    one = scheduler.schedule()
    two = scheduler.schedule()  # before step 1's output is read
    scheduled = (dict(one.num_scheduled_tokens), dict(two.num_scheduled_tokens))
    ids = ["a"]
    scheduler.update_from_output(
        one, ModelRunnerOutput(req_ids=ids, req_id_to_index={"a": 0}, sampled_token_ids=[[7]])
    )
    probe = request("probe", tokens=[*first[:64], *range(500, 516)])
    hit = int(scheduler.kv_cache_manager.get_computed_blocks(probe)[1])
    return [
        ("step 1 prefills A whole, step 2 decodes it", scheduled == ({"a": 80}, {"a": 1}),
         f"{scheduled}"),
        ("after step 1's output, A's checkpoint (64) is hit", hit == 64, f"hit {hit}"),
    ]  # fmt: skip


# (hash block, state block, cache-hit alignment, EAGLE block drop, hash lookahead tokens,
# speculative state blocks): the parameters of vLLM's test_checkpoint_reservation_matches_worker
CHECKPOINT_GRID = (
    (32, 32, 32, False, 0, 0),
    (16, 32, 32, False, 0, 0),
    (16, 32, 16, False, 0, 0),
    (32, 32, 32, True, 0, 3),
    (32, 32, 32, False, 1, 3),
    (16, 32, 32, False, 1, 3),
    (16, 32, 32, False, 2, 3),
)


def checkpoint_grid_checks() -> list[tuple[str, bool, str]]:
    """The property of vLLM's own test_checkpoint_reservation_matches_worker, on kvcert's
    manager driven chunk by chunk as that test drives vLLM's (with its EAGLE and lookahead
    cases, which add speculative state blocks): wherever the runner's
    `compute_mamba_prefill_checkpoints` exports a chunk's state, kvcert's table holds the
    checkpoint block for exactly that position (CKPT-INNER-1) or the null block there. The
    manager checks this itself on every allocation and raises IntegrationError; this drives
    it through 70 cases (hits landing on the state block, or on a smaller hash block as with
    vLLM's partial hits, where the runner's position is not kvcert's boundary and the column
    must stay null), requires some columns held (not a vacuous pass), and that a request
    re-sending a prompt whose whole prefill was one chunk resumes from the checkpoint."""

    held = exported = resumed = one_chunk = cases = 0
    errors = []
    for hash_block, state_block, alignment, eagle, lookahead, spare in CHECKPOINT_GRID:
        full = dataclasses.replace(FULL, block_size=hash_block)
        state = dataclasses.replace(
            CHECKPOINTING_STATE, block_size=state_block, num_speculative_blocks=spare
        )
        for prompt, outputs in ((104, 0), (200, 0), (40, 24), (40, 25), (150, 43)):
            for chunk_blocks in (2, 100):
                cases += 1
                kv = config(full, state)
                kv.cache_hit_alignment_tokens = alignment  # as EngineCore resolves it
                manager = KVCacheManager(
                    kv,
                    512,
                    state_block,
                    hash_block,
                    use_eagle=eagle,
                    num_hash_lookahead_tokens=lookahead,
                )
                req = request("r", tokens=list(range(prompt)))
                req.append_output_token_ids(list(range(1000, 1000 + outputs)))
                start, total, chunks = 0, req.num_tokens, 0
                try:
                    while start < total:
                        end = min(start + chunk_blocks * state_block, total)
                        if manager.allocate_slots(req, end - start) is None:
                            raise RuntimeError(f"no room for [{start}, {end})")
                        offsets, columns = compute_mamba_prefill_checkpoints(
                            [end],
                            [end - start],
                            hash_block,
                            state_block,
                            1,
                            eagle,
                            alignment,
                            num_hash_lookahead_tokens=lookahead,
                        )
                        if offsets[0]:
                            exported += 1
                            held += bool(manager.get_block_ids("r")[1][columns[0]])
                        req.num_computed_tokens = end
                        manager.end_step()
                        start, chunks = end, chunks + 1
                except Exception as why:
                    errors.append(f"{hash_block}/{state_block} {prompt}+{outputs}: {why}")
                    continue
                # (under EAGLE's block drop the runner saves a block before the column's
                # boundary, which kvcert keeps null: sound, and no hit; not counted here)
                if (
                    chunks == 1
                    and outputs == 0
                    and not eagle
                    and prompt > 2 * state_block == 2 * alignment
                ):
                    one_chunk += 1
                    again = request("again", tokens=[*range(prompt), 7])
                    hit = manager.get_computed_blocks(again)[1]
                    resumed += hit == (prompt - 1) // state_block * state_block
    return [
        ("vLLM's checkpoint-reservation property over 70 chunked prefills",
         cases == 70 and not errors, f"{cases} cases; " + "; ".join(errors[:3])),
        ("the runner's checkpoint column is held where it exports",
         0 < held <= exported, f"held {held} of {exported} exports"),
        ("a prompt prefilled in one chunk is hit at its last boundary",
         resumed == one_chunk > 0, f"{resumed} of {one_chunk}"),
    ]  # fmt: skip


def draft_steps(manager: Any, spare: int) -> list[tuple[int, int]]:
    """Up to 12 steps as vLLM's scheduler makes them under MTP with `spare` drafts (a
    40-token prefill, then decode steps of the sampled token and the drafts, every draft
    accepted, `spare` lookahead slots): per step served, (attention blocks, state blocks)."""
    req = request("r", tokens=list(range(100, 140)))
    new, lengths = 40, []
    for _ in range(12):
        if manager.allocate_slots(req, new, num_lookahead_tokens=spare) is None:
            break
        full, states = manager.get_block_ids("r")
        lengths.append((len(full), sum(b != 0 for b in states)))
        # the prefill samples one token; a decode step accepts the drafts, then one more
        sampled = 1 if new == 40 else spare + 1
        req.num_computed_tokens += new
        req.append_output_token_ids(list(range(900, 900 + sampled)))
        getattr(manager, "end_step", lambda: None)()
        new = 1 + spare  # the last sampled token and the drafts for it
    return lengths


def draft_checks() -> list[tuple[str, bool, str]]:
    """MTP on a full-attention + Mamba (align) model whose state group keeps 3 blocks for
    the drafts' states (num_speculative_blocks=3): kvcert's manager and vLLM's own get the
    same calls as vLLM's scheduler makes (draft_steps). The attention table never holds
    more blocks than vLLM's (the twin of before 2026-11-25 sized the attention slots by the
    state table's speculative positions: two blocks more), while every allocation passes the
    manager's own check that the state table holds the running state's and the drafts'
    columns (ALLOC-SPEC-1). That check's broken twin: a planner that forgets the drafts'
    state blocks (every chunk planned as a prefill) must be refused by it, with
    IntegrationError, on the first decode step."""

    spare = 3
    state = dataclasses.replace(STATE, num_speculative_blocks=spare)
    managers = {
        "kvcert": KVCacheManager(config(FULL, state), 256, BLOCK, BLOCK),
        "vLLM": VllmManager(config(FULL, state), 256, BLOCK, BLOCK),
    }
    lengths = {side: draft_steps(manager, spare) for side, manager in managers.items()}
    ours, theirs = lengths["kvcert"], lengths["vLLM"]
    forgetful = KVCacheManager(config(FULL, state), 256, BLOCK, BLOCK)
    # its compiled decode lane off: the lane plans a state group's decode steps itself
    forgetful.core._lane, forgetful.core._lane_registers = None, False
    planned = vars(planning)["table_end"]
    vars(planning)["table_end"] = lambda group, end, decoding, limit=None: planned(
        group, end, False, limit
    )
    caught: list[tuple[int, int]] | IntegrationError
    try:
        caught = draft_steps(forgetful, spare)
    except IntegrationError as why:
        caught = why
    finally:
        vars(planning)["table_end"] = planned
    return [
        (
            "12 steps of 3 drafts served by both managers",
            len(ours) == len(theirs) == 12,
            f"kvcert {ours}, vLLM {theirs}",
        ),
        (
            "kvcert's attention table never holds more blocks than vLLM's",
            all(a[0] <= b[0] for a, b in zip(ours, theirs, strict=False)),
            f"(attention blocks, state blocks) kvcert {ours}, vLLM {theirs}",
        ),
        (
            "the drafts' state blocks forgotten: the runner-columns check refuses the first "
            "decode step",
            isinstance(caught, IntegrationError) and "table columns" in str(caught),
            f"served {caught}",
        ),
    ]


def short_model_checks() -> list[tuple[str, bool, str]]:
    """A max_model_len of 8 under blocks of 16 (a pooling model's short context): no hit
    can fit, and the manager still serves the model (vLLM's does), without reuse."""
    manager = KVCacheManager(config(), 8, BLOCK, BLOCK)
    tokens = TOKENS[:8]
    a = request("a", tokens=tokens)
    allocated = manager.allocate_slots(a, 8)
    manager.end_step()
    manager.free(a)
    hit = manager.get_computed_blocks(request("b", tokens=tokens))[1]
    return [
        ("served", allocated is not None, "no blocks for the prompt"),
        ("a re-send hits nothing", hit == 0, f"hit {hit}"),
    ]


def mtp_checks() -> list[tuple[str, bool, str]]:
    """A model with a drafter's group (its layers marked `is_draft`, as 0.33's drafters mark
    them) served with 3 MTP modules (vLLM's scheduler passes num_prefill_lookahead=3): after
    A's 64 tokens, B shares them up to token 48 and differs at token 49. The drafter's KV at
    position 47 read tokens up to 50, so B may not take block 2 (HASH-DRAFT-1 with reach 3);
    one module (an EAGLE head, reach 1) reads token 48 only and may. Where vLLM's hashes
    reach 3 tokens past each block but the prefill lookahead says 0, the longer reach keys."""
    draft = dataclasses.replace(FULL, is_draft=True)
    b_tokens = [*TOKENS[:49], 7, *TOKENS[50:]]
    hits = {}
    for hashed, modules in ((1, 1), (3, 3), (3, 0)):
        manager = KVCacheManager(
            config(FULL, draft), 256, BLOCK, BLOCK, use_eagle=True,
            num_hash_lookahead_tokens=hashed, num_prefill_lookahead=modules,
        )  # fmt: skip
        a = request("a")
        manager.allocate_slots(a, a.num_tokens)
        manager.end_step()
        manager.free(a)
        hits[hashed, modules] = manager.get_computed_blocks(request("b", tokens=b_tokens))[1]
    return [
        ("3 modules: no hit on a block whose third token after it differs",
         hits[3, 3] == 32, f"hit {hits[3, 3]} (want 32)"),
        ("1 module: the same block hits", hits[1, 1] == 48, f"hit {hits[1, 1]} (want 48)"),
        ("hashes reaching 3 past each block, prefill lookahead 0: keyed with reach 3",
         hits[3, 0] == 32, f"hit {hits[3, 0]} (want 32)"),
    ]  # fmt: skip


def main() -> int:
    failed = 0
    for name, first, second, want in KEYING:
        got = hit_after(first, second)
        failed += got != want
        print(f"{'ok  ' if got == want else 'FAIL'} keying, {name}: hit {got} (want {want})")
    mamba = MambaSpec(block_size=BLOCK, shapes=((4,),), dtypes=(torch.float32,))
    refusals: dict[str, Callable[[], Any]] = {
        "a Mamba group outside align mode": lambda: KVCacheManager(
            config(FULL, mamba), 256, BLOCK, BLOCK
        ),
        "decode context parallelism": lambda: KVCacheManager(
            config(), 256, BLOCK, BLOCK, dcp_world_size=2
        ),
        "routed-experts capture": routed_experts_scheduler,
        "a KV connector": connector_scheduler,
    }
    for kind, checks in (
        ("events", event_checks()),
        ("max_model_len below a block", short_model_checks()),
        ("async, step-end", async_checks(Visibility.STEP_END)),
        ("async, same-pass", async_checks(Visibility.SAME_PASS)),
        ("state", state_checks()),
        ("hold-back", hold_back_checks()),
        ("checkpoint", checkpoint_checks()),
        ("checkpoint", checkpoint_grid_checks()),
        ("checkpoint, async", async_checkpoint_checks()),
        ("drafts", draft_checks()),
        ("multi-module MTP", mtp_checks()),
        ("retention", retention_checks()),
        ("views", view_checks()),
        ("step signal", step_signal_checks()),
        ("block fields", block_field_checks()),
        ("--prefix-match-unit", unit_serving.all_checks()),
        ("block hasher", hasher_checks()),
    ):
        for name, ok, detail in checks:
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {kind}, {name}" + ("" if ok else f": {detail}"))
    for name, build in refusals.items():
        why = refused(build)
        failed += why is None
        print(f"{'ok  ' if why else 'FAIL'} refused, {name}: {why or 'accepted'}")
    whole = refused(functools.partial(match_unit_scheduler, 2 * BLOCK))
    failed += whole is not None
    print(
        f"{'FAIL' if whole else 'ok  '} served, a --prefix-match-unit of whole blocks"
        + (f": {whole}" if whole else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
