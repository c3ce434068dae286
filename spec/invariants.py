"""§7 Invariants of the allocator state, checked after every step (tests/spec, stateful).

Each is a predicate over `State`; `INVARIANTS` maps its tag to it. They hold in the initial
state and `step` preserves them (THM-ALLOC-INV, tested by the stateful machines).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from kvcert.spec.alloc import (
    NULL_BLOCK,
    State,
    Visibility,
    blocks_in_flight,
    positions_written,
    request_keys,
)
from kvcert.spec.hashing import block_keys, extras_within, key_lookahead, partial_key
from kvcert.spec.layout import MambaState


def _held(state: State) -> Counter[int]:
    in_tables = (b for r in state.requests.values() for t in r.tables for b in t)
    sources = (b for r in state.requests.values() for _, _, b in (*r.sources, *r.keeps))
    return Counter(b for b in (*in_tables, *sources) if b != NULL_BLOCK)


def null_block_is_never_handed_out(state: State) -> bool:
    """INV-NULL-1: The null block has no references, no key, no content, and is never free.

        null=0:  ref 0, key None, not in the free queue; tables may name it freely

    pre: True
    post: isinstance(__return__, bool)
    """
    null = state.blocks[NULL_BLOCK]
    return (
        null.ref_count == 0
        and not null.registrations()
        and null.content is None
        and NULL_BLOCK not in state.free
    )


def reference_counts_match_tables(state: State) -> bool:
    """INV-REF-1: A block's reference count is the number of table entries that name it,
    plus, under `unit U`, the chunks in flight that copy it (ALLOC-UNIT-3/-4).

        a: g0 [1 2]   b: g0 [1 3]      ref(1)=2  ref(2)=1  ref(3)=1  others 0
        c copies 4 into its table      ref(4)=1 until the step ends

    pre: True
    post: isinstance(__return__, bool)
    """
    held = _held(state)
    return all(
        block.ref_count == held.get(i, 0) for i, block in enumerate(state.blocks) if i != NULL_BLOCK
    )


def free_queue_is_exactly_the_unreferenced_blocks(state: State) -> bool:
    """INV-FREE-1: The free queue holds every unreferenced non-null block exactly once, and
    nothing else, so blocks are conserved: free + held = num_blocks - 1.

        num_blocks=6, held {1, 2}:   free queue is a permutation of 3 4 5

    pre: True
    post: isinstance(__return__, bool)
    """
    unreferenced = [i for i, b in enumerate(state.blocks) if i != NULL_BLOCK and b.ref_count == 0]
    return sorted(state.free) == unreferenced


def keys_describe_content(state: State) -> bool:
    """INV-KEY-1: A registered key is the key of the tokens and extras the block's KV was
    computed from: a lookup can only match content equal to the request's.

        block 7: content (g0, tokens 0..15, salt s)  key (g0, key(tokens 0..15, salt s))

    Under `unit U` a partial key is the key of the content's first `partial_at` tokens.

    pre: True
    post: isinstance(__return__, bool)
    """
    layout = state.config.layout
    for block in state.blocks:
        for slot, _ in block.registrations():
            if block.content is None or block.content[0] != slot[0]:
                return False
            group, tokens, extras = block.content
            spec_group = layout.groups[group]
            lookahead = key_lookahead(layout, spec_group)
            if slot == block.partial:
                at = block.partial_at
                size = spec_group.block_size
                if not 0 < at <= len(tokens) - lookahead:
                    return False
                if partial_key(tokens, size, at, extras, lookahead) != slot[1]:
                    return False
                continue
            keys = block_keys(tokens, spec_group.block_size, extras, lookahead)
            if not keys or keys[-1] != slot[1]:
                return False
    return True


def tables_hold_the_request_tokens(state: State) -> bool:
    """INV-HIT-1: Every block a request holds at a committed position was computed from the
    request's own tokens and extras: a hit never hands over KV of other tokens.

        a: tokens 5 6 7 8 | 9 ...   g0 [7 ...]   block 7's content is tokens 5 6 7 8

    pre: True
    post: isinstance(__return__, bool)
    """
    layout = state.config.layout
    for request in state.requests.values():
        keys = request_keys(layout, request.tokens, request.extras)
        for g, table in enumerate(request.tables):
            for j, b in enumerate(table):
                content = state.blocks[b].content
                if b == NULL_BLOCK or content is None:
                    continue
                key = state.blocks[b].key
                if content[0] != g or (key is not None and key != (g, keys[g][j])):
                    return False
                covered = len(content[1])
                relevant = extras_within(request.extras, covered)
                if content[1] != request.tokens[:covered] or content[2] != relevant:
                    return False
    return True


def uncommitted_blocks_are_not_hittable(state: State) -> bool:
    """INV-VIS-1: No block is registered beyond what its holders have committed: a block
    written in the current step is not hittable until the step ends, except, under the
    same-pass profile, an attention block the chunk in flight completes (ALLOC-VIS-2).

        a: computed 32, scheduled 32 (B=16)    step-end: a's positions 2, 3 carry no key
                                               same-pass: full attention's may; state's not
        unit U: a partial key never ends past what its holder computed

    pre: True
    post: isinstance(__return__, bool)
    """
    layout = state.config.layout
    same_pass = state.config.visibility is Visibility.SAME_PASS
    for request in state.requests.values():
        for g, table in enumerate(request.tables):
            group = layout.groups[g]
            size = group.block_size
            written = request.computed
            if same_pass and not isinstance(group, MambaState):
                written += request.scheduled
            for j, b in enumerate(table):
                uncommitted = b != NULL_BLOCK and (j + 1) * size > written
                if uncommitted and state.blocks[b].key is not None:
                    return False
                if b != NULL_BLOCK and state.blocks[b].partial_at > request.computed:
                    return False
    return True


def copies_carry_the_request_tokens(state: State) -> bool:
    """INV-COPY-1: Under `unit U` every block a chunk in flight copies was computed from the
    request's own tokens up to where the request resumes (`computed`), and a state source
    holds the state at exactly that length: a copy never hands over KV or state of other
    tokens, nor a state of another length.

        b resumes at 80 copying block 9 (content: tokens 0..95 of a, 0..79 equal to b's)  ok
        b resumes at 80 copying state block 4 (the state at 96)                       broken

    pre: True
    post: isinstance(__return__, bool)
    """
    layout = state.config.layout
    for request in state.requests.values():
        at = request.computed
        for g, _, b in request.sources:
            content = state.blocks[b].content
            if content is None or content[0] != g or len(content[1]) < at:
                return False
            exact = isinstance(layout.groups[g], MambaState)
            if (exact and len(content[1]) != at) or content[1][:at] != request.tokens[:at]:
                return False
            if extras_within(content[2], at) != extras_within(request.extras, at):
                return False
    return True


def copies_read_written_kv(state: State) -> bool:
    """INV-COPY-2: A copy reads only KV an earlier step wrote: a source whose block is in
    flight (ALLOC-VIS-2 published it for a pass that has not run) serves the copy only under
    a partial key that reaches the request's resume length, registered when an earlier step
    ended (HIT-UNIT-5).

        a's chunk writes block 9 (published, in flight); b resumes at 80 copying 9   broken
        the same, 9 also keyed at 96 since step 1 ended                             ok

    pre: True
    post: isinstance(__return__, bool)
    """
    unwritten = blocks_in_flight(state)
    for request in state.requests.values():
        for _, _, b in request.sources:
            block = state.blocks[b]
            if b in unwritten and (block.partial is None or block.partial_at < request.computed):
                return False
    return True


def keyed_state_blocks_are_not_written(state: State) -> bool:
    """INV-WRITE-1: No state block a chunk in flight writes holds a key, unless ALLOC-UNIT-4
    copies it out before the pass: a key names the state its block holds, and the chunk
    changes it; a tail key may stay until the step ends, when it moves to the copy (every
    copy that reads the block runs before the pass).

        a: state B=4, keyed at 6 in block 7 (position 1)    Extend [6, 8):  copy (7, 8) kept
        the same chunk writing block 7 with no copy out                    broken

    pre: True
    post: isinstance(__return__, bool)
    """
    layout = state.config.layout
    for request in state.requests.values():
        if not request.scheduled:
            continue
        end = request.computed + request.scheduled
        for g, group in enumerate(layout.groups):
            if not isinstance(group, MambaState):
                continue
            table = request.tables[g]
            written = positions_written(
                group, request.computed, end, request.decoding, layout.max_model_len
            )
            kept = {j for kept_group, j, _ in request.keeps if kept_group == g}
            for j in written:
                block = state.blocks[table[j]] if j < len(table) else None
                if block and block.registrations() and (j not in kept or block.key):
                    return False
    return True


INVARIANTS: Mapping[str, Callable[[State], bool]] = {
    "INV-NULL-1": null_block_is_never_handed_out,
    "INV-REF-1": reference_counts_match_tables,
    "INV-FREE-1": free_queue_is_exactly_the_unreferenced_blocks,
    "INV-KEY-1": keys_describe_content,
    "INV-HIT-1": tables_hold_the_request_tokens,
    "INV-VIS-1": uncommitted_blocks_are_not_hittable,
    "INV-COPY-1": copies_carry_the_request_tokens,
    "INV-COPY-2": copies_read_written_kv,
    "INV-WRITE-1": keyed_state_blocks_are_not_written,
}


def violated(state: State) -> list[str]:
    """The tags of the invariants `state` breaks (empty when all hold)."""
    return [tag for tag, holds in INVARIANTS.items() if not holds(state)]
