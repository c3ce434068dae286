"""The shipped state machine on SGLang's tree: random traces under the radix profile, the
spec's §13 machine stepped beside SGLang one operation at a time.

`kvcert.conformance.checks.stateful` draws admissions of prefixes of a few shared token
bases (so hits, splits and evictions happen), chunked prefills, decode steps, step ends,
finishes, preemptions, cache resets and misuse, and compares each of SGLang's observations
with the spec's (page ids as lifetimes, RADIX-ID-1), through SGLang 0.5.23's own request
steps (`kvcert.conformance.sglang.alloc.Session`). Where the vectors are fixed traces, this
searches. It has teeth only if the twins of the tree that `radix_twins` holds to the
vectors are found here too, so each must diverge within its budget.

    .engines/sglang-0.5.23/bin/python -W ignore -m kvcert.conformance.sglang.checks.machine

Exit 0 when SGLang matches the spec on every drawn trace and every twin diverges, 1 when
SGLang diverges (the shrunk trace is printed) or a twin escapes. The twins patch 0.5.23's
request steps; on another release only SGLang itself is searched.
"""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcert.conformance.checks.stateful import machine_for
from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.sglang import alloc
from kvcert.conformance.sglang.adapter import SglangEngine
from kvcert.conformance.sglang.campaign.steps import other_steps
from kvcert.conformance.sglang.checks.radix_twins import TWINS

EXAMPLES = 150  # traces SGLang itself is searched with
# traces a twin may take: a caught twin stops at its first divergence, so this costs time
# only when one escapes. Which traces a derandomized search draws still depends on what the
# process imported before (Hypothesis seeds it with their constants): finish-discards was
# caught within 150 in one checkout and needed 300 in another, hence the margin.
TWIN_EXAMPLES = 1000
STEPS = 60  # operations per trace
PROFILES = frozenset({"eviction.radix", "visibility.step-end"})


def engine_with(session: type[alloc.Session]) -> type[SglangEngine]:
    """SGLang's engine whose alloc cases open `session` (SGLang's tree, or a twin of it),
    one operation at a time."""

    class Stepped(SglangEngine):
        def open(self, case: JSON) -> Any:
            problem = alloc.scope_problem(case)
            if problem is not None:
                raise alloc.Unsupported(problem)
            return OneByOne(session(case["layout"], case["num_blocks"]))

    return Stepped


class OneByOne:
    """A session answering an operation SGLang cannot express (a release while its chunk is
    in flight, a retraction of a request still computing its prompt) `{"unsupported": why}`,
    as the protocol lets a session do; the machine leaves it out of the trace."""

    def __init__(self, session: alloc.Session) -> None:
        self.session = session

    def apply(self, op: JSON) -> JSON:
        try:
            return self.session.apply(op)
        except alloc.Unsupported as why:
            return {"unsupported": str(why)}


def search(
    session: type[alloc.Session], *, shrink: bool, examples: int = EXAMPLES
) -> tuple[str | None, Any]:
    """None when no drawn trace diverges in `examples` traces, else the divergence (shrunk
    when `shrink`); and the machine class (its counts)."""
    machine = machine_for(engine_with(session), profiles=PROFILES)
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    budget = settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        derandomize=True,  # the same traces every run: a verdict never depends on luck
        deadline=None,
        print_blob=False,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    try:
        run_state_machine_as_test(machine, settings=budget)
    except AssertionError as divergence:
        return str(divergence), machine
    return None, machine


def main() -> int:
    found, machine = search(alloc.Session, shrink=True)
    print(f"SGLang as shipped: {EXAMPLES} traces, {machine.steps} operations, "
          + ("no divergence" if found is None else f"DIVERGES: {found}"))  # fmt: skip
    for why, count in sorted(machine.unsupported.items()):
        print(f"  left out, SGLang cannot express them: {count} ({why})")
    ok = found is None
    other = other_steps()
    if other is not None:  # the twins patch 0.5.23's request steps
        print(f"twins not played: {other}")
        print("OK" if ok else "DEVIATED")
        return 0 if ok else 1
    for name, twin in TWINS.items():
        caught, _ = search(twin, shrink=False, examples=TWIN_EXAMPLES)
        print(f"twin {name}: " + ("caught" if caught else "ESCAPED"))
        ok = ok and caught is not None
    print("OK" if ok else "DEVIATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
