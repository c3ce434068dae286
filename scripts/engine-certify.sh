#!/usr/bin/env bash
# Certify a real engine release against every vector, strictly against its expected results:
# engines/ENGINE/VERSION/expected.json names each known failure and why (an xfail that passes
# fails the run, as does any failure not named). The report lands in .engines/.
# ENGINE may name an adapter mode: vllm-planned and vllm-planned-unmarked drive the same vLLM
# release through its own planner (docs/engines.md); their expected results are
# engines/vllm/VERSION/expected-planned.json and expected-planned-unmarked.json.
# Usage: scripts/engine-certify.sh vllm 0.33.0 [more kvcert certify options]
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: engine-certify.sh ENGINE VERSION}
version=${2:?usage: engine-certify.sh ENGINE VERSION}
shift 2
family=${engine%%-*}           # vllm-planned -> vllm (the venv and the folder)
mode=${engine#"$family"}       # vllm-planned -> -planned (the expected file's suffix)
venv=$(bash scripts/engine-venv.sh "$family" "$version" | tail -1)
exec "$venv/bin/kvcert" certify --engine "$engine" --quiet \
  --xfails "engines/$family/$version/expected$mode.json" \
  --timeout 120 --json ".engines/$engine-$version.report.json" "$@"
