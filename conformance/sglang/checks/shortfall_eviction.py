"""sglang-whole-ask-eviction: which eviction a release's tree follows, on every radix vector.

RADIX-EVICT-1 evicts the shortfall of an allocation's target; SGLang up to 0.5.15 evicted
the whole target whenever any of it was missing (fixed by sglang#32016, first in 0.5.19;
`kvcert.conformance.sglang.whole_ask` holds the spec's twin). This check plays every radix
vector through the release's own request steps (`kvcert.conformance.sglang.alloc`) and
compares it both with the vector (the spec) and with the twin's answer:

    .engines/sglang-0.5.15/bin/python -W ignore \\
        -m kvcert.conformance.sglang.checks.shortfall_eviction

Exit 0 when the release agrees with exactly one of the two on every vector, and the vectors
tell the two apart; 1 otherwise.
"""

from __future__ import annotations

import sys
from importlib.metadata import version

from kvcert.conformance.sglang import alloc
from kvcert.conformance.sglang.checks.radix_twins import failures, radix_cases
from kvcert.conformance.sglang.whole_ask import twin_answer


def main() -> int:
    cases = radix_cases()
    twins = [{**case, "expect": twin_answer(case["input"])} for case in cases]
    apart = sum(case["expect"] != twin["expect"] for case, twin in zip(cases, twins, strict=True))
    against_spec = failures(alloc.Session, cases)
    against_twin = failures(alloc.Session, twins)
    print(f"SGLang {version('sglang')}, {len(cases)} radix vectors, {apart} answered apart:")
    print(f"  the spec (evict the shortfall): {len(cases) - len(against_spec)} agree")
    print(f"  the twin (evict the whole ask): {len(cases) - len(against_twin)} agree")
    follows = [name for name, failed in (("spec", against_spec), ("twin", against_twin))
               if not failed]  # fmt: skip
    ok = apart > 0 and len(follows) == 1
    print(f"FOLLOWS {follows[0]}" if ok else "DEVIATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
