"""What besides the token ids keys a vLLM request's blocks (HASH-EXTRA-1), read from vLLM's
Request: each extra input tagged by its kind, so that two requests share a block only when
all of them agree."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.vllm.layout import UnsupportedConfigError


def request_extras(request: Any) -> tuple[ExtraKey, ...]:
    """What besides the token ids changes a request's KV, each tagged by its kind
    (HASH-EXTRA-1): cache salt, LoRA adapter (name and path), multimodal items at their
    spans, prompt embeddings (one digest of the whole tensor over the prompt: any difference
    in them keys every block apart, which serves fewer hits than vLLM's per-block digests,
    never a wrong one)."""
    extras: list[ExtraKey] = []
    salt = getattr(request, "cache_salt", None)
    if salt:
        extras.append(ExtraKey(ExtraKind.CACHE_SALT, str(salt)))
    lora = getattr(request, "lora_request", None)
    if lora:
        name, path = str(lora.lora_name), str(getattr(lora, "lora_path", ""))
        extras.append(ExtraKey(ExtraKind.LORA, f"{len(name)}:{name}{path}"))
    for feature in getattr(request, "mm_features", None) or ():
        place = feature.mm_position
        if feature.identifier is None:
            raise UnsupportedConfigError("a multimodal item without an identifier cannot be keyed")
        extras.append(
            ExtraKey(
                ExtraKind.MULTIMODAL,
                str(feature.identifier),
                place.offset,
                place.offset + place.length,
            )
        )
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        import torch  # noqa: PLC0415 - only prompt embeddings need it (vLLM brings it)

        data = embeds.detach().contiguous().cpu()
        digest = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
        extras.append(ExtraKey(ExtraKind.PROMPT_EMBEDS, digest.hexdigest(), 0, len(data)))
    return tuple(extras)


def token_view(request: Any) -> Sequence[int]:
    """vLLM's view of a request's tokens (`all_token_ids`, a read-only view of its list),
    or, while that list is still a copy of the prompt's token ids, that plain list, which
    packs without listing the view first (a 52k-token prompt: 0.14 ms less). A prompt mixing
    ids and embeddings zeroes the embedded positions in its view, so only the view serves
    it."""
    prompt = getattr(request, "prompt_token_ids", None)
    if (
        type(prompt) is list
        and getattr(request, "prompt_is_token_ids", None) is None
        and len(prompt) == request.num_tokens
    ):
        return prompt
    return request.all_token_ids  # type: ignore[no-any-return]
