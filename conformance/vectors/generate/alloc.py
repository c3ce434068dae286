"""The alloc suite's hand-written traces: each allocator rule, each bug in the notes, the hybrid
profile's scenarios, their lru-unkeyed-first twins, and curated regressions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from kvcert.conformance.contract.codec import (
    JSON,
    layout_from_json,
    op_from_json,
)
from kvcert.conformance.vectors.generate.cases import OTHER, PROMPT, alloc_case
from kvcert.conformance.vectors.generate.hit import FULL, SW
from kvcert.spec import (
    Extra,
    ExtraKind,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.retention import Retention


def served(rid: str, tokens: tuple[int, ...]) -> list[spec.Op]:
    """A request computed in one step, then finished."""
    return [spec.Admit(rid, tokens, 64), spec.EndStep(), spec.Finish(rid)]


def seed_001_ops() -> list[spec.Op]:
    """A, an unrelated B of the same length, A again (seed 001's re-send)."""
    return [*served("a", PROMPT[:39]), *served("b", OTHER[:39]), spec.Admit("a2", PROMPT[:39], 64)]


def hybrid_scenarios() -> Iterator[JSON]:
    """The hybrid eviction profile (§11): the lru scenario above, and each EVICT-* rule."""
    yield alloc_case(
        "alloc.hybrid.resent-prefix-survives",
        Layout((FULL, SW, SW)),
        16,
        seed_001_ops(),
        "vllm#42948",
        "the lru case above under the hybrid profile: b evicts a's tail, the prefix stays",
        eviction=spec.Eviction.HYBRID,
    )
    yield alloc_case(
        "alloc.hybrid.shadowed-copy-first",
        Layout((FULL,)),
        7,
        [
            spec.Admit("a", PROMPT[:40], 64),
            spec.Admit("b", PROMPT[:40], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Finish("b"),
            spec.Admit("c", OTHER[:33], 64),
            spec.EndStep(),
            spec.Admit("a2", PROMPT[:40], 64),
        ],
        comment="b's copies of a's blocks are never served: c evicts them before a's",
        eviction=spec.Eviction.HYBRID,
    )
    yield alloc_case(
        "alloc.hybrid.orphans-follow-their-parent",
        Layout((FullAttention(8), SlidingWindow(8, 9))),
        12,
        [
            *served("a", PROMPT[:33]),
            *served("b", OTHER[:17]),
            spec.Admit("c", OTHER[17:40], 64),
            spec.EndStep(),
            spec.Admit("a2", PROMPT[:33], 64),
        ],
        comment="once a block's full-attention prerequisite is evicted it is dead and goes next",
        eviction=spec.Eviction.HYBRID,
    )


def alloc_scenarios() -> Iterator[JSON]:
    """Hand-written traces for each allocator rule and each bug in the notes."""
    one = Layout((FULL,))
    two = Layout((FULL, SW))
    yield alloc_case(
        "alloc.visibility.same-step-miss",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Admit("c", PROMPT, 64),
        ],
        "vllm#41838",
        "blocks are hittable only after the step that wrote them",
    )
    yield from same_pass_scenarios()
    yield alloc_case(
        "alloc.two-phase.hits-before-allocation",
        one,
        5,
        [
            spec.Admit("a", PROMPT[:32], 64),
            spec.Admit("b", OTHER[:32], 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Finish("b"),
            spec.Admit("c", (*PROMPT[:32], *OTHER[:24]), 64),
        ],
        "vllm#33775",
        "a's blocks head the free queue; c hits them and needs two new blocks: taking the "
        "hits first keeps the allocation from evicting them",
    )
    yield alloc_case(
        "alloc.duplicates.earliest-served",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("c", PROMPT, 64),
        ],
        comment="a and b compute the same blocks in one step, so both copies are registered; "
        "a's, registered first, serve c although a has finished and b still holds its own",
    )
    yield alloc_case(
        "alloc.eviction.reuse-forgets-key",
        one,
        4,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", OTHER, 64),
            spec.EndStep(),
            spec.Finish("b"),
            spec.Admit("a2", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.lru.group-zero-prefix-evicted-first",
        Layout((FULL, SW, SW)),
        16,
        seed_001_ops(),
        "vllm#42948",
        "group-major release order sacrifices the full-attention prefix (C12)",
    )
    yield from hybrid_scenarios()
    yield alloc_case(
        "alloc.sliding-window.release-with-nulls",
        Layout((SlidingWindow(4, 8),)),
        32,
        [spec.Admit("a", PROMPT, 20), spec.EndStep(), spec.Extend("a", 4)],
    )
    yield alloc_case(
        "alloc.mamba-align.checkpoint-at-step-end",
        Layout((MambaState(8, MambaMode.ALIGN),)),
        16,
        [
            spec.Admit("a", PROMPT, 16),
            spec.EndStep(),
            spec.Extend("a", 4),
            spec.EndStep(),
            spec.Admit("b", PROMPT[:30], 30),
        ],
        "vllm#36493",
    )
    yield alloc_case(
        "alloc.mamba-none.never-registers",
        Layout((MambaState(8, MambaMode.NONE),)),
        16,
        [spec.Admit("a", PROMPT, 16), spec.EndStep(), spec.Admit("b", PROMPT, 16)],
    )
    yield alloc_case(
        "alloc.draft-exact.waits-for-next-token",
        Layout((FullAttention(8), FullAttention(8, draft=True)), Speculative.EXACT),
        16,
        [
            spec.Admit("a", PROMPT[:16], 16),
            spec.EndStep(),
            spec.Extend("a", 1, (7,)),
            spec.EndStep(),
        ],
    )
    for profile in Speculative:
        yield alloc_case(
            f"alloc.draft-reach-{profile.value}.waits-for-computed-tokens",
            Layout((FullAttention(8), FullAttention(8, draft=True)), profile, draft_reach=3),
            16,
            [
                spec.Admit("a", PROMPT[:16], 16),
                spec.EndStep(),
                spec.Extend("a", 1, (7,)),
                spec.EndStep(),
                spec.Extend("a", 1, (8,)),
                spec.EndStep(),
                spec.Extend("a", 1, (9,)),
                spec.EndStep(),
                spec.Admit("b", (*PROMPT[:16], 7, 8, 9, 5), 20),
            ],
            comment="three MTP modules: draft block 1 is registered once tokens 16 and 17 are "
            "computed too (drop) and token 18 is known (exact, its key covers it); the hit "
            "then reaches 16 (exact) or steps down to 8 (drop)",
            focus=("HASH-DRAFT-1", "ALLOC-COMMIT-1"),
        )
    salt = (Extra(ExtraKind.CACHE_SALT, "x"),)
    lora = (Extra(ExtraKind.LORA, "x"),)
    yield alloc_case(
        "alloc.isolation.salt-and-lora-do-not-collide",
        one,
        32,
        [
            spec.Admit("a", PROMPT, 64, salt),
            spec.EndStep(),
            spec.Admit("b", PROMPT, 64, (Extra(ExtraKind.CACHE_SALT, "y"),)),
            spec.Admit("c", PROMPT, 64, lora),
            spec.Admit("d", PROMPT, 64, salt),
        ],
        "vllm#44701",
        "another salt or a LoRA named like the salt misses; the same salt hits",
    )
    image = (Extra(ExtraKind.MULTIMODAL, "img", 20, 30),)
    yield alloc_case(
        "alloc.multimodal.prefix-before-image-is-shared",
        one,
        32,
        [spec.Admit("a", PROMPT, 64, image), spec.EndStep(), spec.Admit("b", PROMPT, 64)],
    )
    yield alloc_case(
        "alloc.preempt-and-readmit",
        two,
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.Preempt("a"),
            spec.Admit("a", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.reset.refused-while-held",
        one,
        16,
        [
            spec.Admit("a", PROMPT, 64),
            spec.EndStep(),
            spec.ResetCache(),
            spec.Finish("a"),
            spec.ResetCache(),
            spec.Admit("b", PROMPT, 64),
        ],
    )
    yield alloc_case(
        "alloc.decode.output-blocks-cached",
        Layout((FullAttention(4),)),
        16,
        [
            spec.Admit("a", PROMPT[:8], 8),
            spec.EndStep(),
            *[op for t in (1, 2, 3, 4) for op in (spec.Extend("a", 1, (t,)), spec.EndStep())],
            spec.Admit("b", (*PROMPT[:8], 1, 2, 3, 4, 5), 16),
        ],
    )
    yield alloc_case(
        "alloc.capacity.waiting-changes-nothing",
        one,
        4,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", OTHER, 64),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", OTHER, 64),
        ],
    )
    yield alloc_case(
        "alloc.lookahead.speculative-slots",
        Layout((FullAttention(4),)),
        16,
        [
            spec.Admit("a", PROMPT[:8], 8, (), 3),
            spec.EndStep(),
            spec.Extend("a", 1, (1,), 3),
            spec.EndStep(),
            spec.Extend("a", 1, (2,)),
        ],
    )
    state_hybrid = Layout((FullAttention(8), MambaState(8, MambaMode.ALIGN)))
    yield alloc_case(
        "alloc.inner-checkpoint.prompt-tail",
        state_hybrid,
        16,
        [
            spec.Admit("a", PROMPT[:30], 64, checkpoint=24),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("a2", PROMPT[:30], 64),
        ],
        comment="one pass over a 30-token prompt saves the state at 24 (an engine whose "
        "kernel exports it mid-pass); the re-send hits 24 without the prompt being split there",
    )
    drafting = Layout((FullAttention(4), MambaState(4, MambaMode.ALIGN, speculative_blocks=2)))
    yield alloc_case(
        "alloc.speculative-state.decode-across-a-boundary",
        drafting,
        16,
        [
            spec.Admit("a", PROMPT[:6], 6, (), 2),
            spec.EndStep(),
            spec.Extend("a", 2, (1, 2), 2),
            spec.EndStep(),
            spec.Extend("a", 1, (3,), 2),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", (*PROMPT[:6], 1, 2, 3), 16),
        ],
        comment="B=4, two drafts: the prefill [0, 6) writes position 1; the decode chunk [6, 8) "
        "adds 2..4 (a step ending at 8..10 runs in 1 or 2, the drafts' states follow) and "
        "registers 1 as the state at 8; [8, 9) reads 1 and runs in 2, which held a draft's "
        "state: no new block; b hits 8",
    )
    yield alloc_case(
        "alloc.speculative-state.crossed-boundary",
        Layout((FullAttention(4), MambaState(4, MambaMode.ALIGN, speculative_blocks=3))),
        24,
        [
            spec.Admit("a", PROMPT[:6], 6, (), 3),
            spec.EndStep(),
            spec.Extend("a", 1, (1,), 3),
            spec.EndStep(),
            spec.Extend("a", 3, (2, 3, 4), 3, checkpoint=8),
            spec.EndStep(),
            spec.Finish("a"),
            spec.Admit("b", (*PROMPT[:6], 1, 2, 3, 4, 5), 16),
        ],
        comment="B=4, three drafts: the step verifying [6, 7) accepted two drafts, crossing 8; "
        "the decode chunk [7, 10) names 8, in the block it reads from (ALLOC-SPEC-2: the "
        "verification copied the state there), so b hits 8 though no chunk ended there",
    )
    yield alloc_case(
        "alloc.speculative-state.capacity",
        drafting,
        6,
        [
            spec.Admit("a", PROMPT[:6], 6, (), 2),
            spec.EndStep(),
            spec.Extend("a", 1, (1,), 2),
            spec.Finish("a"),
            spec.Admit("a", PROMPT[:6], 6, (), 2),
        ],
        comment="5 free blocks: the prefill holds 2 attention blocks and the running state's; "
        "the first decode step needs a third attention block and 3 state blocks (the two "
        "drafts' states and the running state's at 8) but only 2 are free: it waits",
    )
    yield alloc_case(
        "alloc.inner-checkpoint.and-chunk-end",
        Layout((FullAttention(4), SlidingWindow(4, 6), MambaState(8, MambaMode.ALIGN))),
        24,
        [
            spec.Admit("a", PROMPT, 12),
            spec.EndStep(),
            spec.Extend("a", 20, checkpoint=24),
            spec.EndStep(),
            spec.Admit("b", PROMPT[:28], 64),
            spec.Admit("c", PROMPT[:36], 64),
        ],
        comment="chunk [12, 32) saves the state at 24 and, ending on a boundary, at 32: "
        "b hits 24, c hits 32; the state at 12 it read from is released",
    )
    yield alloc_case(
        "alloc.inner-checkpoint.misplaced-refused",
        state_hybrid,
        16,
        [
            spec.Admit("a", PROMPT, 12),
            spec.EndStep(),
            spec.Extend("a", 20, checkpoint=16),
            spec.Extend("a", 20, checkpoint=20),
            spec.Extend("a", 20, checkpoint=32),
            spec.Extend("a", 20, checkpoint=24),
        ],
        comment="16 would overwrite the state at 12 the chunk reads (position 1), 20 is no "
        "boundary, 32 is where the chunk ends: refused; 24 is taken",
    )
    yield alloc_case(
        "alloc.inner-checkpoint.without-state-refused",
        Layout((FullAttention(8), MambaState(8, MambaMode.NONE))),
        8,
        [spec.Admit("a", PROMPT, 32, checkpoint=16), spec.Admit("a", PROMPT, 32)],
        comment="no state group in mode align keeps a checkpoint: refused, then admitted",
        focus=("INPUT-1",),
    )
    yield alloc_case(
        "alloc.misuse.refused",
        one,
        8,
        [
            spec.Extend("x", 1),
            spec.Finish("x"),
            spec.Admit("a", PROMPT, 8),
            spec.Admit("a", PROMPT, 8),
            spec.Extend("a", 8),
            spec.EndStep(),
            spec.Extend("a", 1, (1,)),
            spec.Admit("b", (), 8),
            spec.Admit("c", PROMPT, 0),
        ],
    )
    yield alloc_case(
        "alloc.max-model-len.refused",
        Layout((FULL,), max_model_len=40),
        16,
        [
            spec.Admit("a", (*PROMPT, 1), 64),
            spec.Admit("b", PROMPT, 64),
            spec.EndStep(),
            spec.Extend("b", 1, (1,)),
        ],
    )


def same_pass_scenarios() -> Iterator[JSON]:
    """The same-pass visibility profile (ALLOC-VIS-2, ALLOC-VIS-3), rule by rule."""
    yield alloc_case(
        "alloc.same-pass.window-hit",
        Layout((FULL, SW)),
        32,
        [spec.Admit("a", PROMPT, 64), spec.Admit("b", (*PROMPT, 7), 64), spec.EndStep()],
        comment="b is looked up in the step that schedules a: it hits a's 32 tokens of both "
        "attention groups, whose KV the pass writes before any attention reads it",
        visibility=spec.Visibility.SAME_PASS,
    )
    yield alloc_case(
        "alloc.same-pass.withdrawn",
        Layout((FULL,)),
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Preempt("a"),
            spec.Admit("b", (*PROMPT, 7), 64),
            spec.EndStep(),
        ],
        comment="a is preempted before its pass runs: its published blocks lose their keys, "
        "so b, looked up after, hits nothing",
        visibility=spec.Visibility.SAME_PASS,
    )
    yield alloc_case(
        "alloc.same-pass.read-writer-stays",
        Layout((FULL,)),
        32,
        [
            spec.Admit("a", PROMPT, 64),
            spec.Admit("b", (*PROMPT, 7), 64),
            spec.Preempt("a"),
            spec.Finish("a"),
            spec.EndStep(),
            spec.Finish("a"),
        ],
        comment="b took a's blocks in a's step: releasing a before its pass runs is refused "
        "(b's hit would read KV nobody writes); after the step it is an ordinary release",
        visibility=spec.Visibility.SAME_PASS,
    )


