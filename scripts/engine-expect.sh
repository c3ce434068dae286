#!/usr/bin/env bash
# Re-derive a release's expected results after the vectors or the adapter changed: certify it
# without its expected-failure file, then write engines/ENGINE/VERSION/expected.json (each
# failure with the cause kvcert.conformance.vllm.expected traces it to) and RESULTS.md from that raw report.
# Review the diff: a new cause, or any "uninvestigated" entry, is open work.
# Usage: scripts/engine-expect.sh vllm 0.33.0
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: engine-expect.sh ENGINE VERSION}
version=${2:?usage: engine-expect.sh ENGINE VERSION}
venv=$(bash scripts/engine-venv.sh "$engine" "$version" | tail -1)
report=.engines/$engine-$version.raw.json
"$venv/bin/kvcert" certify --engine "$engine" --quiet --timeout 120 --json "$report" \
  > /dev/null 2>&1 || true   # failures are what this script records
dir=engines/$engine/$version
.venv/bin/python -m kvcert.conformance.vllm.expected "$report" > "$dir/expected.json"
.venv/bin/python -m kvcert.conformance.vllm.expected --markdown "$report" > "$dir/RESULTS.md"
echo "$dir: $(grep -c '"' "$dir/expected.json" || true) lines; uninvestigated: $(grep -c uninvestigated "$dir/expected.json" || true)"
