#!/usr/bin/env bash
# The main job: install kvcert and run it. With no arguments it explains a bundled example
# (DeepSeek-V4-Flash's 0% re-send); any arguments are passed to `kvcert` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- explain --example deepseek-v4-flash-after-b
fi
exec .venv/bin/kvcert "$@"
