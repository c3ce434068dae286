"""Chunked local attention as SGLang serves it: Llama 4's chunked layers cached as a window.

SGLang's only chunked-local model is Llama 4 (`is_local_attention_model`). Its server runs
the model as a hybrid SWA model (`is_hybrid_swa_model`) whose sliding window is the chunk
size (`resolve_sliding_window_size`: `attention_chunk_size` when the model has no window),
so the tree keeps and demands the C tokens before a hit, where the chunked layer reads only
those of the hit's own chunk (HIT-CHUNK-1):

    C=4, B=2, hit at 8 (a chunk boundary):
      HIT-CHUNK-1 needs          nothing (token 8 starts a fresh chunk)
      the window of C tokens     tokens 4..7 live: a hit whose earlier chunk was evicted
                                 is served shorter (chunked-as-window)

The spec's twin answers a chunked-local case as that window (the spec's window C + 1, SGLang
excluding the query's own token); a failure is named chunked-as-window only where SGLang
answers the twin's hit.
"""

from __future__ import annotations

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.cases import spec_answer

CHUNKED = "chunked_local"


def chunked_problem(groups: list[JSON]) -> str | None:
    """Why SGLang serves no model of this chunked-local layout, or None: its server has the
    chunked layers of Llama 4, beside full-attention layers and nothing else."""
    kinds = {str(g.get("kind")) for g in groups}
    if sum(g.get("kind") == CHUNKED for g in groups) > 1 or "sliding_window" in kinds:
        return "SGLang caches chunked-local layers as its model's one sliding window (Llama 4)"
    if kinds != {"full", CHUNKED}:
        return "SGLang serves chunked-local layers in Llama 4 only: full attention beside them"
    return None


def as_window(group: JSON) -> JSON:
    """A chunked-local group of chunk C as SGLang's server caches it: a sliding window of C
    tokens besides the query's own (the spec's window C + 1)."""
    if group.get("kind") != CHUNKED:
        return group
    window = {k: v for k, v in group.items() if k != "chunk"}
    return {**window, "kind": "sliding_window", "window": group["chunk"] + 1}


def window_twin_hit(case_input: JSON) -> int | None:
    """The spec's hit for a hit case whose chunked-local groups are cached as windows."""
    layout = case_input["layout"]
    twin = {**layout, "groups": [as_window(g) for g in layout["groups"]]}
    answer, _ = spec_answer({**case_input, "layout": twin})
    hit = answer.get("hit")
    return hit if isinstance(hit, int) else None
