"""Z3 proofs of the page-planning rules, each with a satisfiability check and a broken twin.

Encodings stay linear: block multipliers and group sizes range over finite sets, so every
product is a constant times a variable (toolchain notes §3: `%` and products of unknowns time
out). Each proof first checks that its assumptions are satisfiable (a vacuous proof fails),
then that the claim's negation is unsat; each broken twin must come back sat, with a
counterexample. `unknown` fails. The drift guard evaluates the encodings on random concrete
inputs and compares them with kvcert.spec.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import z3  # the proofs extra; CI installs it, and a missing z3 must fail, not skip

from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    KVDtype,
    StateLayer,
    StateTensor,
    page_bytes,
)
from kvcert.spec.plan import (
    KernelLimits,
    PlanInput,
    anchor_block_size,
    fitted_block_size,
    group_size,
)

RLIMIT = 5_000_000  # deterministic resource limit per check (z3 5.4.0, pinned)
POWERS = [1 << k for k in range(9)]  # block multipliers anchor x 2^k, k <= 8
PAGE_BOUND = 1 << 24
GROUP_BOUND = 24


def check(solver: z3.Solver) -> z3.CheckSatResult:
    solver.set("rlimit", RLIMIT)
    result = solver.check()
    assert result != z3.unknown, f"z3 gave up: {solver.reason_unknown()}"
    return result


def prove(assumptions: list[z3.BoolRef], claim: z3.BoolRef) -> None:
    """Assumptions satisfiable, and no model of them violates the claim."""
    solver = z3.Solver()
    solver.add(*assumptions)
    assert check(solver) == z3.sat, "vacuous: the assumptions have no model"
    solver.add(z3.Not(claim))
    assert check(solver) == z3.unsat, f"counterexample: {solver.model()}"


def refute(assumptions: list[z3.BoolRef], claim: z3.BoolRef) -> z3.ModelRef:
    """A broken twin: some model of the assumptions violates the claim."""
    solver = z3.Solver()
    solver.add(*assumptions, z3.Not(claim))
    assert check(solver) == z3.sat, "the broken twin was not caught"
    return solver.model()


# --- PAGE-FIT-1: the chosen block fits the shared page and wastes least --------------------
#
# u: the layer's page at the anchor block (bytes); P: the shared page; u <= P because the
# anchor layers have the most bytes per token. A candidate is anchor x c for c in POWERS with
# c <= cap (the kernel maximum / anchor); its page is c x u.


def fit_inputs():
    u, page, cap = z3.Ints("u page cap")
    return u, page, cap, [u >= 1, u <= page, page <= PAGE_BOUND, z3.Or([cap == c for c in POWERS])]


def chosen_multiplier(u, page, cap, pick_largest=True):
    """The rule as an If-chain: the largest (or, broken, the smallest) fitting power."""
    order = sorted(POWERS, reverse=pick_largest)
    result = z3.IntVal(0)
    for c in reversed(order):
        result = z3.If(z3.And(c <= cap, c * u <= page), c, result)
    return result


def candidates_no_better(u, page, cap, m):
    return z3.And(
        [z3.Implies(z3.And(c <= cap, c * u <= page), page - m * u <= page - c * u) for c in POWERS]
    )


def test_fit_fits_and_wastes_least_among_the_candidates():
    u, page, cap, assumptions = fit_inputs()
    m = chosen_multiplier(u, page, cap)
    prove(assumptions, z3.And(m >= 1, m * u <= page, candidates_no_better(u, page, cap, m)))


def test_twin_smallest_fitting_block_wastes_more():
    u, page, cap, assumptions = fit_inputs()
    m = chosen_multiplier(u, page, cap, pick_largest=False)
    model = refute(assumptions, candidates_no_better(u, page, cap, m))
    assert model.eval(2 * u).as_long() <= model.eval(page).as_long()  # doubling would fit


def test_twin_scaling_without_checking_divisibility_leaves_pages_unequal():
    """vLLM <= 0.23 scaled the block by P // p and took the page to be P: false unless p | P."""
    u, page, _, assumptions = fit_inputs()
    scale = z3.Int("scale")  # P // u, by witness: scale x u <= P < (scale + 1) x u
    bounded = [
        scale >= 1,
        scale <= 64,
        *[z3.Implies(scale == k, z3.And(k * u <= page, page < (k + 1) * u)) for k in range(1, 65)],
    ]
    refute(
        [*assumptions, *bounded],
        z3.And([z3.Implies(scale == k, k * u == page) for k in range(1, 65)]),
    )


