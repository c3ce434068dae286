"""Hypothesis profiles: `dev` (default), `ci` (derandomized, bounded), `long` (deeper, random).

Choose with HYPOTHESIS_PROFILE; scripts/test.sh uses `ci` so CI runs are reproducible and
scripts/test-long.sh uses `long` (tests/tiers.py gives explicit budgets both values).
"""

import os

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

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
    """Mark `covered` the tests kvcert.spec's 100% branch gate rests on: tests/spec's worked
    examples, not its sweeps (Hypothesis properties and state machines, and the exhaustive
    enumerations marked `sweep`). scripts/test.sh runs them alone under coverage's tracer,
    which costs 3-5x on Python 3.11 and which pytest-cov's `no_cover` does not lift in xdist
    workers; every other test runs in a second session without it."""
    for item in items:
        sweep = is_hypothesis_test(getattr(item, "obj", None)) or item.get_closest_marker("sweep")
        if item.nodeid.startswith("tests/spec/") and not sweep:
            item.add_marker(pytest.mark.covered)
