"""The distribution: one import root mapped from four folders, typed, with its data files."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv
import zipfile
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvcert.spec", "kvcert.reference", "kvcert.kernels", "kvcert.conformance")
FOLDERS = {
    "kvcert.spec": "spec",
    "kvcert.reference": "reference",
    "kvcert.kernels": "kernels",
    "kvcert.conformance": "conformance",
}


def run(args, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, **kwargs
    )


def test_all_four_packages_import_from_outside_the_repo(tmp_path):
    code = (
        "; ".join(f"import {p}" for p in PACKAGES)
        + "; print("
        + ", ".join(f"{p}.__file__" for p in PACKAGES)
        + ", sep='\\n')"
    )
    result = run([sys.executable, "-c", code], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for package, location in zip(PACKAGES, result.stdout.split(), strict=True):
        assert Path(location).parent.name in {FOLDERS[package], package.split(".")[1]}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_typed(package):
    assert resources.files(package).joinpath("py.typed").is_file()


def imported_modules(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_reference_never_imports_the_spec(tmp_path):
    """Differential tests compare the two; a shared import would make them tautologies."""
    assert not any(name.startswith("kvcert.spec") for name in imported_modules(ROOT / "reference"))
    probe = "import sys, kvcert.reference; print('kvcert.spec' in sys.modules)"
    assert run([sys.executable, "-c", probe], cwd=tmp_path).stdout.strip() == "False"


def test_spec_is_pure(tmp_path):
    """The spec reads no files, starts no processes and draws no randomness."""
    forbidden = {"os", "io", "pathlib", "random", "subprocess", "socket", "time", "json"}
    assert imported_modules(ROOT / "spec") & forbidden == set()


def test_the_console_script_answers_help():
    script = Path(sys.executable).with_name("kvcert")
    result = run([str(script), "--help"], cwd=ROOT)
    assert result.returncode == 0
    assert "explain" in result.stdout


def test_a_built_wheel_installs_and_runs_outside_the_repo(tmp_path):
    """Build the wheel, install it into a fresh venv, run `kvcert explain` from elsewhere.

    This is the check a broken folder mapping or a missing data file cannot pass.
    """
    wheels = tmp_path / "wheels"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("kvcert-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "kvcert/spec/RULES.md",
        "kvcert/spec/py.typed",
        "kvcert/conformance/examples/gpt-oss-eagle.json",
        "kvcert/reference/__init__.py",
        "kvcert/kernels/__init__.py",
    ):
        assert expected in names
    assert not any(n.startswith(("tests/", "spec/")) for n in names)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = run(
        [str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], cwd=tmp_path
    )
    assert installed.returncode == 0, installed.stderr
    result = run(
        [str(env_dir / "bin" / "kvcert"), "explain", "--example", "gpt-oss-eagle"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "HYBRID HIT: 976 tokens" in result.stdout
