#!/usr/bin/env bash
# The long tier: every engine release that has a lock under engines/, one after another
# (each venv is ~3 GB and cached in .engines/). Exits non-zero if any release deviates from
# its expected results (for SGLang with the unified tree's Rust core, with its Python core too),
# if the preempt-in-flight repro stops reproducing on a vLLM release (eagle-bigram-cap on an
# SGLang one), or
# if the soundness or completeness campaign (kvcert fuzz) cannot run on one; prints one line
# per check (each adapter mode, and for vLLM the repro, both campaigns and the regressions).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
# reproduces ENGINE VERSION MODULE: a finding's repro must still reproduce (exit 1).
reproduces() {
  local repro
  repro=$(".engines/$1-$2/bin/python" -m "$3" 2>&1)
  if [ $? -eq 1 ]; then
    echo "ok   $1 $2 repro: $(echo "$repro" | grep REPRODUCED)"
  else
    status=1
    echo "FAIL $1 $2 repro:"
    echo "$repro" | tail -20
  fi
}
for dir in engines/*/*/; do
  engine=$(basename "$(dirname "$dir")")
  version=$(basename "$dir")
  [ -f "$dir/requirements.txt" ] || continue
  # every adapter mode with expected results: expected.json (the engine's own adapter), and
  # for vLLM expected-planned*.json (through its own planner, per draft marking)
  for expected in "$dir"expected*.json; do
    mode=$(basename "$expected" .json); mode=${mode#expected}
    if out=$(bash scripts/engine-certify.sh "$engine$mode" "$version" 2>&1); then
      echo "ok   $engine$mode $version: $(echo "$out" | tail -1)"
    else
      status=1
      echo "FAIL $engine$mode $version:"
      echo "$out" | tail -40
    fi
  done
  core=""
  if [ "$engine" = sglang ]; then
    core=$(".engines/sglang-$version/bin/python" -c "from kvcert.conformance.sglang.adapter \
import prepare_import; prepare_import(); from sglang.srt.environ import envs; \
flag = getattr(envs, 'SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND', None); \
print(flag.get() if flag is not None else None)" 2>/dev/null | tail -1)
  fi
  if [ "$core" = rust ]; then
    # Where the unified tree runs on its Rust core by default (0.5.23), the Python core must
    # answer alike.
    if out=$(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python bash scripts/engine-certify.sh \
        sglang "$version" 2>&1); then
      echo "ok   sglang $version python tree core: $(echo "$out" | tail -1)"
    else
      status=1
      echo "FAIL sglang $version python tree core:"
      echo "$out" | tail -40
    fi
  fi
  if [ "$engine" = sglang ]; then
    # eagle-bigram-cap (docs/engines.md) must reproduce through SGLang's own finish and
    # prefill path on every pinned release (exit 1).
    reproduces sglang "$version" kvcert.conformance.sglang.checks.bigram_cap
  fi
  if [ "$engine" = vllm ]; then
    # The preempt-in-flight bug (docs/engines.md) must reproduce through vLLM's own
    # Scheduler on every pinned release (exit 1).
    reproduces vllm "$version" kvcert.conformance.vllm.checks.preempt_in_flight
    # The soundness campaign: 5,000 random workloads through the release's own Scheduler,
    # reported (a violation is a finding about the release, not a kvcert failure); a campaign
    # that cannot run on the release (exit 2 or a crash) fails the matrix.
    fuzz=$(".engines/vllm-$version/bin/kvcert" fuzz --runs 5000 --shrink-budget 40 \
      --json ".engines/vllm-$version.fuzz.json" 2>&1)
    code=$?
    if [ $code -le 1 ]; then
      echo "ok   vllm $version fuzz: $(echo "$fuzz" | grep '^kvcert fuzz')"
    else
      status=1
      echo "FAIL vllm $version fuzz (exit $code):"
      echo "$fuzz" | tail -20
    fi
    # The completeness campaign (the lost-hit oracle on its workload families, with the
    # fix), every lost hit then named by its cause (reported: a lost hit is a finding about
    # the release; causes exits 1 on one it cannot name, which engines/vllm/campaign/RESULTS.md
    # must then list with its repro); 0.33.0 with every workload option, as --kvcert plays.
    options=(--fix --families)
    [ "$version" = 0.33.0 ] && options+=(--state-checkpoints --state-drafts --mtp)
    report=".engines/vllm-$version.fuzz-families.json"
    owed=$(".engines/vllm-$version/bin/kvcert" fuzz --runs 2000 --shrink-budget 40 "${options[@]}" \
      --json "$report" 2>&1)
    code=$?
    if [ $code -le 1 ]; then
      named=$(".engines/vllm-$version/bin/python" -m kvcert.conformance.vllm.campaign.causes \
        "$report" --annotate 2>&1 | tail -1)
      echo "ok   vllm $version completeness: $(echo "$owed" | grep '^  completeness') ($named)"
    else
      status=1
      echo "FAIL vllm $version completeness (exit $code):"
      echo "$owed" | tail -20
    fi
    # the release's committed campaign regressions replay as their files record
    if checked=$(".engines/vllm-$version/bin/python" -m kvcert.conformance.vllm.campaign.check \
        --regressions 2>&1); then
      echo "ok   vllm $version regressions: $(echo "$checked" | grep -c '^ok')"
    else
      status=1
      echo "FAIL vllm $version regressions:"
      echo "$checked" | grep -v '^ok' | tail -20
    fi
  fi
done
# kvcert.reference.vllm, the drop-in for vLLM 0.33.0: the deep twin of CI's 400-seed campaign
# (no finding allowed) and of its run of vLLM's own tests (every outcome as expected).
if [ -x .engines/vllm-0.33.0/bin/kvcert ]; then
  if fuzz=$(.engines/vllm-0.33.0/bin/kvcert fuzz --kvcert --runs 10000 --shrink-budget 40 \
      --json .engines/vllm-0.33.0.fuzz-kvcert.json 2>&1); then
    echo "ok   vllm 0.33.0 fuzz --kvcert: $(echo "$fuzz" | grep '^kvcert fuzz')"
  else
    status=1
    echo "FAIL vllm 0.33.0 fuzz --kvcert:"
    echo "$fuzz" | tail -20
  fi
  bash scripts/vllm-own-tests.sh 0.33.0 kvcert > .engines/vllm-0.33.0-tests.log 2>&1
  if checked=$(.engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.own_tests.report 0.33.0 --check 2>&1); then
    echo "ok   vllm 0.33.0 own tests: $(echo "$checked" | tail -1)"
  else
    status=1
    echo "FAIL vllm 0.33.0 own tests:"
    echo "$checked" | tail -20
  fi
fi
exit $status
