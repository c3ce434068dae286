"""The hit suite under the hit-granularity profile `unit U` (HIT-UNIT-1..4): hits that end
inside a block, from whole blocks and partial keys. Every case requires the profile
`hit.unit`; an engine that hits whole blocks only does not claim it and skips them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.vectors.generate.cases import hit_case
from kvcert.spec import (
    ChunkedLocal,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
)
from kvcert.spec.hashing import key_lookahead
from kvcert.spec.view import keyable_blocks


def unit_scenarios() -> Iterator[JSON]:
    """Hand-written cases, each for one reading of HIT-UNIT-2/-3 an engine can get wrong."""
    qwen = Layout((FullAttention(64), MambaState(64, MambaMode.ALIGN)), hit_unit=16)
    yield hit_case(
        "hit.unit.qwen35-like.prompt-end",
        qwen, 101, [[0], [0]], "vllm --prefix-match-unit",
        "a Qwen3.5-class model (64-token blocks, unit 16) re-sends a 101-token prompt whose "
        "writer kept a partial key at its last unit boundary, 96: both groups hold 96 "
        "(attention under the partial key, the state at exactly 96), so the hit ends inside "
        "block 1 and block 1 is the copy source", partial=[[96], [96]],
    )  # fmt: skip
    yield hit_case(
        "hit.unit.longer-key-serves-shorter",
        qwen, 101, [[0], [0]], None,
        "the attention tail is cached under a key at 96 but the state only at 80: the hit is "
        "80, read from the block keyed at 96 (it holds tokens 64..95, so 64..79 too); a "
        "lookup that probes the tail only under the key at the hit length finds nothing "
        "there and falls back to 64 (TWIN-UNIT-EXACT-KEY)", partial=[[96], [80]],
        focus=("HIT-UNIT-2",),
    )  # fmt: skip
    yield hit_case(
        "hit.unit.shorter-key-does-not-serve",
        qwen, 101, [[0], [0]], None,
        "the state is checkpointed at 96 but attention holds block 1 only up to 80: tokens "
        "80..95 were never written there, so 96 is refused and the hit is 80", partial=[[80],
                                                                                      [80, 96]],
        focus=("HIT-UNIT-2",),
    )  # fmt: skip
    yield hit_case(
        "hit.unit.state-needs-exact-checkpoint",
        qwen, 130, [[0, 1], [0]], None,
        "attention holds both blocks whole, the state only block 0 (at 64) and a checkpoint "
        "at 112; 128 has no state, so the hit is 112, not the 128 attention could serve",
        partial=[[], [112]], focus=("HIT-UNIT-3",),
    )  # fmt: skip
    window = Layout((FullAttention(8), SlidingWindow(8, 5)), hit_unit=2)
    yield hit_case(
        "hit.unit.window-tail",
        window, 30, [[0, 1], [1]], None,
        "a window of 5 at a hit of 22 reads tokens 18..21, all in block 2 (16..23), which "
        "holds them under a partial key at 22: the window needs no earlier block, and full "
        "attention holds blocks 0 and 1 whole and block 2 up to 22", partial=[[22], [22]],
        focus=("HIT-UNIT-2",),
    )  # fmt: skip
    chunked = Layout((ChunkedLocal(4, 6),), hit_unit=2)
    yield hit_case(
        "hit.unit.chunk-start-inside-block",
        chunked, 12, [[]], None,
        "a chunk of 6 starts at 6, inside block 1: a hit of 10 reads tokens 6..9, but block 1 "
        "is not cached whole and its partial key at 6 stops before token 6, so 10 is refused; "
        "6 starts a chunk and needs nothing, so the hit is 6",
        partial=[[6, 10]], focus=("HIT-UNIT-2",),
    )  # fmt: skip
    drop = Layout(
        (FullAttention(8, draft=True), MambaState(8, MambaMode.ALIGN)), Speculative.DROP, hit_unit=4
    )
    yield hit_case(
        "hit.unit.drop-one-unit",
        drop, 30, [[0, 1, 2], [0, 1]], "vllm 0.33 eagle_proof_margin",
        "under drop keying the hit steps down once in the common set, whose step is now the "
        "unit: common {0, 8, 16, 20}: plain 20, served 16 (HIT-SPEC-2)",
        partial=[[], [20]], focus=("HIT-SPEC-2",),
    )  # fmt: skip

    none = Layout((FullAttention(4), MambaState(8, MambaMode.NONE)), hit_unit=2)
    yield hit_case(
        "hit.unit.mamba-none",
        none, 12, [[0, 1, 2], []], None,
        "a state group in mode none keeps no checkpoint, under unit U as under block hits: "
        "every positive length is refused and the hit is 0 (HIT-MAMBA-2 in HIT-UNIT-3)",
        focus=("HIT-UNIT-3",),
    )  # fmt: skip


def _groups(rng: random.Random, unit: int) -> list[Group]:
    sizes = [unit * k for k in (1, 2, 3, 4)]
    kinds: list[Group] = [
        FullAttention(rng.choice(sizes)),
        SlidingWindow(rng.choice(sizes), rng.randint(1, 12)),
        ChunkedLocal(rng.choice(sizes), rng.randint(1, 12)),
        MambaState(rng.choice(sizes), rng.choice([MambaMode.ALIGN, MambaMode.ALL])),
    ]
    return rng.sample(kinds, rng.randint(1, 3))


def distinct(drawn: Iterator[tuple[object, JSON]], limit: int) -> Iterator[JSON]:
    """The first case of each new shape, at most `limit` of them."""
    seen: set[object] = set()
    for shape, case in drawn:
        if shape not in seen:
            seen.add(shape)
            yield case
            if len(seen) >= limit:
                return


def unit_hits(limit: int, seed: int = 7000) -> Iterator[JSON]:
    """Seeded random layouts of one to three groups under unit 1, 2 or 3, with random whole
    blocks and partial keys; one case per new (group kinds, outcome) shape."""
    return distinct(_random_unit_hits(50 * limit, seed), limit)


def _random_unit_hits(attempts: int, seed: int) -> Iterator[tuple[object, JSON]]:
    rng = random.Random(seed)
    for attempt in range(attempts):
        unit = rng.choice([1, 2, 3])
        groups = _groups(rng, unit)
        speculative = rng.choice([None, None, Speculative.EXACT, Speculative.DROP])
        if speculative is not None:
            groups.append(FullAttention(unit * rng.choice([1, 2]), draft=True, name="draft"))
        layout = Layout(tuple(groups), speculative, hit_unit=unit)
        num_tokens = rng.randint(1, 24)
        cached, partial = [], []
        for g, group in enumerate(layout.groups):
            blocks = range(keyable_blocks(layout, g, num_tokens))
            cached.append([j for j in blocks if rng.random() < 0.75])
            top = num_tokens - key_lookahead(layout, group)
            inside = [p for p in range(unit, top + 1, unit) if p % group.block_size]
            partial.append([p for p in inside if rng.random() < 0.4])
        case = hit_case(
            f"hit.unit.random.{attempt:05d}", layout, num_tokens, cached, partial=partial
        )
        kinds = tuple(type(group).__name__ for group in layout.groups)
        yield (
            (kinds, speculative, case["expect"]["hit"] % max(1, unit * 2), tuple(case["rules"])),
            case,
        )


def unit_hybrid_layouts() -> list[Layout]:
    """Qwen3.5-class layouts: full attention beside an align-mode state group whose block
    exceeds the unit, with and without a draft group under drop keying (the layouts in which
    vLLM 0.26+ turns its fine-grained lookups on)."""
    pairs = [(2, 2, 4), (2, 4, 4), (2, 4, 8), (4, 8, 8), (1, 2, 2), (2, 8, 4)]
    layouts = []
    for unit, full, state in pairs:
        groups: tuple[Group, ...] = (FullAttention(full), MambaState(state, MambaMode.ALIGN))
        layouts.append(Layout(groups, hit_unit=unit))
        draft = FullAttention(full, draft=True, name="draft")
        layouts.append(Layout((*groups, draft), Speculative.DROP, hit_unit=unit))
    return layouts


def unit_hybrid_hits(limit: int, seed: int = 7100) -> Iterator[JSON]:
    """Seeded random views over unit_hybrid_layouts: whole blocks and partial keys drawn per
    group; one case per new (layout, hit, block lists) shape."""
    return distinct(_random_hybrid_hits(40 * limit, seed), limit)


def _random_hybrid_hits(attempts: int, seed: int) -> Iterator[tuple[object, JSON]]:
    rng = random.Random(seed)
    layouts = unit_hybrid_layouts()
    for attempt in range(attempts):
        index = rng.randrange(len(layouts))
        layout = layouts[index]
        unit = layout.hit_unit or 1
        num_tokens = rng.randint(1, 20)
        cached, partial = [], []
        for g, group in enumerate(layout.groups):
            blocks = range(keyable_blocks(layout, g, num_tokens))
            keep = rng.choice([0.5, 0.8, 1.0])
            cached.append([j for j in blocks if rng.random() < keep])
            inside = [p for p in range(unit, num_tokens + 1, unit) if p % group.block_size]
            partial.append([p for p in inside if rng.random() < 0.35])
        case = hit_case(
            f"hit.unit.hybrid.{index:02d}.{attempt:05d}", layout, num_tokens, cached,
            partial=partial,
        )  # fmt: skip
        yield (index, case["expect"]["hit"], json.dumps(case["expect"]["block_runs"])), case
