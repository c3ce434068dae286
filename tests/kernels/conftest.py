"""Kernel tests run in their own pytest process with TRITON_INTERPRET=1, set here before
triton is imported (scripts/test.sh runs `pytest tests/kernels` separately; the main run
ignores this folder)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
