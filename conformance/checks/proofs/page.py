"""Obligations for §9 page planning: one page for all, nothing overflows, least waste.

Encodings stay linear: block multipliers and group sizes range over finite sets of constants,
so each product is a constant times a variable (toolchain notes §3).
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import (
    AGREES,
    COUNTEREXAMPLE,
    PROVED,
    Obligation,
    evaluate,
)
from kvcert.spec.layers import AttentionKind, AttentionLayer, KVDtype, StateLayer, StateTensor
from kvcert.spec.layers import page_bytes as spec_page_bytes
from kvcert.spec.plan import (
    KernelLimits,
    Objective,
    PlanInput,
    anchor_block_size,
    capped_block_size,
    chosen_option,
    expected_recompute,
    fitted_block_size,
    group_size,
)

POWERS = [1 << k for k in range(9)]  # block multipliers anchor x 2^k
STEP = 16
ANCHOR_STEPS = 128
GROUP_BOUND = 24


# --- PAGE-FIT-1 ------------------------------------------------------------------------------
# u: a layer's page at the anchor block; P: the shared page (u <= P: the anchor has the most
# bytes per token); cap: the kernel maximum over the anchor block.


def _fit_inputs() -> tuple[Any, Any, Any, list[Any]]:
    u, page, cap = z3.Ints("u page cap")
    return u, page, cap, [u >= 1, u <= page, page <= 1 << 24, z3.Or([cap == c for c in POWERS])]


def fit_multiplier(u: Any, page: Any, cap: Any, largest: bool = True) -> Any:
    """PAGE-FIT-1 as an If-chain: the largest (broken: the smallest) fitting power of two."""
    result: Any = z3.IntVal(0)
    for c in sorted(POWERS, reverse=not largest):
        result = z3.If(z3.And(c <= cap, c * u <= page), c, result)
    return result


def _least_waste(u: Any, page: Any, cap: Any, m: Any) -> Any:
    fitting = [(c, z3.And(c <= cap, c * u <= page)) for c in POWERS]
    return z3.And([z3.Implies(fits, page - m * u <= page - c * u) for c, fits in fitting])


def fit_least_waste() -> tuple[list[Any], Any]:
    u, page, cap, assumptions = _fit_inputs()
    m = fit_multiplier(u, page, cap)
    return assumptions, z3.And(m >= 1, m * u <= page, _least_waste(u, page, cap, m))


def fit_smallest_twin() -> tuple[list[Any], Any]:
    u, page, cap, assumptions = _fit_inputs()
    return assumptions, _least_waste(u, page, cap, fit_multiplier(u, page, cap, largest=False))


def pages_equal() -> tuple[list[Any], Any]:
    u, page, cap, assumptions = _fit_inputs()
    m = fit_multiplier(u, page, cap)
    padding = page - m * u
    return assumptions, z3.And(padding >= 0, m * u + padding == page)


def scale_without_divisibility_twin() -> tuple[list[Any], Any]:
    """vLLM <= 0.23: block x (P // p), page taken to be P: false unless p divides P."""
    u, page, _, assumptions = _fit_inputs()
    scale = z3.Int("scale")
    witness = [scale >= 1, scale <= 64] + [
        z3.Implies(scale == k, z3.And(k * u <= page, page < (k + 1) * u)) for k in range(1, 65)
    ]
    claim = z3.And([z3.Implies(scale == k, k * u == page) for k in range(1, 65)])
    return assumptions + witness, claim


# --- PAGE-ANCHOR-1 / PAGE-SIZE-1 ---------------------------------------------------------------


def _anchor_inputs() -> tuple[Any, Any, Any, Any, list[Any]]:
    a, t, s, req = z3.Ints("a t s req")
    return a, t, s, req, [
        a >= 1, t >= 1, t <= a, a <= 1 << 16, s >= 0, s <= 1 << 26,
        z3.Or([req == STEP * n for n in (1, 2, 4)]),
        z3.Or([STEP * n * a >= s for n in range(1, ANCHOR_STEPS + 1)]),
    ]  # fmt: skip


def anchor_block(a: Any, s: Any, req: Any) -> Any:
    """The smallest allowed block >= req whose anchor page holds the state."""
    result: Any = z3.IntVal(0)
    for n in range(ANCHOR_STEPS, 0, -1):
        block = STEP * n
        result = z3.If(z3.And(block >= req, block * a >= s), block, result)
    return result


def _holds_everything(a: Any, t: Any, s: Any, block: Any) -> Any:
    return z3.And(block >= 1, s <= block * a, block * t <= block * a)


def anchor_holds_everything() -> tuple[list[Any], Any]:
    a, t, s, req, assumptions = _anchor_inputs()
    block = anchor_block(a, s, req)
    smallest = z3.And(
        [
            z3.Implies(z3.And(STEP * n < block, STEP * n >= req), STEP * n * a < s)
            for n in range(1, ANCHOR_STEPS + 1)
        ]
    )
    return assumptions, z3.And(_holds_everything(a, t, s, block), smallest)


def requested_block_twin() -> tuple[list[Any], Any]:
    """Keep the requested block and pad the state to it: the state no longer fits."""
    a, t, s, req, assumptions = _anchor_inputs()
    return assumptions, _holds_everything(a, t, s, req)


# --- PAGE-GROUP-1 ----------------------------------------------------------------------------


def _slots(n: Any, g: int) -> Any:
    return ((n + g - 1) / g) * g


def _within(n1: Any, n2: Any, g: int, share: Fraction) -> Any:
    total = _slots(n1, g) + _slots(n2, g)
    return (total - n1 - n2) * share.denominator <= share.numerator * total


def _group_inputs() -> tuple[Any, Any, list[Any]]:
    n1, n2 = z3.Ints("n1 n2")
    return n1, n2, [n1 >= 1, n2 >= 1, n1 <= GROUP_BOUND, n2 <= GROUP_BOUND]


def chosen_group_size(n1: Any, n2: Any, share: Fraction) -> Any:
    result: Any = z3.IntVal(1)
    for g in range(2, GROUP_BOUND + 1):
        result = z3.If(z3.And(g <= z3.If(n1 > n2, n1, n2), _within(n1, n2, g, share)), g, result)
    return result


def _group_claim(n1: Any, n2: Any, g: Any, share: Fraction, largest: bool) -> Any:
    sizes = range(1, GROUP_BOUND + 1)
    bound = z3.And([z3.Implies(g == k, _within(n1, n2, k, share)) for k in sizes])
    if not largest:
        return bound
    largest_bucket = z3.If(n1 > n2, n1, n2)
    bigger = z3.And(
        [
            z3.Implies(z3.And(k > g, k <= largest_bucket), z3.Not(_within(n1, n2, k, share)))
            for k in sizes
        ]
    )
    return z3.And(bound, bigger)


def group_largest_within_share() -> tuple[list[Any], Any]:
    n1, n2, assumptions = _group_inputs()
    share = Fraction(1, 20)
    return assumptions, _group_claim(n1, n2, chosen_group_size(n1, n2, share), share, True)


def vllm_group_rule_twin() -> tuple[list[Any], Any]:
    """vLLM: g = max bucket when max < 1.5 x min, else min: up to 1/3 of slots left empty."""
    n1, n2, assumptions = _group_inputs()
    small, large = z3.If(n1 < n2, n1, n2), z3.If(n1 < n2, n2, n1)
    g = z3.If(2 * large < 3 * small, large, small)
    return assumptions, _group_claim(n1, n2, g, Fraction(1, 20), False)


# --- PAGE-ALIGN-1: capped blocks ---------------------------------------------------------------
# u: a layer's page at the base block; P: the shared page; cap: the alignment cap over the base
# (a power of two, as PAGE-ALIGN-2's chain caps are); kmax: the kernel maximum over the base.


def _cap_inputs() -> tuple[Any, Any, Any, Any, list[Any]]:
    u, page, cap, kmax = z3.Ints("u page cap kmax")
    return u, page, cap, kmax, [
        u >= 1, u <= page, page <= 1 << 24,
        z3.Or([cap == c for c in POWERS]), z3.Or([kmax == c for c in POWERS]), cap <= kmax,
    ]  # fmt: skip


def capped_multiplier(u: Any, page: Any, cap: Any, kmax: Any) -> Any:
    """PAGE-ALIGN-1 as an If-chain: the largest power of two within the cap, maximum and page."""
    return fit_multiplier(u, page, z3.If(cap < kmax, cap, kmax))


def _divides(m: Any, cap: Any) -> Any:
    return z3.And(
        [
            z3.Implies(z3.And(m == a, cap == b), z3.BoolVal(b % a == 0))
            for a in POWERS
            for b in POWERS
        ]
    )


def _cap_claim(u: Any, page: Any, cap: Any, m: Any) -> Any:
    chain = [(c, z3.And(c <= cap, c * u <= page)) for c in POWERS]
    least = z3.And([z3.Implies(fits, page - m * u <= page - c * u) for c, fits in chain])
    return z3.And(m >= 1, m * u <= page, _divides(m, cap), least)


def capped_divides_and_fits() -> tuple[list[Any], Any]:
    u, page, cap, kmax, assumptions = _cap_inputs()
    assumptions.append(u * 1 <= page)  # the base block fits (it is at most the anchor's)
    return assumptions, _cap_claim(u, page, cap, capped_multiplier(u, page, cap, kmax))


def everyone_at_cap_twin() -> tuple[list[Any], Any]:
    """Give every layer the cap itself: the layers with many bytes per token overflow P."""
    u, page, cap, _, assumptions = _cap_inputs()
    return assumptions, _cap_claim(u, page, cap, cap)


# --- PAGE-ALIGN-2 / PAGE-RECOMP-1: finer caps on one chain never lose a token ------------------
CHAIN_BASES = (16, 48, 272, 528, 1056)  # odd parts 1, 3, 17, 33: the bundled anchors' chains
PROMPT_BOUND = 1 << 20


def _loss(c: Any, alignment: int) -> Any:
    return c % alignment  # reusable tokens a lookup recomputes (PAGE-RECOMP-1)


def chain_dominates() -> tuple[list[Any], Any]:
    c = z3.Int("reusable")
    pairs = [(a, a << k) for a in CHAIN_BASES for k in range(1, 4)]
    claim = z3.And([_loss(c, fine) <= _loss(c, coarse) for fine, coarse in pairs])
    return [c >= 0, c <= PROMPT_BOUND], claim


def nondivisor_twin() -> tuple[list[Any], Any]:
    """1024 is finer than 1056 (Qwen3.5's anchor) but does not divide it: c = 1056 loses 32."""
    c = z3.Int("reusable")
    return [c >= 0, c <= PROMPT_BOUND], _loss(c, 1024) <= _loss(c, 1056)


# --- PAGE-OBJ-1: the balanced choice -----------------------------------------------------------
OPTIONS = 5  # options finest first; capacities rise with the alignment (PAGE-ALIGN-1)


def _obj_inputs() -> tuple[list[Any], list[Any]]:
    caps = z3.Ints(" ".join(f"c{i}" for i in range(OPTIONS)))
    rising = [caps[i] <= caps[i + 1] for i in range(OPTIONS - 1)]
    return caps, [caps[0] >= 1, caps[-1] <= 1 << 30, *rising]


def _eligible(capacity: Any, most: Any) -> Any:
    return 20 * capacity >= 19 * most  # share 19/20


def balanced_index(caps: list[Any]) -> Any:
    """PAGE-OBJ-1 `balanced` as an If-chain: the finest option within 19/20 of the most."""
    most = caps[-1]
    result: Any = z3.IntVal(OPTIONS - 1)
    for i in range(OPTIONS - 2, -1, -1):
        result = z3.If(_eligible(caps[i], most), i, result)
    return result


def _obj_claim(caps: list[Any], index: Any) -> Any:
    most = caps[-1]
    chosen = [z3.Implies(index == i, _eligible(caps[i], most)) for i in range(OPTIONS)]
    finest = [
        z3.Implies(z3.And(index == i, j < i), z3.Not(_eligible(caps[j], most)))
        for i in range(OPTIONS)
        for j in range(OPTIONS)
    ]
    return z3.And(index >= 0, index < OPTIONS, *chosen, *finest)


def balanced_within_share() -> tuple[list[Any], Any]:
    caps, assumptions = _obj_inputs()
    return assumptions, _obj_claim(caps, balanced_index(caps))


def greedy_halving_twin() -> tuple[list[Any], Any]:
    """Halve the cap while each step keeps 19/20 of the step before: the losses compound."""
    caps, assumptions = _obj_inputs()
    index: Any = z3.IntVal(OPTIONS - 1)
    keep_going = z3.BoolVal(True)
    for i in range(OPTIONS - 2, -1, -1):
        keep_going = z3.And(keep_going, _eligible(caps[i], caps[i + 1]))
        index = z3.If(keep_going, i, index)
    return assumptions, _obj_claim(caps, index)


# --- drift: the encodings against kvcert.spec ------------------------------------------------


def drift() -> None:
    rng = random.Random(4)
    u, page, cap, _ = _fit_inputs()
    chosen = fit_multiplier(u, page, cap)
    for _ in range(200):
        anchor_heads = rng.randint(1, 16)
        anchor_layer = AttentionLayer(AttentionKind.FULL, anchor_heads, 128, 128)
        layer = AttentionLayer(AttentionKind.FULL, rng.randint(1, anchor_heads), 64, 128)
        dtype = rng.choice(list(KVDtype))
        anchor = rng.choice([16, 32, 64])
        maximum = anchor * rng.choice(POWERS)
        plan_input = PlanInput(
            (anchor_layer, layer), dtype, 1 << 30, kernel=KernelLimits(16, maximum)
        )
        shared = spec_page_bytes(anchor_layer, dtype, anchor)
        at_anchor = spec_page_bytes(layer, dtype, anchor)
        expected = fitted_block_size(layer, plan_input, anchor, shared)
        got = anchor * evaluate(chosen, u=at_anchor, page=shared, cap=maximum // anchor)
        assert got == expected, f"PAGE-FIT-1 encoding {got} != spec {expected}"
    a, _, s, req, _ = _anchor_inputs()
    block = anchor_block(a, s, req)
    for _ in range(200):
        layer = AttentionLayer(AttentionKind.FULL, rng.randint(1, 8), 64, 64)
        requested = rng.choice([16, 32, 64])
        state_bytes = rng.randint(0, 1 << 20)
        layers: tuple[Any, ...] = (layer,)
        if state_bytes:
            layers = (layer, StateLayer((StateTensor((state_bytes,), KVDtype.BF16),)))
        rate = spec_page_bytes(layer, KVDtype.FP8, 1)
        stored = 2 * state_bytes
        if STEP * ANCHOR_STEPS * rate < stored:
            continue
        plan_input = PlanInput(layers, KVDtype.FP8, 1 << 30, block_size=requested)
        got = evaluate(block, a=rate, s=stored, req=requested)
        expected = anchor_block_size(plan_input)
        assert got == expected, f"PAGE-ANCHOR-1 encoding {got} != spec {expected}"
    n1, n2, _ = _group_inputs()
    for share in (Fraction(1, 20), Fraction(1, 4)):
        g = chosen_group_size(n1, n2, share)
        for _ in range(100):
            x, y = rng.randint(1, GROUP_BOUND), rng.randint(1, GROUP_BOUND)
            got, expected = evaluate(g, n1=x, n2=y), group_size((x, y), share)
            assert got == expected, f"PAGE-GROUP-1 encoding {got} != spec {expected}"
    _drift_alignment(rng)


def _drift_alignment(rng: random.Random) -> None:
    """PAGE-ALIGN-1, PAGE-RECOMP-1 and PAGE-OBJ-1's encodings against the spec."""
    u, page, cap, kmax, _ = _cap_inputs()
    capped = capped_multiplier(u, page, cap, kmax)
    for _ in range(200):
        anchor_layer = AttentionLayer(AttentionKind.FULL, 16, 128, 128)
        layer = AttentionLayer(AttentionKind.FULL, rng.randint(1, 16), 64, 128)
        base = rng.choice([16, 32, 64])
        limit, alignment = sorted(base * rng.choice(POWERS) for _ in range(2))[::-1]
        plan_input = PlanInput((anchor_layer, layer), KVDtype.FP8, 1 << 30,
                               kernel=KernelLimits(16, limit))  # fmt: skip
        shared = spec_page_bytes(anchor_layer, KVDtype.FP8, base)
        expected = capped_block_size(layer, plan_input, base, shared, alignment)
        at_base = spec_page_bytes(layer, KVDtype.FP8, base)
        got = base * evaluate(capped, u=at_base, page=shared, cap=alignment // base,
                              kmax=limit // base)  # fmt: skip
        assert got == expected, f"PAGE-ALIGN-1 encoding {got} != spec {expected}"
    for fine, coarse in [(a, a << k) for a in CHAIN_BASES for k in range(1, 4)]:
        assert expected_recompute(fine) <= expected_recompute(coarse)
    caps_vars, _ = _obj_inputs()
    chosen_var = balanced_index(caps_vars)
    for _ in range(200):
        capacities = sorted(rng.randint(1, 1000) for _ in range(OPTIONS))
        options = tuple((16 << i, c) for i, c in enumerate(capacities))
        expected = chosen_option(options, Objective.BALANCED, Fraction(19, 20))
        got = evaluate(chosen_var, **{f"c{i}": c for i, c in enumerate(capacities)})
        assert got == expected, f"PAGE-OBJ-1 encoding {got} != spec {expected}"


OBLIGATIONS = (
    Obligation("THM-PAGE-FIT", ("PAGE-FIT-1",), "pages <= 2^24 B, multipliers 2^0..2^8", PROVED,
               "pr", fit_least_waste, about="the chosen block fits and wastes least"),
    Obligation("TWIN-PAGE-FIT-SMALLEST", ("PAGE-FIT-1",), "as THM-PAGE-FIT", COUNTEREXAMPLE,
               "pr", fit_smallest_twin, twin_of="THM-PAGE-FIT",
               about="taking the smallest fitting block wastes more"),
    Obligation("THM-PAGE-EQUAL", ("PAGE-SIZE-1", "PAGE-FIT-1"), "as THM-PAGE-FIT", PROVED, "pr",
               pages_equal, about="data + padding is the shared page for every group"),
    Obligation("TWIN-PAGE-SCALE-UNCHECKED", ("PAGE-FIT-1",), "scale 1..64", COUNTEREXAMPLE,
               "pr", scale_without_divisibility_twin, twin_of="THM-PAGE-EQUAL",
               about="vLLM <= 0.23 scaled blocks without checking divisibility (seed 002)"),
    Obligation("THM-PAGE-ANCHOR", ("PAGE-ANCHOR-1", "PAGE-SIZE-1"),
               "rates <= 2^16 B/token, state <= 2^26 B, blocks 16..2048", PROVED, "pr",
               anchor_holds_everything, about="the anchor page holds every layer and state"),
    Obligation("TWIN-PAGE-ANCHOR-REQUESTED", ("PAGE-ANCHOR-1",), "as THM-PAGE-ANCHOR",
               COUNTEREXAMPLE, "pr", requested_block_twin, twin_of="THM-PAGE-ANCHOR",
               about="keeping the requested block lets the state overflow the page"),
    Obligation("THM-PAGE-GROUP", ("PAGE-GROUP-1",), "two buckets of 1..24 layers", PROVED, "pr",
               group_largest_within_share, about="the largest g within the padding share"),
    Obligation("TWIN-PAGE-GROUP-VLLM", ("PAGE-GROUP-1",), "as THM-PAGE-GROUP", COUNTEREXAMPLE,
               "pr", vllm_group_rule_twin, twin_of="THM-PAGE-GROUP",
               about="vLLM's min/1.5x-max rule exceeds a 1/20 padding share"),
    Obligation("THM-PAGE-ALIGN-CAP", ("PAGE-ALIGN-1",), "pages <= 2^24 B, caps 2^0..2^8",
               PROVED, "pr", capped_divides_and_fits,
               about="a capped block fits, divides the cap and wastes least below it"),
    Obligation("TWIN-PAGE-ALIGN-EVERYONE-AT-CAP", ("PAGE-ALIGN-1",), "as THM-PAGE-ALIGN-CAP",
               COUNTEREXAMPLE, "pr", everyone_at_cap_twin, twin_of="THM-PAGE-ALIGN-CAP",
               about="giving every layer the cap itself overflows the shared page"),
    Obligation("THM-PAGE-ALIGN-DOMINATES", ("PAGE-ALIGN-2", "PAGE-RECOMP-1"),
               "prompts <= 2^20 tokens, chains of 16, 48, 272, 528, 1056 (x2, x4, x8)", PROVED,
               "pr", chain_dominates,
               about="a finer cap on one chain loses no token on any prompt"),
    Obligation("TWIN-PAGE-ALIGN-NONDIVISOR", ("PAGE-ALIGN-2",), "as THM-PAGE-ALIGN-DOMINATES",
               COUNTEREXAMPLE, "pr", nondivisor_twin, twin_of="THM-PAGE-ALIGN-DOMINATES",
               about="1024 is finer than 1056 but loses 32 tokens on a 1056-token prefix"),
    Obligation("THM-PAGE-OBJ-BALANCED", ("PAGE-OBJ-1",), "5 options, capacities <= 2^30", PROVED,
               "pr", balanced_within_share,
               about="balanced keeps 19/20 of the most capacity at the finest such alignment"),
    Obligation("TWIN-PAGE-OBJ-GREEDY", ("PAGE-OBJ-1",), "as THM-PAGE-OBJ-BALANCED",
               COUNTEREXAMPLE, "pr", greedy_halving_twin, twin_of="THM-PAGE-OBJ-BALANCED",
               about="halving while each step keeps 19/20 compounds below the floor"),
    Obligation("DRIFT-PAGE", ("PAGE-FIT-1", "PAGE-ANCHOR-1", "PAGE-GROUP-1", "PAGE-ALIGN-1",
                              "PAGE-OBJ-1"),
               "1000 random concrete inputs", AGREES, "pr", drift,
               about="the page encodings equal kvcert.spec.plan"),
)  # fmt: skip
