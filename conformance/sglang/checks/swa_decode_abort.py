"""sglang-swa-decode-headroom, end to end: a decoding request aborted out of memory because a
prefill admitted beside it took the SWA slots its next decode step needs.

Through SGLang 0.5.23's own request steps (the campaign's loop, `--model swa`): page 2,
sliding_window_size 8, 32 full-attention slots (an SWA pool of 26), a 4-token chunk,
SGLANG_SWA_EVICTION_INTERVAL 1. Three requests arrive at once: `a` (10 tokens, 8 to decode),
`b` (5 tokens, 3 to decode) and `c` (11 tokens, 3 to decode). While `a` decodes, `c`'s
prefill is admitted chunk by chunk: `PrefillAdder` charges the full-attention budget with
every running request's expected tokens (`total_offset`), but `SWAPrefillBudget` starts its
SWA offset at 0, so each chunk may take every free SWA slot (`available_chunk_tokens` keeps
one page). The next decode step finds none, `retract_decode` retracts `c`, which is
re-prefilled into the same slots, and then, with `a` the only running request and the
chunked `c` holding the pool, aborts `a` out of memory: a request the server accepted is
answered with an error.

The asymmetry is the bug: a request's SWA reservation at admission includes its decode
headroom (`estimate_swa_kv_tokens`: up to a window, plus a page), but from the next round on
nothing holds it, while its full-attention headroom stays charged. The control is the
campaign's fix `swa-decode-headroom` (`variants.keep_decode_headroom`): the SWA budget starts
at what SGLang itself would reserve for each running request's remaining decode. With it the same
requests all finish. (The open sglang#35338 reserves only the next decode step, and only on
the mixed-chunk path; one step is not enough here: the decoding request's passed-over SWA
stays locked in the tree with its prefix, so it needs a slot per token.)

    .engines/sglang-0.5.23/bin/python -W ignore -m kvcert.conformance.sglang.checks.swa_decode_abort

Exit 1 when the abort reproduces and the reservation prevents it (the finding stands), 0 when
nothing is aborted, 2 when the check cannot run or the reservation does not prevent it (the
finding's mechanism would be wrong).
"""

from __future__ import annotations

import sys

from kvcert.conformance.sglang.campaign.replay import replay_sound
from kvcert.conformance.sglang.campaign.workload import Arrival, Workload

ARRIVALS = (
    Arrival(0, "a", tuple(range(1, 11)), 8),
    Arrival(0, "b", tuple(range(1, 6)), 3),
    Arrival(0, "c", tuple(range(100, 111)), 3),
)
# seed, page, full-attention slots, chunk, step budget, arrivals, model, window, interval
WORKLOAD = Workload(0, 2, 32, 4, 16, ARRIVALS, "swa", 8, 1)


def main() -> int:
    try:
        stock = replay_sound(WORKLOAD, None)
        reserved = replay_sound(WORKLOAD, "swa-decode-headroom")
    except Exception as error:  # a crash is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    requests = len(ARRIVALS)
    print(
        f"page {WORKLOAD.page}, sliding_window_size {WORKLOAD.window}, {WORKLOAD.pool_tokens} "
        f"full-attention slots, chunk {WORKLOAD.chunk}: {requests} requests arrive at once"
    )
    print(
        f"SGLang as it ships: {stock.finished} finished, {stock.aborted} aborted out of memory,"
        f" {stock.retracted} retracted; keeping each running request's SWA decode headroom: "
        f"{reserved.finished} finished, {reserved.aborted} aborted"
    )
    if not stock.aborted:
        print("not reproduced: no request was aborted")
        return 0
    if reserved.aborted or reserved.finished != requests:
        print("the abort reproduces, but reserving the decode headroom does not prevent it")
        return 2
    print(
        "REPRODUCED sglang-swa-decode-headroom: a decoding request is aborted out of memory "
        "because prefill chunks admitted beside it took its SWA slots; keeping each running "
        "request's SWA decode headroom in the budget serves every request"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
