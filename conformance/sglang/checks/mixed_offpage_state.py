"""sglang-mixed-chunk-offpage-state, end to end: under mixed chunks a Mamba state is keyed at
the page below the token it ran to, and a later request resumes from it (a wrong state).

Through SGLang 0.5.23's own request steps (the campaign's loop, `--model mamba-paged
--mixed-chunk`): page 4, the extra buffer, a 64-token chunk. `a` (20 tokens, 4 to decode)
decodes while `b` (260 tokens) prefills, and each mixed step's decode token leaves 63 of the
chunk budget:

    step 1   b [0, 60)      a new request's cut chunk is floored to the page
    step 2   b [60, 123)    a continuing one: `floor_chunked_tokens` floors to the 64-token
    step 3   b [123, 186)   Mamba grid, but keeps the cut (63) when that would empty it
    step 4   b [186, 250)   `a` done, a full chunk: tracked at 186 + 64 = 250, relative to
                            its prefix (`_mamba_radix_cache_v2_req_prepare_for_extend`)
    finish   the state after 250 tokens is donated at `mamba_last_track_seqlen` 250, which
             the tree keys at the page below: 248
    step 20  `c`, b's prompt again, hits 248 and starts from the state after 250: tokens
             248 and 249 enter its recurrent state twice

`PrefillAdder` keeps a new request's chunk on the page for exactly this reason ("Mamba
checkpoints only land on page-aligned chunk ends"); the continuing chunk's fallback does
not. The same double count was found and fixed under decode context parallelism, whose
wider tree page leaves prefixes off the page (sglang#34808, sglang#39115: the depth on the
absolute checkpoint grid); 0.5.23 takes that grid only with DCP and, without it, keeps the
depth relative to the prefix. The control is the campaign's fix `mixed-chunk-page-align`
(`variants.align_cut_chunks`): the fallback floors to the page. With it `c` hits a state
keyed where it ran to.

    .engines/sglang-0.5.23/bin/python -W ignore \
        -m kvcert.conformance.sglang.checks.mixed_offpage_state

Exit 1 when the wrong state reproduces and the fix prevents it (the finding stands), 0 when
every read is sound, 2 when the check cannot run or the fix does not prevent it (the
finding's mechanism would be wrong).
"""

from __future__ import annotations

import sys

from kvcert.conformance.sglang.campaign.replay import replay_sound
from kvcert.conformance.sglang.campaign.workload import Arrival, Workload

PROMPT = tuple(range(100, 360))
ARRIVALS = (
    Arrival(0, "a", tuple(range(1, 21)), 4),
    Arrival(1, "b", PROMPT, 1),
    Arrival(20, "c", PROMPT, 1),
)
# seed, page, full-attention slots, chunk, step budget, arrivals, model; mixed chunks
WORKLOAD = Workload(0, 4, 1024, 64, 256, ARRIVALS, "mamba-paged", mixed=True)


def main() -> int:
    try:
        stock = replay_sound(WORKLOAD, None)
        aligned = replay_sound(WORKLOAD, "mixed-chunk-page-align")
    except Exception as error:  # a crash is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    print(
        f"page {WORKLOAD.page}, chunk {WORKLOAD.chunk}, mixed chunks, the extra buffer: "
        f"{len(ARRIVALS)} requests"
    )
    print(f"SGLang as it ships: {len(stock.unsound)} unsound reads {stock.unsound}")
    print(f"a cut chunk floored to the page: {len(aligned.unsound)} unsound reads")
    if not stock.unsound:
        print("not reproduced: every read is sound")
        return 0
    if aligned.unsound or aligned.finished != len(ARRIVALS):
        print("the wrong state reproduces, but keeping cut chunks on the page does not prevent it")
        return 2
    print(
        "REPRODUCED sglang-mixed-chunk-offpage-state: a mixed step's cut chunk ends off the "
        "page, the next checkpoint is keyed at the page below the token its state ran to, "
        "and a request resuming there starts from a wrong Mamba state"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
