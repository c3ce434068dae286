#!/usr/bin/env bash
# The long tier: every engine release that has a lock under engines/, one after another
# (each venv is ~3 GB and cached in .engines/). Exits non-zero if any release deviates from
# its expected results; prints one line per release.
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
done
exit $status
