"""Obligations for the hit-granularity profile `unit U` (HIT-UNIT-1..3, HIT-UNIT-5).

A group is symbolic: kind (full, sliding window, chunked local, state), block size in SIZES,
unit in UNITS (dividing it), window, chunk, one Bool per block (cached in full), one Bool per
block (in flight: cached, its pass not run, same-pass only) and one Bool per position (held
under a partial key; only positions inside a block on the unit grid can be). Lengths are
concrete (0..LMAX), so every `//` and `%` is by a constant.

The claims are stated per token, not per unit or block, so they check the rule's block
arithmetic: which units a kind needs, which block holds each, how far a partial key reaches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import AGREES, COUNTEREXAMPLE, PROVED, Obligation
from kvcert.conformance.checks.proofs.core import evaluate as value_of
from kvcert.spec import ChunkedLocal, FullAttention, Layout, MambaState, SlidingWindow
from kvcert.spec.acceptance import group_accepts

SIZES = (2, 4)
UNITS = (1, 2)
CHUNKS = (2, 3, 4)
LMAX = 8
FULL, SW, CHUNKED, STATE = 0, 1, 2, 3
KINDS = (FULL, SW, CHUNKED, STATE)

# how a tail block's partial keys hold a unit: the rule, and two broken readings
COVERING = "covering"  # a key at P >= the unit's end (HIT-UNIT-2)
ANY_KEY = "any-key"  # any partial key in the block, however short (serves unwritten tokens)
EXACT_KEY = "exact-key"  # only a key at exactly the hit (a lookup probing the hit's own key)
IGNORE_FLIGHT = "ignore-flight"  # a block in flight copied like a written one (no HIT-UNIT-5)


@dataclass(frozen=True)
class UnitGroup:
    kind: Any
    size: Any
    unit: Any
    window: Any
    chunk: Any
    cached: tuple[Any, ...]  # block j cached in full
    partial: tuple[Any, ...]  # position p (index p) held under a partial key
    flight: tuple[Any, ...]  # block j cached but in flight (HIT-UNIT-5)


def _group() -> tuple[UnitGroup, list[Any]]:
    kind, size, unit, window, chunk = z3.Ints("kind size unit window chunk")
    cached = tuple(z3.Bools(" ".join(f"c{j}" for j in range(LMAX))))
    partial = tuple(z3.Bools(" ".join(f"p{p}" for p in range(LMAX + 1))))
    flight = tuple(z3.Bools(" ".join(f"f{j}" for j in range(LMAX))))
    domain = [
        z3.Or([kind == k for k in KINDS]),
        z3.Or([size == s for s in SIZES]),
        z3.Or([unit == u for u in UNITS]),
        window >= 1,
        window <= 2 * LMAX,
        z3.Or([chunk == c for c in CHUNKS]),
        z3.Not(partial[0]),
        *(z3.Implies(flight[j], cached[j]) for j in range(LMAX)),
    ]
    for p in range(1, LMAX + 1):  # a partial key sits on the unit grid, inside a block
        on_grid = z3.Or([z3.And(unit == u, p % u == 0) for u in UNITS])
        inside = z3.Or([z3.And(size == s, p % s != 0) for s in SIZES])
        domain.append(z3.Implies(partial[p], z3.And(on_grid, inside)))
    return UnitGroup(kind, size, unit, window, chunk, cached, partial, flight), domain


def _first_needed_token(group: UnitGroup, length: int) -> Any:
    """The first token a hit of `length` reads, per attention kind (HIT-FULL-1, HIT-SW-1,
    HIT-CHUNK-1 stated per token)."""
    reach = length - (group.window - 1)
    chunk_start = z3.Sum([z3.If(group.chunk == c, length // c * c, 0) for c in CHUNKS])
    return z3.If(
        group.kind == SW, z3.If(reach > 0, reach, 0), z3.If(group.kind == CHUNKED, chunk_start, 0)
    )


def _held(group: UnitGroup, size: int, end: int, length: int, reading: str) -> Any:
    """Whether the block holding token end - 1 holds tokens up to `end` (block size `size`);
    a block in flight does not when the hit ends inside it (HIT-UNIT-5)."""
    block = (end - 1) // size
    keys = range(block * size + 1, (block + 1) * size)
    if reading == ANY_KEY:
        partial = [group.partial[p] for p in keys if p <= LMAX]
    elif reading == EXACT_KEY:
        partial = [group.partial[p] for p in keys if p == length]
    else:
        partial = [group.partial[p] for p in keys if p >= end and p <= LMAX]
    whole = group.cached[block]
    if reading != IGNORE_FLIGHT and length % size and block == length // size:
        whole = z3.And(whole, z3.Not(group.flight[block]))
    return z3.Or(whole, *partial)


def _checkpoint_at(group: UnitGroup, length: int, size: int) -> Any:
    """HIT-UNIT-3: a state checkpoint at exactly `length` (none needed at 0)."""
    if length == 0:
        return z3.BoolVal(True)
    if length % size == 0:
        return group.cached[length // size - 1]
    return group.partial[length]


def accepts(group: UnitGroup, length: int, reading: str = COVERING) -> Any:
    """HIT-UNIT-2 and HIT-UNIT-3 for one symbolic group at a concrete length."""
    branches = []
    for size in SIZES:
        for unit in UNITS:
            if size % unit or length % unit:
                continue
            first = _first_needed_token(group, length)
            units = [
                z3.Implies(first < (u + 1) * unit, _held(group, size, (u + 1) * unit, length,
                                                         reading))
                for u in range(length // unit)
            ]  # fmt: skip
            rule = z3.If(group.kind == STATE, _checkpoint_at(group, length, size), z3.And(units))
            branches.append(z3.And(group.size == size, group.unit == unit, rule))
    return z3.Or(branches) if branches else z3.BoolVal(False)


def sound(reading: str = COVERING) -> Any:
    """Every accepted length reads only written tokens: each token t the kind reads before L
    lies in a block cached in full or held under a partial key past t; a state hit has a
    checkpoint at exactly L. `reading` ANY_KEY: a shorter key in the block counts (twin)."""

    def build() -> tuple[list[Any], Any]:
        group, domain = _group()
        claims = []
        for length in range(LMAX + 1):
            for size in SIZES:
                token_ok = []
                for t in range(length):
                    block = t // size
                    later = [group.partial[p] for p in range(t + 1, (block + 1) * size)
                             if p <= LMAX]  # fmt: skip
                    written = z3.Or(group.cached[block], *later)
                    token_ok.append(z3.Implies(_first_needed_token(group, length) <= t, written))
                state = _checkpoint_at(group, length, size)
                safe = z3.If(group.kind == STATE, state, z3.And(token_ok))
                claims.append(
                    z3.Implies(z3.And(group.size == size, accepts(group, length, reading)), safe)
                )
        return domain, z3.And(claims)

    return build


def copies_written(reading: str = COVERING) -> Any:
    """A hit ending inside a block copies KV an earlier pass wrote: every token the kind reads
    in that block lies under a partial key past it or in the block cached in full and not in
    flight. `reading` IGNORE_FLIGHT: a block in flight is copied like a written one (twin)."""

    def build() -> tuple[list[Any], Any]:
        group, domain = _group()
        claims = []
        for length in range(1, LMAX + 1):
            for size in SIZES:
                if not length % size:
                    continue
                block = length // size
                first = _first_needed_token(group, length)
                written = []
                for t in range(block * size, length):
                    later = [group.partial[p] for p in range(t + 1, (block + 1) * size)
                             if p <= LMAX]  # fmt: skip
                    copyable = z3.And(group.cached[block], z3.Not(group.flight[block]))
                    written.append(z3.Implies(first <= t, z3.Or(copyable, *later)))
                copied = z3.And(group.size == size, group.kind != STATE)
                claims.append(
                    z3.Implies(z3.And(copied, accepts(group, length, reading)), z3.And(written))
                )
        return domain, z3.And(claims)

    return build


def full_downward(reading: str = COVERING) -> Any:
    """A full-attention group with no block in flight accepting L accepts every shorter
    multiple of the unit: a block cached past the hit serves every prefix of it. `reading`
    EXACT_KEY: a lookup that finds a tail only under the hit's own key loses them (twin).
    With a block in flight it does not hold (HIT-UNIT-5 refuses lengths inside that block),
    which is why kvcert.reference's unit search checks full groups below its cap then."""

    def build() -> tuple[list[Any], Any]:
        group, domain = _group()
        claims = []
        for length in range(LMAX + 1):
            for shorter in range(length):
                on_grid = z3.Or([z3.And(group.unit == u, shorter % u == 0) for u in UNITS])
                claims.append(
                    z3.Implies(
                        z3.And(accepts(group, length, reading), on_grid),
                        accepts(group, shorter, reading),
                    )
                )
        no_flight = [z3.Not(f) for f in group.flight]
        return [*domain, *no_flight, group.kind == FULL], z3.And(claims)

    return build


