"""kvcert's allocator inside vLLM 0.33.0: a drop-in KVCacheManager and the schedulers using it.

    vllm serve MODEL --scheduler-cls kvcert.reference.vllm.AsyncScheduler   # vLLM's default
    vllm serve MODEL --scheduler-cls kvcert.reference.vllm.Scheduler --no-async-scheduling

`KVCacheManager`, `Scheduler` and `AsyncScheduler` need vLLM (importing them without it raises
ImportError); `Settings`, `HoldBack`, `UnsupportedConfigError` and `IntegrationError` do not,
so configuration can be checked anywhere.
Never imports kvcert.spec. Configuration: `Settings` or the environment (KVCERT_EVICTION,
KVCERT_HASH, KVCERT_SPECULATIVE, KVCERT_HOLD_BACK; see kvcert.reference.vllm.settings).
"""

from __future__ import annotations

import importlib
from typing import Any

from kvcert.reference.vllm.layout import IntegrationError, UnsupportedConfigError
from kvcert.reference.vllm.settings import HoldBack, Settings

_NEEDS_VLLM = {
    "AsyncScheduler": "kvcert.reference.vllm.scheduler",
    "KVCacheManager": "kvcert.reference.vllm.manager",
    "Scheduler": "kvcert.reference.vllm.scheduler",
}

__all__ = [
    "AsyncScheduler",
    "HoldBack",
    "IntegrationError",
    "KVCacheManager",
    "Scheduler",
    "Settings",
    "UnsupportedConfigError",
]


def __getattr__(name: str) -> Any:
    """The classes that need vLLM, imported on first use (PEP 562)."""
    module = _NEEDS_VLLM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