def test_padding_keeps_every_page_equal():
    """Our rule pads instead: every group's data fits and its padding is >= 0."""
    u, page, cap, assumptions = fit_inputs()
    m = chosen_multiplier(u, page, cap)
    padding = page - m * u
    prove(assumptions, z3.And(padding >= 0, m * u + padding == page))


# --- PAGE-ANCHOR-1 / PAGE-SIZE-1: the shared page holds every layer, state included -------
#
# a: the anchor layers' bytes per token, t <= a another layer's, s: the largest state page,
# req: the requested block size; blocks are step x n for n in 1..ANCHOR_STEPS (step = 16).

STEP = 16
ANCHOR_STEPS = 128


def anchor_inputs():
    a, t, s, req = z3.Ints("a t s req")
    return (
        a,
        t,
        s,
        req,
        [
            a >= 1,
            t >= 1,
            t <= a,
            a <= 1 << 16,
            s >= 0,
            s <= 1 << 26,
            z3.Or([req == STEP * n for n in (1, 2, 4)]),
            z3.Or([STEP * n * a >= s for n in range(1, ANCHOR_STEPS + 1)]),  # some block suffices
        ],
    )


def anchor_block(a, s, req):
    """The smallest allowed block >= req whose anchor page holds the state (If-chain)."""
    result = z3.IntVal(0)
    for n in range(ANCHOR_STEPS, 0, -1):
        block = STEP * n
        result = z3.If(z3.And(block >= req, block * a >= s), block, result)
    return result


def pages_hold_everything(a, t, s, block):
    page = block * a  # linear: block is an If-chain of constants
    return z3.And(block >= 1, s <= page, block * t <= page)


def test_anchor_page_holds_every_layer_and_is_the_smallest():
    a, t, s, req, assumptions = anchor_inputs()
    block = anchor_block(a, s, req)
    smaller = z3.And(
        [
            z3.Implies(z3.And(STEP * n < block, STEP * n >= req), STEP * n * a < s)
            for n in range(1, ANCHOR_STEPS + 1)
        ]
    )
    prove(assumptions, z3.And(pages_hold_everything(a, t, s, block), smaller))


def test_twin_keeping_the_requested_block_overflows_with_state():
    """Keep the requested block and pad the state to it: the state no longer fits."""
    a, t, s, req, assumptions = anchor_inputs()
    model = refute(assumptions, pages_hold_everything(a, t, s, req))
    assert model.eval(s).as_long() > model.eval(req * a).as_long()


# --- PAGE-GROUP-1: the largest g within the share, and no larger g qualifies --------------


def slots(n, g):
    return ((n + g - 1) / g) * g  # z3 integer division; g is a constant here


def group_inputs():
    n1, n2 = z3.Ints("n1 n2")
    return n1, n2, [n1 >= 1, n2 >= 1, n1 <= GROUP_BOUND, n2 <= GROUP_BOUND]


def within_share(n1, n2, g, share: Fraction):
    total = slots(n1, g) + slots(n2, g)
    empty = total - n1 - n2
    return empty * share.denominator <= share.numerator * total


def chosen_group_size(n1, n2, share):
    result = z3.IntVal(1)
    for g in range(2, GROUP_BOUND + 1):  # ascending, so the last qualifying g wins
        fits = z3.And(g <= z3.If(n1 > n2, n1, n2), within_share(n1, n2, g, share))
        result = z3.If(fits, g, result)
    return result


