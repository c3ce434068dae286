"""The radix vectors hold SGLang to each rule: broken twins of its tree must fail them.

`alloc/radix.json` runs against SGLang 0.5.23 through its own request steps
(`kvcert.conformance.sglang.alloc`) and passes. That proves little unless a tree that breaks
a RADIX rule fails the same vectors, so each twin below changes one thing SGLang does and
must fail at least one vector, while SGLang as shipped fails none:

    lru-inverted        the tree evicts its most recently used leaf first (SGLang's own
                        `--radix-eviction-policy mru`)                      RADIX-EVICT-1
    finish-discards     a finished request is released without its insert,
                        as a retraction is                                  RADIX-PUB-2
    prefill-unpublished a prefill chunk is never checkpointed: the tree
                        learns a prompt only when its request finishes      RADIX-PUB-1
    keys-dropped        a request's cache salt and LoRA adapter are not
                        passed to SGLang (its tree keys tokens only)        HASH-EXTRA-1

The last is held to the alloc vectors that key requests by extras (their isolation), which
run beside the radix vectors.

    .engines/sglang-0.5.23/bin/python -W ignore -m kvcert.conformance.sglang.checks.radix_twins

Exit 0 when SGLang passes every one of these vectors and every twin fails one, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.compare import compare_alloc
from kvcert.conformance.sglang import alloc
from kvcert.conformance.sglang.request_steps import RequestKeys


class LruInverted(alloc.Session):
    eviction_policy = "mru"  # SGLang's own `--radix-eviction-policy mru`


class FinishDiscards(alloc.Session):
    def _finish(self, op: JSON) -> JSON:
        return self._release(op, checkpoint=False)


class PrefillUnpublished(alloc.Session):
    def _end_step(self, _: JSON) -> JSON:
        for rid in self.in_step:
            entry = self.running.get(rid)
            if entry is not None:
                entry.scheduled = False
                entry.req.prefix_len = entry.req.extend_end  # what the checkpoint also does
        self.in_step = []
        return {"step_ended": {"registered": 0}}


class KeysDropped(alloc.Session):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.keys = Unkeyed()


class Unkeyed(RequestKeys):
    def for_request(self, cache_salt: str | None, lora: str | None) -> dict[str, Any]:
        return {}


TWINS: dict[str, type[alloc.Session]] = {
    "lru-inverted": LruInverted,
    "finish-discards": FinishDiscards,
    "prefill-unpublished": PrefillUnpublished,
    "keys-dropped": KeysDropped,
}


def _cases(name: str) -> list[JSON]:
    source = resources.files("kvcert.conformance.vectors") / "alloc" / name
    cases: list[JSON] = json.loads(source.read_text(encoding="utf-8"))["cases"]
    return cases


def radix_cases() -> list[JSON]:
    return _cases("radix.json")


def keyed_cases() -> list[JSON]:
    """The alloc scenarios whose requests carry a salt or a LoRA adapter, and nothing else
    SGLang lacks (one full group)."""
    return [
        case
        for case in _cases("scenarios.json")
        if any(op.get("extras") for op in case["input"]["ops"])
        and alloc.scope_problem(case["input"]) is None
        and not any(e.get("kind") == "multimodal" for op in case["input"]["ops"]
                    for e in op.get("extras", []))
    ]  # fmt: skip


def failures(session: Callable[[JSON, int], Any], cases: list[JSON]) -> list[str]:
    """The ids of the cases whose observations differ from the vector's (pages compared as
    lifetimes, RADIX-ID-1), each case through a session `session(layout, num_blocks)`."""
    failed = []
    for case in cases:
        data = case["input"]
        if alloc.scope_problem(data) is not None:
            continue
        answer: JSON
        try:
            opened = session(data["layout"], data["num_blocks"])
            answer = {"observations": [opened.apply(op) for op in data["ops"]]}
        except alloc.Unsupported:
            continue
        if compare_alloc(case["expect"], answer, lifetimes=True) is not None:
            failed.append(case["id"])
    return failed


def main() -> int:
    cases = radix_cases() + keyed_cases()
    ok = True
    stock = failures(alloc.Session, cases)
    print(f"SGLang as shipped: {len(cases) - len(stock)} of {len(cases)} vectors pass")
    if stock:
        print(f"  FAILED: {stock}")
        ok = False
    for name, twin in TWINS.items():
        caught = failures(twin, cases)
        print(f"twin {name}: fails {len(caught)}" + (f", first {caught[0]}" if caught else ""))
        ok = ok and bool(caught)
    print("OK" if ok else "DEVIATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