def _concrete(kind: int, size: int, window: int, chunk: int) -> Any:
    return {
        FULL: FullAttention(size),
        SW: SlidingWindow(size, window),
        CHUNKED: ChunkedLocal(size, chunk),
        STATE: MambaState(size),
    }[kind]


def drift() -> None:
    """The encoding against kvcert.spec.acceptance on random concrete groups."""
    rng = random.Random(11)
    group, _ = _group()
    for _ in range(150):
        kind, size = rng.choice(KINDS), rng.choice(SIZES)
        unit = rng.choice([u for u in UNITS if size % u == 0])
        window, chunk = rng.randint(1, 2 * LMAX), rng.choice(CHUNKS)
        concrete = _concrete(kind, size, window, chunk)
        Layout((concrete,), hit_unit=unit)  # the spec accepts this layout
        cached = frozenset(j for j in range(LMAX) if rng.random() < 0.7)
        partial = frozenset(
            p for p in range(unit, LMAX + 1, unit) if p % size and rng.random() < 0.4
        )
        values: dict[str, int | bool] = {
            "kind": kind, "size": size, "unit": unit, "window": window, "chunk": chunk,
        }  # fmt: skip
        flight = frozenset(j for j in cached if kind != STATE and rng.random() < 0.3)
        values |= {f"c{j}": j in cached for j in range(LMAX)}
        values |= {f"p{p}": p in partial for p in range(LMAX + 1)}
        values |= {f"f{j}": j in flight for j in range(LMAX)}
        for length in range(LMAX + 1):
            got = value_of(accepts(group, length), **values)
            want = group_accepts(
                concrete, cached, length, unit=unit, partial=partial, in_flight=flight
            )
            assert got == want, f"HIT-UNIT encoding {got} != spec {want} at {values} L={length}"


