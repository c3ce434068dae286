"""CrossHair for kvcert: the spec's contracts, spec-vs-reference comparisons, golden controls.

Run as `python -m kvcert.conformance.checks.symbolic check|diffbehavior ARGS...` (what
`kvcert check` does, one subprocess per target): it is CrossHair's own command line with two
shims: CrossHair reads a package's `__init__.py` for directives and `kvcert` is a namespace
package with none; and `--max_iterations N` bounds `check` by paths explored (CrossHair
takes that bound only from source directives), so that a verdict does not depend on how fast
the machine runs. Verdicts are "no counterexample within budget", never "proved".

The functions below are CrossHair's inputs: same-signature integer wrappers around the spec
and the reference (for `diffbehavior`), and a correct and a buggy function with contracts (the
golden controls: a checker that passes the buggy one, or flags the correct one, is broken).
"""

from __future__ import annotations

import importlib.resources
import math
import sys
import types
from fractions import Fraction
from typing import Any

from crosshair import codeconfig
from crosshair import core as crosshair_core
from crosshair import main as crosshair_cli
from crosshair.main import main as crosshair_main
from crosshair.options import DEFAULT_OPTIONS

from kvcert.reference import planner
from kvcert.reference.config import GroupConfig, Kind
from kvcert.reference.groups import first_needed
from kvcert.spec.acceptance import sliding_window_needed
from kvcert.spec.layout import SlidingWindow
from kvcert.spec.plan import group_size

GROUP_SHARE = Fraction(1, 20)


def spec_group_size(a: int, b: int) -> int:
    """PAGE-GROUP-1 (kvcert.spec) for two buckets; 0 outside the checked domain."""
    if not (1 <= a <= 12 and 1 <= b <= 12):
        return 0
    return group_size((a, b), GROUP_SHARE)


def reference_group_size(a: int, b: int) -> int:
    """PAGE-GROUP-1 (kvcert.reference) for two buckets; 0 outside the checked domain."""
    if not (1 <= a <= 12 and 1 <= b <= 12):
        return 0
    return planner._group_size([a, b], GROUP_SHARE)


def spec_window_start(length: int, window: int, block: int) -> int:
    """HIT-SW-1 (kvcert.spec): the first needed block; -1 outside the checked domain."""
    if not (1 <= block <= 64 and 1 <= window <= 4096 and 0 <= length <= 4096):
        return -1
    if length % block:
        return -1
    needed = sliding_window_needed(SlidingWindow(block, window), length)
    return needed.start if len(needed) else length // block


def reference_window_start(length: int, window: int, block: int) -> int:
    """HIT-SW-1 (kvcert.reference): the first needed block; -1 outside the checked domain."""
    if not (1 <= block <= 64 and 1 <= window <= 4096 and 0 <= length <= 4096):
        return -1
    if length % block:
        return -1
    group = GroupConfig(Kind.SLIDING_WINDOW, block, window=window)
    return min(first_needed(group, length), length // block)


def reference_window_start_without_minus_one(length: int, window: int, block: int) -> int:
    """A buggy control for diffbehavior: the window without its -1 (vLLM's old off-by-one)."""
    if not (1 <= block <= 64 and 1 <= window <= 4096 and 0 <= length <= 4096):
        return -1
    if length % block:
        return -1
    return min(max(0, length - window) // block, length // block)


def golden_aligned_hit(sizes: list[int], longest: int) -> int:
    """A correct control: the longest hit every block size divides.

    pre: 1 <= len(sizes) <= 3
    pre: all(1 <= s <= 8 for s in sizes)
    pre: 0 <= longest <= 64
    post: all(__return__ % s == 0 for s in sizes)
    post: 0 <= __return__ <= longest
    """
    step = math.lcm(*sizes)
    return longest // step * step


def golden_aligned_hit_buggy(sizes: list[int], longest: int) -> int:
    """A buggy control: aligns to the largest block size instead of the lcm.

    pre: 1 <= len(sizes) <= 3
    pre: all(1 <= s <= 8 for s in sizes)
    pre: 0 <= longest <= 64
    post: all(__return__ % s == 0 for s in sizes)
    post: 0 <= __return__ <= longest
    """
    step = max(sizes)
    return longest // step * step


def _namespace_tolerant_resources() -> types.ModuleType:
    """importlib with `resources.files` raising FileNotFoundError for namespace packages,
    which CrossHair already treats as "no directives"."""
    real = importlib.resources

    def files(package: Any) -> Any:
        if getattr(package, "__file__", None) is None:
            raise FileNotFoundError(f"{package.__name__} is a namespace package")
        return real.files(package)

    resources = types.SimpleNamespace(files=files, read_text=real.read_text)
    return types.SimpleNamespace(resources=resources)  # type: ignore[return-value]


def _bound_paths(args: list[str]) -> list[str]:
    """Take `--max_iterations N` out of `args` and make N CrossHair's default path budget per
    condition, with no time or "uninteresting paths" bound beside it."""
    if "--max_iterations" not in args:
        return args
    at = args.index("--max_iterations")
    paths = int(args[at + 1])
    bounded = DEFAULT_OPTIONS.overlay(max_iterations=paths, max_uninteresting_iterations=0)
    for module in (crosshair_core, crosshair_cli):  # both read it when they start a check
        setattr(module, "DEFAULT_OPTIONS", bounded)  # noqa: B010 - not re-exported by name
    return args[:at] + args[at + 2 :]


def main(argv: list[str] | None = None) -> int:
    """CrossHair's command line, with the namespace-package and path-budget shims."""
    codeconfig.importlib = _namespace_tolerant_resources()  # type: ignore[attr-defined]
    sys.argv = ["crosshair", *_bound_paths(list(sys.argv[1:] if argv is None else argv))]
    try:
        crosshair_main()
    except SystemExit as done:
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
