"""The alloc suite under the hit-granularity profile `unit U` (ALLOC-UNIT-1..4): prompt tails
keyed inside a block, hits copying the block they end inside, state checkpoints kept by a
copy before a chunk overwrites them. Every case requires `hit.unit`; its admissions and
extensions list the copies they need (format /6)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.cases import alloc_case
from kvcert.conformance.vectors.generate.traces import _play
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.retention import Retention

PROMPT = tuple(range(100, 140))  # 40 distinct tokens
HYBRID = Layout((FullAttention(8), MambaState(8, MambaMode.ALIGN)), hit_unit=2)


def _written(prompt: tuple[int, ...], first: int) -> list[spec.Op]:
    """A writer computes `prompt` in a chunk of `first` tokens and one of the rest, decodes
    a token and finishes."""
    ops: list[spec.Op] = [spec.Admit("a", prompt, first), spec.EndStep()]
    if first < len(prompt):
        ops += [spec.Extend("a", len(prompt) - first), spec.EndStep()]
    return [*ops, spec.Extend("a", 1, (7,)), spec.EndStep(), spec.Finish("a")]


def unit_alloc_scenarios() -> Iterator[JSON]:
    """Hand-written traces, each for one reading of ALLOC-UNIT-2..4 an engine can get wrong."""
    prompt = PROMPT[:13]  # tail boundary 12, inside block 1 [8, 16) of both groups
    resend: list[spec.Op] = [spec.Admit("b", prompt, 13), spec.EndStep(), spec.Finish("b")]
    yield alloc_case(
        "alloc.unit.resend-copies-both-tails",
        HYBRID, 12, [*_written(prompt, 12), *resend], "vllm --prefix-match-unit",
        "a Qwen3.5-like layout (full and align-mode state, 8-token blocks, unit 2): the writer's "
        "first chunk ends at the prompt's tail boundary 12, so both groups key block 1 there "
        "(ALLOC-UNIT-2); its next chunk would overwrite the state at 12, so the state block is "
        "first copied out into a fresh block, which takes the key when the step ends "
        "(ALLOC-UNIT-4); a re-send hits 12 and copies both tails into fresh blocks "
        "(ALLOC-UNIT-3)",
        focus=("ALLOC-UNIT-2", "ALLOC-UNIT-3", "ALLOC-UNIT-4"),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.state-tail-needs-a-chunk-end",
        HYBRID, 12, [*_written(prompt, 13), *resend], None,
        "the writer computes the prompt in one chunk: attention keys its tail at 12, but the "
        "state is keyed only where a step ends exactly there (ALLOC-UNIT-2), and no step "
        "ended at 8 or 12: the re-send hits 0",
        focus=("ALLOC-UNIT-2",),
    )  # fmt: skip
    saving: list[spec.Op] = [
        spec.Admit("a", prompt, 13, checkpoint=12),
        spec.EndStep(),
        spec.Extend("a", 1, (7,)),
        spec.EndStep(),
        spec.Finish("a"),
    ]
    yield alloc_case(
        "alloc.unit.state-tail-saved-in-passing",
        HYBRID, 12, [*saving, *resend], "vllm num_prefill_checkpoint_blocks=1",
        "the same one chunk, naming the tail 12 as its inner checkpoint: the state group "
        "saves the state at 12 in passing into position 0, the one before its running "
        "position 1 (CKPT-INNER-2), keyed at 12 when the step ends; decoding never writes "
        "there, and a re-send hits 12 and copies it",
        focus=("CKPT-INNER-2", "ALLOC-UNIT-2"),
    )  # fmt: skip
    fine = Layout((FullAttention(2), MambaState(8, MambaMode.ALIGN)), hit_unit=2)
    long_prompt, diverging = PROMPT[:24], (*PROMPT[:13], *range(500, 507))
    inside_chunk: list[spec.Op] = [
        spec.Admit("a", long_prompt, 16, checkpoint=12), spec.EndStep(),
        spec.Extend("a", 8), spec.EndStep(), spec.Finish("a"),
        spec.Admit("c", diverging, 20), spec.EndStep(),
    ]  # fmt: skip
    yield alloc_case(
        "alloc.unit.state-saved-inside-a-chunk",
        fine, 30, inside_chunk,
        "vllm dense retention, num_prefill_checkpoint_blocks=1",
        "attention blocks of 2, state blocks of 8: the prompt's first chunk [0, 16) names 12, "
        "inside state block 1, as its inner checkpoint; the state at 12 goes to position 0, "
        "before the running one (CKPT-INNER-2), keyed at 12 when the step ends; a prompt "
        "sharing 13 tokens hits 12 and copies it (no step ended at 8 or 12: without the "
        "checkpoint it hits 0)",
        focus=("CKPT-INNER-2",),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.sparse.state-saved-mid-prompt-dropped",
        fine, 30, inside_chunk,
        "vllm --prefix-cache-retention-interval with --prefix-match-unit",
        "the same under sparse retention: 12 is none of the writer's retained lengths (re-send "
        "22, extension 24), so the state saved there is not keyed (RET-SPARSE-3) and the "
        "diverging prompt hits 0, the hit sparse retention gives up (dense: 12)",
        focus=("RET-SPARSE-3",),
        retention=Retention.SPARSE,
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.unit-checkpoint-over-the-read-state-refused",
        HYBRID, 12,
        [spec.Admit("a", prompt, 8), spec.EndStep(),
         spec.Extend("a", 5, checkpoint=12), spec.Extend("a", 5, checkpoint=11),
         spec.Extend("a", 5), spec.EndStep()],
        None,
        "the chunk [8, 13) reads the state at 8 from position 0, the position before its "
        "running one: naming 12 would have the kernel overwrite it, so it is refused "
        "(CKPT-INNER-2); 11 is no multiple of the unit 2 (refused); then the chunk runs "
        "without a checkpoint",
        focus=("CKPT-INNER-2",),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.checkpoint-kept-after-finish",
        HYBRID, 12,
        [spec.Admit("a", prompt, 12), spec.EndStep(), spec.Finish("a"), *resend],
        None,
        "the writer stops at its tail and finishes without a further chunk: its state block "
        "keeps the key at 12 in the free queue, and a re-send hits 12 from it",
        focus=("ALLOC-UNIT-2",),
    )  # fmt: skip
    window = Layout((FullAttention(8), SlidingWindow(8, 3)), hit_unit=2)
    longer = (*prompt, *range(300, 310))
    tails: list[spec.Op] = [
        *_written(prompt, 13), spec.Admit("b", longer, 23), spec.EndStep(), spec.Finish("b"),
        spec.Admit("c", prompt[:11], 11), spec.EndStep(),
    ]  # fmt: skip
    yield alloc_case(
        "alloc.unit.attention-tails",
        window, 16, tails, None,
        "full attention and a 3-token window key the tail at 12 after one chunk; a longer "
        "prompt sharing the 13 tokens hits 12, copying block 1 of both groups; an 11-token "
        "prompt cannot name the key at 12 (its tokens end at 11) and hits 8",
        focus=("ALLOC-UNIT-2", "ALLOC-UNIT-3"),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.sparse.attention-tails",
        window, 16, tails, None,
        "the same under sparse retention: the re-send length 12 lies inside block 1, whose "
        "window [10, 12) the tail key serves, and the window block kept for it is block 1 "
        "(RET-SPARSE-2 at a length inside a block); the longer prompt still hits 12, while "
        "the 11-token prompt's 8 is no retained length and its window block 0 is not kept: 0",
        focus=("RET-SPARSE-2",),
        retention=Retention.SPARSE,
    )  # fmt: skip
    tight: list[spec.Op] = [*_written(prompt, 12), spec.Admit("b", prompt, 13),
             spec.Admit("c", tuple(range(500, 509)), 9), spec.EndStep(),
             spec.Admit("c", tuple(range(500, 509)), 9)]  # fmt: skip
    yield alloc_case(
        "alloc.unit.copy-source-held-until-step-end",
        HYBRID, 7, tight, None,
        "6 usable blocks: the re-send copies the cached tails, which stay held until the step "
        "ends, so a 9-token request needing 3 blocks finds 1 free and waits in that step; "
        "after it the sources are free again and it fits",
        focus=("ALLOC-UNIT-3",),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.preempt-releases-copy-sources",
        HYBRID, 12,
        [*_written(prompt, 12), spec.Admit("b", prompt, 13), spec.Preempt("b"),
         spec.Admit("b", prompt, 13), spec.EndStep()], None,
        "a request preempted with its chunk in flight releases the blocks it was to copy; "
        "admitted again it copies them again",
        focus=("ALLOC-UNIT-3",),
    )  # fmt: skip
    every = Layout((FullAttention(8), MambaState(8, MambaMode.ALL)), hit_unit=2)
    yield alloc_case(
        "alloc.unit.mode-all",
        every, 12, [*_written(prompt, 12), *resend], None,
        "a state group in mode all keys its tail like mode align, and its next chunk, which "
        "writes that block, copies it out first",
        focus=("ALLOC-UNIT-4",),
    )  # fmt: skip
    chunked = Layout((ChunkedLocal(8, 16),), hit_unit=2)
    yield alloc_case(
        "alloc.unit.chunked-local",
        chunked, 12, [*_written(prompt, 13), *resend], None,
        "a chunked local group keys its tail like full attention; the re-send reads tokens "
        "0..11 of one chunk and copies block 1",
        focus=("ALLOC-UNIT-3",),
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.mode-none",
        Layout((FullAttention(8), MambaState(8, MambaMode.NONE)), hit_unit=2), 12,
        [*_written(prompt, 12), *resend], None,
        "a state group in mode none keeps no checkpoint, whole or at a tail (HIT-MAMBA-2): "
        "attention keys its tail at 12, but the re-send hits 0",
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.cross-attention",
        Layout((FullAttention(8), CrossAttention(8)), hit_unit=2), 12,
        [*_written(prompt, 13), *resend], None,
        "a cross-attention group keeps no keys and needs none (HIT-CROSS-1): full attention "
        "alone decides the re-send's hit, 12, and only its tail is copied",
    )  # fmt: skip
    drafted = Layout((FullAttention(8), FullAttention(8, draft=True)), Speculative.EXACT,
                     draft_reach=2, hit_unit=2)  # fmt: skip
    for length, tail in ((14, 12), (13, 10)):
        tokens = PROMPT[:length]
        yield alloc_case(
            f"alloc.unit.draft-tail-{length}",
            drafted, 12,
            [*_written(tokens, length), spec.Admit("b", tokens, length), spec.EndStep(),
             spec.Finish("b")], "vllm --prefix-match-unit with an MTP drafter",
            f"an MTP drafter of reach 2 keyed exactly: a draft key at P covers tokens up to "
            f"P + 1 (HASH-DRAFT-1), so a {length}-token prompt's tail boundary is "
            f"{length} - 2 floored to the unit, {tail}; both groups key it (ALLOC-UNIT-2) and "
            f"a re-send hits {tail}",
            focus=("ALLOC-UNIT-2",),
        )  # fmt: skip
    other: list[spec.Op] = [spec.Admit("c", tuple(range(500, 508)), 8), spec.EndStep(),
                            spec.Finish("c")]  # fmt: skip
    yield alloc_case(
        "alloc.unit.lru-unkeyed-first",
        HYBRID, 7, [*_written(prompt, 12), *other, *resend], None,
        "under lru-unkeyed-first a block keyed only at its tail counts as keyed: released, it "
        "joins the queue's tail, so the 2 blocks another request takes in between are "
        "unkeyed ones and the re-send still hits 12 (had the tail blocks gone to the head "
        "as unkeyed, it would hit 0)",
        eviction=spec.Eviction.LRU_UNKEYED_FIRST,
    )  # fmt: skip


def same_pass_scenarios() -> Iterator[JSON]:
    """HIT-UNIT-5 and ALLOC-VIS-3 under `unit U`: what a block in flight may serve."""
    full = Layout((FullAttention(8),), hit_unit=2)
    prompt = PROMPT[:16]  # blocks 0 and 1 whole; a re-send's limit 15 ends inside block 1
    same = spec.Visibility.SAME_PASS
    yield alloc_case(
        "alloc.unit.same-pass-block-in-flight-not-copied",
        full, 12,
        [spec.Admit("a", prompt, 16), spec.Admit("b", prompt, 16), spec.EndStep(),
         spec.Admit("c", prompt, 16), spec.EndStep()], "vllm --prefix-match-unit",
        "a publishes blocks 0 and 1 as its chunk is scheduled (ALLOC-VIS-2); b, in the same "
        "step, may take block 0 as a table entry (its pass reads it after a's pass writes it) "
        "but not copy block 1 for a hit of 14, which would read KV a's pass has not written "
        "(HIT-UNIT-5): b hits 8; c, a step later, hits 14 copying a's block 1",
        focus=("HIT-UNIT-5", "ALLOC-UNIT-3"), visibility=same,
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.same-pass-older-tail-key-copied",
        full, 12,
        [*_written(PROMPT[:13], 13), spec.Admit("b", prompt, 16), spec.Admit("c", prompt, 16),
         spec.EndStep()], None,
        "the writer keyed block 1 at 12 when its step ended; b resumes there and publishes its "
        "own block 1 whole, in flight; c, in b's step, copies the writer's block under the "
        "older tail key (hit 12), not b's (hit 14 would copy it unwritten)",
        focus=("HIT-UNIT-5", "ALLOC-UNIT-3"), visibility=same,
    )  # fmt: skip
    yield alloc_case(
        "alloc.unit.same-pass-withdrawal-keeps-tail-key",
        full, 12,
        [spec.Admit("a", PROMPT[:11], 11), spec.EndStep(), spec.Admit("b", PROMPT[:11], 11),
         spec.Extend("a", 5, PROMPT[11:16]), spec.Finish("a"), spec.EndStep(),
         spec.Finish("b"), spec.Admit("c", PROMPT[:11], 11)], None,
        "a keys block 1 at 10; b copies it; a's next chunk publishes block 1 whole and a is "
        "released before its pass: the block loses its block key but keeps the tail key and "
        "the KV it names, so the release is not refused (b reads only that) and c still hits "
        "10 (ALLOC-VIS-3)",
        focus=("ALLOC-VIS-3",), visibility=same,
    )  # fmt: skip


def _unit_layout(rnd: random.Random) -> Layout:
    """A small layout without draft groups, under a unit below its smallest block size."""
    kinds: list[Callable[[], Group]] = [
        lambda: FullAttention(rnd.choice([2, 4])),
        lambda: SlidingWindow(rnd.choice([2, 4]), rnd.randint(1, 9)),
        lambda: ChunkedLocal(rnd.choice([2, 4]), rnd.randint(2, 9)),
        lambda: MambaState(rnd.choice([2, 4]), rnd.choice([MambaMode.ALIGN, MambaMode.ALL])),
    ]
    groups: list[Group] = [rnd.choice(kinds)() for _ in range(rnd.randint(1, 3))]
    if not any(isinstance(g, FullAttention | SlidingWindow | ChunkedLocal) for g in groups):
        groups.append(FullAttention(rnd.choice([2, 4])))
    sizes = math.gcd(*(g.block_size for g in groups))
    return Layout(tuple(groups), hit_unit=rnd.choice([d for d in (1, 2) if sizes % d == 0]))


BASES = [tuple(range(1, 25)), (*range(1, 9), *range(60, 76))]


def unit_traces(count: int, first_seed: int, eviction: spec.Eviction) -> Iterator[JSON]:
    """Seeded random traces over `unit U` layouts: half the prefill chunks stop at the
    prompt's tail boundary, so state tails are keyed and later prompts hit inside blocks."""
    for n in range(count):
        rnd = random.Random(first_seed + n)
        layout = _unit_layout(rnd)
        unit = layout.hit_unit or 1
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(8, 40), eviction))

        def admit(
            state: spec.State, rid: str, rnd: random.Random = rnd, unit: int = unit
        ) -> spec.Op:
            tokens = rnd.choice(BASES)[: rnd.randint(1, 24)]
            tail = (len(tokens) - 1) // unit * unit
            hit = spec.lookup(state, tokens, ())[0]
            stop = rnd.random() < 0.5 and tail > hit
            return spec.Admit(rid, tokens, tail - hit if stop else rnd.randint(1, 24))

        def extend(
            rid: str, request: spec.Request, rnd: random.Random = rnd, unit: int = unit
        ) -> spec.Op:
            if request.computed == len(request.tokens):
                return spec.Extend(rid, 1, (rnd.randint(0, 2),))
            tail = (request.prompt - 1) // unit * unit
            if request.computed < tail and rnd.random() < 0.5:
                return spec.Extend(rid, tail - request.computed)
            return spec.Extend(rid, rnd.randint(1, 8))

        state, ops = _play(rnd, state, admit, extend)
        label = "unit" if eviction is spec.Eviction.LRU else f"unit-{eviction.value}"
        yield alloc_case(f"alloc.{label}.{n:03d}", layout, state.config.num_blocks, ops,
                         eviction=eviction)  # fmt: skip
