"""sglang-swa-admission-livelock, end to end: an idle SWA server that never admits a request.

Through SGLang 0.5.23's own request steps (the campaign's loop, `--model swa`): page 1,
sliding_window_size 2, an SWA pool of C slots. A first request with a 4-token prompt
finishes, so the tree keeps that prompt and the live window before its end. A second request
extends the prompt by E tokens; SGLang reserves B SWA slots for its prefill
(`SWAPrefillBudget.swa_tokens`) and admits it only while B is below what is free, R. While
B < C it counts a shortfall as transient pressure and waits for running requests to free
their windows (sglang#32700 keeps the chunk-cap escape for B >= C). But nothing runs, and the
prefix the request matched is locked during admission, so its live window is never
evictable then: R stays C minus that window. For every E with C - window <= B < C the request
waits forever, and the FCFS queue behind it with it. Sent without the shared prefix (same
length, nothing matched) the same request is admitted at once.

    .engines/sglang-0.5.23/bin/python -m kvcert.conformance.sglang.checks.swa_livelock

Exit 1 when the livelock reproduces (the finding stands), 0 when every extension is served,
2 when the check cannot run.
"""

from __future__ import annotations

import sys

from kvcert.conformance.sglang.campaign.loop import Run
from kvcert.conformance.sglang.campaign.workload import Arrival, Workload

PREFIX = (11, 12, 13, 14)
POOL_TOKENS = 20  # full-attention slots; the SWA pool is swa_full_tokens_ratio of them
WINDOW = 2  # sliding_window_size
# the extensions whose request fits the full-attention pool with its output token and a
# page to spare (a longer one the server turns away as too long for the pool)
EXTENSIONS = range(1, POOL_TOKENS - len(PREFIX) - 1)


def served(extension: int, shared: bool) -> tuple[bool, str | None]:
    """Whether the request extending PREFIX by `extension` tokens (or, not `shared`, a
    request of the same length matching nothing) is served, and the livelock's account."""
    first = Arrival(0, "first", PREFIX, 1)
    head = PREFIX if shared else tuple(t + 100 for t in PREFIX)
    tail = tuple(range(200, 200 + extension))
    second = Arrival(5, "second", head + tail, 1)
    workload = Workload(0, 1, POOL_TOKENS, 64, 64, (first, second), "swa", WINDOW, 1)
    found = Run(workload).play()
    if found.crashed:
        raise RuntimeError(found.crashed)
    return found.stalled is None, found.stalled


def main() -> int:
    try:
        outcomes = {e: (served(e, True), served(e, False)[0]) for e in EXTENSIONS}
    except Exception as error:  # a crash is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    stuck = [e for e, ((ok, _), control) in outcomes.items() if not ok and control]
    print(
        f"page 1, sliding_window_size {WINDOW}, {POOL_TOKENS} full-attention slots: a "
        f"{len(PREFIX)}-token prompt finished, then extended by 1..{EXTENSIONS[-1]} tokens"
    )
    if not stuck:
        print("not reproduced: every extension was served")
        return 0
    (_, why), _ = outcomes[stuck[0]]
    print(
        f"REPRODUCED sglang-swa-admission-livelock: extended by {stuck} tokens the request "
        f"is never admitted on an idle server (the same length sent without the prefix is "
        f"served); e.g. {why}"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
