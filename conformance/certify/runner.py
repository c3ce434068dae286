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

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from kvcert.conformance.certify.report import Report, Result
from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.compare import compare_alloc, compare_hit, compare_page
from kvcert.conformance.contract.protocol import Engine, EngineDead

VECTORS: Traversable = resources.files("kvcert.conformance.vectors")
SCHEMA: Traversable = (
    resources.files("kvcert.conformance.contract") / "schema" / "vector.schema.json"
)


def load_reasons(path: Path | None, what: str) -> dict[str, str]:
    """A skip or xfail file: {"case id": "reason", ...}; every entry needs a reason."""
    if path is None:
        return {}
    entries = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(entries, dict) or not all(
        isinstance(v, str) and v.strip() for v in entries.values()
    ):
        raise ValueError(f"{path}: a {what} file maps case ids to non-empty reasons")
    return entries


def iter_cases(root: Traversable = VECTORS) -> Iterator[tuple[str, JSON | None, str]]:
    """(file, case or None, error) for every case of every file in the manifest."""
    import jsonschema  # noqa: PLC0415 - only certification needs it; explain stays stdlib-only

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    for name, entry in sorted(manifest["files"].items()):
        try:
            text = (root / name).read_text(encoding="utf-8")
        except OSError as error:
            yield name, None, f"vector file missing: {error}"
            continue
        if hashlib.sha256(text.encode()).hexdigest() != entry["sha256"]:
            yield name, None, "vector file does not match its manifest sha256"
            continue
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            yield name, None, f"not valid JSON: {error}"
            continue
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        bad = {tuple(e.absolute_path)[:2] for e in errors}
        if errors and not all(len(b) == 2 and b[0] == "cases" for b in bad):
            yield name, None, f"schema: {errors[0].message} at {list(errors[0].absolute_path)}"
            continue
        for index, case in enumerate(body["cases"]):
            if ("cases", index) in bad:
                message = next(
                    e.message for e in errors if tuple(e.absolute_path)[:2] == ("cases", index)
                )
                yield name, None, f"case {index} ({case.get('id')!r}) fails the schema: {message}"
            else:
                yield name, case, ""


def user_manifest(directory: Path) -> JSON:
    """The manifest for a user's own vector files: every `*.json` under `directory` (bar the
    manifest), each schema-valid, citing only rules the spec defines, with unique case ids.

    Raises InputError naming the file and case at fault. Whether each expectation is the
    spec's answer is checked by running the spec on them (`kvcert certify --write-manifest`).
    """
    import jsonschema  # noqa: PLC0415 - only certification needs it

    from kvcert.spec.rules import all_rules  # noqa: PLC0415 - tags, not behaviour

    if not directory.is_dir():
        raise InputError(f"--vectors {directory}: not a folder of vector files")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    tags = {rule.tag for rule in all_rules()}
    files: dict[str, JSON] = {}
    seen: dict[str, str] = {}
    for path in sorted(directory.rglob("*.json")):
        name = path.relative_to(directory).as_posix()
        if name == "manifest.json":
            continue
        text = path.read_text(encoding="utf-8")
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{name}: not valid JSON: {error}") from error
        first = jsonschema.exceptions.best_match(validator.iter_errors(body))
        if first is not None:
            why = _deepest(first)
            raise InputError(f"{name}: schema: {why.message} at {list(why.absolute_path)}")
        for case in body["cases"]:
            unknown = sorted(set(case["rules"]) - tags)
            if unknown:
                raise InputError(
                    f"{name}: case {case['id']!r} cites {', '.join(unknown)}, which the spec "
                    "does not define (see spec/RULES.md)"
                )
            if case["id"] in seen:
                raise InputError(f"{name}: case id {case['id']!r} is also in {seen[case['id']]}")
            seen[case["id"]] = name
        files[name] = {
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "cases": len(body["cases"]),
        }
    if not files:
        raise InputError(f"--vectors {directory}: no *.json vector files in it")
    return {"format": "kvcert-vector/2", "files": files, "retired_ids": []}


def _deepest(error: Any) -> Any:
    """The most specific reason under a schema error: a oneOf (hit input, alloc input or
    refusal) reports only that no branch fits; the deepest error inside says why."""
    inner = [_deepest(e) for e in error.context or ()]
    return max([error, *inner], key=lambda e: len(e.absolute_path))


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
) -> Report:
    """Run every vector against `engine` and account for each one."""
    skips, xfails = skips or {}, xfails or {}
    dead: str | None = None
    try:
        info = engine.describe()
    except EngineDead as unavailable:  # its features are unknown: every case is an error
        info, dead = {"name": str(getattr(engine, "label", engine))}, str(unavailable)
    offered = set(info.get("features", [])) | set(info.get("profiles", []))
    report = Report(info)
    known: set[str] = set()
    for name, case, error in iter_cases(root):
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
            result = run_case(engine, case, timeout)
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


def run_case(engine: Engine, case: JSON, timeout: float) -> Result:
    """Run one case and compare."""
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
    compare = {"hit": compare_hit, "alloc": compare_alloc, "page": compare_page}[suite]
    try:
        difference = compare(case["expect"], answer)
    except (TypeError, KeyError, ValueError) as error:
        difference = f"malformed answer: {type(error).__name__}: {error}"
    if difference is not None:
        base.status, base.detail = "failed", difference
    return base
