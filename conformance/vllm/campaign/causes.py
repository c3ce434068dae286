"""Which known vLLM mechanism each lost hit of a campaign report follows.

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.campaign.causes REPORT.json
    ... causes REPORT.json --annotate   # also write each finding's cause into the report

For every lost-hit finding of a `kvcert fuzz --json` report (run in this venv, its shrunk
workloads still in it), the shrunk workload is played again with the known bugs' fixes
applied (one at a time, then the smallest sets of them): those of
kvcert.conformance.vllm.trace_causes, named as kvcert.conformance.vllm.expected names the
differences they explain, and the campaign's own below; then with the drop keying in place of the
release's lookahead block hashes (0.33: `lookahead-boundary`, a flag: the oracle then holds
the run to the drop profile); then without the drafter (`drafter`, a feature, not a fix).
The first under which the workload plays with no finding names the cause. A lost hit none
explains is printed as unexplained and the command exits 1: a new mechanism cannot hide in
a known class. Played with the report's `--fix` setting. With `--annotate` each lost-hit
finding of the report gets its `"cause"` (None: unexplained), which
kvcert.conformance.vllm.campaign.results tallies.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from kvcert.conformance.campaign.command import finding_role
from kvcert.conformance.campaign.workload import Workload
from kvcert.conformance.vllm import runtime, trace_causes
from kvcert.conformance.vllm.campaign.loop import play


@contextmanager
def resume_prompt() -> Iterator[None]:
    """vLLM retaining a resumed request's replay boundaries from the tokens it was
    re-admitted with (spec RET-SPARSE-1 reads the prompt of each admission: a preempted
    request comes back with its outputs as prompt) instead of its original prompt: 0.33's
    `cache_blocks` passes `num_prompt_tokens`, so the blocks a resumed request computes past
    its original prompt keep no sliding-window or state blocks, and its next re-admission
    hits one alignment step less."""
    coordinator: Any = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    manager: Any = importlib.import_module("vllm.v1.core.kv_cache_manager")
    cls, lookup = coordinator.KVCacheCoordinator, manager.KVCacheManager.get_computed_blocks
    original_cache = cls.cache_blocks

    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        request.kvcert_admitted_tokens = request.num_tokens  # as it is (re-)admitted
        return lookup(self, request, *args, **kwargs)

    def cache_blocks(self: Any, request: Any, num_computed_tokens: int) -> Any:
        # the prompt its replay boundaries are computed from, for this call only
        prompt = request.num_prompt_tokens
        request.num_prompt_tokens = getattr(request, "kvcert_admitted_tokens", prompt)
        try:
            return original_cache(self, request, num_computed_tokens)
        finally:
            request.num_prompt_tokens = prompt

    cls.cache_blocks, manager.KVCacheManager.get_computed_blocks = cache_blocks, get_computed_blocks
    try:
        yield
    finally:
        cls.cache_blocks, manager.KVCacheManager.get_computed_blocks = original_cache, lookup


@contextmanager
def reachable_extension() -> Iterator[None]:
    """vLLM 0.25-0.28 with the extension boundary kept: their sparse masks keep only the
    replay boundary `num_prompt_tokens - 1`'s tail (and 0.28 a junction's), so a
    block-aligned prompt keeps no window or state at floor_A(p), the length RET-SPARSE-1
    retains for an extension (0.33's `replay_boundaries` without EAGLE is the same loss,
    `sparse-extension-dropped`); patched, the boundary one token later is kept too."""
    module: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    originals = {
        cls: vars(cls)["reachable_block_mask"]
        for cls in vars(module).values()
        if isinstance(cls, type) and isinstance(vars(cls).get("reachable_block_mask"), classmethod)
    }

    def patched(function: Callable[..., Any]) -> classmethod[Any, Any, Any]:
        def mask(cls: Any, *args: Any, **kwargs: Any) -> Any:
            found = list(kwargs.get("reachable_boundaries", ()))
            if found:  # 0.28: the first is the replay boundary, num_prompt_tokens - 1
                kwargs["reachable_boundaries"] = [*found, found[0] + 1]
            prompt = kwargs.get("num_prompt_tokens")
            if prompt is None:
                return function(cls, *args, **kwargs)
            # 0.25: the mask keeps num_prompt_tokens - 1's tail: keep the next one's too
            kept = function(cls, *args, **kwargs)
            more = function(cls, *args, **{**kwargs, "num_prompt_tokens": prompt + 1})
            if kept is None or more is None:  # None: every block is cached
                return None
            return [a or b for a, b in zip(kept, more, strict=True)]

        return classmethod(mask)

    for cls, original in originals.items():
        setattr(cls, "reachable_block_mask", patched(original.__func__))  # noqa: B010
    try:
        yield
    finally:
        for cls, original in originals.items():
            setattr(cls, "reachable_block_mask", original)  # noqa: B010


def _before_replay_boundaries() -> bool:
    """0.25-0.28: sparse masks without 0.33's `replay_boundaries`."""
    module = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    return not trace_causes.has_replay_boundaries() and any(
        isinstance(vars(cls).get("reachable_block_mask"), classmethod)
        for cls in vars(module).values()
        if isinstance(cls, type)
    )


