#!/usr/bin/env bash
# The long tier: every fast test again with its deep budget (HYPOTHESIS_PROFILE=long: ten to
# twenty-five times the examples, 200k differential steps), `kvcert check --tier long`
# (deeper Z3 bounds, CrossHair budgets, state machines that also shrink and time every seeded
# bug), then every pinned engine release (scripts/engine-matrix.sh). Hours, not minutes; run
# it before a release and after any change to spec/ or reference/coordinator.py.
set -euo pipefail
cd "$(dirname "$0")/.."
HYPOTHESIS_PROFILE=long bash scripts/test.sh "$@"
bash scripts/engine-matrix.sh
