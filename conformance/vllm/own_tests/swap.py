"""pytest plugin (`-p kvcert.conformance.vllm.own_tests.swap`): vLLM's own tests with
kvcert's manager swapped in.

Before any test module is imported, vLLM's KVCacheManager and its two schedulers are replaced
where the tests (and vLLM's code) look them up, by kvcert.reference.vllm's classes: the
manager everywhere, the Scheduler and the AsyncScheduler by kvcert's subclasses (which
register a step's blocks when its output arrives). No test file is edited. The manager's
hash view is turned on (KVCERT_VLLM_HASH_VIEW=on): the tests read the cache by vLLM's block
hashes (`block_pool.get_cached_block`), and the view remembers what each names.
"""

from __future__ import annotations

import os

import pytest
from vllm.v1.core import kv_cache_manager
from vllm.v1.core.sched import async_scheduler, scheduler

from kvcert.reference.vllm import AsyncScheduler, KVCacheManager, Scheduler


def pytest_configure(config: pytest.Config) -> None:
    os.environ["KVCERT_VLLM_HASH_VIEW"] = "on"  # read when each manager is built
    kv_cache_manager.KVCacheManager = KVCacheManager
    scheduler.KVCacheManager = KVCacheManager
    scheduler.Scheduler = Scheduler
    async_scheduler.AsyncScheduler = AsyncScheduler
    config.stash[MARK] = "kvcert"


MARK = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    return f"KV-cache manager: {config.stash.get(MARK, 'vllm')} (kvcert.reference.vllm)"
