#!/usr/bin/env bash
# The long tier: every engine release that has a lock under engines/, one after another
# (each venv is ~3 GB and cached in .engines/). Exits non-zero if any release deviates from
# its expected results, or if the preempt-in-flight repro stops reproducing on a vLLM release;
# prints one line per release (two for vLLM).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
for dir in engines/*/*/; do
  engine=$(basename "$(dirname "$dir")")
  version=$(basename "$dir")
  [ -f "$dir/requirements.txt" ] || continue
  if out=$(bash scripts/engine-certify.sh "$engine" "$version" 2>&1); then
    echo "ok   $engine $version: $(echo "$out" | tail -1)"
  else
    status=1
    echo "FAIL $engine $version:"
    echo "$out" | tail -40
  fi
  if [ "$engine" = vllm ]; then
    # The preempt-in-flight bug (engines/README.md) must reproduce through vLLM's own
    # Scheduler on every pinned release (exit 1).
    repro=$(".engines/vllm-$version/bin/python" engines/vllm/repro/preempt_in_flight.py 2>&1)
    if [ $? -eq 1 ]; then
      echo "ok   vllm $version repro: $(echo "$repro" | grep REPRODUCED)"
    else
      status=1
      echo "FAIL vllm $version repro:"
      echo "$repro" | tail -20
    fi
  fi
done
exit $status
