"""A Hypothesis state machine any engine can run against itself, with the spec as the model.

    from kvcert.conformance.stateful import machine_for
    TestMyEngine = machine_for(lambda: MyEngine()).TestCase      # collected by pytest

Each step appends one random operation to the trace, applies it to the spec, and asks the
engine to replay the whole trace through its ordinary `run({"suite": "alloc", ...})` entry
(engines need no session API). The first observation that differs fails the step, and
Hypothesis shrinks the trace to a minimal one, printed as a program that is easy to turn into
a regression vector. Token sequences come from a few shared bases so prefixes, duplicates and
evictions really happen. Requires the `test` extra (hypothesis).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvcert.conformance.codec import REFUSED, layout_to_json, observation_to_json, op_to_json
from kvcert.conformance.compare import compare_alloc
from kvcert.conformance.engines import Engine
from kvcert.spec import (
    ChunkedLocal,
    Extra,
    ExtraKind,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    SpecError,
    Speculative,
)
from kvcert.spec import alloc as spec
from kvcert.spec.invariants import violated

BASES = (
    tuple(range(1, 33)),
    tuple(range(1, 9)) + tuple(range(60, 84)),
    tuple(range(1, 5)) + tuple(range(200, 228)),
)
EXTRAS = ((), (Extra(ExtraKind.CACHE_SALT, "s"),), (Extra(ExtraKind.LORA, "s"),))
SIZES = st.sampled_from([1, 2, 4])


def _groups() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(FullAttention, SIZES),
        st.builds(SlidingWindow, SIZES, st.integers(1, 12)),
        st.builds(ChunkedLocal, SIZES, st.integers(1, 12)),
        st.builds(MambaState, SIZES, st.sampled_from(list(MambaMode))),
    )


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Small hybrid layouts, with or without a speculative profile."""
    groups = draw(st.lists(_groups(), min_size=1, max_size=3))
    profile = draw(st.sampled_from([None, Speculative.EXACT, Speculative.DROP]))
    if profile is not None:
        groups.append(FullAttention(draw(SIZES), draft=True))
    return Layout(tuple(groups), profile)


def save_failure(layout: Layout, num_blocks: int, ops: list[dict[str, Any]]) -> None:
    """With KVCERT_REGRESSION_DIR set, keep the failing trace as a regression candidate.

    Hypothesis replays the shrunk example last, so `latest-failure.json` ends up minimal;
    copy it to conformance/regressions/ with an id and comment, and `python -m
    kvcert.conformance.gen` turns it into a vector whose expectation comes from the spec.
    """
    folder = os.environ.get("KVCERT_REGRESSION_DIR")
    if not folder:
        return
    trace = {
        "id": "alloc.regression.CHANGE-ME",
        "origin": "kvcert stateful machine",
        "layout": layout_to_json(layout),
        "num_blocks": num_blocks,
        "ops": ops,
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "latest-failure.json").write_text(
        json.dumps(trace, indent=1) + "\n", encoding="utf-8"
    )


def machine_for(engine_factory: Callable[[], Engine] | None) -> type[RuleBasedStateMachine]:
    """A state machine class checking `engine_factory()` against the spec.

    After every step the spec's own invariants (§7) are checked too; with no engine
    (`machine_for(None)`) that is all it checks: the spec's self-check machine.
    `failing_trace_lengths` records the length of each diverging trace, the shrunk one last;
    `first_failure_at` when the first one was found (to split finding from shrinking).
    """

    class KVCacheConformanceMachine(RuleBasedStateMachine):
        failing_trace_lengths: list[int] = []  # noqa: RUF012 - shared on purpose, per class
        first_failure_at: list[float] = []  # noqa: RUF012 - perf_counter() of the first one

        def __init__(self) -> None:
            super().__init__()
            self.engine = engine_factory() if engine_factory is not None else None
            self.layout: Layout | None = None
            self.state: spec.State | None = None
            self.ops: list[spec.Op] = []
            self.expected: list[dict[str, Any]] = []

        @initialize(layout=layouts(), blocks=st.integers(4, 64))
        def start(self, layout: Layout, blocks: int) -> None:
            self.layout = layout
            self.state = spec.initial_state(spec.PoolConfig(layout, blocks))

        def _started(self) -> tuple[spec.State, Layout]:
            if self.state is None or self.layout is None:
                raise RuntimeError("the machine's start rule has not run")
            return self.state, self.layout

        def apply(self, op: spec.Op) -> None:
            state, layout = self._started()
            try:
                state, observation = spec.step(state, op)
                self.expected.append(observation_to_json(observation))
            except SpecError:
                self.expected.append(REFUSED)
            self.state = state
            self.ops.append(op)
            if broken := violated(state):  # an explicit raise: `python -O` must not hide it
                raise AssertionError(f"the spec broke its invariants {broken} after {op}")
            if self.engine is None:
                return
            ops = [op_to_json(o) for o in self.ops]
            case = {
                "suite": "alloc",
                "layout": layout_to_json(layout),
                "num_blocks": state.config.num_blocks,
                "ops": ops,
            }
            difference = compare_alloc({"observations": self.expected}, self.engine.run(case))
            if difference is not None:  # an explicit raise: `python -O` must not hide it
                self.failing_trace_lengths.append(len(ops))
                if not self.first_failure_at:
                    self.first_failure_at.append(time.perf_counter())
                save_failure(layout, state.config.num_blocks, ops)
                raise AssertionError(f"engine diverges from the spec at {difference}")

        def _running(self, index: int) -> str | None:
            names = sorted(self._started()[0].requests)
            return names[index % len(names)] if names else None

        @rule(
            base=st.sampled_from(BASES),
            length=st.integers(20, 32) | st.integers(1, 32),  # long shared prefixes hit
            budget=st.integers(1, 32),
            extras=st.sampled_from(EXTRAS),
            lookahead=st.integers(0, 2),
        )
        def admit(
            self,
            base: tuple[int, ...],
            length: int,
            budget: int,
            extras: tuple[Extra, ...],
            lookahead: int,
        ) -> None:
            running = self._started()[0].requests
            rid = next((r for r in "abcd" if r not in running), None)
            if rid is not None:
                self.apply(spec.Admit(rid, base[:length], budget, extras, lookahead))

        @rule(index=st.integers(0, 3), budget=st.integers(1, 16), token=st.integers(0, 2))
        def extend(self, index: int, budget: int, token: int) -> None:
            rid = self._running(index)
            if rid is None:
                return
            request = self._started()[0].requests[rid]
            if request.scheduled:
                return
            appended = (token,) if request.computed == len(request.tokens) else ()
            self.apply(spec.Extend(rid, budget, appended))

        @rule()
        def end_step(self) -> None:
            self.apply(spec.EndStep())

        @rule(index=st.integers(0, 3), preempt=st.booleans())
        def release(self, index: int, preempt: bool) -> None:
            rid = self._running(index)
            if rid is not None:
                self.apply(spec.Preempt(rid) if preempt else spec.Finish(rid))

    return KVCacheConformanceMachine
