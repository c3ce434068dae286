"""Proof obligations: what a Z3 check states, how it is run, and what counts as a verdict.

An obligation is a claim over bounded inputs: `build()` returns (assumptions, claim). It is
discharged in two solver calls, each under a deterministic resource limit (rlimit, stable for
the pinned z3 build) and a wall-clock backstop:

    1. assumptions alone must be satisfiable, or the proof is vacuous (a failure);
    2. assumptions and not(claim): unsat is "proved", sat is a "counterexample" (with the
       model), unknown is a failure, never a pass.

A broken twin is an obligation whose claim is false on purpose (a real bug's rule): its
expected verdict is "counterexample", so a checker that proves everything fails. A drift
check evaluates an encoding on random concrete inputs and compares it with kvcert.spec.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3  # type: ignore[import-untyped]

PROVED = "proved"
COUNTEREXAMPLE = "counterexample"
AGREES = "agrees"


@dataclass(frozen=True)
class Obligation:
    """One row of the manifest."""

    id: str  # e.g. THM-PAGE-FIT
    rules: tuple[str, ...]  # spec rule tags the claim is about
    bounds: str  # the bounded domain, in words
    expect: str  # PROVED, COUNTEREXAMPLE (a broken twin) or AGREES (a drift check)
    tier: str  # "pr" (every CI run) or "long"
    build: Callable[[], Any]  # () -> (assumptions, claim); a drift check: () -> None
    rlimit: int = 20_000_000  # deterministic z3 resource limit per solver call
    timeout_s: float = 120.0  # wall-clock backstop per solver call
    twin_of: str | None = None  # a broken twin names the obligation it mirrors
    about: str = ""  # one line: what the claim says, or which bug the twin reproduces


@dataclass
class Verdict:
    """What discharging an obligation gave."""

    id: str
    expect: str
    got: str  # PROVED, COUNTEREXAMPLE, AGREES, "vacuous", "unknown", "error"
    seconds: float
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.got == self.expect


def _solver(obligation: Obligation) -> z3.Solver:
    solver = z3.Solver()
    solver.set("rlimit", obligation.rlimit)
    solver.set("timeout", int(obligation.timeout_s * 1000))
    return solver


def discharge(obligation: Obligation) -> Verdict:
    """Run one obligation (proof, twin or drift check) and say what it gave."""
    start = time.perf_counter()

    def verdict(got: str, detail: str = "") -> Verdict:
        return Verdict(obligation.id, obligation.expect, got, time.perf_counter() - start, detail)

    try:
        if obligation.expect == AGREES:
            obligation.build()
            return verdict(AGREES)
        assumptions, claim = obligation.build()
        solver = _solver(obligation)
        solver.add(*assumptions)
        first = solver.check()
        if first == z3.unknown:
            return verdict("unknown", f"assumptions: {solver.reason_unknown()}")
        if first == z3.unsat:
            return verdict("vacuous", "the assumptions have no model")
        solver.add(z3.Not(claim))
        second = solver.check()
        if second == z3.unknown:
            return verdict("unknown", solver.reason_unknown())
        if second == z3.unsat:
            return verdict(PROVED)
        return verdict(COUNTEREXAMPLE, _model_text(solver.model()))
    except AssertionError as error:  # a drift check found a disagreement
        return verdict("disagrees", str(error))
    except Exception as error:  # an encoding bug must fail the run, not crash it
        return verdict("error", f"{type(error).__name__}: {error}")


def _model_text(model: z3.ModelRef, limit: int = 400) -> str:
    pairs = sorted(f"{d.name()}={model[d]}" for d in model.decls() if d.arity() == 0)
    text = ", ".join(pairs)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def evaluate(expression: z3.ExprRef, **values: int | bool) -> Any:
    """An encoding's value at concrete inputs (for drift checks)."""
    pairs = [
        (z3.Bool(k), z3.BoolVal(v)) if isinstance(v, bool) else (z3.Int(k), z3.IntVal(v))
        for k, v in values.items()
    ]
    result = z3.simplify(z3.substitute(expression, *pairs))
    if z3.is_true(result) or z3.is_false(result):
        return z3.is_true(result)
    return result.as_long()


def one_of(variable: z3.ArithRef, values: list[int]) -> z3.BoolRef:
    """variable is one of these constants (keeps products linear: branch per value)."""
    return z3.Or([variable == v for v in values])
