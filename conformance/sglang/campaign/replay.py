"""A workload played again, quietly: the replays that tell a finding from anything else."""

from __future__ import annotations

import contextlib
import io

from kvcert.conformance.sglang.campaign.loop import Findings, Run
from kvcert.conformance.sglang.campaign.workload import Workload


def replay(workload: Workload, *, mutant: str | None = None, fix: str | None = None) -> Findings:
    """The workload through SGLang with `fix` (or `mutant`) played, SGLang's own messages (an
    abort's, a crash's) kept out of the report."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return Run(workload, mutant, fix).play()


def replay_sound(workload: Workload, fix: str | None) -> Findings:
    """A check's replay: its findings, or RuntimeError when SGLang raised or stalled (a check
    that cannot run gives no verdict)."""
    found = replay(workload, fix=fix)
    if found.crashed or found.stalled:
        raise RuntimeError(found.crashed or found.stalled)
    return found
