"""The vector files a certification reads: the manifest, each file's checks, and its cases.

    {"format": "kvcert-vector/6", "spec_version": "0.7.0", "retired_ids": [...],
     "files": {"hit/scenarios.json": {"sha256": "<64 hex>", "cases": 12}, ...}}

A malformed manifest is the user's input error (`InputError`: nothing can run, and the
message names the manifest and what to write). A file or case that is wrong is reported
against that file or case, so a run accounts for every case and never passes over one: a
file missing, changed since the manifest (sha256), not JSON, off the schema, with another
case count than the manifest's or none; a case of another suite than its file or its id, a
case id seen before, a feature in `requires` that no engine can claim.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema

from kvcert.conformance.contract.codec import JSON, InputError
from kvcert.conformance.contract.protocol import FEATURES, PROFILES
from kvcert.spec.rules import all_rules

VECTORS: Traversable = resources.files("kvcert.conformance.vectors")
SCHEMA: Traversable = (
    resources.files("kvcert.conformance.contract") / "schema" / "vector.schema.json"
)
MANIFEST_FORMAT = "kvcert-vector/6"
# /5 and /6 only add optional fields (/5 hit_unit and partial, /6 copies)
READ_FORMATS = ("kvcert-vector/4", "kvcert-vector/5", MANIFEST_FORMAT)
SHA256 = re.compile(r"[0-9a-f]{64}")
CLAIMABLE = frozenset(FEATURES) | frozenset(PROFILES)

Found = tuple[str, JSON | None, str]  # (file, case or None, error or "")


def jsonschema_best_match(errors: list[Any]) -> Any:
    return jsonschema.exceptions.best_match(errors)


def _validator() -> Any:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))


_schema_clean: set[str] = set()  # digests of file texts the schema passed in this process


def _schema_errors(validator: Any, text: str, body: JSON) -> list[Any]:
    """The schema's errors on a file's body, sorted by path. Validating every bundled vector
    takes seconds; the same bytes under the same schema pass again, so a clean verdict is
    remembered by the digest of the two texts (the errors of a failing file are not)."""
    key = hashlib.sha256(f"{SCHEMA.read_text(encoding='utf-8')}\0{text}".encode()).hexdigest()
    if key in _schema_clean:
        return []
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    if not errors:
        _schema_clean.add(key)
    return errors


def _file_name(name: str, where: str) -> str:
    """A manifest entry names a file inside the vector folder: a relative POSIX path to a
    .json file, with no `..` (a manifest must not make the runner read outside its folder)."""
    path = PurePosixPath(name)
    if (
        not name.endswith(".json")
        or path.is_absolute()
        or "\\" in name
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise InputError(
            f"{where}: file {name!r} must be a relative path to a .json file inside the "
            "folder, without '..' (e.g. \"hit/mine.json\")"
        )
    return name


def read_manifest(root: Traversable) -> dict[str, JSON]:
    """The manifest's file entries, checked: {"name": {"sha256": ..., "cases": n}}."""
    where = f"{root}/manifest.json" if isinstance(root, Path) else "manifest.json"
    try:
        manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError(f"{where}: cannot be read: {error}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{where}: not valid JSON: {error}") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise InputError(
            f'{where}: expected an object with "files": {{"suite/name.json": {{"sha256": '
            '"<64 hex>", "cases": N}, ...}; kvcert certify --vectors DIR --write-manifest '
            "writes one"
        )
    if manifest.get("format", MANIFEST_FORMAT) not in READ_FORMATS:
        raise InputError(
            f"{where}: format must be one of {list(READ_FORMATS)}, got {manifest['format']!r}"
        )
    files: dict[str, JSON] = manifest["files"]
    if not files:
        raise InputError(f"{where}: lists no vector files, so there is nothing to certify")
    for name, entry in files.items():
        _file_name(name, where)
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not SHA256.fullmatch(entry["sha256"])
            or isinstance(entry.get("cases"), bool)
            or not isinstance(entry.get("cases"), int)
            or entry["cases"] < 1
        ):
            raise InputError(
                f'{where}: entry {name!r} must be {{"sha256": "<64 lowercase hex>", "cases": '
                f"N >= 1}}, got {entry!r}"
            )
    return files


