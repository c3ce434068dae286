#!/usr/bin/env bash
# Create .venv (if needed) and install kvcert into it, editable, with the given extras.
# Usage: scripts/setup.sh [EXTRAS]      e.g. scripts/setup.sh test,proofs
# Versions come from constraints.txt, so nothing can swap the CPU torch for a CUDA build.
# An install is skipped when .venv already holds these extras (or more) from the same
# pyproject.toml, constraints.txt and C sources (the install is editable: Python changes
# need none).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
if [ ! -x .venv/bin/python ]; then
  echo "kvcert setup: creating .venv"
  "${PYTHON:-python3}" -m venv .venv
fi
inputs=$(cat pyproject.toml constraints.txt reference/_*.[ch] | sha256sum | cut -c1-16)
read -r stamped installed 2>/dev/null < .venv/.kvcert-stamp || true
if [ "${stamped:-}" = "$inputs" ]; then
  missing=0
  for extra in ${extras//,/ }; do
    [[ ",${installed:-}," == *",$extra,"* ]] || missing=1
  done
  [ "$missing" = 0 ] && exit 0
  # Keep what is installed: the union of the extras, so main.sh after test.sh (or the
  # reverse) never reinstalls back and forth.
  extras=$(echo "${installed:-},$extras" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
echo "kvcert setup: installing kvcert${extras:+[$extras]} into .venv (a first install takes 1-2 min)"
# pip's own lines are the progress; the machine's pip.conf warnings are noise. pip compiles
# every installed module to bytecode on one core (torch and triton: about half of a 2-minute
# install); compileall does it on every core instead (2026-11-30, 2 cores: 126 s as one pip
# step, 58 + 30 s split). The bytecode must be written here: with PYTHONDONTWRITEBYTECODE set,
# as on this project's machines, an import never writes it, so each process would compile
# what it imports again (torch and the test tools: 6 s compiled, 14 s from source).
.venv/bin/python -m pip install --disable-pip-version-check --progress-bar off --no-compile \
  -c constraints.txt -e "$spec" 2>&1 | { grep --line-buffered -v "^WARNING: Location '" || true; }
# Like pip's step it skips a file this Python cannot parse (torch ships one in 3.12 syntax),
# where compileall exits 1.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m compileall -q -j 0 "$site" > /dev/null || true
echo "$inputs $extras" > .venv/.kvcert-stamp
echo "kvcert setup: done"
