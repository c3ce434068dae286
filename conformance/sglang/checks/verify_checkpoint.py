"""The extra buffer's checkpoint inside an EAGLE verify pass, end to end: a state tracked
where a verify pass crosses the decode track grid is cached, and a later request resumes
from it.

Through SGLang 0.5.23's own request steps (the campaign's loop, `--model mamba-paged
--eagle`): page 2, the extra buffer, its decode track grid lcm(64, mamba_track_interval
256) = 256. Random workloads rarely decode across 256 tokens, so this one is built to:

    step 0-3    a (254 tokens, 8 to decode) prefills in chunks of 64
    decode      verify passes of 1 to 4 tokens; the one crossing 256 leaves the state after
                256 tokens in the track slot SGLang named (prepare_mamba_track_for_verify,
                commit_mamba_states_after_verify), and the result step records it
                (_mamba_check_track_boundary)
    finish      release_kv_cache caches that state with the first 256 tokens
    step 40     b, a's prompt, answer and 6 tokens more, is owed 256 tokens and its state

The twin `track-final-state` checkpoints the state after the crossing pass's last token in
its place, under the same name: b must then read a wrong state, and the campaign must say so.

    .engines/sglang-0.5.23/bin/python -W ignore \
        -m kvcert.conformance.sglang.checks.verify_checkpoint

Exit 0 when b is served the 256 tokens soundly and the twin is caught, 1 when SGLang serves
less or reads unsoundly (a finding to trace), 2 when the check cannot run or misses the twin
(the campaign would not see a wrong verify checkpoint).
"""

from __future__ import annotations

import sys

from kvcert.conformance.sglang.campaign.eagle import served_with_eagle
from kvcert.conformance.sglang.campaign.replay import replay
from kvcert.conformance.sglang.campaign.workload import Arrival, Workload, outputs

PROMPT = tuple(range(1000, 1254))
ANSWER = 8
FOLLOW_UP = PROMPT + outputs(PROMPT, ANSWER) + tuple(range(3000, 3006))
ARRIVALS = (Arrival(0, "a", PROMPT, ANSWER), Arrival(40, "b", FOLLOW_UP, 1))
# seed, page, full-attention slots, chunk, step budget, arrivals, model: the extra buffer
WORKLOAD = served_with_eagle(Workload(0, 2, 1024, 64, 256, ARRIVALS, "mamba-paged"))
OWED = 256  # b's hit: the verify checkpoint at the decode track grid


def main() -> int:
    try:
        stock = replay(WORKLOAD)
        twin = replay(WORKLOAD, mutant="track-final-state")
    except Exception as error:  # a crash is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    if stock.crashed or stock.stalled or stock.finished != len(ARRIVALS):
        print(f"CANNOT RUN: {stock.crashed or stock.stalled or 'a request did not finish'}")
        return 2
    print(
        f"page {WORKLOAD.page}, EAGLE, the extra buffer: a decodes {ANSWER} tokens from "
        f"{len(PROMPT)}, b sends {len(FOLLOW_UP)}: owed {stock.owed_tokens} tokens, served "
        f"{stock.served_tokens}, {len(stock.unsound)} unsound reads"
    )
    wrong_state = [u for u in twin.unsound if f"after its {OWED} computed tokens" in u]
    print(f"twin track-final-state: {len(wrong_state)} passes start from a wrong state")
    if stock.owed_tokens != OWED:
        print(f"CANNOT RUN: b was owed {stock.owed_tokens} tokens, not the {OWED} this checks")
        return 2
    if stock.unsound or stock.draft_stale or stock.served_tokens != OWED:
        print("DEVIATED: the verify checkpoint was not served soundly", *stock.unsound, sep="\n")
        return 1
    if not wrong_state:
        print("MISSED: the twin's wrong verify checkpoint went unseen")
        return 2
    print("ok: the state a verify pass tracks at the grid is cached and served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
