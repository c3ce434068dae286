"""`python -m kvcert.conformance.sglang.campaign`: seeds through SGLang's request steps.

Exit 0 when no read was unsound (but those the fix `mixed-chunk-page-align` prevents: a
Mamba state keyed off its page under mixed chunks), SGLang never raised, every request
finished (or was left waiting by its SWA admission livelock, or aborted out of memory where
the fix `swa-decode-headroom` prevents it), and every lost hit has a known cause
(`EXPLAINED`); 1 otherwise; 2 on bad arguments or a release whose request steps the loop
does not play (it plays 0.5.23's). Those three SGLang bugs found here are counted and
printed either way, and a fourth, the scheduler's single-flight assertion under priority
preemption (a crash the fix `single-chunked-request` prevents); a fifth, the lazy extra
buffer's synchronous crash, fails the run.
The lost hits are printed with their causes either way: they are failures of SGLang against
the spec, each with its cause (docs/engines.md), not a pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version

from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang.campaign.eagle import served_with_eagle
from kvcert.conformance.sglang.campaign.loop import Findings, Run
from kvcert.conformance.sglang.campaign.places import (
    BIGRAM_CAP,
    BIGRAM_INSERT,
    BRANCHED,
    DECODED,
    FREED,
    FREED_STATE,
    OVERSHOOT,
    OVERSHOOT_STATE,
    RETRACTED,
    RETRACTED_STATE,
    RUNNING_STATE,
    SWA_DECODED,
    SWA_FREED,
)
from kvcert.conformance.sglang.campaign.replay import replay
from kvcert.conformance.sglang.campaign.variants import FIXES, MUTANTS
from kvcert.conformance.sglang.campaign.workload import (
    MAMBA_MODELS,
    MODELS,
    Workload,
    generate,
    runs_extra_buffer,
)

# Lost hits whose cause is SGLang's design, documented in docs/engines.md; any other place a
# lost page or state can be (a prompt not published, a page or state in the tree it did not
# match) is a new finding and fails the run.
# An SGLang bug found here, reproduced by kvcert.conformance.sglang.checks.swa_livelock: an
# idle scheduler that never admits the head of its queue (docs/engines.md).
LIVELOCK = "sglang-swa-admission-livelock"
# The other, reproduced by checks.swa_decode_abort: a decoding request aborted out of memory
# because a prefill admitted beside it took its SWA slots; an abort is this one only when
# the workload replayed with the fix swa-decode-headroom aborts nothing.
HEADROOM = "sglang-swa-decode-headroom"
OFFPAGE = "sglang-mixed-chunk-offpage-state"
# checks.single_flight: a second request chunked while one continues; SGLang's scheduler
# asserts (its process dies); a crash is this one only when the fix's replay finishes
SINGLE_FLIGHT = "sglang-chunked-single-flight"
# Under EAGLE beside a Mamba component SGLang's tree keys tokens, not bigrams
# (UnifiedTreeCore.is_eagle), so the last position a request shares with the tree (a hit's
# end, or where its insert re-points its row at the tree's slots) holds the draft layer's KV
# of the writer's next token (campaign.eagle.stale_drafts); explained only for those models
STALE_DRAFT = "sglang-mamba-eagle-plain-keys"
EXPLAINED = {
    DECODED: "sglang-decode-publish-at-finish",
    RUNNING_STATE: "sglang-decode-publish-at-finish",
    SWA_DECODED: "sglang-decode-publish-at-finish",
    FREED: "sglang-node-eviction",
    FREED_STATE: "sglang-node-eviction",
    SWA_FREED: "sglang-swa-tombstone",
    BRANCHED: "sglang-swa-branch-insert",
    RETRACTED: "sglang-retract-discards",
    RETRACTED_STATE: "sglang-retract-discards",
    BIGRAM_CAP: "sglang-eagle-bigram-cap",
    BIGRAM_INSERT: "sglang-eagle-bigram-insert",
    OVERSHOOT: "sglang-eagle-overshoot-discarded",
    OVERSHOOT_STATE: "sglang-eagle-overshoot-discarded",
}


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if importlib.util.find_spec("sglang") is None:
        print(
            "kvcert: SGLang is not installed in this Python; create its venv with "
            "`scripts/engine-venv.sh sglang 0.5.23` and run that venv's python",
            file=sys.stderr,
        )
        return 2
    tally = Tally()
    for seed in range(args.first, args.first + args.runs):
        workload = generate(
            seed, args.model, overlap=args.overlap, mixed=args.mixed_chunk, priority=args.priority
        )
        workload = dataclasses.replace(workload, lazy=args.lazy)
        if args.eagle:
            workload = served_with_eagle(workload)
        try:
            found = Run(workload, args.mutant, args.fix).play()
            tally.add(
                seed, workload, found,
                abort=_abort_cause(workload, found, args),
                unsound=_unsound_cause(workload, found, args),
                crash=_crash_cause(workload, found, args),
            )  # fmt: skip
        except EngineError as error:
            print(f"kvcert: {error}", file=sys.stderr)
            return 2
    tally.print(args)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(tally.report(args), out, indent=1)
    return 1 if tally.failed() else 0


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kvcert.conformance.sglang.campaign")
    parser.add_argument("--runs", type=int, default=1000, help="workloads (default 1000)")
    parser.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    parser.add_argument(
        "--model", choices=MODELS, default="full",
        help="full attention (default); a full-attention + Mamba hybrid at page 1 (no "
        "buffer, the extra buffer under --overlap: mamba) or at pages 2 and 4 (extra "
        "buffer: mamba-paged); a full-attention "
        "+ sliding-window hybrid (swa), and one with a Mamba state too, page 1 (no buffer, "
        "the extra buffer under --overlap: swa-mamba)",
    )  # fmt: skip
    parser.add_argument(
        "--overlap", action="store_true",
        help="schedule as the server does by default (event_loop_overlap: a batch's result is "
        "processed after the next batch is launched); synchronous without it",
    )  # fmt: skip
    parser.add_argument(
        "--mixed-chunk", action="store_true",
        help="the server's --enable-mixed-chunk: a prefill batch carries the running "
        "requests' decode step",
    )  # fmt: skip
    parser.add_argument(
        "--lazy", action="store_true",
        help="the server's --mamba-radix-cache-strategy extra_buffer_lazy: the extra "
        "buffer's second track slot allocated at a checkpoint boundary (mamba-paged, or a "
        "Mamba hybrid under --overlap)",
    )  # fmt: skip
    parser.add_argument(
        "--priority", action="store_true",
        help="the server's --enable-priority-scheduling: requests carry priorities, the "
        "queue is ordered by them and a full batch preempts lower ones (2-4 rows)",
    )  # fmt: skip
    parser.add_argument(
        "--eagle", action="store_true",
        help="the server's --speculative-algorithm EAGLE (3 steps, top-k 1, 4 draft tokens): "
        "spec-v2 decode steps, synchronous or overlapped, on every model (not with --lazy "
        "or --mixed-chunk)",
    )  # fmt: skip
    parser.add_argument("--mutant", choices=MUTANTS, help="play a broken twin of SGLang")
    parser.add_argument(
        "--fix", choices=FIXES, help="play the fix an SGLang bug found here proposes"
    )
    parser.add_argument("--json", help="write the totals and every finding here")
    parser.add_argument("--show", type=int, default=3, help="findings printed per kind")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.first < 0:
        parser.error("--runs must be >= 1 and --first >= 0")
    if args.mutant == "preempt-frees-prefix" and not args.priority:
        parser.error("the twin preempt-frees-prefix breaks a preemption: add --priority")
    if args.mutant == "eagle-plain-keys" and not args.eagle:
        parser.error("the twin eagle-plain-keys breaks EAGLE's keys: add --eagle")
    page = 2 if args.model == "mamba-paged" else 1  # the least page the model draws
    if args.lazy and not runs_extra_buffer(args.model, page, overlap=args.overlap):
        where = "only under --overlap" if args.model in MAMBA_MODELS else "never (no Mamba state)"
        parser.error(f"--lazy varies the extra buffer, which --model {args.model} runs {where}")
    if args.eagle:
        try:
            plain = generate(0, args.model, overlap=args.overlap, mixed=args.mixed_chunk)
            served_with_eagle(dataclasses.replace(plain, lazy=args.lazy))
        except ValueError as refused:
            parser.error(str(refused))
    return args


def _abort_cause(workload: Workload, found: Findings, args: argparse.Namespace) -> str | None:
    """HEADROOM when the workload's aborts vanish with the fix swa-decode-headroom replayed
    (and nothing raises), else None: an abort nothing found here explains."""
    if not found.aborted or args.fix is not None or workload.window is None:
        return None
    again = replay(workload, mutant=args.mutant, fix="swa-decode-headroom")
    return HEADROOM if not again.aborted and not again.crashed else None


def _unsound_cause(workload: Workload, found: Findings, args: argparse.Namespace) -> str | None:
    """OFFPAGE when the workload's unsound reads vanish with the fix mixed-chunk-page-align
    replayed (and nothing raises), else None: an unsound read nothing found here explains."""
    if not found.unsound or args.fix is not None or not workload.mixed:
        return None
    again = replay(workload, mutant=args.mutant, fix="mixed-chunk-page-align")
    return OFFPAGE if not again.unsound and not again.crashed else None


def _crash_cause(workload: Workload, found: Findings, args: argparse.Namespace) -> str | None:
    """SINGLE_FLIGHT when the crash is SGLang's single-flight assertion and the workload
    replayed with the fix single-chunked-request finishes without a crash, else None."""
    if not found.crashed or "assert self.chunked_req is None" not in found.crashed:
        return None
    if args.fix is not None:
        return None
    again = replay(workload, mutant=args.mutant, fix="single-chunked-request")
    return SINGLE_FLIGHT if not again.crashed and not again.stalled else None


@dataclass
class Tally:
    """What the runs found, summed over the workloads."""

    totals: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)  # lost hits by place
    unsound: list[str] = field(default_factory=list)
    offpage: list[str] = field(default_factory=list)  # unsound reads OFFPAGE explains
    stale_draft: list[str] = field(default_factory=list)  # unsound reads STALE_DRAFT explains
    crashed: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    single_flight: list[str] = field(default_factory=list)  # crashes SINGLE_FLIGHT explains

    def add(
        self,
        seed: int,
        workload: Workload,
        found: Findings,
        *,
        abort: str | None = None,
        unsound: str | None = None,
        crash: str | None = None,
    ) -> None:
        """One run's findings; `abort`, `unsound` and `crash` are what explains its aborts,
        its unsound reads and its crash (None: nothing)."""
        totals = self.totals
        for name in (
            "admissions", "owed_tokens", "served_tokens", "served_early", "finished",
            "retracted", "preempted", "aborted", "finishing_inflight", "dropped", "mixed_decodes",
            "mixed_untracked",
        ):  # fmt: skip
            totals[name] += getattr(found, name)
        totals["requests"] += len(workload.arrivals)
        self.causes.update(found.lost_causes)
        read = [f"seed {seed}: {text}" for text in found.unsound]
        if unsound == OFFPAGE:
            self.offpage += read
        else:
            self.unsound += read
        stale = [f"seed {seed}: {text}" for text in found.draft_stale]
        if workload.model in MAMBA_MODELS:
            self.stale_draft += stale
        else:  # a tree keying tokens where SGLang keys bigrams: the twin eagle-plain-keys
            self.unsound += stale
        self.lost += [f"seed {seed}: {text}" for text in found.lost]
        if found.crashed and crash == SINGLE_FLIGHT:  # its requests died with the scheduler
            self.single_flight.append(f"seed {seed}: {found.crashed}")
            totals["single_flight_requests"] += (
                len(workload.arrivals) - found.finished - found.aborted
            )
        elif found.crashed:
            self.crashed.append(f"seed {seed}: {found.crashed}")
        if found.aborted:
            totals["unexplained_aborts"] += found.aborted if abort is None else 0
            self.aborted.append(
                f"seed {seed}: {found.aborted} aborted out of memory, {abort or 'UNEXPLAINED'}"
            )
        if found.stalled:  # the requests it left waiting are the livelock's
            self.stalled.append(f"seed {seed}: {found.stalled}")
            totals["stalled_requests"] += len(workload.arrivals) - found.finished - found.aborted

    def unfinished(self) -> int:
        t = self.totals
        lost = t["aborted"] + t["stalled_requests"] + t["single_flight_requests"]
        return t["requests"] - t["finished"] - lost

    def failed(self) -> bool:
        unexplained = sum(n for cause, n in self.causes.items() if cause not in EXPLAINED)
        return bool(
            self.unsound or self.crashed or self.unfinished() or unexplained
            or self.totals["unexplained_aborts"]
        )  # fmt: skip

    def print(self, args: argparse.Namespace) -> None:
        totals = self.totals
        served = totals["served_tokens"] / max(1, totals["owed_tokens"])
        played = " overlap" if args.overlap else ""
        played += " mixed-chunk" if args.mixed_chunk else ""
        played += " lazy" if args.lazy else ""
        played += " priority" if args.priority else ""
        played += " eagle" if args.eagle else ""
        played += "".join(f" {k} {v}" for k, v in (("mutant", args.mutant), ("fix", args.fix)) if v)
        print(
            f"sglang {version('sglang')} {args.model}{played}: "
            f"{args.runs} workloads, {totals['requests']} requests, {totals['admissions']} "
            f"admissions, {totals['retracted']} retractions, {totals['preempted']} "
            f"preemptions, {totals['aborted']} aborted out "
            f"of memory; {len(self.unsound) + len(self.offpage) + len(self.stale_draft)} "
            "unsound reads, "
            f"{len(self.crashed)} crashed, "
            f"{self.unfinished()} unfinished; served {totals['served_tokens']} of "
            f"{totals['owed_tokens']} owed tokens ({served:.1%}), {len(self.lost)} lost hits"
        )
        if args.overlap:
            print(f"  overlap: {totals['finishing_inflight']} decode steps skipped for requests "
                  f"their queued result finishes; {totals['dropped']} sampled tokens dropped "
                  "(finished or retracted since the pass was launched)")  # fmt: skip
        if args.mixed_chunk:
            print(f"  mixed chunks: {totals['mixed_decodes']} decode rows carried by prefill "
                  "batches")  # fmt: skip
            if totals["mixed_untracked"]:
                print(f"  mixed chunks: {totals['mixed_untracked']} decode rows at a Mamba "
                      "checkpoint boundary, which a mixed step does not track (the extra "
                      "buffer's state there is never cached)")  # fmt: skip
        if totals["served_early"]:
            why = []
            if args.overlap:
                why.append("prefixes published before their step's result was processed")
            if args.eagle and (args.model in MAMBA_MODELS or args.mutant == "eagle-plain-keys"):
                why.append("a tree keying tokens reaches the position whose next token differs")
            print(f"  served past the owed hit: {totals['served_early']} tokens "
                  f"({'; '.join(why) or 'sound, not owed'})")  # fmt: skip
        for cause, count in self.causes.most_common():
            print(f"  lost hits, {EXPLAINED.get(cause, 'UNEXPLAINED')}: {count} ({cause})")
        if totals["aborted"]:
            explained = totals["aborted"] - totals["unexplained_aborts"]
            print(f"  aborted out of memory, {HEADROOM}: {explained} requests; UNEXPLAINED: "
                  f"{totals['unexplained_aborts']}")  # fmt: skip
        if self.offpage:
            print(f"  unsound reads, {OFFPAGE}: {len(self.offpage)} (a Mamba state keyed at "
                  "the page below the one it ran to; the fix mixed-chunk-page-align "
                  "prevents each)")  # fmt: skip
        if self.stale_draft:
            print(f"  unsound reads, {STALE_DRAFT}: {len(self.stale_draft)} (a slot shared "
                  "through the tree whose draft-layer KV read another next token: SGLang keys "
                  "tokens, not bigrams, beside a Mamba component)")  # fmt: skip
        if self.single_flight:
            print(f"  crashed, {SINGLE_FLIGHT}: {len(self.single_flight)} workloads (the "
                  "scheduler's assertion; the fix single-chunked-request prevents each), "
                  f"{totals['single_flight_requests']} requests unserved")  # fmt: skip
        if self.stalled:
            print(f"  stalled, {LIVELOCK}: {len(self.stalled)} workloads, "
                  f"{totals['stalled_requests']} requests never admitted")  # fmt: skip
        kinds = (
            ("unsound", self.unsound), ("unsound", self.offpage), ("unsound", self.stale_draft),
            ("crashed", self.crashed),
            ("crashed", self.single_flight),
            ("stalled", self.stalled),
            ("aborted", self.aborted), ("lost", self.lost),
        )  # fmt: skip
        for kind, texts in kinds:
            for text in texts[: args.show]:
                print(f"  {kind}: {text}")

    def report(self, args: argparse.Namespace) -> dict[str, object]:
        return {
            "sglang": version("sglang"),
            "model": args.model,
            "mutant": args.mutant,
            "fix": args.fix,
            "overlap": args.overlap,
            "mixed_chunk": args.mixed_chunk,
            "lazy": args.lazy,
            "priority": args.priority,
            "eagle": args.eagle,
            "seeds": [args.first, args.first + args.runs],
            "totals": dict(self.totals),
            "lost_causes": dict(self.causes),
            "unsound": self.unsound,
            "unsound_offpage": self.offpage,
            "unsound_stale_draft": self.stale_draft,
            "crashed": self.crashed,
            "crashed_single_flight": self.single_flight,
            "stalled": self.stalled,
            "aborted": self.aborted,
            "lost": self.lost,
        }


if __name__ == "__main__":
    sys.exit(main())
