#!/usr/bin/env bash
# Create .venv (if needed) and install kvcert into it, editable, with the given extras.
# Usage: scripts/setup.sh [EXTRAS]      e.g. scripts/setup.sh test
# Versions come from constraints.txt, so nothing can swap the CPU torch for a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e "$spec"
