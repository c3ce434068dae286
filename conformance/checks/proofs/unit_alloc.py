"""Obligations for the allocator's side of `unit U` (ALLOC-UNIT-2..4): a state block keyed
at a tail holds exactly the state its key names, whatever the steps after it do.

A state group's block is abstracted to the length whose state it holds (`content`) and, once
keyed at a tail (ALLOC-UNIT-2), the length its key names (`key`). Five steps cover what a
state group's blocks go through:

    allocate(slot, i)       pop free block i (ALLOC-EVICT-1: its key goes)
    write(slot, e, f)       the slot's chunk ends at e: its running block takes the state at
                            e; when that block is keyed, it is first copied into fresh block
                            f, which takes the key when the step ends and is released, cached
                            (ALLOC-UNIT-4: the running request's table only grows)
    key(slot)               the step ends where the running block's state is: key it there
    copy(slot, i, f)        a hit on keyed block i copies it into fresh block f (ALLOC-UNIT-3)
    release(slot)           drop the slot's reference; at zero the block joins the free queue

The obligation is inductive, like THM-POOL-STEP: from any state satisfying the invariants,
every enabled step leads to one satisfying them. Its twin writes the running block in place
even when it is keyed: the key then names a state the block no longer holds, so a later
hit copies the state of another length (a wrong output, not a lost hit).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.alloc import replaced_at
from kvcert.conformance.checks.proofs.core import AGREES, COUNTEREXAMPLE, PROVED, Obligation
from kvcert.spec import FullAttention, Layout, MambaMode, MambaState, SpecError
from kvcert.spec import alloc as spec

BLOCKS = 4  # physical ids 0 (null) .. 3
SLOTS = 2  # running state blocks of the requests


@dataclass(frozen=True)
class StatePool:
    rc: tuple[Any, ...]
    free: tuple[Any, ...]
    keyed: tuple[Any, ...]
    key: tuple[Any, ...]  # the length the block's tail key names
    content: tuple[Any, ...]  # the length whose state the block holds
    holds: tuple[Any, ...]  # per slot: its running block, 0 when none


def symbolic_pool(prefix: str) -> StatePool:
    def ints(name: str, n: int) -> tuple[Any, ...]:
        return tuple(z3.Int(f"{prefix}{name}{i}") for i in range(n))

    def bools(name: str, n: int) -> tuple[Any, ...]:
        return tuple(z3.Bool(f"{prefix}{name}{i}") for i in range(n))

    return StatePool(
        rc=ints("rc", BLOCKS),
        free=bools("free", BLOCKS),
        keyed=bools("keyed", BLOCKS),
        key=ints("key", BLOCKS),
        content=ints("content", BLOCKS),
        holds=ints("holds", SLOTS),
    )


def invariants(p: StatePool) -> Any:
    """INV-NULL-1, INV-REF-1, INV-FREE-1 and INV-KEY-1 as a state tail key reads it (the key
    names the state its block holds, so INV-COPY-1 holds for every copy made from it)."""
    count = [z3.Sum([z3.If(h == i, 1, 0) for h in p.holds]) for i in range(BLOCKS)]
    return z3.And(
        z3.Not(p.free[0]), z3.Not(p.keyed[0]), p.rc[0] == 0,  # INV-NULL-1
        *[z3.And(h >= 0, h < BLOCKS) for h in p.holds],
        *[p.rc[i] == count[i] for i in range(1, BLOCKS)],  # INV-REF-1
        *[p.free[i] == (p.rc[i] == 0) for i in range(1, BLOCKS)],  # INV-FREE-1
        *[z3.Implies(p.keyed[i], p.key[i] == p.content[i]) for i in range(BLOCKS)],  # INV-KEY-1
    )  # fmt: skip


def _fresh(p: StatePool, s: int, f: int, content: Any) -> StatePool:
    """Slot s takes free block f holding the state at `content`, without a key."""
    return replace(
        p,
        rc=replaced_at(p.rc, f, 1),
        free=replaced_at(p.free, f, False),
        keyed=replaced_at(p.keyed, f, False),
        content=replaced_at(p.content, f, content),
        holds=replaced_at(p.holds, s, f),
    )


def _released(p: StatePool, i: int) -> StatePool:
    count = p.rc[i] - 1
    return replace(p, rc=replaced_at(p.rc, i, count), free=replaced_at(p.free, i, count == 0))


def steps(p: StatePool, end: Any, in_place: bool) -> list[tuple[Any, StatePool]]:
    """(enabled condition, next state) for every step and argument; `end` is the length a
    chunk ends at (any), `in_place` the twin's bug."""
    out: list[tuple[Any, StatePool]] = []
    for s in range(SLOTS):
        for i in range(1, BLOCKS):
            held = p.holds[s] == i
            out.append((z3.And(p.holds[s] == 0, p.free[i]), _fresh(p, s, i, 0)))
            written = replace(p, content=replaced_at(p.content, i, end))
            if in_place:
                out.append((held, written))
            else:
                out.append((z3.And(held, z3.Not(p.keyed[i])), written))
                for f in range(1, BLOCKS):
                    if f != i:  # ALLOC-UNIT-4: f, a copy of i, takes the key; the chunk writes i
                        kept = replace(
                            written,
                            keyed=replaced_at(replaced_at(p.keyed, i, False), f, True),
                            key=replaced_at(p.key, f, p.key[i]),
                            content=replaced_at(written.content, f, p.content[i]),
                        )
                        out.append((z3.And(held, p.keyed[i], p.free[f]), kept))
            keyed = replace(
                p, keyed=replaced_at(p.keyed, i, True), key=replaced_at(p.key, i, p.content[i])
            )
            out.append((z3.And(held, z3.Not(p.keyed[i])), keyed))
            for f in range(1, BLOCKS):
                if f != i:  # ALLOC-UNIT-3: a hit on keyed block i copies it into f
                    copied = _fresh(p, s, f, p.content[i])
                    out.append((z3.And(p.holds[s] == 0, p.keyed[i], p.free[f]), copied))
            released = replace(_released(p, i), holds=replaced_at(p.holds, s, 0))
            out.append((held, released))
    return out


