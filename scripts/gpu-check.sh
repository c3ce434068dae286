#!/usr/bin/env bash
# The kernels' GPU check: install kvcert from this working tree without the network, then run
# every Triton kernel against kvcert.spec's page layout and time it against the device's copy
# bandwidth (kvcert.kernels.certify). Arguments go to it:
#
#   bash scripts/gpu-check.sh --json kernels/GPU_REPORT.json     # on a GPU machine
#   bash scripts/gpu-check.sh --quick                            # on a CPU, under the interpreter
#
# PYTHON picks the interpreter (default python3, the one holding torch and triton there).
# kvcert goes into a scratch folder with `pip install --no-deps --no-build-isolation`, so the
# machine's torch, triton and hypothesis are used as they are; where that build cannot run (no
# setuptools >= 77), the package map of pyproject.toml is laid out as links instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
if "$python" -m pip install --quiet --no-deps --no-build-isolation --no-index \
    --target "$site" . > "$site/.install.log" 2>&1; then
  echo "gpu-check: kvcert installed from $(pwd) into a scratch folder"
else
  echo "gpu-check: pip could not build kvcert here ($(tail -1 "$site/.install.log")); linking it"
  mkdir -p "$site/kvcert"
  for part in spec reference kernels conformance; do
    ln -s "$(pwd)/$part" "$site/kvcert/$part"
  done
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m kvcert.kernels.certify "$@"
