#!/usr/bin/env bash
# Fetch vLLM VERSION's source distribution with pip and unpack its tests/ beside the engine
# venv: .engines/vllm-VERSION-tests/{src/tests,site}. `site` holds pytest and its plugins
# (installed with --target, so the engine venv the certification uses stays as locked).
#
# Why a direct reference: `pip download vllm==VERSION --no-binary vllm` builds the sdist's
# metadata, which needs torch, setuptools-rust and setuptools-scm; on a CPU-only machine the
# build turns VLLM_TARGET_DEVICE to "empty" and the metadata version becomes VERSION+empty,
# which pip then refuses for the pin. A "vllm @ URL#sha256=..." reference is checked by hash,
# not by version, so the same build is accepted. Cached: a second call does nothing.
# Usage: scripts/vllm-own-tests-fetch.sh 0.33.0   (prints the tests dir last)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: vllm-own-tests-fetch.sh VERSION}
url=$(grep -v '^#' "engines/vllm/$version/sdist.txt" | head -1)
venv=$(bash scripts/engine-venv.sh vllm "$version" | tail -1)
dest=$PWD/.engines/vllm-$version-tests
stamp=$(printf '%s\n' "$url" "$(cat engines/vllm/own_tests/test-requirements.txt)" | sha256sum | cut -c1-16)
if [ "$(cat "$dest/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$dest" && mkdir -p "$dest/download" "$dest/build" "$dest/src"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  # the sdist's build requirements, beside the venv's torch, for its metadata step only
  "${pip[@]}" install --quiet --target "$dest/build" "setuptools>=77,<81" setuptools-scm \
    setuptools-rust packaging wheel jinja2
  PYTHONPATH="$dest/build" "${pip[@]}" download --quiet --no-deps --no-build-isolation \
    -d "$dest/download" "vllm @ $url"
  tar -xzf "$dest"/download/vllm-"$version".tar.gz -C "$dest/src" --strip-components=1 \
    "vllm-$version/tests" "vllm-$version/pyproject.toml"
  rm -rf "$dest/build"
  "${pip[@]}" install --quiet --target "$dest/site" -r engines/vllm/own_tests/test-requirements.txt
  echo "$stamp" > "$dest/.stamp"
fi
# The hub models the tests name, as an offline Hugging Face cache of config.json files
# (models/README.md); rebuilt every call, it is small.
rm -rf "$dest/hf" && mkdir -p "$dest/hf/hub"
revision=0000000000000000000000000000000000000000
for config in engines/vllm/own_tests/models/*/*/config.json; do
  repo=$(dirname "${config#engines/vllm/own_tests/models/}")
  cache="$dest/hf/hub/models--${repo//\//--}"
  mkdir -p "$cache/refs" "$cache/snapshots/$revision"
  printf '%s' "$revision" > "$cache/refs/main"
  cp "$config" "$cache/snapshots/$revision/config.json"
done
echo "$dest"
