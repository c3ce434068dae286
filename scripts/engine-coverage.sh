#!/usr/bin/env bash
# Branch coverage of vLLM's KV-cache modules reached by the conformance suite and the
# soundness campaign, for one release: installs coverage (pinned in constraints.txt) into the
# release venv, runs `kvcert certify` in every adapter mode the release has expected results
# for (vllm, vllm-planned, vllm-planned-unmarked) and `kvcert fuzz` under it (every workload
# option on: the lost-hit families with their retention intervals and follow-ups, state
# backends saving checkpoints inside a prefill, state hybrids decoding with drafts,
# multi-module MTP drafters; findings are not shrunk: only what runs is measured), and writes
# the per-file report to .engines/vllm-VERSION.coverage.txt and the JSON to
# .engines/vllm-VERSION.coverage.json (kvcert.conformance.vllm.coverage turns it into COVERAGE.md).
# Usage: scripts/engine-coverage.sh 0.33.0 [fuzz runs, default 2000]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: engine-coverage.sh VERSION [FUZZ_RUNS]}
runs=${2:-2000}
venv=$(bash scripts/engine-venv.sh vllm "$version" | tail -1)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "coverage==$(grep -E '^coverage==' constraints.txt | cut -d= -f3)"
site=$("$venv/bin/python" -c 'import vllm, os; print(os.path.dirname(vllm.__file__))')
include="$site/v1/core/kv_cache_manager.py,$site/v1/core/kv_cache_coordinator.py"
include="$include,$site/v1/core/single_type_kv_cache_manager.py,$site/v1/core/block_pool.py"
include="$include,$site/v1/core/kv_cache_utils.py"
data=".engines/vllm-$version.covdata"
rm -f "$data"
rc=$(mktemp)  # an empty config: kvcert's own [tool.coverage] (source = kvcert) must not apply
cov=("$venv/bin/python" -m coverage)
"${cov[@]}" run --rcfile="$rc" --branch --data-file="$data" --include="$include" -m kvcert.conformance.cli \
  certify --engine vllm --quiet --xfails "engines/vllm/$version/expected.json" --timeout 120 \
  > /dev/null || true   # deviations are engine-certify.sh's business; here we measure
for mode in planned planned-unmarked; do   # the same vectors through vLLM's own planner
  [ -f "engines/vllm/$version/expected-$mode.json" ] || continue
  "${cov[@]}" run --rcfile="$rc" --append --branch --data-file="$data" --include="$include" \
    -m kvcert.conformance.cli certify --engine "vllm-$mode" --quiet --timeout 120 \
    --xfails "engines/vllm/$version/expected-$mode.json" > /dev/null || true
done
"${cov[@]}" run --rcfile="$rc" --append --branch --data-file="$data" --include="$include" \
  -m kvcert.conformance.cli fuzz --runs "$runs" --families --state-checkpoints --state-drafts \
  --mtp --shrink-budget 0 > /dev/null || true
"${cov[@]}" report --rcfile="$rc" --data-file="$data" --show-missing \
  > ".engines/vllm-$version.coverage.txt"
"${cov[@]}" json --rcfile="$rc" --data-file="$data" -o ".engines/vllm-$version.coverage.json" \
  --quiet
rm -f "$rc"
tail -8 ".engines/vllm-$version.coverage.txt"