def unkeyed_first_twins(cases: Iterator[JSON]) -> Iterator[JSON]:
    """The lru scenarios whose outcome depends on the free order, replayed under the
    lru-unkeyed-first profile (ALLOC-FREE-2), so engines with vLLM 0.25+'s order run them."""
    for case in cases:
        if "eviction.lru" in case["requires"]:
            yield replayed(case, "unkeyed-first", eviction=spec.Eviction.LRU_UNKEYED_FIRST)


def same_pass_twins(files: dict[str, list[JSON]]) -> Iterator[JSON]:
    """Every alloc case whose answer depends on the visibility profile, replayed under
    same-pass (ALLOC-VIS-2, ALLOC-VIS-3), so engines that serve a block in the step that
    schedules its writer (vLLM) are held to that profile on the same traces."""
    for path, cases in sorted(files.items()):
        if not path.startswith("alloc/"):
            continue
        for case in cases:
            if "visibility.step-end" in case["requires"]:
                yield replayed(
                    case, "same-pass", ("ALLOC-VIS-2",), visibility=spec.Visibility.SAME_PASS
                )


def replayed(
    case: JSON,
    prefix: str,
    focus: tuple[str, ...] = (),
    *,
    eviction: spec.Eviction | None = None,
    visibility: spec.Visibility | None = None,
    retention: Retention | None = None,
) -> JSON:
    """`case`'s trace again under the profiles given (the others as its input names them),
    as a case whose id gains `prefix` and whose focus `focus`; the spec answers it anew."""
    data = case["input"]
    return alloc_case(
        case["id"].replace("alloc.", f"alloc.{prefix}.", 1),
        layout_from_json(data["layout"]),
        data["num_blocks"],
        [op_from_json(op) for op in data["ops"]],
        case.get("origin"),
        case.get("comment", ""),
        (*focus, *case.get("focus", ())),
        eviction=eviction or spec.Eviction(data.get("eviction", "lru")),
        visibility=visibility or spec.Visibility(data.get("visibility", "step-end")),
        retention=retention or Retention(data.get("retention", "dense")),
        retention_interval=data.get("retention_interval", 0),
    )


# --- regressions: traces the stateful machines shrank, curated in conformance/regressions/ ---

REGRESSIONS = Path(__file__).resolve().parent / "regressions"


def regression_cases() -> Iterator[JSON]:
    """Each curated failure trace, with its expectation recomputed from the spec; each file
    names the rules it was kept for (`focus`)."""
    for path in sorted(REGRESSIONS.glob("*.json")):
        saved = json.loads(path.read_text(encoding="utf-8"))
        ops = [op_from_json(op) for op in saved["ops"]]
        yield alloc_case(
            saved["id"],
            layout_from_json(saved["layout"]),
            saved["num_blocks"],
            ops,
            saved.get("origin"),
            saved.get("comment", ""),
            tuple(saved.get("focus", ())),
            eviction=spec.Eviction(saved.get("eviction", "lru")),
            visibility=spec.Visibility(saved.get("visibility", "step-end")),
            retention=Retention(saved.get("retention", "dense")),
            retention_interval=saved.get("retention_interval", 0),
        )
