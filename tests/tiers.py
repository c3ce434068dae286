"""Budgets of the two test tiers.

The fast tier is the README's test command (HYPOTHESIS_PROFILE=ci, a few minutes on 2 cores);
the long tier (scripts/test-long.sh, HYPOTHESIS_PROFILE=long) runs every test again with the
deep budget. A test with an explicit budget states both, so no fast test lacks a deep twin.
"""

from __future__ import annotations

import os

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"


def tiered(fast: int, deep: int) -> int:
    """Examples (or runs) for this tier: `fast` in the fast tier, `deep` in the long one."""
    if deep < fast:
        raise ValueError(f"the long tier must go deeper: {deep} < {fast}")
    return deep if LONG else fast
