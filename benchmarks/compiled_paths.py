"""kvcert's manager calls inside vLLM 0.33.0's Scheduler with compiled twins on and off,
alternating rounds in one process.

    .engines/vllm-0.33.0/bin/python benchmarks/compiled_paths.py [--model qwen3.5-0.8b]
        [--rounds N] [--quick]

`vs_vllm_scheduler.py --by-call` compares kvcert with vLLM; on a noisy machine its ratio moves
by a third between runs of the same code, more than most changes to one path. This measures
such a change where drift cancels: the same workload and by-call timer (each public manager
call less the collector's pauses inside it, summed), kvcert's side only, every round once
with the compiled paths below and once with their Python definitions answering, the two
alternating; each side's least round. The paths: the digest memo's (`hashing._memo_digest`,
reference/_chain_memo.c) and the drop-in's wrapping of tables into vLLM's block lists
(`vllm.tables._wrap_blocks`); "off" sets both to None. Both sides must serve the same hits
in the same steps (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vs_vllm_scheduler import calls_time, one_round_by_call, workload
from kvcert.reference import hashing
from kvcert.reference.vllm import tables

SHOWN = ("get_computed_blocks", "allocate_slots")  # the calls the switched paths run in


@contextmanager
def compiled(on: bool) -> Iterator[None]:
    """Within: the switched paths compiled (`on`, as built) or their definitions."""
    saved = hashing._memo_digest, tables._wrap_blocks
    if not on:
        hashing._memo_digest, tables._wrap_blocks = None, None
    try:
        yield
    finally:
        hashing._memo_digest, tables._wrap_blocks = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-oss-20b", help="gpt-oss-20b or qwen3.5-0.8b")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a side (least kept)")
    parser.add_argument("--quick", action="store_true", help="one small round a side (CI smoke)")
    args = parser.parse_args()
    if hashing._memo_digest is None or tables._wrap_blocks is None:
        print("the compiled paths are not built here (KVCERT_PURE_PYTHON=1 or no compiler)")
        return 2
    rounds = 1 if args.quick else max(args.rounds, 1)
    requests, output = (16, 8) if args.quick else (64, 64)
    for asynchronous in (False, True):
        load = workload(requests, output, asynchronous, args.model)
        least: dict[bool, dict[str, float]] = {}
        served: dict[bool, tuple[int, int]] = {}
        for _ in range(rounds):
            for on in (True, False):
                with compiled(on):
                    (_, unpaused), outcome = one_round_by_call(load, kvcert=True)
                if served.setdefault(on, outcome) != outcome:
                    raise SystemExit(f"kvcert served differently between rounds: {outcome}")
                calls = {
                    "calls": calls_time(unpaused),
                    **{name: unpaused.get(name, (0, 0.0))[1] for name in SHOWN},
                }
                best = least.setdefault(on, calls)
                for name, seconds in calls.items():
                    best[name] = min(best[name], seconds)
        if served[True] != served[False]:
            print(f"the compiled paths served {served[True]}, the definitions {served[False]}")
            return 1
        mode = "asynchronous" if asynchronous else "synchronous"
        parts = ", ".join(
            f"{name} {least[False][name] * 1e3:.2f} -> {least[True][name] * 1e3:.2f} ms"
            for name in ("calls", *SHOWN)
        )
        print(f"{args.model}, {mode}, {len(load.arrivals)} requests, {rounds} round(s) a side, "
              f"definitions -> compiled (least round, each call less the collector's pauses): "
              f"{parts}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
