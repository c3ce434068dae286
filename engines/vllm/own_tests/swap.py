"""pytest plugin (`-p swap`): vLLM's own tests with kvcert's manager swapped in.

Before any test module is imported, vLLM's KVCacheManager and its two schedulers are replaced
where the tests (and vLLM's code) look them up, by kvcert.reference.vllm's classes: the
manager everywhere, the Scheduler and the AsyncScheduler by kvcert's subclasses (which
register a step's blocks when its output arrives). No test file is edited.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from vllm.v1.core import kv_cache_manager  # noqa: PLC0415
    from vllm.v1.core.sched import async_scheduler, scheduler  # noqa: PLC0415

    from kvcert.reference.vllm import AsyncScheduler, KVCacheManager, Scheduler  # noqa: PLC0415

    kv_cache_manager.KVCacheManager = KVCacheManager  # type: ignore[misc]
    scheduler.KVCacheManager = KVCacheManager  # type: ignore[misc]
    scheduler.Scheduler = Scheduler  # type: ignore[misc]
    async_scheduler.AsyncScheduler = AsyncScheduler  # type: ignore[misc]
    config.stash[MARK] = "kvcert"


MARK = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    return f"KV-cache manager: {config.stash.get(MARK, 'vllm')} (kvcert.reference.vllm)"
