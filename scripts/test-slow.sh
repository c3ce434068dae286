#!/usr/bin/env bash
# The whole-suite sweeps the fast tier leaves out (pytest marker `slow`: each broken engine
# against every vector, regenerating the vectors, the vectors' coverage gate, a shrunk
# failure turned into a regression vector), with the fast tier's budgets. .ci/run runs it
# after scripts/test.sh; the long tier runs them inside scripts/test.sh. Any failure, and
# pytest's exit 5 (nothing marked slow), fails the script. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,proofs,symbolic,kernels,sim
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
.venv/bin/python -m pytest -n 2 --dist worksteal -m slow --ignore=tests/kernels \
  --junitxml=.slow-report.xml "$@"