OBLIGATIONS = (
    Obligation("THM-UNIT-SOUND", ("HIT-UNIT-2", "HIT-UNIT-3"),
               "full, window, chunked, state; blocks 2/4, units 1/2; lengths <= 8", PROVED, "pr",
               sound(), about="a unit hit reads only tokens a cached block or longer key holds"),
    Obligation("TWIN-UNIT-ANY-KEY", ("HIT-UNIT-2",), "as THM-UNIT-SOUND", COUNTEREXAMPLE, "pr",
               sound(ANY_KEY), twin_of="THM-UNIT-SOUND",
               about="a shorter partial key in the tail block serves tokens nobody wrote"),
    Obligation("THM-UNIT-FULL-DOWN", ("HIT-UNIT-2",), "full; blocks 2/4, units 1/2; lengths <= 8",
               PROVED, "pr", full_downward(),
               about="full attention under unit U accepts every multiple of U below a hit"),
    Obligation("TWIN-UNIT-EXACT-KEY", ("HIT-UNIT-2",), "as THM-UNIT-FULL-DOWN", COUNTEREXAMPLE,
               "pr", full_downward(EXACT_KEY), twin_of="THM-UNIT-FULL-DOWN",
               about="probing only the hit's own key loses the tails a longer key holds"),
    Obligation("THM-UNIT-PASS", ("HIT-UNIT-5", "HIT-UNIT-2"), "as THM-UNIT-SOUND", PROVED,
               "pr", copies_written(),
               about="a hit ending inside a block copies only KV an earlier pass wrote"),
    Obligation("TWIN-UNIT-COPY-IN-FLIGHT", ("HIT-UNIT-5",), "as THM-UNIT-PASS", COUNTEREXAMPLE,
               "pr", copies_written(IGNORE_FLIGHT), twin_of="THM-UNIT-PASS",
               about="copying a block in flight reads KV its pass has not written"),
    Obligation("DRIFT-UNIT", ("HIT-UNIT-2", "HIT-UNIT-3", "HIT-UNIT-5"),
               "150 random concrete groups", AGREES, "pr", drift,
               about="the unit encoding equals kvcert.spec.acceptance"),
)  # fmt: skip
