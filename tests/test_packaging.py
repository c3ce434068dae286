"""The distribution: one import root mapped from four folders, typed, with its data files."""

from __future__ import annotations

import ast
import os
import shutil
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


def tree_contents() -> tuple[set[str], set[str]]:
    """What the wheel must hold, read off the four folders: every package (a folder with an
    __init__.py, as kvcert.X.Y) and every data file (anything but Python sources and caches)."""
    packages, files = set(), set()
    for package, folder in FOLDERS.items():
        root = ROOT / folder
        for path in root.rglob("*"):
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts or path.suffix == ".pyc" or path.is_dir():
                continue
            installed = "/".join(("kvcert", package.split(".")[1], *relative.parts))
            if path.name == "__init__.py":
                packages.add(".".join(installed.split("/")[:-1]))
            files.add(installed)
    return packages, files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a clean copy of the tree: a working copy's stale *.egg-info (from
    the editable install) or build/ would smuggle in files the configuration forgot."""
    source = tmp_path_factory.mktemp("source") / "kvcert"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".engines", "build", "*.egg-info", "__pycache__", ".*cache"
        ),
    )
    wheels = tmp_path_factory.mktemp("wheels")
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        cwd=wheels,
    )
    assert built.returncode == 0, built.stderr
    (path,) = wheels.glob("kvcert-*.whl")
    return path


@pytest.mark.slow
def test_the_wheel_holds_every_package_and_data_file_of_the_tree(wheel):
    packages, files = tree_contents()
    assert "kvcert.conformance.checks.proofs" in packages  # the package the wheel once lost
    names = set(zipfile.ZipFile(wheel).namelist())
    in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert packages - in_wheel == set(), "pyproject's [tool.setuptools] packages misses these"
    assert files - names == set(), "pyproject's package-data misses these files"
    assert not any(n.startswith(("tests/", "spec/", "conformance/")) for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


@pytest.mark.slow
def test_a_built_wheel_installs_and_runs_outside_the_repo(wheel, tmp_path):
    """Install the wheel (not editable) into a fresh venv and run it from elsewhere: the check a
    broken folder mapping, a missing package or a missing data file cannot pass."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    constraints = str(ROOT / "constraints.txt")
    installed = run(
        [str(python), "-m", "pip", "install", "-q", "-c", constraints, f"{wheel}[proofs]"],
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    kvcert = str(env_dir / "bin" / "kvcert")
    result = run([kvcert, "explain", "--example", "gpt-oss-eagle"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "HYBRID HIT: 976 tokens" in result.stdout
    listed = run([kvcert, "check", "--list"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "THM-HYB-SEARCH" in listed.stdout


def test_kernels_import_without_torch_and_name_the_extra(tmp_path):
    """Once `import kvcert.kernels` failed without torch and nothing named the extra."""
    probe = (
        "import sys; sys.modules['torch'] = None\n"
        "import kvcert.kernels as kernels\n"
        "print(kernels.attention_layout.__name__)\n"
        "try:\n"
        "    from kvcert.kernels import write_kv\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = run([sys.executable, "-c", probe], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "attention_layout"
    assert "kvcert.kernels.write_kv needs torch" in result.stdout
    assert "'kvcert[kernels]'" in result.stdout


def test_the_suite_collects_with_the_test_extra_alone(tmp_path):
    """`pip install -e .[test] && pytest` must collect: the tests that need z3, CrossHair,
    matplotlib or torch skip without them instead of failing to import."""
    probe = (
        "import sys\n"
        "for name in ('z3', 'crosshair', 'matplotlib', 'torch', 'triton'):\n"
        "    sys.modules[name] = None\n"
        "import pytest\n"
        f"sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
        f"'--ignore={ROOT / 'tests' / 'kernels'}', '{ROOT / 'tests'}']))\n"
    )
    result = run([sys.executable, "-c", probe], cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "ERROR collecting" not in result.stdout


def test_setup_installs_once_and_only_what_is_missing(tmp_path):
    """`bash scripts/main.sh ARGS` once reinstalled on every call: setup.sh now skips pip
    when .venv holds the extras asked for (or more) from the same pyproject, constraints and
    C source of the compiled key index (an editable install rebuilds it only when pip runs)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "reference").mkdir()
    for name in (
        "pyproject.toml",
        "constraints.txt",
        "reference/_keyindex.c",
        "reference/_refcounts.c",
    ):
        shutil.copy(ROOT / name, tmp_path / name)
    fake = tmp_path / ".venv" / "bin" / "python"  # records each pip call instead of running it
    fake.parent.mkdir(parents=True)
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "pip-calls"}\n', encoding="utf-8")
    fake.chmod(0o755)

    def setup(extras: str) -> list[str]:
        done = run(["bash", "scripts/setup.sh", extras], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        calls = tmp_path / "pip-calls"
        lines = calls.read_text().splitlines() if calls.exists() else []
        return [line for line in lines if line.startswith("-m pip install")]

    assert len(setup("test,proofs")) == 1
    assert len(setup("test,proofs")) == 1  # nothing changed: no reinstall
    assert len(setup("")) == 1  # the main job needs no extra
    assert len(setup("proofs")) == 1  # a subset of what is installed
    union = "-e .[proofs,sim,test]"  # the union of the extras, not a swap
    assert setup("sim")[-1].endswith(f"--no-compile -c constraints.txt {union}")
    (tmp_path / "constraints.txt").write_text("z3-solver==5.4.0.0\n", encoding="utf-8")
    assert len(setup("sim")) == 3  # a changed constraint reinstalls
    with (tmp_path / "reference" / "_keyindex.c").open("a", encoding="utf-8") as source:
        source.write("/* changed */\n")
    assert len(setup("sim")) == 4  # so does a changed extension source (it must be rebuilt)
    compiled = (tmp_path / "pip-calls").read_text().count("-m compileall -q -j 0")
    assert compiled == 4  # each install is compiled to bytecode on every core (pip skips it)
    fake.write_text("#!/bin/sh\necho 'ERROR: no matching distribution'\nexit 1\n")
    failed = run(["bash", "scripts/setup.sh", "kernels"], cwd=tmp_path)
    assert failed.returncode != 0  # a failed pip fails the setup, and records nothing
    assert "kernels" not in (tmp_path / ".venv" / ".kvcert-stamp").read_text()
