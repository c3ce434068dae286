"""Z3 proof obligations of kvcert.spec and kvcert.reference (requires the `proofs` extra).

MANIFEST lists every obligation: its id, the rules it covers, its bounds, the expected
verdict, its deterministic resource limit and its tier. `kvcert check` discharges them;
tests/proofs runs each as a pytest case.
"""

from __future__ import annotations

from kvcert.conformance.checks.proofs import alloc, hashing, hit, kernel, page, unit, unit_alloc
from kvcert.conformance.checks.proofs.core import Obligation

MANIFEST: tuple[Obligation, ...] = (
    *hit.OBLIGATIONS,
    *unit.OBLIGATIONS,
    *hashing.OBLIGATIONS,
    *alloc.OBLIGATIONS,
    *unit_alloc.OBLIGATIONS,
    *page.OBLIGATIONS,
    *kernel.OBLIGATIONS,
)


def tier(name: str) -> tuple[Obligation, ...]:
    """Obligations of a tier: `pr` holds the pr ones, `long` holds all."""
    return tuple(o for o in MANIFEST if name == "long" or o.tier == "pr")
