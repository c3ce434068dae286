#!/usr/bin/env bash
# Install kvcert with its test extras and run the whole suite: lint, format, pytest with the
# 100% branch-coverage gate on kvcert.spec, the Triton kernels under the interpreter in their
# own process, then the model checks (`kvcert check --tier pr`:
# Z3 obligations, CrossHair contracts, state machines). Extra arguments go to pytest.
# Any failure, and pytest's exit 5 (no tests collected), fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,proofs,symbolic,kernels,sim
.venv/bin/ruff check .
.venv/bin/ruff format --check .
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
.venv/bin/python -m pytest --cov --cov-branch --junitxml=.test-report.xml --ignore=tests/kernels "$@"
# Triton kernels in their own process: TRITON_INTERPRET=1 must be set before triton is imported.
TRITON_INTERPRET=1 .venv/bin/python -m pytest tests/kernels --junitxml=.kernel-report.xml -p no:cacheprovider
.venv/bin/kvcert check --tier pr --json .check-report.json