# name (as kvcert.conformance.vllm.expected's causes) -> (whether the release has the code
# the fix is for, vLLM with that bug fixed)
FIXES: dict[str, tuple[Callable[[], bool], Callable[[], AbstractContextManager[None]]]] = {
    "sparse-extension-dropped": (
        trace_causes.has_replay_boundaries,
        trace_causes.extension_boundary,
    ),
    "sparse-lookahead-boundary": (
        trace_causes.has_replay_boundaries,
        trace_causes.lookahead_boundary,
    ),
    "sparse-resume-prompt": (trace_causes.has_replay_boundaries, resume_prompt),
    "sparse-extension-dropped (0.25-0.28)": (_before_replay_boundaries, reachable_extension),
}


def _fixes() -> dict[str, Callable[[], AbstractContextManager[None]]]:
    return {name: fix for name, (applies, fix) in FIXES.items() if applies()}


@contextmanager
def _applied(fixes: list[Callable[[], AbstractContextManager[None]]]) -> Iterator[None]:
    with ExitStack() as stack:
        for fix in fixes:
            stack.enter_context(fix())
        yield


def _clean(workload: Workload, fix: bool) -> bool:
    """The workload plays with no finding at all (a crash is not a fix; a workload that
    reaches the step limit without one is clean as far as it went)."""
    outcome = play(workload, fix)
    return outcome.kind is None and outcome.unreachable is None


def cause_of(workload: Workload, fix: bool) -> str | None:
    """The known causes whose fixes (the fewest that do, `_fixed_cause`) make the workload
    play with no finding; then the feature without which it does (`drafter`:
    the same workload served without its drafter, on releases before 0.33 the EAGLE drop
    every flagged group takes, kvcert.conformance.vllm.expected's eagle-fallback-drops);
    None when nothing does."""
    found = _fixed_cause(workload, fix)
    if found is not None:
        return found
    if workload.spec_tokens and _clean(dataclasses.replace(workload, spec_tokens=0), fix):
        return "drafter"
    return None


def _fixed_cause(workload: Workload, fix: bool) -> str | None:
    """The smallest set of fixes (one, then two, ...) under which the workload plays with no
    finding, joined by " + "; then the same with drop keying for `lookahead-boundary`."""
    fixes = _fixes()
    for size in range(1, len(fixes) + 1):
        for names in itertools.combinations(fixes, size):
            with _applied([fixes[name] for name in names]):
                if _clean(workload, fix):
                    return " + ".join(names)
    # before 0.33 the release's keying is the drop already: no lookahead hashes to turn off
    if workload.spec_tokens and workload.spec_keying != "drop" and runtime.has_lookahead_hashes():
        dropped = dataclasses.replace(workload, spec_keying="drop")
        if _clean(dropped, fix):
            return "lookahead-boundary"
        for name, fixed in fixes.items():
            with fixed():
                if _clean(dropped, fix):
                    return f"lookahead-boundary + {name}"
    return None


def causes(report: dict[str, Any]) -> list[tuple[int, str | None, str]]:
    """(seed, cause or None, the shrunk finding) for every lost hit of the report, each
    finding annotated with its `"cause"`."""
    out = []
    for finding in report["violations"]:
        if finding_role(finding) != "lost":
            continue
        shrunk = finding["shrunk"]
        if "workload" not in shrunk:
            raise SystemExit(
                f"seed {finding['seed']}: the report holds no shrunk workload (an imported "
                "report drops them); give the report `kvcert fuzz --json` wrote"
            )
        workload = Workload.from_json(shrunk["workload"])
        finding["cause"] = cause_of(workload, report["fix"])
        out.append((finding["seed"], finding["cause"], shrunk["violation"]))
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[1:] not in ([], ["--annotate"]):
        raise SystemExit(__doc__)
    path = Path(argv[0])
    report = json.loads(path.read_text(encoding="utf-8"))
    unexplained = 0
    for seed, cause, violation in causes(report):
        unexplained += cause is None
        print(f"seed {seed}: {cause or 'UNEXPLAINED'}: {violation}")
    print(f"{unexplained} unexplained lost hit(s)")
    if argv[1:] == ["--annotate"]:
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
