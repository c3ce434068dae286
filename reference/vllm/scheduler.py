"""vLLM's Scheduler with the kvcert-backed KV-cache manager.

    vllm serve MODEL --scheduler-cls kvcert.reference.vllm.Scheduler --no-async-scheduling

The only change to vLLM's scheduling: the manager is kvcert's, and a step's blocks are
registered when its model output arrives (`update_from_output`), the moment their KV exists.
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

from vllm.v1.core.sched import scheduler as vllm_scheduler  # type: ignore[import-not-found]

from kvcert.reference.vllm.layout import UnsupportedConfigError
from kvcert.reference.vllm.manager import KVCacheManager
from kvcert.reference.vllm.settings import Settings


class Scheduler(vllm_scheduler.Scheduler):  # type: ignore[misc]
    """vLLM 0.33.0's synchronous Scheduler over kvcert's allocator."""

    settings: Settings | None = None  # None: Settings.from_env() when the manager is built

    @classmethod
    def configured(cls, settings: Settings) -> type[Scheduler]:
        """This scheduler with `settings` instead of the environment's (for code that builds
        schedulers itself; `vllm serve` takes the class by name, so it reads the environment)."""
        return type(cls.__name__, (cls,), {"settings": settings})

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            raise UnsupportedConfigError(
                "the kvcert scheduler needs each step's output before the next step is "
                "scheduled: run vLLM with --no-async-scheduling"
            )
        # vLLM's __init__ builds its manager from this module-level name; build ours instead
        manager = functools.partial(KVCacheManager, settings=self.settings)
        with mock.patch.object(vllm_scheduler, "KVCacheManager", manager):
            super().__init__(vllm_config, *args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """The step's KV is written: register its blocks, then let vLLM read the output
        (which may finish requests, releasing blocks that are now hittable)."""
        self.kv_cache_manager.end_step()
        return super().update_from_output(scheduler_output, model_runner_output)
