"""`python -m kvcert.conformance.sglang.campaign`: seeds through SGLang's request steps.

Exit 0 when no read was unsound, SGLang never raised, every request finished (or was
aborted out of memory by SGLang, or left waiting by its SWA admission livelock, both
counted and printed), and every lost hit has a known cause (`EXPLAINED`); 1 otherwise; 2 on
bad arguments or a release whose request steps the loop does not play (it plays 0.5.23's).
The lost hits are printed with their causes either way: they are failures of SGLang against
the spec, each with its cause (docs/engines.md), not a pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import Counter
from importlib.metadata import version

from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang.campaign.loop import Mutant, Run
from kvcert.conformance.sglang.campaign.places import (
    BRANCHED,
    DECODED,
    FREED,
    FREED_STATE,
    RUNNING_STATE,
    SWA_DECODED,
    SWA_FREED,
)
from kvcert.conformance.sglang.campaign.workload import MODELS, generate

# Lost hits whose cause is SGLang's design, documented in docs/engines.md; any other place a
# lost page or state can be (a prompt not published, a page or state in the tree it did not
# match) is a new finding and fails the run.
# An SGLang bug found here, reproduced by kvcert.conformance.sglang.checks.swa_livelock: an
# idle scheduler that never admits the head of its queue (docs/engines.md).
LIVELOCK = "sglang-swa-admission-livelock"
EXPLAINED = {
    DECODED: "sglang-decode-publish-at-finish",
    RUNNING_STATE: "sglang-decode-publish-at-finish",
    SWA_DECODED: "sglang-decode-publish-at-finish",
    FREED: "sglang-node-eviction",
    FREED_STATE: "sglang-node-eviction",
    SWA_FREED: "sglang-swa-tombstone",
    BRANCHED: "sglang-swa-branch-insert",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcert.conformance.sglang.campaign")
    parser.add_argument("--runs", type=int, default=1000, help="workloads (default 1000)")
    parser.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    parser.add_argument(
        "--model", choices=MODELS, default="full",
        help="full attention (default); a full-attention + Mamba hybrid at page 1 (no "
        "buffer: mamba) or at pages 2 and 4 (extra buffer: mamba-paged); a full-attention "
        "+ sliding-window hybrid (swa), and one with a Mamba state too, page 1 (swa-mamba)",
    )  # fmt: skip
    parser.add_argument("--mutant", choices=Mutant.NAMES, help="play a broken twin of SGLang")
    parser.add_argument("--json", help="write the totals and every finding here")
    parser.add_argument("--show", type=int, default=3, help="findings printed per kind")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.first < 0:
        parser.error("--runs must be >= 1 and --first >= 0")
    if importlib.util.find_spec("sglang") is None:
        print(
            "kvcert: SGLang is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh sglang 0.5.23` and run that venv's python",
            file=sys.stderr,
        )
        return 2
    totals: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    unsound: list[str] = []
    crashed: list[str] = []
    stalled: list[str] = []
    aborted: list[str] = []
    lost: list[str] = []
    for seed in range(args.first, args.first + args.runs):
        workload = generate(seed, args.model)
        try:
            found = Run(workload, args.mutant).play()
        except EngineError as error:
            print(f"kvcert: {error}", file=sys.stderr)
            return 2
        for name in (
            "admissions", "owed_tokens", "served_tokens", "finished", "retracted", "aborted"
        ):  # fmt: skip
            totals[name] += getattr(found, name)
        totals["requests"] += len(workload.arrivals)
        causes.update(found.lost_causes)
        unsound += [f"seed {seed}: {text}" for text in found.unsound]
        lost += [f"seed {seed}: {text}" for text in found.lost]
        if found.crashed:
            crashed.append(f"seed {seed}: {found.crashed}")
        if found.aborted:
            aborted.append(f"seed {seed}: {found.aborted} aborted out of memory")
        if found.stalled:  # the requests it left waiting are the livelock's
            stalled.append(f"seed {seed}: {found.stalled}")
            waiting = len(workload.arrivals) - found.finished - found.aborted
            totals["stalled_requests"] += waiting
    unfinished = (
        totals["requests"] - totals["finished"] - totals["aborted"] - totals["stalled_requests"]
    )
    unexplained = sum(n for cause, n in causes.items() if cause not in EXPLAINED)
    served = totals["served_tokens"] / max(1, totals["owed_tokens"])
    print(
        f"sglang {version('sglang')} {args.model}"
        f"{' mutant ' + args.mutant if args.mutant else ''}: "
        f"{args.runs} workloads, {totals['requests']} requests, {totals['admissions']} "
        f"admissions, {totals['retracted']} retractions, {totals['aborted']} aborted out "
        f"of memory; {len(unsound)} unsound reads, "
        f"{len(crashed)} crashed, {unfinished} unfinished; served {totals['served_tokens']} of "
        f"{totals['owed_tokens']} owed tokens ({served:.1%}), {len(lost)} lost hits"
    )
    for cause, count in causes.most_common():
        print(f"  lost hits, {EXPLAINED.get(cause, 'UNEXPLAINED')}: {count} ({cause})")
    if stalled:
        print(f"  stalled, {LIVELOCK}: {len(stalled)} workloads, {totals['stalled_requests']} "
              "requests never admitted")  # fmt: skip
    kinds = (
        ("unsound", unsound), ("crashed", crashed), ("stalled", stalled), ("aborted", aborted),
        ("lost", lost),
    )  # fmt: skip
    for kind, texts in kinds:
        for text in texts[: args.show]:
            print(f"  {kind}: {text}")
    if args.json:
        report = {
            "sglang": version("sglang"),
            "model": args.model,
            "mutant": args.mutant,
            "seeds": [args.first, args.first + args.runs],
            "totals": dict(totals),
            "lost_causes": dict(causes),
            "unsound": unsound,
            "crashed": crashed,
            "stalled": stalled,
            "aborted": aborted,
            "lost": lost,
        }
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 1 if unsound or crashed or unfinished or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