def iter_cases(root: Traversable = VECTORS) -> Iterator[Found]:
    """(file, case or None, error) for every case of every file in the manifest."""
    validator = _validator()
    seen: dict[str, str] = {}
    for name, entry in sorted(read_manifest(root).items()):
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            yield name, None, f"vector file missing or unreadable: {error}"
            continue
        if hashlib.sha256(text.encode()).hexdigest() != entry["sha256"]:
            yield name, None, "vector file does not match its manifest sha256"
            continue
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            yield name, None, f"not valid JSON: {error}"
            continue
        errors = _schema_errors(validator, text, body)
        bad = {tuple(e.absolute_path)[:2] for e in errors}
        if errors and not all(len(b) == 2 and b[0] == "cases" for b in bad):
            yield name, None, f"schema: {errors[0].message} at {list(errors[0].absolute_path)}"
            continue
        if len(body["cases"]) != entry["cases"]:
            yield (
                name,
                None,
                (
                    f"holds {len(body['cases'])} cases but the manifest says {entry['cases']}: "
                    "a case was added or lost; rewrite the manifest (--write-manifest)"
                ),
            )
            continue
        for index, case in enumerate(body["cases"]):
            if ("cases", index) in bad:
                mine = [e for e in errors if tuple(e.absolute_path)[:2] == ("cases", index)]
                why = _deepest(jsonschema_best_match(mine))
                where = list(why.absolute_path)[2:]
                label = case.get("id") if isinstance(case, dict) else None
                problem = f"fails the schema: {why.message} at {where}"
                yield name, None, f"case {index} ({label!r}) {problem}"
            elif problem := _misplaced(case, body["suite"], seen.get(case["id"])):
                yield name, None, f"case {index} ({case['id']!r}): {problem}"
            else:
                yield name, case, ""
            if isinstance(case, dict) and isinstance(case.get("id"), str):
                seen.setdefault(case["id"], name)


@cache
def rule_tags() -> frozenset[str]:
    """Every rule tag the spec defines."""
    return frozenset(rule.tag for rule in all_rules())


def _misplaced(case: JSON, file_suite: str, earlier: str | None) -> str:
    """Why a schema-valid case cannot run as its file presents it ("" when it can)."""
    suite = case["input"]["suite"]
    if suite != file_suite:
        return f"this {suite} case sits in a file of suite {file_suite}; move it to a {suite} file"
    prefix = case["id"].split(".", 1)[0]
    if prefix != suite:
        return f"the id names suite {prefix!r} but the case is a {suite} case"
    if earlier is not None:
        return f"its id is also a case of {earlier}; case ids are unique across files"
    undefined = sorted(set(case["rules"]) - rule_tags())
    if undefined:
        return f"cites {', '.join(undefined)}, which the spec does not define (spec/RULES.md)"
    unknown = sorted(set(case["requires"]) - CLAIMABLE)
    if unknown:
        return (
            f"requires {', '.join(unknown)}, which no engine can claim (features and "
            "profiles: CONFORMANCE.md); a misspelt feature would skip the case on every engine"
        )
    return ""


def user_manifest(directory: Path) -> JSON:
    """The manifest for a user's own vector files: every `*.json` under `directory` (bar the
    manifest), each schema-valid, citing only rules the spec defines, with unique case ids.

    Raises InputError naming the file and case at fault. Whether each expectation is the
    spec's answer is checked by running the spec on them (`kvcert certify --write-manifest`).
    """
    if not directory.is_dir():
        raise InputError(f"--vectors {directory}: not a folder of vector files")
    validator = _validator()
    files: dict[str, JSON] = {}
    seen: dict[str, str] = {}
    for path in sorted(directory.rglob("*.json")):
        name = path.relative_to(directory).as_posix()
        if name == "manifest.json":
            continue
        try:
            text = path.read_text(encoding="utf-8")
            body = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InputError(f"{path}: not a readable JSON file: {error}") from error
        first = jsonschema.exceptions.best_match(validator.iter_errors(body))
        if first is not None:
            why = _deepest(first)
            raise InputError(f"{path}: schema: {why.message} at {list(why.absolute_path)}")
        if not body["cases"]:
            raise InputError(f"{path}: holds no cases; add at least one or delete the file")
        for case in body["cases"]:
            if problem := _misplaced(case, body["suite"], seen.get(case["id"])):
                raise InputError(f"{path}: case {case['id']!r}: {problem}")
            seen[case["id"]] = name
        files[name] = {
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "cases": len(body["cases"]),
        }
    if not files:
        raise InputError(f"--vectors {directory}: no *.json vector files in it")
    return {"format": MANIFEST_FORMAT, "files": files, "retired_ids": []}


def _deepest(error: Any) -> Any:
    """The most specific reason under a schema error: a oneOf (hit input, alloc input or
    refusal) reports only that no branch fits; the deepest error inside says why."""
    inner = [_deepest(e) for e in error.context or ()]
    return max([error, *inner], key=lambda e: len(e.absolute_path))
