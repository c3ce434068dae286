#!/usr/bin/env bash
# Re-derive a release's expected results after the vectors or the adapter changed: certify it
# without its expected-failure file, for vLLM trace each difference to the fix (every mode) or
# engine argument (planned modes) it follows (kvcert.conformance.vllm.trace_causes), then write
# engines/FAMILY/VERSION/expected$MODE.json (each failure with the cause
# kvcert.conformance.vllm.expected gives it) and RESULTS$MODE.md from that raw report.
# Review the diff: a new cause, or any "uninvestigated" entry, is open work.
# With --classify, nothing runs: the causes are given again from the last raw report and trace
# (after a change to kvcert.conformance.vllm.expected).
# Usage: scripts/engine-expect.sh vllm 0.33.0
#        scripts/engine-expect.sh vllm-planned 0.28.0      (or vllm-planned-unmarked)
#        scripts/engine-expect.sh --classify vllm-planned 0.28.0
set -euo pipefail
cd "$(dirname "$0")/.."
run=1
if [ "${1:-}" = --classify ]; then run=0; shift; fi
engine=${1:?usage: engine-expect.sh [--classify] ENGINE VERSION}
version=${2:?usage: engine-expect.sh [--classify] ENGINE VERSION}
family=${engine%%-*}           # vllm-planned -> vllm (the venv and the folder)
mode=${engine#"$family"}       # vllm-planned -> -planned (the files' suffix)
report=.engines/$engine-$version.raw.json
if [ "$run" -eq 1 ]; then
  venv=$(bash scripts/engine-venv.sh "$family" "$version" | tail -1)
  "$venv/bin/kvcert" certify --engine "$engine" --quiet --timeout 120 --json "$report" \
    > /dev/null 2>&1 || true   # failures are what this script records
fi
dir=engines/$family/$version
trace=()
case "$family$mode" in
  vllm-planned) marking=marked ;;
  vllm-planned-unmarked) marking=unmarked ;;
  vllm) marking=hand ;;
  *) marking= ;;   # causes are traced to vLLM fixes only; SGLang's are named by hand
esac
if [ -n "$marking" ] && [ "$run" -eq 1 ]; then
  "$venv/bin/python" -m kvcert.conformance.vllm.trace_causes "$report" "$marking" \
    "$dir/trace$mode.json" > "${report%.raw.json}.trace.log" 2>&1
fi
[ -n "$marking" ] && trace=("$dir/trace$mode.json")
.venv/bin/python -m kvcert.conformance.vllm.expected "$report" "${trace[@]}" > "$dir/expected$mode.json"
.venv/bin/python -m kvcert.conformance.vllm.expected --markdown "$report" "${trace[@]}" \
  > "$dir/RESULTS$mode.md"
echo "$dir $engine: $(grep -m1 '^\* counts:' "$dir/RESULTS$mode.md"); uninvestigated: $(grep -c uninvestigated "$dir/expected$mode.json" || true)"
