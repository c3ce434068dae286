"""The reference allocator against the spec state machine, step by step.

The spec is the model: every operation goes to both, observations must agree up to a
consistent renaming of block ids, misuse must be refused by both, and the spec's invariants
must hold after every step. Token sequences come from a few shared bases so that prefixes,
duplicates and evictions really happen.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kvcert.conformance.codec import REFUSED, layout_to_json, observation_to_json, op_to_json
from kvcert.conformance.compare import Renaming, compare_observation
from kvcert.conformance.reference_engine import ReferenceSession
from kvcert.spec import Extra, ExtraKind, SpecError
from kvcert.spec import alloc as spec
from kvcert.spec.invariants import violated
from tests.strategies import layouts

BASES = [
    tuple(range(1, 41)),
    tuple(range(1, 13)) + tuple(range(60, 88)),
    tuple(range(1, 5)) + tuple(range(200, 236)),
]
EXTRAS = [
    (),
    (Extra(ExtraKind.CACHE_SALT, "s"),),
    (Extra(ExtraKind.LORA, "s"),),
    (Extra(ExtraKind.MULTIMODAL, "img", 2, 9),),
]
RIDS = st.sampled_from("abcde")


class ReferenceAgainstSpec(RuleBasedStateMachine):
    steps = 0  # operations applied, over every run of the machine in this process

    def __init__(self):
        super().__init__()
        self.model = None
        self.engine = None
        self.renaming = Renaming()

    @initialize(
        layout=layouts(max_groups=3),
        blocks=st.integers(4, 96),
        eviction=st.sampled_from(list(spec.Eviction)),
    )
    def start(self, layout, blocks, eviction):
        config = spec.PoolConfig(layout, blocks, eviction)
        self.model = spec.initial_state(config)
        self.engine = ReferenceSession(layout_to_json(layout), blocks, eviction.value)

    def apply(self, op):
        ReferenceAgainstSpec.steps += 1
        try:
            self.model, observation = spec.step(self.model, op)
            expected = observation_to_json(observation)
        except SpecError:
            observation, expected = None, REFUSED
        actual = self.engine.apply(op_to_json(op))
        difference = compare_observation(self.renaming, expected, actual)
        assert difference is None, (op, difference)
        event("refused by both" if observation is None else type(observation).__name__)
        if isinstance(observation, spec.Admitted) and observation.hit:
            event("admitted with a hit")

    def running(self, index):
        names = sorted(self.model.requests)
        return names[index % len(names)] if names else None

    @rule(
        base=st.sampled_from(BASES),
        length=st.integers(1, 40),
        budget=st.integers(1, 40),
        lookahead=st.integers(0, 3),
        extras=st.sampled_from(EXTRAS),
    )
    def admit(self, base, length, budget, lookahead, extras):
        rid = next((r for r in "abcde" if r not in self.model.requests), None)
        if rid is not None:
            self.apply(spec.Admit(rid, base[:length], budget, extras, lookahead))

    @rule(
        index=st.integers(0, 4),
        budget=st.integers(1, 24),
        token=st.integers(0, 2),
        lookahead=st.integers(0, 3),
    )
    def extend(self, index, budget, token, lookahead):
        rid = self.running(index)
        if rid is None or self.model.requests[rid].scheduled:
            return
        request = self.model.requests[rid]
        appended = (token,) if request.computed == len(request.tokens) else ()
        self.apply(spec.Extend(rid, budget, appended, lookahead))

    @rule()
    def end_step(self):
        self.apply(spec.EndStep())

    @rule(index=st.integers(0, 4), preempt=st.booleans())
    def release(self, index, preempt):
        rid = self.running(index)
        if rid is not None:
            self.apply(spec.Preempt(rid) if preempt else spec.Finish(rid))

    @rule(roll=st.integers(0, 9))
    def reset(self, roll):
        if roll == 0:  # rare: a reset wipes the cache the other rules build up
            self.apply(spec.ResetCache())

    @rule(
        rid=st.sampled_from("abcdex"),
        kind=st.sampled_from(["admit", "extend", "finish"]),
        appended=st.booleans(),
    )
    def misuse(self, rid, kind, appended):
        """Operations that may break the protocol: both must refuse the same ones."""
        if kind == "admit":
            self.apply(spec.Admit(rid, BASES[0][:8], 8))
        elif kind == "extend":
            self.apply(spec.Extend(rid, 4, (1,) if appended else ()))
        else:
            self.apply(spec.Finish(rid))

    @invariant()
    def spec_invariants_hold(self):
        if self.model is not None:
            assert violated(self.model) == []


def test_reference_matches_the_spec_for_ten_thousand_steps():
    """Differential, stateful: >= 10k operations per run (more under the long profile)."""
    ReferenceAgainstSpec.steps = 0
    budget = max(settings.default.max_examples, 300)
    run_state_machine_as_test(
        ReferenceAgainstSpec, settings=settings(max_examples=budget, stateful_step_count=80)
    )
    assert ReferenceAgainstSpec.steps >= 10_000, ReferenceAgainstSpec.steps
