#!/usr/bin/env bash
# Run vLLM VERSION's own tests/v1/core (from its sdist, scripts/vllm-own-tests-fetch.sh) in
# the engine venv, against vLLM's KVCacheManager (MANAGER=vllm, the baseline: what runs on a
# CPU-only machine at all) or with kvcert's drop-in swapped in (MANAGER=kvcert: the pytest
# plugin kvcert.conformance.vllm.own_tests.swap replaces the class before the tests import
# it; no test file is edited). Writes .engines/vllm-VERSION-tests/MANAGER.xml (JUnit).
# Extra arguments go to pytest (e.g. -k, a file).
# Usage: scripts/vllm-own-tests.sh 0.33.0 vllm|kvcert [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: vllm-own-tests.sh VERSION vllm|kvcert [PYTEST ARGS]}
manager=${2:?usage: vllm-own-tests.sh VERSION vllm|kvcert [PYTEST ARGS]}
shift 2
case $manager in
  vllm) plugin=() ;;
  kvcert) plugin=(-p kvcert.conformance.vllm.own_tests.swap) ;;
  *) echo "MANAGER must be vllm or kvcert, got $manager" >&2; exit 2 ;;
esac
here=$PWD
dest=$(bash scripts/vllm-own-tests-fetch.sh "$version" | tail -1)
python=$here/.engines/vllm-$version/bin/python
case " $* " in *" tests/"*) ;; *) set -- "$@" tests/v1/core ;; esac  # the default: all of it
cd "$dest/src"
# --confcutdir: the sdist's top conftest imports the whole serving stack (transformers, PIL,
# the LLM class); tests/v1/core needs none of it. Workers: both cores.
# No network here (no model downloads): the hub's offline mode over the fetch script's cache
# of config files; a test that needs more of a model fails at once instead of retrying. vLLM
# picks its platform from the build; this CPU-only install needs VLLM_TARGET_DEVICE=cpu.
VLLM_TARGET_DEVICE=cpu HF_HOME=$dest/hf HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
PYTHONPATH=$dest/site:$dest/src \
  "$python" -m pytest --confcutdir=tests/v1/core -p no:cacheprovider -q -rfE \
  --timeout "${VLLM_TESTS_TIMEOUT:-120}" -n "${VLLM_TESTS_WORKERS:-2}" \
  "${plugin[@]}" --junitxml "$dest/$manager.xml" "$@"
