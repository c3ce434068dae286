"""Which compiled helpers this process uses.

kvcert.reference ships four C extensions, each the compiled form of a pure-Python definition
it is tested equal to: `_keyindex` (reference/keyindex.py, and coordinator.find_hit's search
where no group holds state), `_refcounts` (reference/refcounts.py), `_chain` (the digest
chain's loops in reference/hashing.py) and `_decodelane` (a decode step and its
registration, reference/decode_lane.py). pip builds them at install; they are optional, so
a machine without a C compiler installs and runs on the definitions. KVCERT_PURE_PYTHON=1
makes this process use the definitions even where the extensions were built.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON = os.environ.get("KVCERT_PURE_PYTHON") == "1"


def native(name: str) -> ModuleType | None:
    """The compiled module kvcert.reference.`name`, or None (not built, or not wanted)."""
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(f"kvcert.reference.{name}")
    except ImportError:
        return None
