"""pytest plugin (`-p kvcert.conformance.vllm.own_tests.swap`): vLLM's own tests with
kvcert's manager swapped in.

Before any test module is imported, vLLM's KVCacheManager and its two schedulers are replaced
where the tests (and vLLM's code) look them up, by kvcert.reference.vllm's classes: the
manager everywhere, the Scheduler and the AsyncScheduler by kvcert's subclasses (which
register a step's blocks when its output arrives). No test file is edited. The manager's
hash view is turned on (KVCERT_VLLM_HASH_VIEW=on): the tests read the cache by vLLM's block
hashes (`block_pool.get_cached_block`), and the view remembers what each names.

Many tests drive the manager alone, as vLLM's scheduler drives it under its default fcfs
policy. A manager built without a scheduler declares no visibility profile, and kvcert's
default there is step-end; these tests are run under the profile vLLM's own manager has and
kvcert's Scheduler picks under fcfs, same-pass (ALLOC-VIS-2), unless KVCERT_VISIBILITY says
otherwise. A manager a Scheduler builds gets the Scheduler's settings, chosen by its policy
as in production (step-end under priority).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from vllm.v1.core import kv_cache_manager
from vllm.v1.core.sched import async_scheduler, scheduler

from kvcert.reference.config import Visibility
from kvcert.reference.vllm import AsyncScheduler, KVCacheManager, Scheduler, Settings


class BareManager(KVCacheManager):  # type: ignore[misc]
    """kvcert's manager as vLLM's tests build it alone: same-pass visibility unless the
    environment names one (a Scheduler passes its own settings)."""

    def __init__(self, *args: Any, settings: Settings | None = None, **kwargs: Any) -> None:
        if settings is None:
            settings = Settings.from_env()
            if settings.visibility is None:
                settings = dataclasses.replace(settings, visibility=Visibility.SAME_PASS)
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
