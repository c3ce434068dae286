# Decode steps' table changes and registrations, and an admission's first chunk, compiled
# (reference/_decodelane.c); the general paths of KVCacheManager.extend and admit and
# commit.Registrar.register define them (kvcert.reference.decode_lane).
from array import array
from collections.abc import Callable
from typing import Any

from kvcert.reference.requests import Scheduled

class DecodeLane:
    def __init__(
        self,
        *,
        kinds: tuple[int, ...],
        sizes: tuple[int, ...],
        spans: tuple[int, ...],
        spares: tuple[int, ...],
        every_state: tuple[int, ...],
        limit: int | None,
        key_lookahead: tuple[int, ...],
        commit_delay: tuple[int, ...],
        unit: int,
        pool: object,
        counts: array[int],
        links: array[int],
        keys: object,
        evictions: list[int],
        dead_evictions: list[int],
        no_blocks: tuple[tuple[int, ...], ...],
        token_limit: int,
        scheduled: type[Scheduled],
        quiet_steps: dict[int, Scheduled],
        same_pass: bool,
        registers: bool,
        commits: object,
    ) -> None: ...
    def extend(
        self,
        requests: dict[str, Any],
        rid: object,
        budget: object,
        appended: object,
        lookahead: object,
        step: object,
        checkpoint: object,
        in_flight: dict[str, int],
        current: int,
        /,
    ) -> Scheduled | None: ...
    def admit(
        self,
        request: Any,
        rid: str,
        hits: list[int],
        reviving: int,
        keep_free: int,
        fit_tokens: int | None,
        fit_keep_free: int,
        requests: dict[str, Any],
        in_flight: dict[str, int],
        current: int,
        /,
    ) -> Scheduled | None: ...
    def register(self, request: object, before: int, /) -> int | None: ...
    def publish(self, request: object, /) -> int | None: ...
    def take_published(self) -> int: ...
    def end_chunks(
        self, ending: list[str], requests: dict[str, Any], /
    ) -> list[tuple[str, Any, int]]: ...
    def end_step(self, core: object, step: int | None, /) -> int | None: ...

class DropIn:
    """The vLLM drop-in's allocate_slots (the object, called), start_pending and end_step for
    decode chunks (kvcert.reference.vllm.lane)."""

    def __init__(
        self,
        *,
        manager: object,
        general: Callable[..., Any],
        pending: Callable[..., Any],
        start_chunk: Callable[..., Any],
        end_step: Callable[..., Any],
        state_columns: tuple[tuple[int, int], ...],
        token_list: type | None,
    ) -> None: ...
    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any: ...
    def start_pending(self, requests: Any, /) -> None: ...
    def end_step(self, step: int | None = None) -> int: ...

def wrap_blocks(
    views: list[Any],
    tables: object,
    blocks_class: Callable[[tuple[list[Any], ...]], Any],
    empty: Any,
    /,
) -> Any | None: ...
