"""The conformance runner: validate, filter, drive, compare, account for every vector.

Guarantees (CONFORMANCE.md states them for implementers):
* every vector file is schema-validated and its sha256 checked against the manifest; a bad
  file or case is reported as an error against it, never skipped silently;
* a case runs unless the engine lacks a feature it requires, or a skip file names it with a
  reason, or the engine answers {"unsupported": "why"} (a combination it cannot express
  although it has each feature); either way it is recorded, so the run accounts for every case;
* expected failures are strict: an xfail that passes fails the run;
* an engine that raises, answers garbage or exceeds the per-case time limit is reported
  against that case, and the run carries on; an engine that is dead for good (EngineDead) has
  every remaining case reported as an engine error, and the run still ends with its summary.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterable
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from kvcert.conformance.certify.report import Report, Result
from kvcert.conformance.certify.vector_files import VECTORS, Found, iter_cases
from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.compare import compare_alloc, compare_hit, compare_page
from kvcert.conformance.contract.protocol import Engine, EngineDead


def load_reasons(path: Path | None, what: str) -> dict[str, str]:
    """A skip or xfail file: {"case id": "reason", ...}; every entry needs a reason."""
    if path is None:
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read the {what} file: {error}") from error
    if not isinstance(entries, dict) or not all(
        isinstance(v, str) and v.strip() for v in entries.values()
    ):
        raise InputError(
            f'{path}: a {what} file maps case ids to non-empty reasons: {{"id": "why"}}'
        )
    return entries


def call_with_timeout(run: Callable[[], Any], seconds: float) -> Any:
    """run() in a daemon thread; TimeoutError if it does not return in time."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = run()
        except BaseException as error:
            box["error"] = error

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_vectors(
    engine: Engine,
    *,
    skips: dict[str, str] | None = None,
    xfails: dict[str, str] | None = None,
    timeout: float = 30.0,
    suites: tuple[str, ...] = ("hit", "alloc", "page"),
    root: Traversable = VECTORS,
    progress: Callable[[int, Result], None] | None = None,
    found: Iterable[Found] | None = None,
) -> Report:
    """Run every vector against `engine` and account for each one. `found`: the cases of
    `root` as `iter_cases` reads them, when the caller has read them already."""
    skips, xfails = skips or {}, xfails or {}
    dead: str | None = None
    try:
        info = engine.describe()
    except EngineDead as unavailable:  # its features are unknown: every case is an error
        info, dead = {"name": str(getattr(engine, "label", engine))}, str(unavailable)
    offered = set(info.get("features", [])) | set(info.get("profiles", []))
    report = Report(info)
    known: set[str] = set()
    for name, case, error in iter_cases(root) if found is None else found:
        if case is None:
            report.results.append(Result(f"{name}", name.split("/")[0], "errored", [], error))
            continue
        known.add(case["id"])
        suite = case["input"]["suite"]
        if dead is not None and suite in suites:
            result = Result(
                case["id"],
                suite,
                "errored",
                case["rules"],
                f"engine unavailable: {dead}",
                case.get("origin"),
            )
        elif suite not in suites:
            result = Result(
                case["id"],
                suite,
                "skipped",
                case["rules"],
                f"suite {suite} not selected",
                case.get("origin"),
            )
        elif missing := sorted(set(case["requires"]) - offered):
            result = Result(
                case["id"],
                suite,
                "skipped",
                case["rules"],
                f"engine lacks {', '.join(missing)}",
                case.get("origin"),
            )
        elif case["id"] in skips:
            result = Result(
                case["id"],
                suite,
                "skipped",
                case["rules"],
                f"skip file: {skips[case['id']]}",
                case.get("origin"),
            )
        else:
            # only the radix profile names pages by lifetime: the block-pool profiles'
            # traces stay compared up to one bijection, whatever else the engine claims
            radix = case["input"].get("eviction") == "radix"
            result = run_case(engine, case, timeout, lifetimes=radix)
            dead = getattr(engine, "dead", None)
            if case["id"] in xfails and result.status != "skipped":
                result.status = "xpassed" if result.status == "passed" else "xfailed"
                result.detail = f"expected failure ({xfails[case['id']]}): {result.detail}"
        report.results.append(result)
        if progress is not None:
            progress(len(report.results), result)
    for stale in sorted((set(skips) | set(xfails)) - known):
        report.results.append(
            Result(
                stale, "-", "errored", [], "skip/xfail entry names no vector (retired or misspelt)"
            )
        )
    return report


def run_case(engine: Engine, case: JSON, timeout: float, *, lifetimes: bool = False) -> Result:
    """Run one case and compare; `lifetimes`: the case is under the radix profile, whose
    page ids name lifetimes (RADIX-ID-1), so its tables are compared up to a renaming of
    them."""
    suite = case["input"]["suite"]
    base = Result(
        case["id"], suite, "passed", case["rules"], "", case.get("origin"), case.get("focus", [])
    )
    try:
        if getattr(engine, "enforces_timeout", False):
            answer = engine.run(case["input"])  # its own timer, start-up included (stdio)
        else:
            answer = call_with_timeout(lambda: engine.run(case["input"]), timeout)
    except Exception as error:
        base.status, base.detail = "errored", f"{type(error).__name__}: {error}"
        return base
    if isinstance(answer, dict) and isinstance(answer.get("unsupported"), str):
        # The engine cannot express this case (declared per case, not faked): accounted for.
        base.status, base.detail = "skipped", f"engine cannot express it: {answer['unsupported']}"
        return base
    compares: dict[str, Callable[[Any, Any], str | None]] = {
        "hit": compare_hit,
        "alloc": functools.partial(compare_alloc, lifetimes=lifetimes),
        "page": compare_page,
    }
    compare = compares[suite]
    try:
        difference = compare(case["expect"], answer)
    except (TypeError, KeyError, ValueError) as error:
        difference = f"malformed answer: {type(error).__name__}: {error}"
    if difference is not None:
        base.status, base.detail = "failed", difference
    return base
