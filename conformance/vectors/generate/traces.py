"""Seeded random allocator traces over small random layouts (the stateful machine's op mix)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

from kvcert.conformance.contract.codec import (
    JSON,
)
from kvcert.conformance.vectors.generate.cases import alloc_case
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
from kvcert.spec import alloc as spec


def _play(
    rnd: random.Random,
    state: spec.State,
    admit: Callable[[spec.State, str], spec.Op],
    extend: Callable[[str, spec.Request], spec.Op],
) -> tuple[spec.State, list[spec.Op]]:
    """Thirty draws of the stateful machine's op mix from `state`: admissions (`admit` builds
    the op for a free request id), extensions of a request with no chunk in flight
    (`extend`), step ends, finishes and preemptions. Returns the final state and the ops."""
    ops: list[spec.Op] = []
    for _ in range(30):
        roll = rnd.random()
        running = sorted(state.requests)
        if roll < 0.35:
            rid = next((r for r in "abcd" if r not in state.requests), None)
            if rid is None:
                continue
            op = admit(state, rid)
        elif roll < 0.55 and running:
            rid = rnd.choice(running)
            request = state.requests[rid]
            if request.scheduled:
                continue
            op = extend(rid, request)
        elif roll < 0.85:
            op = spec.EndStep()
        elif running:
            rid = rnd.choice(running)
            op = spec.Preempt(rid) if rnd.random() < 0.3 else spec.Finish(rid)
        else:
            continue
        state, _ = spec.step(state, op)
        ops.append(op)
    return state, ops


SHORT = [tuple(range(1, 25)), tuple(range(1, 9)) + tuple(range(60, 76))]  # prompts to cut


def _mixed_play(
    rnd: random.Random,
    state: spec.State,
    bases: list[tuple[int, ...]],
    lookaheads: list[int],
    budget: Callable[[random.Random], int],
) -> tuple[spec.State, list[spec.Op]]:
    """`_play` with prompts cut from `bases`, admissions reserving one of `lookaheads` and
    extensions of `budget` tokens (one sampled token appended once the prompt is computed)."""

    def admit(_: spec.State, rid: str) -> spec.Op:
        tokens = rnd.choice(bases)[: rnd.randint(1, 24)]
        return spec.Admit(rid, tokens, rnd.randint(1, 24), (), rnd.choice(lookaheads))

    def extend(rid: str, request: spec.Request) -> spec.Op:
        done = request.computed == len(request.tokens)
        return spec.Extend(rid, budget(rnd), (rnd.randint(0, 2),) if done else ())

    return _play(rnd, state, admit, extend)


def random_traces(
    count: int, eviction: spec.Eviction = spec.Eviction.LRU, first_seed: int = 0
) -> Iterator[JSON]:
    """Seeded random traces over small random layouts (the stateful machine's op mix)."""
    kinds: list[Callable[[random.Random], Group]] = [
        lambda r: FullAttention(r.choice([1, 2, 4])),
        lambda r: SlidingWindow(r.choice([1, 2, 4]), r.randint(1, 9)),
        lambda r: ChunkedLocal(r.choice([2, 4]), r.randint(2, 9)),
        lambda r: MambaState(r.choice([2, 4]), r.choice(list(MambaMode))),
    ]
    for n in range(count):
        rnd = random.Random(first_seed + n)
        groups = [rnd.choice(kinds)(rnd) for _ in range(rnd.randint(1, 3))]
        if (
            not any(isinstance(g, FullAttention | SlidingWindow | ChunkedLocal) for g in groups)
            or rnd.random() < 0.3
        ):
            groups.append(FullAttention(rnd.choice([2, 4])))
        profile = rnd.choice([None, None, Speculative.EXACT, Speculative.DROP])
        if profile is not None:
            groups.append(FullAttention(rnd.choice([2, 4]), draft=True))
        layout = Layout(tuple(groups), profile)
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(6, 40), eviction))
        state, ops = _mixed_play(rnd, state, SHORT, [0, 0, 1], lambda r: r.randint(1, 8))
        label = "random" if eviction is spec.Eviction.LRU else f"random-{eviction.value}"
        yield alloc_case(
            f"alloc.{label}.{n:03d}",
            layout,
            state.config.num_blocks,
            ops,
            eviction=eviction,
        )


def draft_reach_traces(
    count: int, first_seed: int, eviction: spec.Eviction = spec.Eviction.LRU
) -> Iterator[JSON]:
    """Seeded random traces over layouts whose drafter reads 2 or 3 tokens ahead (several MTP
    modules, `draft_reach`): exact keys spanning them (HASH-DRAFT-1), draft blocks registered
    only once the tokens after them are computed (ALLOC-COMMIT-1), and drop hits stepping
    down over them (HIT-SPEC-2). Shared prefixes and one-token decode steps, so that blocks
    wait, commit late and are hit."""
    kinds: list[Callable[[random.Random], Group]] = [
        lambda r: FullAttention(r.choice([2, 4])),
        lambda r: SlidingWindow(r.choice([2, 4]), r.randint(2, 9)),
        lambda r: MambaState(4, r.choice([MambaMode.ALIGN, MambaMode.ALL])),
    ]
    drafts: list[Callable[[random.Random], Group]] = [
        lambda r: FullAttention(r.choice([2, 4]), draft=True),
        lambda r: SlidingWindow(r.choice([2, 4]), r.randint(3, 9), draft=True),
    ]
    for n in range(count):
        rnd = random.Random(first_seed + n)
        groups = [rnd.choice(kinds)(rnd) for _ in range(rnd.randint(0, 2))]
        groups.append(rnd.choice(drafts)(rnd))
        alignment = math.lcm(*(g.block_size for g in groups))
        profile = rnd.choice([Speculative.EXACT, Speculative.DROP])
        top = 3 if profile is Speculative.EXACT else min(3, alignment)
        layout = Layout(tuple(groups), profile, draft_reach=rnd.randint(2, max(2, top)))
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(8, 40), eviction))
        # one-token decode steps mostly: draft blocks wait, then commit
        state, ops = _mixed_play(rnd, state, SHORT, [0, 1, 2], lambda r: r.choice([1, 1, 2, 8]))
        label = "" if eviction is spec.Eviction.LRU else f"-{eviction.value}"
        yield alloc_case(
            f"alloc.draft-reach{label}.{n:03d}",
            layout,
            state.config.num_blocks,
            ops,
            eviction=eviction,
        )


