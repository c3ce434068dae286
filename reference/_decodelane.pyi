# Decode steps that change tables, compiled (reference/_decodelane.c); the general path of
# kvcert.reference.manager.KVCacheManager.extend defines them (kvcert.reference.decode_lane).
from array import array

class DecodeLane:
    def __init__(
        self,
        *,
        kinds: tuple[int, ...],
        sizes: tuple[int, ...],
        spans: tuple[int, ...],
        limit: int | None,
        pool: object,
        counts: array[int],
        links: array[int],
        keys: object,
        evictions: list[int],
        dead_evictions: list[int],
        no_blocks: tuple[tuple[int, ...], ...],
        token_limit: int,
    ) -> None: ...
    def advance(
        self, request: object, budget: object, appended: object, lookahead: object, /
    ) -> tuple[tuple[int, ...], ...] | None: ...
