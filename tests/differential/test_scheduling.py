"""Checkpoint placement: the reference's chunking and branch point against the spec's."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.conformance.contract.codec import layout_to_json, op_to_json
from kvcert.conformance.engines.reference_engine import ReferenceSession
from kvcert.reference import scheduling as ref
from kvcert.spec import Layout, SlidingWindow, checkpoints
from kvcert.spec import alloc as spec
from tests.strategies import layouts
from tests.tiers import tiered


def test_next_chunk_equals_the_spec_on_every_small_case():
    for placement, block, num_tokens, budget in itertools.product(
        checkpoints.Placement, (1, 2, 3, 4, 8), range(1, 40), (1, 2, 3, 5, 8, 16, 64)
    ):
        for branch in range(0, num_tokens, block):
            for computed in range(num_tokens):
                args = (computed, num_tokens, budget, block)
                expected = checkpoints.next_chunk(placement, *args, branch=branch)
                assert ref.next_chunk(ref.Placement(placement), *args, branch=branch) == expected


def test_prefill_under_each_placement_ends_where_the_rules_say():
    def chunks(placement, branch=0):
        computed, out = 0, []
        while computed < 100:
            out.append(checkpoints.next_chunk(placement, computed, 100, 40, 16, branch=branch))
            computed += out[-1]
        return out

    assert chunks(checkpoints.Placement.ALL) == [40, 40, 20]
    assert chunks(checkpoints.Placement.ALIGN) == [32, 32, 32, 4]
    assert chunks(checkpoints.Placement.BRANCH, branch=48) == [32, 16, 32, 16, 4]


BASES = [tuple(range(1, 41)), tuple(range(1, 17)) + tuple(range(60, 84))]


@settings(max_examples=tiered(150, 3000))
@given(
    layout=layouts(max_groups=3, reach=True),
    served=st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(1, 40)), max_size=4),
    probe=st.tuples(st.sampled_from([0, 1]), st.integers(1, 40)),
)
def test_branch_point_equals_the_spec(layout, served, probe):
    state = spec.initial_state(spec.PoolConfig(layout, 400))
    session = ReferenceSession(layout_to_json(layout), 400)
    for n, (base, length) in enumerate(served):
        tokens = BASES[base][:length]
        for op in (spec.Admit(f"r{n}", tokens, 40), spec.EndStep(), spec.Finish(f"r{n}")):
            state, _ = spec.step(state, op)
            session.apply(op_to_json(op))
    tokens = BASES[probe[0]][: probe[1]]
    expected = checkpoints.branch_point(state, tokens, ())
    assert session.manager.branch_point(tokens) == expected
    hit, _ = spec.lookup(state, tokens, ())
    if layout.speculative is None:  # the drop profile can put the hit below, never above
        assert expected >= hit


def test_a_group_that_needs_no_block_accepts_lengths_past_its_keys():
    """A draft window of 1 token under exact keys of reach 2 holds no key for a 2-token
    prompt, and needs none: the hit and the branch point are 1, as the spec says (the
    reference once refused every length past a group's keys)."""
    layout = Layout(
        groups=(
            SlidingWindow(1, 1, name="a"),
            SlidingWindow(1, 1, name="b"),
            SlidingWindow(1, 1, draft=True, name="d"),
        ),
        speculative="exact",
        draft_reach=2,
    )
    state = spec.initial_state(spec.PoolConfig(layout, 400))
    manager = ReferenceSession(layout_to_json(layout), 400).manager
    for tokens in ((1, 2), (1, 2, 3)):
        assert spec.lookup(state, tokens, ())[0] == len(tokens) - 1
        assert manager.lookup(tokens)[0] == len(tokens) - 1
        assert manager.branch_point(tokens) == checkpoints.branch_point(state, tokens, ())
