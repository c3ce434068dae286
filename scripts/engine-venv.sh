#!/usr/bin/env bash
# Create (or reuse) .engines/ENGINE-VERSION, a venv in which a real engine runs the vectors:
# CPU torch 2.13.0, the engine's wheel without its dependencies (every release pins a CUDA
# torch), the packages its KV-cache import chain needs (the lock engines/ENGINE/VERSION/
# requirements.txt, made by kvcert.conformance.tools.discover), and kvcert itself (editable).
# Usage: scripts/engine-venv.sh vllm 0.33.0      (prints the venv path last)
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: engine-venv.sh ENGINE VERSION}
version=${2:?usage: engine-venv.sh ENGINE VERSION}
lock=engines/$engine/$version/requirements.txt
if [ ! -f "$lock" ]; then
  echo "no lock $lock; releases with a lock: $(ls engines/"$engine" 2>/dev/null | tr '\n' ' ')" >&2
  exit 2
fi
venv=.engines/$engine-$version
stamp=$(sha256sum "$lock" | cut -c1-16)
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" --no-deps "$engine==$version"
  "${pip[@]}" --no-deps -r "$lock"
  echo "$stamp" > "$venv/.stamp"
fi
# DEPS_ONLY=1: stop before installing kvcert, whose editable install rebuilds the C extensions
# in this checkout (.ci/run builds the venvs while tests import those extensions).
[ "${DEPS_ONLY:-0}" = 1 ] && { echo "$venv"; exit 0; }
# kvcert from this checkout (its only dependency is in the lock), editable, and Hypothesis at
# the constrained version (the shipped state machine the engine checks run): installed again
# only when its build inputs (pyproject.toml, the C extensions, this script) or the checkout
# changed, so
# that runs sharing the venv at once (CI's lanes) never see it half reinstalled; the lock
# keeps two first installs apart.
kvcert_stamp=$( { pwd; cat pyproject.toml reference/*.c scripts/engine-venv.sh; } | sha256sum | cut -c1-16)
(
  flock 9
  if [ "$(cat "$venv/.kvcert-stamp" 2>/dev/null)" != "$kvcert_stamp" ]; then
    "${pip[@]}" --no-deps -e .
    "${pip[@]}" -c constraints.txt hypothesis
    echo "$kvcert_stamp" > "$venv/.kvcert-stamp"
  fi
) 9> "$venv/.install-lock"
echo "$venv"
