"""Read-only views of a KVCacheManager's state: tables, cached blocks, running requests.

They answer an engine's questions between calls (which block a request holds where, which
block a lookup would get) without changing anything; kvcert.reference.manager holds the
state and the operations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvcert.reference import inputs
from kvcert.reference.block_pool import NULL_BLOCK, BlockPool
from kvcert.reference.commit import Registrar
from kvcert.reference.config import CacheConfig
from kvcert.reference.errors import RequestStateError
from kvcert.reference.groups import checkpoint_position
from kvcert.reference.hashing import ExtraKey
from kvcert.reference.keyindex import ServedMap
from kvcert.reference.requests import Prompt, Request
from kvcert.reference.tails import Tails


class Inspection:
    """The views; the manager supplies its state and the two lookups they share."""

    config: CacheConfig
    pool: BlockPool
    _requests: dict[str, Request]
    _running: Callable[[str], Request]  # the running request, or UnknownRequestError
    _prepared: Callable[[Sequence[int] | Prompt, Sequence[ExtraKey]], Prompt]
    _tails: Tails | None  # `unit U`: the tail keys (ALLOC-UNIT-2)
    _in_flight: dict[str, int]  # the requests with a chunk in flight
    _served_after_steps: Callable[..., list[ServedMap[bytes]] | None]
    _commits: Registrar  # what a chunk registers when its step ends (ALLOC-COMMIT-1)

    def block_tables(self, rid: str) -> tuple[tuple[int, ...], ...]:
        """The request's block table per group (NULL_BLOCK = 0 where nothing is held)."""
        return tuple(map(tuple, self._running(rid).tables))

    def table_tails(
        self, rid: str, starts: Sequence[int]
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """Each group's table from `starts[g]` on (what an engine whose worker holds that
        many entries appends), and each table's length, at a cost proportional to the tails,
        not the tables."""
        tables = self._running(rid).tables
        if type(starts) not in (list, tuple) or len(starts) != len(tables):
            raise RequestStateError(
                f"table starts are a list of one position per group ({len(tables)}), got {starts!r}"
            )
        for start in starts:
            inputs.position(start, "a table start")
        tails = tuple(tuple(t[s:]) for t, s in zip(tables, starts, strict=True))
        return tails, tuple(map(len, tables))

    def cached_block(
        self, prompt: Sequence[int] | Prompt, group: int, end: int, *, after_steps: bool = False
    ) -> int | None:
        """The block a lookup gets for group `group`'s block of `prompt` ending at token `end`
        (ALLOC-LOOKUP-1), or under `unit U` the block holding its tail key at an `end` inside
        a block (ALLOC-UNIT-2); None when nothing is cached there or no key ends there.
        `after_steps`: once every step in flight has ended (the keys their chunks register
        then count already, as in `lookup_after_steps`)."""
        prepared, size = self._prepared(prompt, ()), self._group_size(group)
        inputs.position(end, "end")
        chain, unit = prepared.chains[group], self.config.hit_unit
        if chain is None or not 0 < end <= len(prepared):
            return None
        if end % size == 0:
            key = chain.key(size, end // size - 1)
        elif unit is not None and end % unit == 0:
            key = chain.key(unit, end // unit - 1)
        else:
            return None
        maps = self._maps_after_steps() if after_steps else self._maps_now()
        block = NULL_BLOCK if key is None else maps[group].get(key, NULL_BLOCK)
        return None if block == NULL_BLOCK else block

    def _maps_now(self) -> Sequence[ServedMap[bytes]]:
        """Per group, what a lookup reads now: block keys, then under `unit U` tail keys."""
        return self.pool.served if self._tails is None else self._tails.served

    def _maps_after_steps(self) -> Sequence[ServedMap[bytes]]:
        """As `_maps_now`, once every step in flight has ended (ALLOC-COMMIT-1, ALLOC-UNIT-2)."""
        served = self._served_after_steps() or self.pool.served
        if self._tails is None:
            return served
        return self._tails.served_after(served, self._chunks_in_flight())

    def keys_after_steps(self) -> dict[int, tuple[int, bytes] | None]:
        """Block -> (group, key) for each key a chunk in flight registers when its step ends
        (ALLOC-COMMIT-1; under `unit U` its tail keys too, ALLOC-UNIT-2, and the tail keys
        ALLOC-UNIT-4 moves then: None for the block that loses one): what an engine that
        keys blocks as it schedules them already shows on them."""
        chunks = self._chunks_in_flight()
        pending: list[dict[bytes, int]] = [{} for _ in self.config.groups]
        for request in chunks:
            self._commits.pending_keys(request, pending)
        moves: dict[int, tuple[int, bytes] | None] = {}
        if self._tails is not None:
            for g, tails in enumerate(self._tails.pending(chunks)):
                for key, block in tails.items():
                    pending[g].setdefault(key, block)
            moves = self._tails.moving(chunks)
        keyed = {block: (g, key) for g, keys in enumerate(pending) for key, block in keys.items()}
        return {**keyed, **moves}

    def _chunks_in_flight(self) -> list[Request]:
        """The running requests with a chunk scheduled and not yet ended."""
        return [r for rid in self._in_flight if (r := self._requests.get(rid)) and r.scheduled]

    def _group_size(self, group: int) -> int:
        count = len(self.config.groups)
        if type(group) is not int or not 0 <= group < count:
            raise RequestStateError(f"group must be in [0, {count}) (a group index), got {group!r}")
        return self.config.groups[group].block_size

    def running(self) -> tuple[str, ...]:
        """The ids of the requests holding blocks, in admission order."""
        return tuple(self._requests)

    def checkpoint_position(self, rid: str, group: int, checkpoint: int) -> int:
        """The table position of state group `group` at which running request `rid`'s chunk in
        flight saves the inner checkpoint `checkpoint`: the block ending there (CKPT-INNER-1),
        or for a position inside a block the one before the running position (CKPT-INNER-2)."""
        size = self._group_size(group)
        inputs.position(checkpoint, "checkpoint")
        request = self._running(rid)
        return checkpoint_position(size, checkpoint, request.computed + request.scheduled)

    def scheduled_checkpoints(self, rid: str) -> tuple[int, ...]:
        """Request `rid`'s inner checkpoints (CKPT-INNER-1) in chunks not yet ended."""
        return tuple(self._running(rid).checkpoints)

    def considered_positions(self, rid: str, group: int) -> int:
        """How many leading positions of group `group`'s table running request `rid` has had
        considered for caching: each registered (under same-pass visibility also published
        for the chunk in flight, ALLOC-VIS-2), or passed over (a position retention does not
        keep)."""
        self._group_size(group)  # a valid group index
        return self._running(rid).registered[group]

    def block_at(self, rid: str, group: int, position: int) -> int:
        """The block running request `rid` holds at `position` of group `group`'s table
        (NULL_BLOCK where it holds none, or past the table's end)."""
        table = self._group_table(rid, group)
        inputs.position(position, "position")
        return table[position] if position < len(table) else NULL_BLOCK

    def holds(self, rid: str, group: int, start: int, stop: int) -> bool:
        """Whether running request `rid` holds a block at every position in [start, stop) of
        group `group`'s table."""
        table = self._group_table(rid, group)
        inputs.position(start, "start")
        inputs.position(stop, "stop")
        return stop <= len(table) and NULL_BLOCK not in table[start:stop]

    def first_unheld(self, rid: str, spans: Sequence[tuple[int, int, int]]) -> int | None:
        """The index of the first (group, start, stop) of `spans` where running request
        `rid` lacks a block at some position of [start, stop) (`holds` is False), or None
        where it holds them all: one question for an engine that checks several groups'
        columns every step."""
        tables = self._running(rid).tables
        if type(spans) not in (list, tuple):
            raise RequestStateError(f"spans are a list of (group, start, stop), got {spans!r}")
        groups = len(self.config.groups)
        for k, span in enumerate(spans):
            if type(span) not in (list, tuple) or len(span) != 3:
                raise RequestStateError(f"a span is (group, start, stop), got {span!r}")
            group, start, stop = span
            if not (  # checked inline: engines ask this every step; the checks name the error
                type(group) is int
                and 0 <= group < groups
                and type(start) is int
                and start >= 0
                and type(stop) is int
                and stop >= 0
            ):
                self._group_size(group)
                inputs.position(start, "start")
                inputs.position(stop, "stop")
            table = tables[group]
            if stop > len(table) or NULL_BLOCK in table[start:stop]:
                return k
        return None

    def _group_table(self, rid: str, group: int) -> list[int]:
        request = self._running(rid)
        self._group_size(group)  # a valid group index
        return request.tables[group]
