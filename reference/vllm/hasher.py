"""kvcert's prompt digests where vLLM computes its block hashes: in the request's block
hasher, which vLLM's engine runs as a request is built (in `vllm serve`, on the thread that
reads requests in, beside the model's step), not in the scheduler's step.

vLLM's own hashes are read by nothing else while kvcert's manager serves the engine (it
refuses KV connectors), so they are computed only where the manager publishes KV events
(they name blocks by them) or keeps its view of them for vLLM's tests; otherwise the hasher
skips vLLM's hashing altogether. A request carries its digests (`ATTACHED`) from the
hasher's first call to its next one: vLLM calls the hasher again whenever a request's
tokens change (an output appended, a streaming update, a re-hash before recomputing), and
then the digests go, so the manager digests that request itself, as it does a request
built without this hasher. The hasher also makes the array of ids the admission gives the
request (`Prompt.decode_ahead`), a copy of the whole prompt the step need not make. A prompt
the allocator refuses (a multimodal item without an identifier, ids out of range) gets no
digests here: the manager refuses it in its step, with the same error as without this
hasher, never on the thread building requests.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from kvcert.reference.errors import KVCacheError
from kvcert.reference.requests import Prompt
from kvcert.reference.vllm.extras import request_extras, token_view

ATTACHED = "_kvcert_prompt"  # the attribute of vLLM's Request carrying kvcert's digests

VllmHasher = Callable[[Any], list[Any]]


class RequestHasher:
    """vLLM's request block hasher for an engine served by `manager` (a kvcert
    KVCacheManager facade): digests a new request's prompt for the manager's allocator, and
    answers vLLM's hashes where the manager reads them (`vllm_hasher`'s), else none."""

    __slots__ = ("_manager", "_vllm")

    def __init__(self, manager: Any, vllm_hasher: VllmHasher | None) -> None:
        self._manager = manager
        needed = manager.enable_kv_cache_events or manager.hash_view is not None
        self._vllm = vllm_hasher if needed else None

    def __call__(self, request: Any) -> list[Any]:
        hashes = [] if self._vllm is None else self._vllm(request)
        state = vars(request)
        if ATTACHED in state or request.num_output_tokens:
            state.pop(ATTACHED, None)  # called again: its tokens may have changed
            return hashes
        # a prompt it refuses is refused where the manager digests it, in the scheduler's step
        with contextlib.suppress(KVCacheError):
            prompt = self._manager.core.prompt(token_view(request), request_extras(request))
            prompt.decode_ahead()  # the admission's copy of the ids, made here too
            state[ATTACHED] = prompt
        return hashes


def attached_prompt(request: Any, owner: object) -> Prompt | None:
    """The digests `RequestHasher` attached to `request` for the allocator `owner`, when
    they still describe its tokens; else None."""
    prompt = getattr(request, ATTACHED, None)
    if prompt is None or prompt.owner is not owner or len(prompt) != request.num_tokens:
        return None
    return prompt  # type: ignore[no-any-return]


def engine_hasher(scheduler: Any, vllm_hasher: VllmHasher | None) -> VllmHasher | None:
    """The block hasher an engine running `scheduler` gives its requests: kvcert's where
    the scheduler's manager is kvcert's and vLLM would hash (prefix caching on), else
    `vllm_hasher` unchanged."""
    make = getattr(getattr(scheduler, "kv_cache_manager", None), "request_hasher", None)
    if vllm_hasher is None or isinstance(vllm_hasher, RequestHasher) or not callable(make):
        return vllm_hasher
    hasher: RequestHasher = make(vllm_hasher)
    return hasher


def hook_engine_core() -> None:
    """Have vLLM's EngineCore build requests with `engine_hasher`'s hasher: its hasher is
    made after its scheduler (so a scheduler cannot pass one), and read each time a request
    is built (`preprocess_add_request`), where this hook swaps it in once per engine. An
    engine whose scheduler is not kvcert's keeps vLLM's hasher. Idempotent."""
    from vllm.v1.engine.core import EngineCore  # noqa: PLC0415 - needs vLLM

    original = EngineCore.preprocess_add_request
    if getattr(original, "kvcert_hook", False):
        return

    @functools.wraps(original)
    def preprocess_add_request(self: Any, request: Any) -> Any:
        self.request_block_hasher = engine_hasher(self.scheduler, self.request_block_hasher)
        return original(self, request)

    preprocess_add_request.kvcert_hook = True  # type: ignore[attr-defined]
    EngineCore.preprocess_add_request = preprocess_add_request
