"""The Hypothesis state machine that holds an engine to the spec, operation by operation.

    from kvcert.conformance.checks.stateful import machine_for
    TestMyEngine = machine_for(make_my_engine).TestCase      # collected by pytest

kvcert's own differential test of kvcert.reference subclasses exactly this machine, so an
engine author runs the same search kvcert runs on itself. Each step draws one operation
(admissions of prefixes of a few shared token bases, so prefixes, duplicates and evictions
really happen; extensions with sampled tokens and speculative lookahead; step ends;
finishes and preemptions; rare cache resets; and misuse the engine must refuse), applies it
to the spec, and compares the engine's observation, block tables up to one renaming of ids
per trace. A session may answer an operation it cannot express `{"unsupported": why}`,
changing nothing: the operation leaves the trace (the spec's state goes back), and the
class counts the operations so skipped by reason (`unsupported`). The spec's invariants
(§7) are checked after every step.

Only what the engine claims is drawn: group kinds, speculative profiles, extra keys, the
allocator features (`describe()`), and the eviction, visibility and retention profiles
among which each run picks one (block identities are compared, so at least one eviction
profile must be claimed; an engine naming no visibility profile is held to step-end, none
naming a retention profile to dense). A run under the radix profile (§13, SGLang's tree)
steps kvcert.spec.radix on one full-attention group, step-end and dense, and compares page
ids as lifetimes (RADIX-ID-1): an engine id may name a new page once the spec no longer
holds the page it named. An engine
with `open(case)` is driven one operation at a time; otherwise the whole trace is replayed
through `run()` at every step. A failing trace is shrunk and printed as a program, and with
KVCERT_REGRESSION_DIR set it is saved as a regression candidate. Requires the test extra.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvcert.conformance.contract.codec import (
    JSON,
    REFUSED,
    layout_to_json,
    observation_to_json,
    op_to_json,
)
from kvcert.conformance.contract.compare import (
    LiveRenaming,
    Renaming,
    compare_alloc,
    compare_observation,
)
from kvcert.conformance.contract.protocol import FEATURES, Engine, Session
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    Extra,
    ExtraKind,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
    radix,
)
from kvcert.spec import alloc as spec
from kvcert.spec.hashing import keys_reach
from kvcert.spec.invariants import violated
from kvcert.spec.layout import hit_alignment, is_cacheable, is_draft
from kvcert.spec.retention import Retention

BASES = (
    tuple(range(1, 41)),
    tuple(range(1, 13)) + tuple(range(60, 88)),
    tuple(range(1, 5)) + tuple(range(200, 236)),
)
EXTRAS = (
    (),
    (Extra(ExtraKind.CACHE_SALT, "s"),),
    (Extra(ExtraKind.LORA, "s"),),
    (Extra(ExtraKind.MULTIMODAL, "img", 2, 9),),
)
SIZES = st.sampled_from([1, 2, 4])
RIDS = "abcde"


def _kinds(features: frozenset[str]) -> list[st.SearchStrategy[Group]]:
    """Strategies for the group kinds the features allow (draft groups come separately)."""
    kinds: list[st.SearchStrategy[Group]] = []
    if "kind.full" in features:
        kinds.append(st.builds(FullAttention, SIZES))
    if "kind.sliding_window" in features:
        kinds.append(st.builds(SlidingWindow, SIZES, st.integers(1, 12)))
    if "kind.chunked_local" in features:
        kinds.append(st.builds(ChunkedLocal, SIZES, st.integers(1, 12)))
    modes = [m for m in MambaMode if f"kind.mamba.{m.value}" in features]
    if modes:
        kinds.append(st.builds(MambaState, SIZES, st.sampled_from(modes)))
    if "kind.mamba.align" in features and "alloc.speculative_state" in features:
        spare = st.integers(1, 3)
        kinds.append(
            st.builds(MambaState, SIZES, st.just(MambaMode.ALIGN), speculative_blocks=spare)
        )
    if "kind.cross" in features:
        kinds.append(st.builds(CrossAttention, SIZES))
    return kinds


@st.composite
def layouts(draw: st.DrawFn, features: frozenset[str], max_groups: int = 3) -> Layout:
    """Small layouts of the kinds and speculative profiles the features allow."""
    groups = draw(st.lists(st.one_of(_kinds(features)), min_size=1, max_size=max_groups))
    profiles = [None, *(p for p in Speculative if f"speculative.{p.value}" in features)]
    profile = draw(st.sampled_from(profiles))
    if profile is not None:
        groups.append(FullAttention(draw(SIZES), draft=True))
    if not any(is_cacheable(g) for g in groups):
        groups.append(FullAttention(draw(SIZES)))
    reach = 1
    if profile is not None and "speculative.reach" in features:  # several MTP modules
        alignment = math.lcm(*(g.block_size for g in groups if is_cacheable(g)))
        reach = draw(st.integers(1, 3 if profile is Speculative.EXACT else min(3, alignment)))
    return Layout(tuple(groups), profile, draft_reach=reach)


def with_unit(
    layout: Layout,
    pick: int,
    eviction: spec.Eviction,
    visibility: spec.Visibility,  # either serves `unit U` (same-pass through HIT-UNIT-5)
    retention: Retention,  # either serves it (RET-SPARSE-2/-3 under sparse)
) -> Layout:
    """`layout` under `unit U` for a nonzero `pick` (U: the pick-th smallest divisor of the
    block sizes, cycling: the smaller U, the more tails fall inside blocks), where
    ALLOC-UNIT-1 serves the profiles; else `layout` itself."""
    del retention
    served = eviction is not spec.Eviction.HYBRID and not (
        layout.speculative is Speculative.DROP and any(map(is_draft, layout.groups))
    )
    if not pick or not served:
        return layout
    sizes = math.gcd(*(g.block_size for g in layout.groups if is_cacheable(g)))
    divisors = [d for d in range(1, sizes + 1) if sizes % d == 0]
    return dataclasses.replace(layout, hit_unit=divisors[(pick - 1) % len(divisors)])


def _unsupported(answer: object) -> bool:
    """Whether a session's answer to one operation is `{"unsupported": why}`: an operation the
    engine cannot express (and did not apply); the machine drops it from the trace."""
    return (
        isinstance(answer, dict) and set(answer) == {"unsupported"}
        and isinstance(answer["unsupported"], str)
    )  # fmt: skip


def save_failure(case: JSON) -> None:
    """With KVCERT_REGRESSION_DIR set, keep the failing trace as a regression candidate.

    Hypothesis replays the shrunk example last, so `latest-failure.json` ends up minimal;
    copy it to conformance/vectors/generate/regressions/ with an id and comment, and
    `python -m kvcert.conformance.vectors.generate` turns it into a vector whose expectation
    comes from the spec.
    """
    folder = os.environ.get("KVCERT_REGRESSION_DIR")
    if not folder:
        return
    trace = {"id": "alloc.regression.CHANGE-ME", "origin": "kvcert stateful machine"}
    trace |= {k: case[k] for k in ("layout", "num_blocks", "ops")}
    if "eviction" in case:
        trace["eviction"] = case["eviction"]
    for profile in ("visibility", "retention", "retention_interval"):
        if profile in case:
            trace[profile] = case[profile]
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "latest-failure.json").write_text(
        json.dumps(trace, indent=1) + "\n", encoding="utf-8"
    )


def machine_for(
    engine_factory: Callable[[], Engine] | None,
    *,
    features: frozenset[str] | None = None,
    profiles: frozenset[str] | None = None,
    every_run_unit: bool = False,
) -> type[RuleBasedStateMachine]:
    """A state machine class checking `engine_factory()` against the spec.

    `features` and `profiles` narrow what the engine's description claims (default: all of
    it). With no engine (`machine_for(None)`) the machine checks the spec's own invariants:
    its self-check. `every_run_unit`: every run whose profiles allow it is under `unit U`
    (an engine claiming `hit.unit`). `failing_trace_lengths` records the length of each
    diverging trace, the shrunk one last, and `first_failure_at` when the first was found;
    `steps` counts the operations applied over every run, for budgets.
    """
    described: JSON = engine_factory().describe() if engine_factory is not None else {}
    claimed = frozenset(described.get("features", FEATURES))
    allowed = claimed if features is None else claimed & features
    pool = spec.BLOCK_POOL_EVICTIONS
    offered = frozenset(described.get("profiles", [f"eviction.{e.value}" for e in pool]))
    chosen = offered if profiles is None else offered & profiles
    evictions = [e for e in pool if f"eviction.{e.value}" in chosen]
    if "eviction.radix" in chosen and "kind.full" in allowed:  # §13: one full group
        evictions.append(spec.Eviction.RADIX)
    if not evictions:
        raise ValueError(
            f"the machine compares block identities, which is normative only under an eviction "
            f"profile; the engine claims {sorted(offered) or 'none'}: claim eviction.lru, "
            "eviction.hybrid, eviction.lru-unkeyed-first or eviction.radix (with kind.full)"
        )
    # an engine that names no visibility profile is held to step-end, the only one before
    # spec 0.4.0 (so older descriptions keep their meaning)
    visibilities = [v for v in spec.Visibility if f"visibility.{v.value}" in chosen]
    if not any(p.startswith("visibility.") for p in offered):
        visibilities = [spec.Visibility.STEP_END]
    if not visibilities:
        raise ValueError(
            f"the engine claims {sorted(offered)}, none of them a visibility profile the "
            "machine may pick: claim visibility.step-end or visibility.same-pass"
        )
    # likewise dense retention, the only one before spec 0.5.0
    retentions = [r for r in Retention if f"retention.{r.value}" in chosen]
    if not any(p.startswith("retention.") for p in offered):
        retentions = [Retention.DENSE]
    if not retentions:
        raise ValueError(
            f"the engine claims {sorted(offered)}, none of them a retention profile the "
            "machine may pick: claim retention.dense or retention.sparse"
        )
    intervals = "retention.sparse-interval" in chosen and Retention.SPARSE in retentions
    extras = [x for x in EXTRAS if all(f"extras.{e.kind.value}" in allowed for e in x)]
    lookaheads = st.integers(0, 3) if "alloc.lookahead" in allowed else st.just(0)
    # `unit U` (ALLOC-UNIT-1): in a quarter of the runs whose profiles the allocator serves it
    # under, a unit dividing every block size (picked among its divisors)
    units = st.sampled_from([0, 0, 0, 1, 2]) if "hit.unit" in chosen else st.just(0)
    if every_run_unit and "hit.unit" in chosen:
        units = st.sampled_from([1, 2])
    checkpoints = "alloc.state_checkpoint" in allowed

    class KVCacheConformanceMachine(RuleBasedStateMachine):
        failing_trace_lengths: list[int] = []  # noqa: RUF012 - shared on purpose, per class
        first_failure_at: list[float] = []  # noqa: RUF012 - perf_counter() of the first one
        steps = 0  # operations applied, over every run of this class
        # operations the engine answered {"unsupported": why}, by why, over every run
        unsupported: dict[str, int] = {}  # noqa: RUF012 - shared on purpose, per class

        def __init__(self) -> None:
            super().__init__()
            self.engine = engine_factory() if engine_factory is not None else None
            self.state: spec.State | radix.State | None = None
            self.next_state: Callable[..., tuple[object, spec.Observation]] = spec.step
            self.broken: Callable[..., list[str]] = violated
            self.case: JSON = {}
            self.expected: list[JSON] = []
            self.session: Session | None = None
            self.renaming = Renaming()

        @initialize(
            layout=layouts(allowed),
            blocks=st.integers(4, 96),
            eviction=st.sampled_from(evictions),
            visibility=st.sampled_from(visibilities),
            retention=st.sampled_from(retentions),
            interval_steps=st.integers(0, 2) if intervals else st.just(0),
            unit_pick=units,
            page=SIZES,
        )
        def start(
            self,
            *,
            layout: Layout,
            blocks: int,
            eviction: spec.Eviction,
            visibility: spec.Visibility,
            retention: Retention,
            interval_steps: int,
            unit_pick: int,
            page: int,
        ) -> None:
            if eviction is spec.Eviction.RADIX:  # RADIX-SCOPE-1: what the tree caches
                layout, unit_pick = Layout((FullAttention(page),)), 0
                visibility, retention, interval_steps = spec.Visibility.STEP_END, Retention.DENSE, 0
                self.next_state, self.broken = radix.step, radix.violated
                self.renaming = LiveRenaming()
            layout = with_unit(layout, unit_pick, eviction, visibility, retention)
            interval = 0
            if retention is Retention.SPARSE:
                interval = interval_steps * hit_alignment(layout)
            config = spec.PoolConfig(layout, blocks, eviction, visibility, retention, interval)
            if eviction is spec.Eviction.RADIX:
                self.state = radix.initial_state(config)
            else:
                self.state = spec.initial_state(config)
            self.case = {"suite": "alloc", "layout": layout_to_json(layout), "num_blocks": blocks}
            if eviction is not spec.Eviction.LRU:
                self.case["eviction"] = eviction.value
            if visibility is not spec.Visibility.STEP_END:
                self.case["visibility"] = visibility.value
            if retention is not Retention.DENSE:
                self.case["retention"] = retention.value
            if interval:
                self.case["retention_interval"] = interval
            self.case["ops"] = []
            opener = getattr(self.engine, "open", None)
            if callable(opener):
                self.session = opener(self.case)

        def model(self) -> spec.State | radix.State:
            if self.state is None:
                raise RuntimeError("the machine's start rule has not run")
            return self.state

        def apply(self, op: spec.Op) -> None:
            type(self).steps += 1
            before = self.state
            try:
                self.state, observation = self.next_state(self.model(), op)  # type: ignore[assignment]
                expected = observation_to_json(observation)
            except SpecError:
                expected = REFUSED
            self.expected.append(expected)
            self.case["ops"].append(op_to_json(op))
            if self.engine is None:
                event(next(iter(expected)))
                return
            if isinstance(self.renaming, LiveRenaming) and isinstance(self.state, radix.State):
                self.renaming.live = radix.live_pages(self.state)
            try:
                if self.session is not None:
                    actual = self.session.apply(self.case["ops"][-1])
                    if _unsupported(actual):  # the engine cannot express this operation
                        self._skip(before, actual)
                        return
                    difference = compare_observation(self.renaming, expected, actual)
                    if difference is not None:
                        difference = f"step {len(self.expected) - 1}: {difference}"
                else:
                    answer = self.engine.run(self.case)
                    lifetimes = isinstance(self.renaming, LiveRenaming)
                    expect = {"observations": self.expected}
                    difference = compare_alloc(expect, answer, lifetimes=lifetimes)
            except Exception as error:  # a crash is a divergence too, shrunk like any other
                step = len(self.expected) - 1
                difference = f"step {step}: raised {type(error).__name__}: {error}"
            event(next(iter(expected)))
            if difference is not None:  # an explicit raise: `python -O` must not hide it
                self.failing_trace_lengths.append(len(self.expected))
                if not self.first_failure_at:
                    self.first_failure_at.append(time.perf_counter())
                save_failure(self.case)
                raise AssertionError(f"engine diverges from the spec at {difference} ({op})")

        def _skip(self, before: spec.State | radix.State | None, answer: JSON) -> None:
            """An operation the engine answered `{"unsupported": why}` (it changed nothing):
            it leaves the trace, and the spec's state goes back to before it."""
            self.state = before
            self.expected.pop()
            self.case["ops"].pop()
            type(self).unsupported[answer["unsupported"]] = (
                type(self).unsupported.get(answer["unsupported"], 0) + 1
            )
            event("unsupported by the engine")

        def keeps_checkpoints(self) -> bool:
            """Whether the layout has a state group in mode align (CKPT-INNER-1 applies)."""
            return self.state is not None and any(
                isinstance(g, MambaState) and g.mode is MambaMode.ALIGN
                for g in self.state.config.layout.groups
            )

        def _lookahead(self, drawn: int) -> int:
            """The drawn lookahead; under the radix profile, which refuses any, only the
            largest is kept (a misuse both must refuse), so most operations run."""
            if isinstance(self.state, radix.State) and drawn < 3:
                return 0
            return drawn

        def _running(self, index: int) -> str | None:
            names = sorted(self.model().requests)
            return names[index % len(names)] if names else None

        @rule(
            base=st.sampled_from(BASES),
            length=st.integers(1, 40),
            budget=st.integers(1, 40),
            lookahead=lookaheads,
            extra=st.sampled_from(extras),
        )
        def admit(
            self,
            base: tuple[int, ...],
            length: int,
            budget: int,
            lookahead: int,
            extra: tuple[Extra, ...],
        ) -> None:
            rid = next((r for r in RIDS if r not in self.model().requests), None)
            if rid is not None:
                lookahead = self._lookahead(lookahead)
                self.apply(spec.Admit(rid, base[:length], budget, extra, lookahead))

        @rule(
            index=st.integers(0, 4),
            budget=st.integers(1, 24),
            token=st.integers(0, 2),
            lookahead=lookaheads,
        )
        def extend(self, index: int, budget: int, token: int, lookahead: int) -> None:
            rid = self._running(index)
            if rid is None or self.model().requests[rid].scheduled:
                return
            request = self.model().requests[rid]
            appended = (token,) if request.computed == len(request.tokens) else ()
            self.apply(spec.Extend(rid, budget, appended, self._lookahead(lookahead)))

        @precondition(lambda self: checkpoints and self.keeps_checkpoints())
        @rule(index=st.integers(0, 4), budget=st.integers(2, 24), pick=st.integers(0, 7))
        def extend_past_a_checkpoint(self, index: int, budget: int, pick: int) -> None:
            """A prefill chunk whose kernel saves state at a boundary inside it (CKPT-INNER-1), or
            under `unit U` inside a block (CKPT-INNER-2)."""
            rid = self._running(index)
            if rid is None or self.model().requests[rid].scheduled:
                return
            request = self.model().requests[rid]
            end = min(request.computed + budget, len(request.tokens))
            layout = self.model().config.layout  # under `unit U` inside blocks too (CKPT-INNER-2)
            allowed = spec.allowed_checkpoints(layout, request.computed, end)
            if allowed:
                self.apply(spec.Extend(rid, budget, (), 0, allowed[pick % len(allowed)]))

        def _tail(self, prompt: int) -> int:
            """ALLOC-UNIT-2's tail boundary of a `prompt`-token prompt (the re-send hit)."""
            layout = self.model().config.layout
            return spec.tail_boundary(layout.hit_unit or 1, prompt, keys_reach(layout))

        def under_unit(self) -> bool:
            """Whether the run is under `unit U` (the tail rules below apply)."""
            return self.state is not None and self.state.config.layout.hit_unit is not None

        @precondition(lambda self: self.under_unit())
        @rule(
            base=st.sampled_from(BASES),
            length=st.integers(2, 40),
            stop=st.booleans(),
            save=st.booleans(),
        )
        def admit_to_the_tail(
            self, base: tuple[int, ...], length: int, stop: bool, save: bool
        ) -> None:
            """`unit U`: a prompt whose first chunk ends at its tail boundary (ALLOC-UNIT-2's
            state key) or runs to its end, saving the tail in passing where it may
            (CKPT-INNER-2), so a later one can hit inside a block."""
            rid = next((r for r in RIDS if r not in self.model().requests), None)
            if rid is None:
                return
            state = self.model()
            if not isinstance(state, spec.State):  # `unit U` is §6's alone
                return
            tokens = base[:length]
            tail = self._tail(length)
            hit = spec.lookup(state, tokens, ())[0]
            budget = tail - hit if stop and tail > hit else length
            checkpoint = 0
            layout = self.model().config.layout
            if checkpoints and save and budget == length and self.keeps_checkpoints():
                problem = spec.checkpoint_problem(layout, hit, length, tail)
                checkpoint = tail if problem is None else 0
            self.apply(spec.Admit(rid, tokens, budget, checkpoint=checkpoint))

        @precondition(lambda self: self.under_unit())
        @rule(index=st.integers(0, 4))
        def extend_to_the_tail(self, index: int) -> None:
            """`unit U`: a prefill chunk ending at the prompt's tail boundary."""
            rid = self._running(index)
            if rid is None or self.model().requests[rid].scheduled:
                return
            request = self.model().requests[rid]
            tail = self._tail(request.prompt)
            if request.computed < tail:
                self.apply(spec.Extend(rid, tail - request.computed))

        @rule()
        def end_step(self) -> None:
            self.apply(spec.EndStep())

        @rule(index=st.integers(0, 4), preempt=st.booleans())
        def release(self, index: int, preempt: bool) -> None:
            rid = self._running(index)
            if rid is None:
                return
            preempt = preempt and "alloc.preempt" in allowed
            self.apply(spec.Preempt(rid) if preempt else spec.Finish(rid))

        @rule(roll=st.integers(0, 9))
        def reset(self, roll: int) -> None:
            if roll == 0 and "alloc.reset_cache" in allowed:  # rare: it wipes the cache
                self.apply(spec.ResetCache())

        @rule(
            rid=st.sampled_from(RIDS + "x"),
            kind=st.sampled_from(["admit", "extend", "finish"]),
            appended=st.booleans(),
        )
        def misuse(self, rid: str, kind: str, appended: bool) -> None:
            """Operations that may break the protocol: both must refuse the same ones."""
            if kind == "admit":
                self.apply(spec.Admit(rid, BASES[0][:8], 8))
            elif kind == "extend":
                self.apply(spec.Extend(rid, 4, (1,) if appended else ()))
            else:
                self.apply(spec.Finish(rid))

        @invariant()
        def spec_invariants_hold(self) -> None:
            if self.state is not None and (broken := self.broken(self.state)):
                raise AssertionError(f"the spec broke its invariants {broken}")

    return KVCacheConformanceMachine
