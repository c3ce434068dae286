"""The compiled helpers are built where they can be: their own tests skip when a helper is
missing (the fallbacks must still install and run), so this is what fails when an install
quietly stopped building one."""

from __future__ import annotations

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
