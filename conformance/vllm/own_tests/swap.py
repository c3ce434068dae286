"""pytest plugin (`-p kvcert.conformance.vllm.own_tests.swap`): vLLM's own tests with
kvcert's manager swapped in.

Before any test module is imported, vLLM's KVCacheManager and its two schedulers are replaced
where the tests (and vLLM's code) look them up, by kvcert.reference.vllm's classes: the
manager everywhere, the Scheduler and the AsyncScheduler by kvcert's subclasses (which
register a step's blocks when its output arrives). No test file is edited. The manager's
hash view is turned on (KVCERT_VLLM_HASH_VIEW=on): the tests read the cache by vLLM's block
hashes (`block_pool.get_cached_block`), and the view remembers what each names.

Many tests drive the manager alone, as vLLM's scheduler drives it under its default fcfs
policy, and they are written against the profiles vLLM's own manager has. Such a manager is
built under those profiles, each one kvcert's spec defines and holds it to exactly, unless
the environment names another: same-pass visibility (ALLOC-VIS-2, which kvcert's Scheduler
also picks under fcfs; kvcert's default without a scheduler is step-end, KVCERT_VISIBILITY)
and lru-unkeyed-first eviction (ALLOC-FREE-2: vLLM's free queue puts blocks without a key
at its head; kvcert's default is lru, KVCERT_EVICTION). A manager a Scheduler builds gets
the Scheduler's settings, chosen by its policy as in production (step-end under priority).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from vllm.v1.core import kv_cache_manager
from vllm.v1.core.sched import async_scheduler, scheduler

from kvcert.reference.config import Eviction, Visibility
from kvcert.reference.vllm import AsyncScheduler, KVCacheManager, Scheduler, Settings


class BareManager(KVCacheManager):  # type: ignore[misc]
    """kvcert's manager as vLLM's tests build it alone: vLLM's manager's visibility and
    eviction profiles unless the environment names others (a Scheduler passes its own
    settings)."""

    def __init__(self, *args: Any, settings: Settings | None = None, **kwargs: Any) -> None:
        if settings is None:
            settings = Settings.from_env()
            if settings.visibility is None:
                settings = dataclasses.replace(settings, visibility=Visibility.SAME_PASS)
            if "KVCERT_EVICTION" not in os.environ:
                settings = dataclasses.replace(settings, eviction=Eviction.LRU_UNKEYED_FIRST)
        super().__init__(*args, settings=settings, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    os.environ["KVCERT_VLLM_HASH_VIEW"] = "on"  # read when each manager is built
    kv_cache_manager.KVCacheManager = BareManager
    scheduler.KVCacheManager = BareManager
    scheduler.Scheduler = Scheduler
    async_scheduler.AsyncScheduler = AsyncScheduler
    config.stash[MARK] = "kvcert"


MARK = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    return f"KV-cache manager: {config.stash.get(MARK, 'vllm')} (kvcert.reference.vllm)"
