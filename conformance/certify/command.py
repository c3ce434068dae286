"""`kvcert certify` (every vector against an engine) and `kvcert serve` (an engine over stdio)."""

from __future__ import annotations

import argparse
import json
import sys
from importlib.resources.abc import Traversable
from pathlib import Path

from kvcert.conformance.arguments import output_path, positive_seconds
from kvcert.conformance.certify.report import PASSING, Result, render_report
from kvcert.conformance.certify.runner import load_reasons, run_vectors
from kvcert.conformance.certify.vector_files import VECTORS, iter_cases, user_manifest
from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.contract.compare import REFUSED_VALID
from kvcert.conformance.contract.protocol import Engine
from kvcert.conformance.contract.stdio import StdioEngine, serve
from kvcert.conformance.engines.loader import load_engine


def vector_root(args: argparse.Namespace) -> Traversable:
    """The bundled vectors, or a user's folder (`--vectors DIR`) with its own manifest."""
    if args.write_manifest and (args.engine or args.cmd or args.skips or args.xfails):
        raise InputError(
            "--write-manifest checks your vectors against the spec and certifies no engine: "
            "drop --engine/--cmd/--skips/--xfails, then certify your engine against the "
            "folder with --vectors DIR"
        )
    if args.vectors is None:
        if args.write_manifest:
            raise InputError("--write-manifest needs --vectors DIR: the folder to write it in")
        return VECTORS
    directory: Path = args.vectors
    if args.write_manifest:
        return directory
    if not (directory / "manifest.json").is_file():
        raise InputError(
            f"--vectors {directory}: no manifest.json; write one (it also checks every case "
            f"against the spec) with: kvcert certify --vectors {directory} --write-manifest"
        )
    return directory


def write_manifest(directory: Path) -> int:
    """`--write-manifest`: lock a user's vector files, once the spec agrees with each case."""
    manifest = user_manifest(directory)
    target = directory / "manifest.json"
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    report = run_vectors(load_engine("spec"), root=directory)
    wrong = [r for r in report.results if r.status not in PASSING]
    if wrong:
        target.unlink()
        for result in wrong:
            print(f"{result.id}: {spec_verdict(result.detail)}", file=sys.stderr)
        print(f"no manifest written: fix the {len(wrong)} case(s) above", file=sys.stderr)
        return 1
    total = sum(entry["cases"] for entry in manifest["files"].values())
    print(f"wrote {target}: {len(manifest['files'])} files, {total} cases, each the spec's answer")
    return 0


def spec_verdict(detail: str) -> str:
    """Why the spec does not give a user's case its expectation: the spec is the judge of
    valid input, so a case it refuses is invalid input, not a refusal of valid input."""
    if detail.startswith(REFUSED_VALID):
        why = detail.removeprefix(REFUSED_VALID).removeprefix(": ")
        return (
            f"the input is invalid: the spec refuses it ({why or 'see spec/RULES.md'}); fix "
            'the input, or expect {"refused": true}'
        )
    return f"the spec disagrees: {detail}"


def run_certify(args: argparse.Namespace) -> int:
    """The `certify` command: exit 0 when nothing unexpected happened, 1 otherwise."""
    root = vector_root(args)
    if args.write_manifest:
        return write_manifest(root)  # type: ignore[arg-type]  # a Path when writing
    skips = load_reasons(args.skips, "skip")
    xfails = load_reasons(args.xfails, "xfail")
    if args.cmd is not None:
        engine: Engine = StdioEngine(args.cmd, timeout=args.timeout, on_retry=_say)
    else:
        engine = load_engine(args.engine or "reference")
    found = list(iter_cases(root))  # each file read and schema-checked once
    cases = {case["id"]: case for _, case, _ in found if case is not None}
    total = len(found)
    told: set[str] = set()

    def progress(done: int, result: Result) -> None:
        # a cause shared by many cases (a dead engine) is told once, with its first case
        fresh = result.status not in PASSING and result.detail not in told
        if fresh:
            told.add(result.detail)
        if done % 50 == 0 or done == total or fresh:
            print(f"[{done:4d}/{total}] {result.status:8} {result.id}", file=sys.stderr)

    try:
        report = run_vectors(
            engine,
            skips=skips,
            xfails=xfails,
            timeout=args.timeout,
            root=root,
            progress=None if args.quiet else progress,
            found=found,
        )
    finally:
        if isinstance(engine, StdioEngine):
            engine.close()
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    print(render_report(report, cases), end="")
    return 0 if report.ok else 1


def _say(message: str) -> None:
    print(f"kvcert: {message}", file=sys.stderr)


def run_serve(args: argparse.Namespace) -> int:
    """The `serve` command."""
    return serve(load_engine(args.engine))


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert certify` and `kvcert serve`."""
    certify = commands.add_parser(
        "certify",
        help="run every conformance vector against an engine (default: the bundled reference)",
        description="Run every conformance vector against an engine and report per suite and "
        "per rule; exits 1 on any unexpected result.",
    )
    which = certify.add_mutually_exclusive_group()
    which.add_argument(
        "--engine",
        help="entry-point name (reference, spec, vllm, sglang) or module:factory "
        "(default: reference)",
    )
    which.add_argument("--cmd", help="an out-of-process engine speaking kvcert-stdio/1")
    certify.add_argument("--json", type=output_path, help="also write the JSON report here")
    certify.add_argument("--skips", type=Path, help="JSON {case id: reason} to skip")
    certify.add_argument(
        "--xfails", type=Path, help="JSON {case id: reason} expected to fail (strict)"
    )
    certify.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="seconds per case (and start-up)"
    )
    certify.add_argument("--quiet", action="store_true", help="no progress lines")
    certify.add_argument(
        "--vectors",
        type=Path,
        help="certify against your own vector files in this folder (same schema; the folder "
        "needs a manifest.json, see --write-manifest)",
    )
    certify.add_argument(
        "--write-manifest",
        action="store_true",
        help="with --vectors: validate every case (schema, rule tags, unique ids, and the "
        "spec's own answer) and write the folder's manifest.json",
    )
    certify.set_defaults(run=run_certify)
    serve_parser = commands.add_parser(
        "serve",
        help="serve an engine over kvcert-stdio/1",
        description="Answer kvcert-stdio/1 messages (newline-delimited JSON) on stdin/stdout "
        "with an in-process engine, until a stop message or the end of input: what `kvcert "
        "certify --cmd` talks to. Logs go to stderr. The messages: CONFORMANCE.md and "
        "kvcert/conformance/contract/schema/stdio.schema.json.",
    )
    serve_parser.add_argument(
        "--engine", default="reference", help="entry-point name or module:factory"
    )
    serve_parser.set_defaults(run=run_serve)
