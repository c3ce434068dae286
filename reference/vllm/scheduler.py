"""vLLM's schedulers with the kvcert-backed KV-cache manager.

    vllm serve MODEL --scheduler-cls kvcert.reference.vllm.AsyncScheduler   # vLLM's default
    vllm serve MODEL --scheduler-cls kvcert.reference.vllm.Scheduler --no-async-scheduling

The only change to vLLM's scheduling: the manager is kvcert's, and a step's blocks are
registered when its model output arrives (`update_from_output`), the moment their KV exists.
Building one also has its engine build requests with kvcert's block hasher
(`kvcert.reference.vllm.hasher`): prompts are digested as they arrive, as vLLM hashes them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.v1.core.sched import async_scheduler as vllm_async
from vllm.v1.core.sched import scheduler as vllm_scheduler

from kvcert.reference.errors import ConfigError
from kvcert.reference.vllm.hasher import hook_engine_core
from kvcert.reference.vllm.layout import UnsupportedConfigError
from kvcert.reference.vllm.manager import KVCacheManager
from kvcert.reference.vllm.settings import Settings


@contextmanager
def _manager_class(factory: Any) -> Iterator[None]:
    """vLLM's scheduler module builds `KVCacheManager` by its module-level name: point the
    name at `factory` while a scheduler is built, then back."""
    vllm_class = vllm_scheduler.KVCacheManager
    vllm_scheduler.KVCacheManager = factory
    try:
        yield
    finally:
        vllm_scheduler.KVCacheManager = vllm_class


class _KvcertManaged:
    """What both schedulers change: the manager they build and when a step ends."""

    settings: Settings | None = None  # None: Settings.from_env() when the manager is built
    kv_cache_manager: KVCacheManager
    requests: dict[str, Any]

    @classmethod
    def configured(cls, settings: Settings) -> type[Any]:
        """This scheduler with `settings` instead of the environment's (for code that builds
        schedulers itself; `vllm serve` takes the class by name, so it reads the environment)."""
        return type(cls.__name__, (cls,), {"settings": settings})

    def _check(self, vllm_config: Any) -> None:
        """Refuse a configuration this scheduler class does not serve."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        aux = getattr(vllm_config, "aux_output_config", None)
        if aux is not None and aux.enabled:  # its connector reads vLLM's block pool
            raise UnsupportedConfigError(
                "routed-experts capture (--enable-return-routed-experts) keeps each cached "
                "block's outputs beside vLLM's own block pool, which the kvcert manager does "
                "not have: turn it off, or drop --scheduler-cls"
            )
        transfer = getattr(vllm_config, "kv_transfer_config", None)
        if transfer is not None and getattr(transfer, "kv_connector", None):
            raise UnsupportedConfigError(
                f"KV connector {transfer.kv_connector!r}: the kvcert manager does not support KV "
                "connectors (tokens loaded from an external store are no hit source the spec "
                "defines); drop --kv-transfer-config, or drop --scheduler-cls"
            )
        self._check(vllm_config)
        policy = str(getattr(vllm_config.scheduler_config, "policy", "fcfs"))
        try:
            settings = (self.settings or Settings.from_env()).for_policy(policy)
        except ConfigError as why:
            raise UnsupportedConfigError(str(why)) from why
        unit = getattr(vllm_config.cache_config, "prefix_match_unit", None)
        pipelined = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
        if unit is not None and pipelined:
            raise UnsupportedConfigError(
                f"--prefix-match-unit {unit} with asynchronous scheduling: the copies of a hit "
                "inside a block (ALLOC-UNIT-3/-4) are defined for one chunk in flight per "
                "request; turn --async-scheduling off or unset --prefix-match-unit"
            )
        manager = functools.partial(KVCacheManager, settings=settings, prefix_match_unit=unit)
        self._kvcert_steps: list[tuple[Any, int]] = []  # outputs to arrive, with step numbers
        with _manager_class(manager):
            super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        hook_engine_core()  # the engine building this scheduler digests prompts with its hasher

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's step, numbered in the manager so that its output ends it alone."""
        step = self.kv_cache_manager.start_step()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        vars(self).setdefault("_kvcert_steps", []).append((output, step))
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """The step's KV is written: register its blocks (and those of earlier steps whose
        output was skipped), then let vLLM read the output (which may finish requests,
        releasing blocks that are now hittable); then the chunks scheduled while the step ran
        are the ones in flight."""
        self.kv_cache_manager.end_step(self._kvcert_step_of(scheduler_output))
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self.kv_cache_manager.start_pending(self.requests)
        return outputs

    def _kvcert_step_of(self, scheduler_output: Any) -> int | None:
        """The manager's number of the step `scheduler_output` came from; steps scheduled
        before it whose output never arrives end with it (vLLM reads outputs in order).
        None (every step so far) for an output this scheduler did not make."""
        steps: list[tuple[Any, int]] = vars(self).get("_kvcert_steps", [])
        for i, (output, step) in enumerate(steps):
            if output is scheduler_output:
                del steps[: i + 1]
                return step
        return None


class Scheduler(_KvcertManaged, vllm_scheduler.Scheduler):  # type: ignore[misc]
    """vLLM 0.33.0's synchronous Scheduler over kvcert's allocator."""

    def _check(self, vllm_config: Any) -> None:
        super()._check(vllm_config)
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            raise UnsupportedConfigError(
                "asynchronous scheduling is on: use kvcert.reference.vllm.AsyncScheduler, "
                "or run vLLM with --no-async-scheduling"
            )


class AsyncScheduler(_KvcertManaged, vllm_async.AsyncScheduler):  # type: ignore[misc]
    """vLLM 0.33.0's AsyncScheduler over kvcert's allocator: step N+1 is scheduled before
    step N's output arrives; its blocks are registered when its own output arrives."""
