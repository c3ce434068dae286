"""Obligations for §6-§7: one allocator step preserves every invariant (a bounded pool).

The pool is abstracted to what the invariants talk about: per block a reference count, free
queue membership, whether it is registered (hittable) and with which content key, whether its
KV is written, and the content it was allocated for; per request slot the block it holds and
the content it wants there. Four steps cover the allocator's block-level moves:

    allocate(slot, i)  pop free block i for new content (ALLOC-EVICT-1: its old key goes)
    touch(slot, i)     take a registered block whose key is the slot's content (a hit)
    commit(i)          write and register a held block (ALLOC-COMMIT-1, ALLOC-VIS-1)
    release(slot)      drop a slot's reference; at zero the block joins the free queue

The obligation is inductive: from ANY state satisfying the invariants, each enabled step
leads to a state satisfying them (so every reachable state does).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import AGREES, COUNTEREXAMPLE, PROVED, Obligation
from kvcert.spec import FullAttention, Layout, SlidingWindow, SpecError
from kvcert.spec import alloc as spec
from kvcert.spec.invariants import violated

BLOCKS = 4  # physical ids 0 (null) .. 3
SLOTS = 4  # table entries of the running requests


@dataclass(frozen=True)
class Pool:
    rc: tuple[Any, ...]
    free: tuple[Any, ...]
    keyed: tuple[Any, ...]
    key: tuple[Any, ...]
    written: tuple[Any, ...]
    content: tuple[Any, ...]
    holds: tuple[Any, ...]  # per slot: block id, 0 when empty
    wants: tuple[Any, ...]  # per slot: the content it must hold


def symbolic_pool(prefix: str) -> Pool:
    def ints(name: str, n: int) -> tuple[Any, ...]:
        return tuple(z3.Int(f"{prefix}{name}{i}") for i in range(n))

    def bools(name: str, n: int) -> tuple[Any, ...]:
        return tuple(z3.Bool(f"{prefix}{name}{i}") for i in range(n))

    return Pool(
        rc=ints("rc", BLOCKS),
        free=bools("free", BLOCKS),
        keyed=bools("keyed", BLOCKS),
        key=ints("key", BLOCKS),
        written=bools("written", BLOCKS),
        content=ints("content", BLOCKS),
        holds=ints("holds", SLOTS),
        wants=ints("wants", SLOTS),
    )


def invariants(p: Pool) -> Any:
    """INV-NULL-1, INV-REF-1, INV-FREE-1, INV-KEY-1, INV-VIS-1, INV-HIT-1 on the abstraction."""
    count = [z3.Sum([z3.If(h == i, 1, 0) for h in p.holds]) for i in range(BLOCKS)]
    return z3.And(
        z3.Not(p.free[0]), z3.Not(p.keyed[0]), p.rc[0] == 0,  # INV-NULL-1
        *[z3.And(h >= 0, h < BLOCKS) for h in p.holds],
        *[p.rc[i] == count[i] for i in range(1, BLOCKS)],  # INV-REF-1
        *[p.free[i] == (p.rc[i] == 0) for i in range(1, BLOCKS)],  # INV-FREE-1
        *[z3.Implies(p.keyed[i], p.key[i] == p.content[i]) for i in range(BLOCKS)],  # INV-KEY-1
        *[z3.Implies(p.keyed[i], p.written[i]) for i in range(BLOCKS)],  # INV-VIS-1
        *[
            z3.Implies(p.holds[s] == i, p.content[i] == p.wants[s])
            for s in range(SLOTS)
            for i in range(1, BLOCKS)
        ],  # INV-HIT-1, strengthened to every held block so that it is inductive
    )  # fmt: skip


def replaced_at(values: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    """`values` with the item at `index` replaced (a symbolic state's next value)."""
    return tuple(value if i == index else v for i, v in enumerate(values))


@dataclass(frozen=True)
class Bugs:
    """Seeded bugs for the broken twins."""

    touch_keeps_free: bool = False  # a hit forgets to take the block off the free queue
    register_on_allocate: bool = False  # vLLM #41838: hittable before the KV is written
    keep_old_key: bool = False  # a reused block stays registered under its old key


def steps(p: Pool, bugs: Bugs) -> list[tuple[Any, Pool]]:
    """(enabled condition, next state) for every step and argument."""
    out: list[tuple[Any, Pool]] = []
    for s in range(SLOTS):
        for i in range(1, BLOCKS):
            allocated = replace(
                p,
                rc=replaced_at(p.rc, i, 1),
                free=replaced_at(p.free, i, False),
                keyed=replaced_at(p.keyed, i, True if bugs.register_on_allocate else (
                    p.keyed[i] if bugs.keep_old_key else False)),
                key=replaced_at(p.key, i, p.wants[s] if bugs.register_on_allocate else p.key[i]),
                written=replaced_at(p.written, i, False),
                content=replaced_at(p.content, i, p.wants[s]),
                holds=replaced_at(p.holds, s, i),
            )  # fmt: skip
            out.append((z3.And(p.holds[s] == 0, p.free[i]), allocated))
            touched = replace(
                p,
                rc=replaced_at(p.rc, i, p.rc[i] + 1),
                free=p.free if bugs.touch_keeps_free else replaced_at(p.free, i, False),
                holds=replaced_at(p.holds, s, i),
            )
            hit = z3.And(p.holds[s] == 0, p.keyed[i], p.key[i] == p.wants[s])
            out.append((hit, touched))
        for i in range(1, BLOCKS):
            released = replace(
                p,
                rc=replaced_at(p.rc, i, p.rc[i] - 1),
                free=replaced_at(p.free, i, p.rc[i] - 1 == 0),
                holds=replaced_at(p.holds, s, 0),
            )
            out.append((p.holds[s] == i, released))
    for i in range(1, BLOCKS):
        committed = replace(
            p,
            keyed=replaced_at(p.keyed, i, True),
            key=replaced_at(p.key, i, p.content[i]),
            written=replaced_at(p.written, i, True),
        )
        out.append((p.rc[i] > 0, committed))
    return out


def preserved(bugs: Bugs = Bugs()) -> Any:
    def build() -> tuple[list[Any], Any]:
        p = symbolic_pool("s_")
        claim = z3.And([z3.Implies(enabled, invariants(q)) for enabled, q in steps(p, bugs)])
        return [invariants(p)], claim

    return build


# --- drift: the abstraction's invariants hold on every state the spec reaches ------------


def project(state: spec.State, group: int) -> list[tuple[int, bool, bool]]:
    """(ref count, in the free queue, registered) per block."""
    return [
        (b.ref_count, i in state.free, b.key is not None and b.key[0] == group)
        for i, b in enumerate(state.blocks)
    ]


def drift() -> None:
    rng = random.Random(11)
    for _ in range(40):
        layout = Layout((FullAttention(2), SlidingWindow(2, 3)))
        state = spec.initial_state(spec.PoolConfig(layout, 6))
        for _step in range(30):
            op = _random_op(rng, state)
            try:
                state, _ = spec.step(state, op)
            except SpecError:
                continue
            assert not violated(state), f"the spec broke {violated(state)}"
            held = [b for r in state.requests.values() for t in r.tables for b in t if b]
            for i, (rc, free, _registered) in enumerate(project(state, 0)):
                if i == 0:
                    assert not free, "abstract INV-NULL-1 fails on a spec state"
                    continue
                assert rc == held.count(i), "abstract INV-REF-1 fails on a spec state"
                assert free == (rc == 0), "abstract INV-FREE-1 fails on a spec state"


def _random_op(rng: random.Random, state: spec.State) -> spec.Op:
    running = sorted(state.requests)
    choice = rng.random()
    if running and choice < 0.3:
        rid = rng.choice(running)
        if state.requests[rid].scheduled:
            return spec.EndStep()
        return spec.Finish(rid)
    if running and choice < 0.5:
        return spec.EndStep()
    rid = next((r for r in "abc" if r not in state.requests), "a")
    tokens = tuple(rng.choice([1, 2]) for _ in range(rng.randint(1, 7)))
    return spec.Admit(rid, tokens, rng.randint(1, 8))


OBLIGATIONS = (
    Obligation("THM-POOL-STEP", ("ALLOC-EVICT-1", "ALLOC-FREE-1", "ALLOC-COMMIT-1",
               "ALLOC-VIS-1", "INV-NULL-1", "INV-REF-1", "INV-FREE-1", "INV-KEY-1", "INV-VIS-1",
               "INV-HIT-1"), "3 blocks + null, 4 table slots, any contents", PROVED, "pr",
               preserved(), about="every step preserves every invariant, from any such state"),
    Obligation("TWIN-POOL-TOUCH-KEEPS-FREE", ("INV-FREE-1",), "as THM-POOL-STEP",
               COUNTEREXAMPLE, "pr", preserved(Bugs(touch_keeps_free=True)),
               twin_of="THM-POOL-STEP", about="a hit that leaves its block in the free queue"),
    Obligation("TWIN-POOL-VISIBLE-EARLY", ("ALLOC-VIS-1", "INV-VIS-1"), "as THM-POOL-STEP",
               COUNTEREXAMPLE, "pr", preserved(Bugs(register_on_allocate=True)),
               twin_of="THM-POOL-STEP",
               about="vLLM #41838: hashes visible before the KV is written"),
    Obligation("TWIN-POOL-STALE-KEY", ("ALLOC-EVICT-1", "INV-KEY-1"), "as THM-POOL-STEP",
               COUNTEREXAMPLE, "pr", preserved(Bugs(keep_old_key=True)),
               twin_of="THM-POOL-STEP", about="a reused block keeps its old key (stale hits)"),
    Obligation("DRIFT-POOL", ("INV-REF-1", "INV-FREE-1", "INV-NULL-1"),
               "40 random spec traces of 30 steps", AGREES, "pr", drift,
               about="the abstract invariants hold on every state the spec reaches"),
)  # fmt: skip
