"""The compiled helpers are built where they can be: their own tests skip when a helper is
missing (the fallbacks must still install and run), so this is what fails when an install
quietly stopped building one."""

from __future__ import annotations

import ast
import importlib
import sysconfig
from pathlib import Path

import pytest

# gcc and Python's headers are on every machine kvcert supports; OpenSSL's are not
ALWAYS = ["_keyindex", "_refcounts", "_decodelane"]
OPENSSL_HEADERS = [
    Path(root) / "openssl" / "sha.h"
    for root in ("/usr/include", "/usr/local/include", sysconfig.get_paths()["include"])
]


@pytest.mark.parametrize("name", [*ALWAYS, "_chain"])
def test_each_compiled_helper_is_built_where_it_can_be(name):
    if name == "_chain" and not any(header.exists() for header in OPENSSL_HEADERS):
        pytest.skip("no OpenSSL headers here: the digest chain runs on hashlib")
    module = importlib.import_module(f"kvcert.reference.{name}")
    assert Path(module.__file__ or "").suffix == ".so"


# types a module hands out (its stub names them for typing) but does not export
HANDED_OUT = {"GroupView"}  # _keyindex: KeyIndex.served's views


@pytest.mark.parametrize("name", ALWAYS)
def test_each_built_helper_has_every_name_its_stub_declares(name):
    """A build that failed to compile leaves the last one's module in place (the extensions
    are optional): one missing a name its stub (and so the Python code) expects is stale."""
    module = importlib.import_module(f"kvcert.reference.{name}")
    stub = ast.parse((Path(__file__).parents[2] / "reference" / f"{name}.pyi").read_text())
    missing = []
    for node in stub.body:
        if getattr(node, "name", None) in HANDED_OUT:
            continue
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not hasattr(module, node.name):
            missing.append(node.name)
        if isinstance(node, ast.ClassDef) and hasattr(module, node.name):
            owner = getattr(module, node.name)
            missing += [
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and not hasattr(owner, item.name)
            ]
    assert not missing, f"{name} is stale: rebuild it (bash scripts/setup.sh); missing {missing}"
