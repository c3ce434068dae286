#!/usr/bin/env bash
# The main job: install kvcert and run it. With no arguments it certifies the bundled
# reference allocator against every conformance vector; any arguments go to `kvcert` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- certify
fi
exec .venv/bin/kvcert "$@"
