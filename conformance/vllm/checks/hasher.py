"""kvcert's block hasher (kvcert.reference.vllm.hasher) on vLLM 0.33.0's own Request and
EngineCore: the digests it attaches are the ones the manager would make, the manager looks
up with them instead of digesting again, they go as soon as vLLM calls the hasher again (the
request's tokens may have changed), vLLM's hashes are computed only where the manager reads
them (KV events), a prompt the manager refuses is refused in the manager's step (never
while the request is built), and vLLM's EngineCore builds its requests with it only when its
scheduler is kvcert's. Run by `kvcert.conformance.vllm.checks.integration`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from vllm import SamplingParams
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.core import EngineCore
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.checks.fixtures import BLOCK, TOKENS, config, make_scheduler
from kvcert.reference.vllm import KVCacheManager, Scheduler, UnsupportedConfigError
from kvcert.reference.vllm.extras import request_extras
from kvcert.reference.vllm.hasher import ATTACHED, RequestHasher, attached_prompt

Check = tuple[str, bool, str]


def vllm_hasher() -> Callable[[Any], list[Any]]:
    init_none_hash(sha256)
    hasher: Callable[[Any], list[Any]] = get_request_block_hasher(BLOCK, sha256)
    return hasher


def manager(events: bool = False) -> KVCacheManager:
    return KVCacheManager(config(), 256, BLOCK, BLOCK, enable_kv_cache_events=events)


def built(rid: str, hasher: Any, **extra: Any) -> Request:
    params = SamplingParams(max_tokens=4)
    return Request(rid, list(TOKENS), params, None, block_hasher=hasher, **extra)


def digests(prompt: Any) -> list[list[bytes]]:
    return [list(chain.digests) for chain in prompt.chains if chain is not None]


def counting_prompts(owner: KVCacheManager) -> list[int]:
    """Count the core's `prompt` calls (a digest the manager makes itself)."""
    core, made = owner.core, [0]
    digest = core.prompt

    def prompt(*args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return digest(*args, **kwargs)

    core.prompt = prompt
    return made


def attach_checks() -> list[Check]:
    """What the hasher attaches, and the manager's use of it."""
    checks = []
    for name, extra in (("plain", {}), ("salted", {"cache_salt": "s"})):
        owner = manager()
        request = built("a", RequestHasher(owner, vllm_hasher()), **extra)
        prompt = attached_prompt(request, owner.core)
        made = owner.core.prompt(list(TOKENS), request_extras(request))
        same = prompt is not None and prompt.encoded == made.encoded
        same = same and digests(prompt) == digests(made) and digests(made) != [[]]
        checks.append((f"attached digests are the manager's, {name}", same, f"{prompt}"))
    # a second request served with the attached digests: the manager digests nothing itself
    owner = manager()
    hasher = RequestHasher(owner, vllm_hasher())
    first = built("a", hasher)
    owner.allocate_slots(first, first.num_tokens)
    owner.end_step()
    owner.free(first)
    second = built("b", hasher)
    made = counting_prompts(owner)
    _, hit = owner.get_computed_blocks(second)[:2]
    owner.allocate_slots(second, second.num_tokens - hit)
    checks.append(
        ("the manager looks up and admits with them", (made[0], hit) == (0, 48), f"{made}, {hit}")
    )
    unhashed = built("c", None)  # a request built without the hasher: the manager digests it
    hit = owner.get_computed_blocks(unhashed)[1]
    checks.append(("without them the manager digests", (made[0], hit) == (1, 48), f"{made}, {hit}"))
    return checks


def later_call_checks() -> list[Check]:
    """The digests describe the request as built: any later hasher call drops them."""
    owner = manager()
    request = built("a", RequestHasher(owner, vllm_hasher()))
    kept = ATTACHED in vars(request)
    request.append_output_token_ids(7)
    dropped = ATTACHED not in vars(request)
    request.append_output_token_ids(8)  # and stay gone
    gone = ATTACHED not in vars(request)
    fresh = built("c", RequestHasher(owner, vllm_hasher()))
    stale = built("b", RequestHasher(owner, vllm_hasher()))
    stale.prompt_token_ids.append(9)  # changed behind vLLM's back: the length tells
    stale._all_token_ids.append(9)
    mine = attached_prompt(fresh, owner.core) is not None
    return [
        ("attached as built", kept, ""),
        ("dropped when an output is appended", dropped and gone, "still attached"),
        ("a digest of other length is not used", attached_prompt(stale, owner.core) is None, ""),
        (
            "only the manager it was made for uses it",
            mine and attached_prompt(fresh, manager().core) is None,
            f"its own manager finds it: {mine}",
        ),
    ]


def vllm_hash_checks() -> list[Check]:
    """vLLM's hashes: skipped where nothing reads them, vLLM's own where events name them."""
    plain = built("a", RequestHasher(manager(), vllm_hasher()))
    evented = built("b", RequestHasher(manager(events=True), vllm_hasher()))
    own = built("c", vllm_hasher())
    return [
        (
            "vLLM's hashing skipped with events off",
            plain.block_hashes == [],
            f"{plain.block_hashes}",
        ),
        (
            "vLLM's hashes kept with events on",
            evented.block_hashes == own.block_hashes and len(own.block_hashes) == 4,
            f"{len(evented.block_hashes)} vs {len(own.block_hashes)}",
        ),
    ]


def refusal_checks() -> list[Check]:
    """A prompt the manager refuses is built, then refused in the manager's call."""
    owner = manager()
    item = MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=None,
        mm_position=PlaceholderRange(offset=4, length=8),
    )
    try:
        request = built("a", RequestHasher(owner, vllm_hasher()), mm_features=[item])
    except Exception as why:
        return [("a refused prompt is built", False, repr(why))]
    try:
        owner.get_computed_blocks(request)
    except UnsupportedConfigError:
        return [("a refused prompt is refused in the manager's call", True, "")]
    return [("a refused prompt is refused in the manager's call", False, "served")]


