#!/usr/bin/env bash
# Certify a real engine release against every vector, strictly against its expected results:
# engines/ENGINE/VERSION/expected.json names each known failure and why (an xfail that passes
# fails the run, as does any failure not named). The report lands in .engines/.
# Usage: scripts/engine-certify.sh vllm 0.33.0 [more kvcert certify options]
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: engine-certify.sh ENGINE VERSION}
version=${2:?usage: engine-certify.sh ENGINE VERSION}
shift 2
venv=$(bash scripts/engine-venv.sh "$engine" "$version" | tail -1)
exec "$venv/bin/kvcert" certify --engine "$engine" --quiet \
  --xfails "engines/$engine/$version/expected.json" \
  --timeout 120 --json ".engines/$engine-$version.report.json" "$@"
