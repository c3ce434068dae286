"""A re-send's sub-block hit under --prefix-match-unit, before and after the promotion fix.

Run in a vLLM release venv (`scripts/engine-venv.sh vllm 0.33.0`):

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.unit_resend

vLLM's own KVCacheManager (full attention and an align-mode Mamba group, 64-token blocks,
hashed every 16 tokens), the adapter playing the scheduler:

    writer: a 100-token prompt, computed as [0, 96) then [96, 100) (the prompt's last unit
            boundary below its last token is 96), then `decode` tokens, one per step; finish
    reader: the same 100 tokens: what does get_computed_blocks serve?

Once the writer decodes past 128, its block 1 is full and vLLM promotes it: the partial key
at 96 is dropped for the whole-block key at 128. 0.33.0 then registers the prompt-tail key
again on the next step (vllm#49125, "stale partial hash resurrected"), and the re-send hits
96. The open fixes (PRs #52972, #53158) keep the stale key dropped; replayed here with their
guard (`cache_partial_block` skips a block whose hash already covers the boundary), the
re-send hits 0: vLLM's full-attention lookup takes a block a hit ends inside only under a key
at or below the length asked (99), and the block now has only its key at 128. HIT-UNIT-2
serves 96: the block holds tokens 64..127, the request's up to 96 (kvcert's cause
unit-tail-past-asked, docs/engines.md). Exit 0 when both are seen (released 96 with a long
decode, guarded 0), 1 otherwise.
"""

from __future__ import annotations

import sys
from typing import Any

from kvcert.conformance.vllm.adapter import Session

LAYOUT = {
    "groups": [
        {"kind": "full", "block_size": 64},
        {"kind": "mamba", "block_size": 64, "mode": "align"},
    ],
    "hit_unit": 16,
}


def resend_hit(decode: int) -> int:
    """The reader's hit after the writer decoded `decode` tokens."""
    session = Session(LAYOUT, 64)
    prompt = list(range(1000, 1100))
    ops: list[dict[str, Any]] = [
        {"op": "admit", "rid": "w", "tokens": prompt, "budget": 96},
        {"op": "end_step"},
        {"op": "extend", "rid": "w", "budget": 4},
        {"op": "end_step"},
    ]
    for i in range(decode):
        ops += [
            {"op": "extend", "rid": "w", "budget": 1, "appended": [5000 + i]},
            {"op": "end_step"},
        ]
    ops.append({"op": "finish", "rid": "w"})
    for op in ops:
        answer = session.apply(op)
        if "refused" in answer or "waiting" in answer:
            raise RuntimeError(f"the writer could not run: {op} -> {answer}")
    reader = session.apply({"op": "admit", "rid": "r", "tokens": prompt, "budget": 100})
    return int(reader["admitted"]["hit"])


def guard_promotion() -> None:
    """PR #53158's pool guard: never give a block a key its current hash already covers."""
    from vllm.v1.core.block_pool import BlockPool  # noqa: PLC0415 - the release's own

    original = BlockPool.cache_partial_block

    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        block, tokens = kwargs["block"], kwargs["num_tokens"]
        covered = block.block_hash is not None and (block.block_hash_num_tokens or 0) >= tokens
        if covered and not kwargs.get("replace_existing_hashes", False):
            return None
        return original(self, *args, **kwargs)

    BlockPool.cache_partial_block = guarded


def main() -> int:
    released = {decode: resend_hit(decode) for decode in (1, 40)}
    guard_promotion()
    guarded = {decode: resend_hit(decode) for decode in (1, 40)}
    print(f"re-send hit by writer decode length: released {released}, with the guard {guarded}")
    shown = released == {1: 96, 40: 96} and guarded == {1: 96, 40: 0}
    print("SHOWN: the guarded promotion loses the re-send's sub-block hit" if shown
          else "not shown on this release")  # fmt: skip
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