@pytest.mark.parametrize("share", [Fraction(1, 20), Fraction(1, 4)])
def test_group_size_is_the_largest_within_the_share(share):
    n1, n2, assumptions = group_inputs()
    g = chosen_group_size(n1, n2, share)
    bound = z3.And(
        [z3.Implies(g == k, within_share(n1, n2, k, share)) for k in range(1, GROUP_BOUND + 1)]
    )
    largest = z3.And(
        [
            z3.Implies(
                z3.And(k > g, k <= z3.If(n1 > n2, n1, n2)), z3.Not(within_share(n1, n2, k, share))
            )
            for k in range(1, GROUP_BOUND + 1)
        ]
    )
    prove(assumptions, z3.And(bound, largest))


def test_twin_vllm_min_or_max_rule_exceeds_the_share():
    """vLLM: g = max bucket when max < 1.5 x min, else min; it can leave 1/3 of slots empty."""
    n1, n2, assumptions = group_inputs()
    small, large = z3.If(n1 < n2, n1, n2), z3.If(n1 < n2, n2, n1)
    g = z3.If(2 * large < 3 * small, large, small)
    share = Fraction(1, 20)
    claim = z3.And(
        [z3.Implies(g == k, within_share(n1, n2, k, share)) for k in range(1, GROUP_BOUND + 1)]
    )
    model = refute(assumptions, claim)
    assert model.eval(n1).as_long() != model.eval(n2).as_long()


# --- drift guard: the encodings agree with the Python spec -------------------------------


def _state_of(nbytes: int) -> StateLayer:
    return StateLayer((StateTensor((nbytes,), KVDtype.BF16),))


def evaluate(expression, **values):
    substituted = z3.substitute(expression, *[(z3.Int(k), z3.IntVal(v)) for k, v in values.items()])
    return z3.simplify(substituted).as_long()


def test_encodings_agree_with_the_spec_on_random_inputs():
    rng = random.Random(4)
    u, page, cap, _ = fit_inputs()
    chosen = chosen_multiplier(u, page, cap)
    for _ in range(300):
        heads_anchor, heads = rng.randint(1, 16), rng.randint(1, 16)
        heads = min(heads, heads_anchor)
        anchor_layer = AttentionLayer(AttentionKind.FULL, heads_anchor, 128, 128)
        layer = AttentionLayer(AttentionKind.FULL, heads, rng.choice([64, 128]), 128)
        dtype = rng.choice(list(KVDtype))
        anchor = rng.choice([16, 32, 64])
        maximum = anchor * rng.choice(POWERS)
        plan_input = PlanInput(
            (anchor_layer, layer), dtype, 1 << 30, kernel=KernelLimits(16, maximum)
        )
        shared = page_bytes(anchor_layer, dtype, anchor)
        at_anchor = page_bytes(layer, dtype, anchor)
        if at_anchor > shared:
            continue
        spec_block = fitted_block_size(layer, plan_input, anchor, shared)
        encoded = evaluate(chosen, u=at_anchor, page=shared, cap=maximum // anchor)
        assert spec_block == anchor * encoded
    a, _, s_, req, _ = anchor_inputs()
    block = anchor_block(a, s_, req)
    for _ in range(200):
        heads, state_bytes = rng.randint(1, 8), rng.randint(0, 1 << 20)
        layer = AttentionLayer(AttentionKind.FULL, heads, 64, 64)
        requested = rng.choice([16, 32, 64])
        layers = (layer,) if not state_bytes else (layer, _state_of(state_bytes))
        plan_input = PlanInput(layers, KVDtype.FP8, 1 << 30, block_size=requested)
        rate = page_bytes(layer, KVDtype.FP8, 1)
        stored = page_bytes(layers[-1], KVDtype.FP8, 1) if state_bytes else 0
        if STEP * ANCHOR_STEPS * rate < stored:
            continue
        assert evaluate(block, a=rate, s=stored, req=requested) == anchor_block_size(plan_input)
    n1, n2, _ = group_inputs()
    for share in (Fraction(1, 20), Fraction(1, 4)):
        g = chosen_group_size(n1, n2, share)
        for a, b in (
            (rng.randint(1, GROUP_BOUND), rng.randint(1, GROUP_BOUND)) for _ in range(200)
        ):
            assert evaluate(g, n1=a, n2=b) == group_size((a, b), share)
