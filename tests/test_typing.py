"""`mypy --strict` over the four packages, through a link tree that mirrors the kvcert.* map.

mypy cannot follow setuptools' editable-install finder, so the test builds the mapping itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_packages_are_strictly_typed(tmp_path):
    tree = tmp_path / "kvcert"
    tree.mkdir()
    for folder in ("spec", "reference", "kernels", "conformance"):
        (tree / folder).symlink_to(ROOT / folder, target_is_directory=True)
    packages = [
        arg
        for p in ("spec", "reference", "kernels", "conformance")
        for arg in ("-p", f"kvcert.{p}")
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--namespace-packages",
            "--explicit-package-bases",
            "--cache-dir",
            str(tmp_path / "cache"),
            *packages,
        ],
        env={**os.environ, "MYPYPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
