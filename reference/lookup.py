"""What a lookup reads: each group's keys for a prompt, and the cache as the steps in flight
will leave it.

Implements HASH-DRAFT-1 (`Keying.chains`: a draft group under exact keying gets its own
chain) and HASH-MATCH-1 (`Keying.keys`: block j of a group is cached when its key is among
the group's served keys). `Layered` lets the hit search read a served map plus the keys
that steps in flight will register (or, under `unit U`, the tail keys), without copying
the map.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvcert.reference.block_pool import NULL_BLOCK
from kvcert.reference.config import CacheConfig, Kind
from kvcert.reference.hashing import Chain, ExtraKey, copy_chains
from kvcert.reference.keyindex import ServedMap


class Keying:
    """Per cache configuration: which digest chain keys each group's blocks."""

    def __init__(
        self, config: CacheConfig, digest: Callable[[bytes], Any], lookahead: list[int]
    ) -> None:
        self.config = config
        self.digest = digest
        self.lookahead = lookahead  # per group, the draft tokens its keys cover past a block
        self._sizes = [g.block_size for g in config.groups]
        base = [
            g.block_size
            for g, s in zip(config.groups, lookahead, strict=True)
            if not s and g.kind is not Kind.CROSS
        ]
        # under `unit U` the shared chain is digested at every multiple of U (tail keys)
        self.base_size = math.gcd(*base, config.hit_unit or 0) if base else 0
        self._plain: list[Chain | None] | None = None  # chains(()), copied for each prompt

    def chains(self, extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        """Per group, the digest chain keying its blocks. Implements HASH-DRAFT-1: a draft
        group under exact keying gets its own chain covering draft_reach tokens past each block;
        every other group shares one chain at the gcd of their block sizes. A prompt without
        extras (most) gets copies of chains made once, which cost less than making them."""
        if extras:
            return self._made(extras)
        if self._plain is None:
            self._plain = self._made(())
        return copy_chains(self._plain)

    def _made(self, extras: tuple[ExtraKey, ...]) -> list[Chain | None]:
        base = Chain(self.base_size, 0, extras, self.digest) if self.base_size else None
        chains: list[Chain | None] = []
        for group, lookahead in zip(self.config.groups, self.lookahead, strict=True):
            if group.kind is Kind.CROSS:
                chains.append(None)
            elif lookahead:  # under `unit U` digested at every multiple of U (its tail keys)
                size = self.config.hit_unit or group.block_size
                chains.append(Chain(size, lookahead, extras, self.digest))
            else:
                chains.append(base)
        return chains

    def unit_keys(self, chains: Sequence[Chain | None]) -> list[list[bytes]]:
        """Under `unit U`: per group the request's key at every multiple of U it reaches (a
        draft group's from its own chain at U), as kvcert.reference.unit_hits reads them.
        Implements HASH-UNIT-1: the digest after P tokens certifies exactly tokens [0, P),
        so a tail key (P inside a block) never equals a block key (P a block end)."""
        unit = self.config.hit_unit or self.base_size
        return [[] if c is None else c.keys(unit) for c in chains]

    def keys(self, chains: Sequence[Chain | None]) -> list[list[bytes]]:
        """Implements HASH-MATCH-1 with the pool's map: per group the request's key of each
        block, looked up in that group's served keys (block j is cached when it is there)."""
        return [
            [] if c is None else c.keys(size) for c, size in zip(chains, self._sizes, strict=True)
        ]


class Layered:
    """One group's served map read through two: the first wins a key both hold. The hit
    search reads the pool's map over the keys steps in flight will register (the cached block
    was registered first), and under `unit U` block keys over tail keys (disjoint: a digest
    names one length)."""

    __slots__ = ("_now", "_pending")

    def __init__(self, now: ServedMap[bytes], pending: ServedMap[bytes]) -> None:
        self._now, self._pending = now, pending

    def get(self, key: bytes, default: int, /) -> int:
        block = self._now.get(key, NULL_BLOCK)
        return block if block != NULL_BLOCK else self._pending.get(key, default)

    def prefix(self, keys: Sequence[bytes], cap: int) -> list[int]:
        """The blocks serving keys[0], keys[1], ... up to the first key neither map serves
        (at most `cap`), as the hit search's generic scan reads them through `get`: the
        first map's own run in one call where it scans one (the compiled index), then key
        by key through both maps' own `get`, up to the first miss. A search once the steps
        in flight end reads a long cached prefix here, and the keys those steps add are
        few: the generic scan's runs of 64 would call `get` here past that miss."""
        scan = getattr(self._now, "prefix", None)
        blocks: list[int] = [] if scan is None else scan(keys, cap)
        now, pending = self._now.get, self._pending.get
        for key in keys[len(blocks) : max(cap, 0)]:
            block = now(key, NULL_BLOCK) or pending(key, NULL_BLOCK)
            if block == NULL_BLOCK:
                break
            blocks.append(block)
        return blocks

    def __getitem__(self, key: bytes, /) -> int:
        block = self.get(key, NULL_BLOCK)
        if block == NULL_BLOCK:
            raise KeyError(key)
        return block

    def __contains__(self, key: object, /) -> bool:
        return key in self._now or key in self._pending

    def __len__(self) -> int:
        return len(self._now) + sum(1 for key, _ in self._pending.items() if key not in self._now)

    def items(self) -> Iterable[tuple[bytes, int]]:
        yield from self._now.items()
        yield from ((k, b) for k, b in self._pending.items() if k not in self._now)