def engine_core(scheduler: Any) -> Any:
    """The parts of vLLM's EngineCore its `preprocess_add_request` reads."""
    return types.SimpleNamespace(
        scheduler=scheduler,
        request_block_hasher=vllm_hasher(),
        mm_receiver_cache=None,
        structured_output_manager=None,
    )


def core_request(rid: str) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=rid,
        prompt_token_ids=list(TOKENS),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def engine_checks() -> list[Check]:
    """vLLM's EngineCore builds requests with kvcert's hasher once its scheduler is kvcert's
    (building one installs the hook), and keeps vLLM's under vLLM's own scheduler."""
    vllm_config = runtime.engine_config(
        runtime.Settings(max_len=256, block_size=BLOCK, budget=64, max_num_seqs=4)
    )
    vllm_config.cache_config.num_gpu_blocks = 64
    ours = engine_core(make_scheduler(Scheduler, vllm_config))
    request, _ = EngineCore.preprocess_add_request(ours, core_request("a"))
    swapped = isinstance(ours.request_block_hasher, RequestHasher)
    owner = ours.scheduler.kv_cache_manager
    theirs = engine_core(
        VllmScheduler(
            vllm_config=vllm_config,
            kv_cache_config=config(),
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK,
            hash_block_size=BLOCK,
        )
    )
    kept = theirs.request_block_hasher
    plain, _ = EngineCore.preprocess_add_request(theirs, core_request("b"))
    return [
        (
            "an engine under kvcert's scheduler digests with kvcert's hasher",
            swapped and attached_prompt(request, owner.core) is not None,
            f"{type(ours.request_block_hasher).__name__}",
        ),
        (
            "an engine under vLLM's scheduler keeps vLLM's hasher",
            theirs.request_block_hasher is kept and len(plain.block_hashes) == 4,
            f"{type(theirs.request_block_hasher).__name__}, {len(plain.block_hashes)} hashes",
        ),
    ]


def hasher_checks() -> list[Check]:
    return [
        *attach_checks(),
        *later_call_checks(),
        *vllm_hash_checks(),
        *refusal_checks(),
        *engine_checks(),
    ]