BASES = [tuple(range(1, 41)), tuple(range(1, 13)) + tuple(range(60, 88))]


def _align_layout(rnd: random.Random, spare: int = 0) -> Layout:
    """A random layout with a state group in mode align (its blocks `spare` speculative
    ones), sometimes a second one, full attention and sometimes a sliding window."""
    size = rnd.choice([2, 4])
    groups: list[Group] = [MambaState(size, MambaMode.ALIGN, speculative_blocks=spare)]
    if rnd.random() < 0.3:
        groups.append(MambaState(size * 2, MambaMode.ALIGN, speculative_blocks=spare))
    groups.append(FullAttention(rnd.choice([1, 2, 4])))
    if rnd.random() < 0.4:
        groups.append(SlidingWindow(rnd.choice([2, 4]), rnd.randint(2, 9)))
    rnd.shuffle(groups)
    return Layout(tuple(groups))


def _admitting(
    rnd: random.Random, layout: Layout, chance: float | None = None
) -> Callable[[spec.State, str], spec.Op]:
    """Admissions of a random prefix of BASES whose first chunk names an inner checkpoint
    (`_pick`), only `chance` of the time when given."""

    def admit(state: spec.State, rid: str) -> spec.Op:
        tokens = rnd.choice(BASES)[: rnd.randint(1, 40)]
        budget = rnd.randint(1, 40)
        hit = spec.lookup(state, tokens, ())[0]
        end = hit + min(budget, len(tokens) - hit)
        picked = chance is None or rnd.random() < chance
        return spec.Admit(rid, tokens, budget, (), 0, _pick(rnd, layout, hit, end) if picked else 0)

    return admit


def checkpoint_traces(count: int, first_seed: int) -> Iterator[JSON]:
    """Seeded random traces over layouts with a state group in mode align whose chunks name
    inner checkpoints (CKPT-INNER-1) where they have one, half the time."""
    for n in range(count):
        rnd = random.Random(first_seed + n)
        layout = _align_layout(rnd)
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(8, 40)))

        def extend(
            rid: str, request: spec.Request, rnd: random.Random = rnd, layout: Layout = layout
        ) -> spec.Op:
            done = request.computed == len(request.tokens)
            appended = (rnd.randint(0, 2),) if done else ()
            budget = rnd.randint(1, 12)
            known = len(request.tokens) + len(appended)
            end = request.computed + min(budget, known - request.computed)
            checkpoint = _pick(rnd, layout, request.computed, end)
            return spec.Extend(rid, budget, appended, 0, checkpoint)

        state, ops = _play(rnd, state, _admitting(rnd, layout), extend)
        yield alloc_case(f"alloc.random-checkpoints.{n:03d}", layout, state.config.num_blocks, ops)


def _pick(rnd: random.Random, layout: Layout, computed: int, end: int) -> int:
    """One of the chunk's allowed inner checkpoints half the time it has any, else 0."""
    chosen = spec.allowed_checkpoints(layout, computed, end)
    return rnd.choice(chosen) if chosen and rnd.random() < 0.5 else 0


def speculative_state_traces(count: int, first_seed: int) -> Iterator[JSON]:
    """Seeded random traces over layouts whose state groups keep blocks for the states after
    draft tokens (ALLOC-SPEC-1), decoding with as many speculative slots as they keep (or
    fewer), naming inner checkpoints (CKPT-INNER-1) a third of the time a prefill chunk can
    and most times a decode chunk crosses a boundary (ALLOC-SPEC-2)."""
    for n in range(count):
        rnd = random.Random(first_seed + n)
        spare = rnd.randint(1, 3)
        layout = _align_layout(rnd, spare)
        state = spec.initial_state(spec.PoolConfig(layout, rnd.randint(10, 48)))

        def extend(
            rid: str,
            request: spec.Request,
            rnd: random.Random = rnd,
            spare: int = spare,
            layout: Layout = layout,
        ) -> spec.Op:
            if request.computed == len(request.tokens):  # decoding: drafts ride as lookahead
                appended = tuple(rnd.randint(0, 2) for _ in range(rnd.randint(1, spare + 1)))
                end = request.computed + len(appended)
                # the boundary accepted drafts crossed, saved when they were verified
                crossed = spec.allowed_checkpoints(layout, request.computed, end, decoding=True)
                checkpoint = rnd.choice(crossed) if crossed and rnd.random() < 0.8 else 0
                return spec.Extend(rid, len(appended), appended, rnd.randint(0, spare), checkpoint)
            return spec.Extend(rid, rnd.randint(1, 12))

        state, ops = _play(rnd, state, _admitting(rnd, layout, 0.66), extend)
        yield alloc_case(
            f"alloc.random-speculative-state.{n:03d}", layout, state.config.num_blocks, ops
        )
