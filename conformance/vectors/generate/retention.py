"""The retention profiles' vectors (spec §6b): the hits sparse retention owes, family by
family, and every alloc case whose answer depends on the profile replayed under sparse.

Owed-hit families (`owed_hit_traces`): a writer computes a prompt of p tokens and finishes;
then one follower looks it up. Followers: the re-send, an extension, and siblings that
share the first d tokens and diverge at a block boundary, inside a block and one token
before the next boundary, each followed by a third request sharing the same d tokens (the
junction, RET-JUNCTION-1), and under exact keying the draft's keyed tokens past it. p runs
one below, at and one above a multiple of the hit alignment; layouts cover sliding window,
state, chunked local, block sizes whose lcm exceeds a block, and draft groups under both
speculative profiles with draft_reach 1 to 3.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.alloc import replayed
from kvcert.conformance.vectors.generate.cases import alloc_case, under_unit
from kvcert.spec import (
    ChunkedLocal,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    hit_alignment,
)
from kvcert.spec import alloc as spec
from kvcert.spec.retention import Retention

WRITER = 100  # the writer's prompt is 100, 101, ...
BLOCKS = 96  # enough that nothing is evicted: a lost hit is the profile's, never the pool's


def owed_layouts() -> Iterator[tuple[str, Layout]]:
    """The layouts whose bounded groups sparse retention thins, named for case ids."""
    full, window = FullAttention(4), SlidingWindow(4, 8)
    yield "sw", Layout((full, window))
    yield "state", Layout((full, MambaState(4, MambaMode.ALL)))
    yield "chunked", Layout((full, ChunkedLocal(4, 8)))
    yield "sw-b8", Layout((full, SlidingWindow(8, 12)))
    yield "sw-state", Layout((full, window, MambaState(4, MambaMode.ALL)))
    for reach in (1, 2, 3):
        draft = SlidingWindow(4, 8, draft=True, name="draft")
        yield f"sw-exact-k{reach}", Layout((full, window, draft), Speculative.EXACT, None, reach)
        yield f"sw-drop-k{reach}", Layout((full, window, draft), Speculative.DROP, None, reach)


def owed_hit_traces() -> Iterator[JSON]:
    """Every owed-hit family on every layout, as dense-retention cases (each requires its
    profile where sparse answers it otherwise; `sparse_twins` replays those)."""
    for name, layout in owed_layouts():
        step = hit_alignment(layout)
        for prompt_length in (3 * step - 1, 3 * step, 3 * step + 1):
            prompt = tuple(range(WRITER, WRITER + prompt_length))
            writer: list[spec.Op] = [spec.Admit("w", prompt, 256), spec.EndStep(), spec.Finish("w")]
            for follower, ops in followers(prompt, step, keyed_past(layout)):
                yield alloc_case(
                    f"alloc.owed.{name}.p{prompt_length}.{follower}",
                    layout,
                    BLOCKS,
                    [*writer, *ops],
                    comment=f"a {prompt_length}-token prompt, then {follower.replace('-', ' ')}",
                )


def interval_traces() -> Iterator[JSON]:
    """Sparse retention with an interval of one alignment: every sibling family hits at
    each multiple the writer passed (RET-SPARSE-1's interval), on layouts with a window, a
    state group and a drop-keyed draft."""
    layouts = dict(owed_layouts())
    for name in ("sw", "state", "sw-drop-k1"):
        layout = layouts[name]
        step = hit_alignment(layout)
        prompt = tuple(range(WRITER, WRITER + 3 * step + 1))
        writer: list[spec.Op] = [spec.Admit("w", prompt, 256), spec.EndStep(), spec.Finish("w")]
        for follower, ops in followers(prompt, step, keyed_past(layout)):
            if follower.startswith("sibling"):
                yield alloc_case(
                    f"alloc.sparse-interval.{name}.p{len(prompt)}.{follower}",
                    layout,
                    BLOCKS,
                    [*writer, *ops],
                    comment=f"interval {step}: {follower.replace('-', ' ')} hits at a multiple",
                    focus=("RET-SPARSE-1",),
                    retention=Retention.SPARSE,
                    retention_interval=step,
                )


def keyed_past(layout: Layout) -> int:
    """The tokens past a block that exact draft keys cover (HASH-DRAFT-1): a request reuses
    a block at a junction only if it shares them too."""
    return layout.draft_reach if layout.speculative is Speculative.EXACT else 0


def followers(
    prompt: tuple[int, ...], step: int, keyed: int = 0
) -> Iterator[tuple[str, list[spec.Op]]]:
    """The requests after the writer, each family's ops. The third request of a sibling
    family shares the sibling's tokens up to the junction and the `keyed` tokens past it,
    so that the junction's blocks (RET-JUNCTION-1) can serve it under every keying."""
    yield "re-send", [spec.Admit("f", prompt, 256)]
    yield "extension", [spec.Admit("f", (*prompt, 7, 8, 9), 256)]
    for shared in (step, step + 1, 2 * step - 1, 2 * step):
        sibling = (*prompt[:shared], *range(900, 900 + len(prompt) - shared + 2))
        kept = max(shared, shared // step * step + keyed)
        third = (*sibling[:kept], *range(800, 800 + len(prompt) - kept + 2))
        yield (
            f"sibling-at-{shared}",
            [
                spec.Admit("s", sibling, 256),
                spec.EndStep(),
                spec.Finish("s"),
                spec.Admit("t", third, 256),
            ],
        )


def sparse_twins(files: dict[str, list[JSON]]) -> Iterator[JSON]:
    """Every alloc case whose answer depends on the retention profile, replayed under
    sparse (RET-SPARSE-1/-2), so engines that keep fewer blocks (vLLM's default
    prefix_cache_retention_interval=0) are held to what that profile owes on the same traces."""
    for path, cases in sorted(files.items()):
        if not path.startswith("alloc/"):
            continue
        for case in cases:
            # under `unit U` the allocator refuses sparse (ALLOC-UNIT-1; refusal vectors)
            if "retention.dense" in case["requires"] and not under_unit(case):
                focus = (
                    ("RET-SPARSE-2", "RET-JUNCTION-1")
                    if "sibling" in case["id"]
                    else ("RET-SPARSE-2",)
                )
                twin = replayed(case, "sparse", focus, retention=Retention.SPARSE)
                yield twin
                if "eviction.lru" in twin["requires"] and "eviction.lru" not in case["requires"]:
                    # blocks sparse retention frees unkeyed make the free order matter where
                    # dense keyed them: the trace again under vLLM 0.25+'s order
                    first = replayed(
                        case, "unkeyed-first", eviction=spec.Eviction.LRU_UNKEYED_FIRST
                    )
                    yield replayed(first, "sparse", focus, retention=Retention.SPARSE)
