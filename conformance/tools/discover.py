"""Find the packages an engine's KV-cache import chain needs, one ImportError at a time.

Run with the Python of a venv holding CPU torch and the engine's wheel installed --no-deps:

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.tools.discover vllm \
        vllm.v1.core.kv_cache_manager
    .engines/sglang-0.5.23/bin/python -m kvcert.conformance.tools.discover sglang \
        kvcert.conformance.sglang.adapter:prepare_import sglang.srt.mem_cache.radix_cache

A `module:function` argument is called instead of imported (set-up before the imports).

Each missing top-level module is installed under the engine's own version bound for it (from
its Requires-Dist) with torch held at 2.13.0, until the modules import. Then freeze the venv
into engines/ENGINE/VERSION/requirements.txt (scripts/engine-venv.sh installs that lock).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib import metadata

from packaging.requirements import Requirement

# Import names whose distribution is named differently.
DISTRIBUTION = {
    "zmq": "pyzmq",
    "PIL": "pillow",
    "cpuinfo": "py-cpuinfo",
    "yaml": "pyyaml",
    "google": "protobuf",
    "cv2": "opencv-python-headless",
    "openai_harmony": "openai-harmony",
    "tvm_ffi": "apache-tvm-ffi",
}
# The engine's own pins that cannot hold here (not on the package index this machine reaches).
UNPINNED = {"certifi"}
# Packages that cannot work here: the index's torchvision needs the CUDA torch it was built for.
NEVER = {"torchvision"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bounds(distribution: str) -> dict[str, str]:
    """The engine's requirement string per normalised name, markers evaluated, extras dropped."""
    out = {}
    for text in metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = normal(requirement.name)
        out[name] = name if name in UNPINNED else f"{name}{requirement.specifier}"
    return out


def main(distribution: str, modules: list[str]) -> int:
    wanted = bounds(distribution)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pin:
        pin.write("torch==2.13.0\n")
    steps = []
    for name in modules:
        module, _, function = name.partition(":")
        steps.append(f"import {module}" + (f"; {module}.{function}()" if function else ""))
    probe = "; ".join(steps)
    for _ in range(80):
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
        if result.returncode == 0:
            print(f"{', '.join(modules)}: ok")
            return 0
        missing = re.search(r"No module named '([^'.]+)", result.stderr)
        if missing is None:
            print(result.stderr[-3000:], file=sys.stderr)
            return 1
        name = normal(DISTRIBUTION.get(missing.group(1), missing.group(1)))
        if name in NEVER:
            print(f"{name} cannot be installed beside CPU torch 2.13.0: {result.stderr[-600:]}")
            return 1
        spec = wanted.get(name, name)
        print(f"{missing.group(1)}: installing {spec}", flush=True)
        install = [sys.executable, "-m", "pip", "install", "-q", "-c", pin.name, spec]
        if subprocess.run(install, check=False).returncode != 0:
            return 1
    print("gave up after 80 installs", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
