"""The Z3 manifest's shape and the checker's own honesty.

The obligations themselves are discharged by `kvcert check --tier pr`, which the README's test
command runs right after pytest (each against its expected verdict, broken twins included):
they ran twice there, once as pytest cases. The long tier: `kvcert check --tier long`.
"""

from __future__ import annotations

import pytest

z3 = pytest.importorskip(
    "z3", reason="the proofs extra: pip install -c constraints.txt '.[proofs]'"
)

from kvcert.conformance.checks.proofs import MANIFEST, tier  # noqa: E402 - needs z3
from kvcert.conformance.checks.proofs.core import (  # noqa: E402 - needs z3
    AGREES,
    COUNTEREXAMPLE,
    PROVED,
    Obligation,
    discharge,
)
from kvcert.spec.rules import all_rules  # noqa: E402


def test_the_manifest_is_well_formed():
    ids = [o.id for o in MANIFEST]
    assert len(ids) == len(set(ids))
    tags = {r.tag for r in all_rules()}
    for obligation in MANIFEST:
        assert set(obligation.rules) <= tags, obligation.id
        assert obligation.expect in (PROVED, COUNTEREXAMPLE, AGREES)
        assert obligation.tier in ("pr", "long")
        assert obligation.about
        if obligation.expect == COUNTEREXAMPLE:
            assert obligation.twin_of in ids, f"{obligation.id} mirrors no obligation"
    twinned = {o.twin_of for o in MANIFEST}
    proofs = [o.id for o in MANIFEST if o.expect == PROVED]
    assert [p for p in proofs if p not in twinned and not p.endswith("-LONG")] == []
    assert tier("long") == MANIFEST


def test_the_issue_list_of_obligations_is_covered():
    covered = {o.id for o in MANIFEST}
    assert covered >= {
        "THM-FULL-DOWN",
        "THM-SW-SEARCH",
        "THM-HYB-SEARCH",
        "THM-HYB-SEARCH-LONG",
        "THM-SPEC-DROP-ONCE",
        "THM-POOL-STEP",
        "THM-HASH-ISOLATION",
        "THM-PAGE-FIT",
        "THM-PAGE-EQUAL",
        "THM-PAGE-ANCHOR",
        "THM-PAGE-GROUP",
        "THM-KERNEL-INBOUNDS",
        "TWIN-SPEC-PER-GROUP-DROP",
        "TWIN-HYB-TWO-GROUP",
        "TWIN-SW-NO-MINUS-ONE",
        "TWIN-POOL-VISIBLE-EARLY",
    }


def _obligation(build, expect=PROVED, rlimit=20_000_000):
    return Obligation("TEST", (), "", expect, "pr", build, rlimit=rlimit, about="test")


def test_a_vacuous_proof_fails():
    x = z3.Int("x")
    verdict = discharge(_obligation(lambda: ([x > 1, x < 0], x == 5)))
    assert verdict.got == "vacuous"
    assert not verdict.ok


def test_a_false_claim_gives_a_counterexample_with_its_model():
    x = z3.Int("x")
    verdict = discharge(_obligation(lambda: ([x >= 0, x <= 3], x < 3)))
    assert verdict.got == COUNTEREXAMPLE
    assert "x=3" in verdict.detail


def test_unknown_is_a_failure_not_a_pass():
    x, y, z = z3.Ints("x y z")
    hard = (
        [x > 1, y > 1, z > 1, x < 10**6, y < 10**6],
        z3.Not(x * x * x + y * y * y == z * z * z),
    )
    verdict = discharge(_obligation(lambda: hard, rlimit=2_000))
    assert verdict.got == "unknown"
    assert not verdict.ok


def test_encoding_errors_and_drift_are_failures():
    def broken():
        raise ValueError("bad encoding")

    assert discharge(_obligation(broken)).got == "error"

    def disagrees():
        raise AssertionError("encoding 3 != spec 4")

    verdict = discharge(_obligation(disagrees, expect=AGREES))
    assert verdict.got == "disagrees"
    assert "3 != spec 4" in verdict.detail
