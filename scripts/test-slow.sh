#!/usr/bin/env bash
# The whole-suite sweeps the fast tier leaves out (pytest marker `slow`: each broken engine
# against every vector, regenerating the vectors, the vectors' coverage gate, a shrunk
# failure turned into a regression vector) and the whole-tree checks (mypy --strict over every
# package, a wheel built from a clean copy and installed in a fresh venv), with the fast
# tier's budgets. .ci/run runs it
# after scripts/test.sh; the long tier runs them inside scripts/test.sh. Any failure, and
# pytest's exit 5 (nothing marked slow), fails the script. Extra arguments go to pytest.
# Then the reference on its pure-Python fallbacks (KVCERT_PURE_PYTHON=1: no compiled key
# index, reference counts or digest chain): its own and the differential tests, and the
# certification against every vector.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,proofs,symbolic,kernels,sim
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
.venv/bin/python -m pytest -n 2 --dist worksteal -m slow --ignore=tests/kernels \
  --junitxml=.slow-report.xml "$@"
KVCERT_PURE_PYTHON=1 .venv/bin/python -m pytest -n 2 --dist worksteal -m "not slow" \
  tests/reference tests/differential --junitxml=.pure-python-report.xml "$@"
KVCERT_PURE_PYTHON=1 .venv/bin/kvcert certify > .pure-python-certify.log
tail -1 .pure-python-certify.log
