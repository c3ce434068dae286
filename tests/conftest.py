"""Hypothesis profiles: `dev` (default), `ci` (derandomized, bounded), `long` (deeper, random).

Choose with HYPOTHESIS_PROFILE; scripts/test.sh uses `ci` so CI runs are reproducible and
scripts/test-long.sh uses `long` (tests/tiers.py gives explicit budgets both values).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("long", max_examples=5000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """kvcert.spec's 100% branch gate is met by tests/spec alone: every other test runs
    without coverage's tracer, which costs 3-5x on Python 3.11."""
    for item in items:
        if not item.nodeid.startswith("tests/spec/"):
            item.add_marker(pytest.mark.no_cover)
