"""The hit queries of a KVCacheManager: what a prompt would get now or once the steps in
flight have ended, and where its attention prefix ends. They take nothing (the manager's
`admit` takes the hit `_hit` finds); kvcert.reference.coordinator is the search they run.
"""

from __future__ import annotations

import weakref
from array import array
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar, cast

from kvcert.reference import inputs
from kvcert.reference.coordinator import BLOCK_IDS, Keys, Served, find_hit
from kvcert.reference.hashing import ExtraKey
from kvcert.reference.inspection import Inspection
from kvcert.reference.lookup import Keying
from kvcert.reference.requests import Prompt
from kvcert.reference.tails import Maps
from kvcert.reference.unit_hits import Hit, find_unit_hit

T = TypeVar("T")
PackedSearch: TypeAlias = "Callable[..., tuple[int, list[array[int]]]]"  # find_hit, packed


def capped(search: Callable[[int | None], tuple[int, T]], max_hit: int | None) -> tuple[int, T]:
    """The hit at most `max_hit` tokens: when the uncapped hit exceeds the cap, the largest
    length below it that every group accepts (the search's `limit`), not a cut of it."""
    found = search(None)
    if max_hit is not None and found[0] > max_hit:
        found = search(max_hit)
    return found


class HitQueries(Inspection):
    """The lookups; the manager supplies its keying and counts the probes."""

    search = staticmethod(find_hit)  # the hybrid hit search (a benchmark baseline swaps it)
    _keying: Keying
    _probes: int  # lookups asked (Stats)
    # the last uncapped search: its prompt (weakly: a memo keeps no prompt alive), what
    # else it read (search, pool, the pool's changes) and its answer, tables copied
    _last_search: tuple[weakref.ref[Prompt], tuple[object, ...], int, list[list[int]]] | None
    _last_search = None

    def _probed(
        self, tokens: Sequence[int] | Prompt, extras: Sequence[ExtraKey], max_hit: int | None
    ) -> Prompt:
        """A lookup's prompt, its cap checked and the probe counted (Stats.probes)."""
        prompt = self._prepared(tokens, extras)
        inputs.counts(max_hit=max_hit)
        self._probes += 1
        return prompt

    def lookup(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The hit a prompt would get now, taking nothing; `max_hit` caps it (see `admit`)."""
        prompt = self._probed(tokens, extras, max_hit)
        # a Prompt made here dies with this call: nothing could take its search later
        hit, tables = self._hit(prompt, max_hit, spend=prompt is not tokens)
        return hit, tuple(map(tuple, tables))

    def hit_length(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> int:
        """`lookup`'s hit alone: an engine asking again whether a request still gets the hit
        it looked up (the search is remembered, and no table is copied out)."""
        prompt = self._probed(tokens, extras, max_hit)
        return self._hit(prompt, max_hit, spend=prompt is not tokens, tables=False)[0]

    def lookup_packed(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> tuple[int, tuple[array[int], ...]]:
        """`lookup`'s answer with each block table an int32 array (typecode "i"), which numpy
        or torch take without a copy: a long hit's Python ints (one per block and group) cost
        more than its search."""
        prompt = self._probed(tokens, extras, max_hit)
        if self._tails is not None:  # `unit U`: its search answers lists
            hit, lists = self._hit(prompt, max_hit)
            return hit, tuple(array(BLOCK_IDS, t) for t in lists)
        keys, served = self._keying.keys(prompt.chains), self.pool.served
        search = cast("PackedSearch", self.search)  # staticmethod keeps find_hit's 1st overload
        hit, tables = capped(
            lambda limit: search(self.config, len(prompt), keys, served, limit=limit, packed=True),
            max_hit,
        )
        return hit, tuple(tables)

    def _hit(
        self,
        prompt: Prompt,
        max_hit: int | None,
        after: Maps | None = None,
        *,
        spend: bool = False,
        tables: bool = True,
    ) -> Hit:
        """The hybrid hit of `prompt`, at most `max_hit` tokens: the largest length below
        the cap that every group accepts when the hit exceeds it (find_hit's `limit`);
        under `unit U` over the served maps `after` the steps in flight, when given.
        `spend`: the caller takes the hit (an admission), or nobody can ask again of this
        Prompt (one made for the call), see `_uncapped`. Without `tables` the caller reads
        the length alone (the tables may then be empty)."""
        if self._tails is not None:  # `unit U`: every key at a multiple of U, tails too
            units = self._keying.unit_keys(prompt.chains)
            top = len(prompt) if max_hit is None else min(len(prompt), max_hit + 1)
            maps, flying = (self._tails.served, self._tails.flying) if after is None else after
            return find_unit_hit(self.config, top, units, maps, flying)
        found = self._remembered(prompt, spend, copied=tables)
        if found is not None and (max_hit is None or found[0] <= max_hit):
            return found  # the keys are read only for a search
        keys, served = self._keying.keys(prompt.chains), self.pool.served
        return capped(
            lambda limit: (
                (found if found is not None else self._uncapped(prompt, keys, served, spend))
                if limit is None
                else self.search(self.config, len(prompt), keys, served, limit=limit)
            ),
            max_hit,
        )

    def _remembered(self, prompt: Prompt, spend: bool, *, copied: bool) -> Hit | None:
        """The remembered uncapped search of `prompt` (`_uncapped`) when it still stands, else
        None: the caller gets tables of its own (none unless `copied`); a `spend`ing caller
        takes the remembered ones and leaves nothing remembered (a memo kept after an
        admission would hold its tables for nothing)."""
        last, pool = self._last_search, self.pool
        if last is None or last[0]() is not prompt or last[1] != (self.search, pool, pool.changes):
            return None
        if spend:
            self._last_search = None
            return last[2], last[3]
        return last[2], list(map(list, last[3])) if copied else []

    def _uncapped(
        self, prompt: Prompt, keys: Keys[bytes], served: Served[bytes], spend: bool
    ) -> Hit:
        """The search's uncapped answer for `prompt`, remembered while the pool's key index
        has not changed since (its `changes` count stands still only while every served map
        does, and the search reads nothing else of the cache; `_remembered` answers from
        it): an engine's lookup and the admission right after it search once. A `spend`ing
        caller (an admission, or a Prompt nobody can ask of again) leaves nothing
        remembered."""
        hit, tables = self.search(self.config, len(prompt), keys, served)
        if not spend:
            asked = (self.search, self.pool, self.pool.changes)
            self._last_search = (weakref.ref(prompt), asked, hit, list(map(list, tables)))
        return hit, tables

    def lookup_after_steps(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        max_hit: int | None = None,
    ) -> int:
        """The hit `tokens` would get once every step in flight has ended: the blocks their
        chunks complete join the cache then (ALLOC-COMMIT-1) and count here already. An
        engine that would rather hold a request back a step than admit it without them asks
        this; `lookup` keeps them out until then (ALLOC-VIS-1)."""
        prompt = self._prepared(tokens, extras)
        inputs.counts(max_hit=max_hit)
        if self._tails is not None:  # `unit U`: the tail keys those steps register count too
            return self._hit(prompt, max_hit, (self._maps_after_steps(), ()))[0]
        keys = self._keying.keys(prompt.chains)
        served = self._served_after_steps(keys)
        if served is None:  # the steps in flight register none of its keys: as `lookup`
            return self._hit(prompt, max_hit)[0]
        return capped(
            lambda limit: self.search(self.config, len(prompt), keys, served, limit=limit),
            max_hit,
        )[0]

    def branch_point(
        self,
        tokens: Sequence[int] | Prompt,
        extras: Sequence[ExtraKey] = (),
        *,
        after_steps: bool = False,
    ) -> int:
        """Where the attention groups' cached prefix of `tokens` ends, aligned for every group:
        the length a `branch` placement checkpoints state at. Implements BRANCH-1.
        `after_steps`: as the cache will be once the steps in flight have ended (a prefix
        another request is writing now is where this one will leave it too)."""
        prompt = self._prepared(tokens, extras)
        self._probes += 1
        keys = self._keying.keys(prompt.chains)
        served = self._served_after_steps(keys) if after_steps else None
        return find_hit(
            self.config, len(prompt), keys, served or self.pool.served, ignore_state=True
        )[0]
