"""sglang-chunked-single-flight, end to end: under priority scheduling a second request is
chunked while one is still mid-prefill, and SGLang's scheduler asserts (its process dies).

SGLang tracks one request left mid-prefill (`chunked_req`) and asserts, before adopting a
new one, that none continues. Nothing enforces it: the round's first chunked request
usually spends the chunk budget, so `budget_state()` ends the admission loop. A continuing
chunk cut short by memory (the SWA pool's `fit_chunk`) leaves budget, and once a preemption
(`preempt_to_schedule`) frees a row and memory, the request it made room for is chunked
into what is left. Through SGLang 0.5.23's own request steps (the campaign's loop, seed
934 of `--model swa --priority`: page 2, window W - 1 = 8, 3 rows, an 8-token chunk):

    step 8    r5 (14-token prompt, 4 decoded) is retracted
    step 9    r5 comes back: its first chunk [0, 8)
    step 10   its next chunk is cut by the SWA pool to [8, 14), 2 tokens of budget left;
              the 3 rows are full, so r4 (priority 50) preempts r2 (priority 0) and is
              chunked into the 2 tokens: `assert self.chunked_req is None` fails

The related reports: sglang#12676 (the same assertion with a small chunked_prefill_size,
closed as inactive without a cause), sglang#34554 (a chunk cap that leaves budget breaks
the same invariant; its fix refuses the chunked branch while a chunked request is pending)
and the crash in sglang#27667's CI run. The control is the campaign's fix
`single-chunked-request` (`variants.refuse_second_chunk`): that guard, which SGLang keeps
for shortest-prefill-first only. With it every request is served.

    .engines/sglang-0.5.23/bin/python -W ignore -m kvcert.conformance.sglang.checks.single_flight

Exit 1 when the assertion reproduces and the fix serves every request (the finding
stands), 0 when nothing raises, 2 when the check cannot run or the fix does not prevent it.
"""

from __future__ import annotations

import sys

from kvcert.conformance.sglang.campaign.replay import replay
from kvcert.conformance.sglang.campaign.workload import generate

WORKLOAD = generate(934, "swa", priority=True)
ASSERTION = "assert self.chunked_req is None"


def main() -> int:
    try:
        stock = replay(WORKLOAD)
        fixed = replay(WORKLOAD, fix="single-chunked-request")
    except Exception as error:  # the loop itself failing is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    print(
        f"page {WORKLOAD.page}, window {WORKLOAD.window}, {WORKLOAD.rows} rows, chunk "
        f"{WORKLOAD.chunk}, priority scheduling: {len(WORKLOAD.arrivals)} requests"
    )
    print(f"SGLang as it ships: {stock.crashed or 'no crash'}")
    print(f"one chunked request at a time: {fixed.finished} of {len(WORKLOAD.arrivals)} served")
    if not stock.crashed:
        print("not reproduced: the scheduler never asserts")
        return 0
    if ASSERTION not in stock.crashed:
        print(f"CANNOT RUN: SGLang raised something else: {stock.crashed}")
        return 2
    if fixed.crashed or fixed.finished != len(WORKLOAD.arrivals):
        print("the assertion reproduces, but one chunked request at a time does not prevent it")
        return 2
    print(
        "REPRODUCED sglang-chunked-single-flight: a continuing chunk cut short by memory "
        "leaves chunk budget, a preemption makes room, and a second request is chunked: "
        "the scheduler's single-flight assertion fails"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
