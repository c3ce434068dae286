"""What CI requires of the soundness campaign on a vLLM release (run in its venv).

    python -m kvcert.conformance.vllm.campaign.check REPORTS_DIR   # CI, on 0.33.0
    python -m kvcert.conformance.vllm.campaign.check --regressions  # long tier, every release
    python -m kvcert.conformance.vllm.campaign.check --kvcert REPORTS_DIR  # kvcert's manager

REPORTS_DIR holds the `--json` reports of 400-seed runs of `kvcert fuzz` (`plain.json`,
`fix.json`, `families.json` made with `--fix --families --state-checkpoints --state-drafts
--mtp` (kvcert's own workloads), and `mutant-NAME.json` for each
broken twin, made with `--fix --mutant NAME`).
Required, each with its reason:

- plain: the campaign finds the preempt-in-flight bug (vllm#43569) on its own, as an unsound
  read of the served model's KV;
- fix: with the fix (a Scheduler subclass) no unsound read of the served model's KV and no
  engine crash remains; an unsound read of draft KV is allowed only under drop keying, the
  limit HIT-SPEC-2 states and the campaign shows (exact keying, 0.33's default, has none),
  and lost hits (the completeness oracle's findings on vLLM, each class with its upstream
  status in engines/vllm/campaign/RESULTS.md);
- families: on the lost-hit workload families the completeness oracle finds vLLM's lost hit
  on its own (the extension of a block-aligned prompt under sparse retention, RESULTS.md),
  and, with the fix, nothing else than the fix run allows;
- every mutant (the fixed vLLM with one more safeguard switched off) is caught: an unsound
  read of draft KV on a seed the fixed vLLM serves soundly, so the draft checks are seen to
  fail where they should;
- every committed regression of the installed release (`vllm-RELEASE-*.json`) replays as its
  file records (`expect`: whether a finding is expected unfixed and fixed).

With --kvcert, REPORTS_DIR holds `kvcert.json` (`kvcert fuzz --kvcert`) and
`kvcert-mutant-NAME.json` for each twin of kvcert's manager (`--kvcert --mutant NAME`): the
manager serves every workload soundly and loses no hit its declared profiles owe, and every
twin is caught on seeds it serves without a finding, by what the twin breaks and with no
crash (an engine crash under a twin is kvcert's own failure: the drop-in's compiled calls
once raised SystemError under a twin that replaces a method, and the twin still read as
caught).

Prints one line per requirement; exit 1 when any fails.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from kvcert.conformance.campaign.command import finding_class, finding_role
from kvcert.conformance.campaign.workload import Workload
from kvcert.conformance.vllm import checkout
from kvcert.conformance.vllm.campaign.loop import play
from kvcert.conformance.vllm.campaign.mutants import CAUGHT_AS, KVCERT_MUTANTS, MUTANTS

HERE = checkout() / "engines" / "vllm" / "campaign"  # the committed regressions
DRAFT_UNDER_DROP = "unsound read of draft KV, drop keying"
LOST_HIT = "lost hit"  # reported with their classes in RESULTS.md; a finding for kvcert


def _classes(report: dict[str, Any]) -> set[str]:
    return {finding_class(v) for v in report["violations"]}


def requirements(reports: Path) -> list[tuple[str, bool]]:
    def load(name: str) -> dict[str, Any]:
        report: dict[str, Any] = json.loads((reports / name).read_text(encoding="utf-8"))
        return report

    plain, fixed, families = load("plain.json"), load("fix.json"), load("families.json")
    out = [
        ("unfixed: the preempt-in-flight violation is found from random workloads",
         any(finding_role(v) == "target" for v in plain["violations"])),
        ("fixed: only draft KV under drop keying and lost hits remain",
         _classes(fixed) <= {DRAFT_UNDER_DROP, LOST_HIT}),
        ("families: a lost hit is found from random workloads",
         any(finding_role(v) == "lost" for v in families["violations"])),
        ("families: only draft KV under drop keying and lost hits remain",
         _classes(families) <= {DRAFT_UNDER_DROP, LOST_HIT}),
    ]  # fmt: skip
    sound = set(fixed["seeds"]) - {v["seed"] for v in fixed["violations"]}
    for name in MUTANTS:
        mutant = load(f"mutant-{name}.json")
        caught = [v["seed"] for v in mutant["violations"]
                  if v["seed"] in sound and finding_role(v) == CAUGHT_AS[name]]  # fmt: skip
        out.append((f"mutant {name}: caught on {len(caught)} seeds the fixed vLLM serves "
                    "soundly", bool(caught)))  # fmt: skip
    return out + regressions()


def kvcert_requirements(reports: Path) -> list[tuple[str, bool]]:
    """kvcert's manager inside vLLM's Scheduler: sound, and each of its twins caught."""
    served = json.loads((reports / "kvcert.json").read_text(encoding="utf-8"))
    lost = [v["seed"] for v in served["violations"] if finding_role(v) == "lost"]
    out = [
        ("kvcert: no finding", not served["violations"]),
        (f"kvcert: no lost hit (owed {served.get('owed_tokens', 0):,} hit tokens, served "
         f"{served.get('served_tokens', 0):,}; seeds {lost[:10]})", not lost),
    ]  # fmt: skip
    sound = set(served["seeds"]) - {v["seed"] for v in served["violations"]}
    for name in KVCERT_MUTANTS:
        path = reports / f"kvcert-mutant-{name}.json"
        mutant = json.loads(path.read_text(encoding="utf-8"))
        caught = [v["seed"] for v in mutant["violations"]
                  if v["seed"] in sound and finding_role(v) == CAUGHT_AS[name]]  # fmt: skip
        # a crash under a twin is kvcert failing on its own, not the twin's bug being seen
        crashed = [v["seed"] for v in mutant["violations"] if finding_role(v) == "crash"]
        out.append((f"kvcert twin {name}: caught on {len(caught)} seeds kvcert serves soundly, "
                    f"crashed on {len(crashed)} (seeds {crashed[:10]})",
                    bool(caught) and not crashed))  # fmt: skip
    return out


def regressions() -> list[tuple[str, bool]]:
    """The installed release's committed regressions, each against what its file records."""
    out = []
    for path in sorted(HERE.glob(f"vllm-{version('vllm')}-*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        workload = Workload.from_json(body["workload"])
        for fix, key in ((False, "unfixed"), (True, "fixed")):
            found = play(workload, fix).found(body.get("kind", "unsound"))
            out.append((f"{path.name} {key}: finding {body['expect'][key]}",
                        found == body["expect"][key]))  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    if argv == ["--regressions"]:
        results = regressions()
    elif argv[:1] == ["--kvcert"]:
        results = kvcert_requirements(Path(argv[1]))
    else:
        results = requirements(Path(argv[0]))
    for what, ok in results:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