def kept(in_place: bool = False) -> Any:
    def build() -> tuple[list[Any], Any]:
        p = symbolic_pool("u_")
        end = z3.Int("end")
        claim = z3.And([z3.Implies(on, invariants(q)) for on, q in steps(p, end, in_place)])
        return [invariants(p), end >= 1], claim

    return build


# --- drift: the abstraction's key invariant on every state the spec reaches ---------------


def drift() -> None:
    """Random traces of the spec under `unit 1` over full attention and an align-mode state
    group: every state block keyed at a tail holds the state at its key's length (the spec's
    content is what its state was computed from: as many tokens as the state's length)."""
    rng = random.Random(13)
    layout = Layout((FullAttention(4), MambaState(4, MambaMode.ALIGN)), hit_unit=1)
    prompts = [tuple(range(1, 12)), (*range(1, 6), *range(40, 46))]
    seen = 0
    for _ in range(40):
        state = spec.initial_state(spec.PoolConfig(layout, 12))
        for _step in range(30):
            running = sorted(state.requests)
            roll = rng.random()
            rid = next((r for r in "abc" if r not in state.requests), "a")
            if running and roll < 0.4:
                rid = rng.choice(running)
                request = state.requests[rid]
                done = request.computed == len(request.tokens)
                tail = request.prompt - 1  # the tail boundary under unit 1
                budget = tail - request.computed if request.computed < tail else 1
                op: spec.Op = spec.Extend(rid, max(1, budget), (rng.randint(0, 3),) if done else ())
            elif running and roll < 0.7:
                op = spec.EndStep()
            elif running and roll < 0.8:
                op = spec.Finish(rng.choice(running))
            else:
                tokens = rng.choice(prompts)[: rng.randint(2, 11)]
                op = spec.Admit(rid, tokens, rng.choice([len(tokens) - 1, len(tokens)]))
            try:
                state, _ = spec.step(state, op)
            except SpecError:
                continue
            for block in state.blocks:
                if block.partial is not None and block.partial[0] == 1:
                    seen += 1
                    assert block.content is not None, "a keyed state block holds no state"
                    held = len(block.content[1])
                    assert held == block.partial_at, (
                        f"a state block keyed at {block.partial_at} holds the state at {held}"
                    )
    assert seen, "no trace keyed a state tail: the drift check checked nothing"


OBLIGATIONS = (
    Obligation("THM-UNIT-KEEP", ("ALLOC-UNIT-2", "ALLOC-UNIT-3", "ALLOC-UNIT-4", "INV-KEY-1",
               "INV-REF-1", "INV-FREE-1"), "3 blocks + null, 2 running slots, any lengths",
               PROVED, "pr", kept(),
               about="a state block keyed at a tail always holds the state its key names"),
    Obligation("TWIN-UNIT-OVERWRITE", ("ALLOC-UNIT-4", "INV-KEY-1"), "as THM-UNIT-KEEP",
               COUNTEREXAMPLE, "pr", kept(in_place=True), twin_of="THM-UNIT-KEEP",
               about="a chunk that writes a keyed state block in place: a later hit copies "
                     "the state of another length"),
    Obligation("DRIFT-UNIT-KEEP", ("ALLOC-UNIT-2", "ALLOC-UNIT-4"),
               "40 random spec traces of 30 steps under unit 1", AGREES, "pr", drift,
               about="every state tail key the spec registers names its block's state"),
)  # fmt: skip
