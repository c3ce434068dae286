"""Hypothesis profiles: `dev` (default), `ci` (derandomized, bounded), `long` (deeper, random).

Choose with HYPOTHESIS_PROFILE; scripts/test.sh uses `ci` so CI runs are reproducible.
"""

import os

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
