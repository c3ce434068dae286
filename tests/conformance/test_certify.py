"""The conformance suite: vectors, runner, adapters, `kvcert certify`, and its meta tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from kvcert.conformance.certify.report import render_report
from kvcert.conformance.certify.runner import run_vectors
from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.cli import main
from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.contract.stdio import StdioEngine
from kvcert.conformance.engines.loader import load_engine
from kvcert.conformance.engines.mutants import BROKEN
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.conformance.engines.spec_engine import SpecEngine
from kvcert.conformance.vectors import generate as gen
from kvcert.conformance.vectors.generate import cases
from kvcert.spec.alloc import Eviction, Visibility
from kvcert.spec.retention import Retention
from kvcert.spec.rules import all_rules

ROOT = Path(__file__).resolve().parents[2]


def all_cases():
    return [case for _, case, error in iter_cases() if not error]


def radix_cases():
    """The cases under the radix profile (spec §13), kvcert.reference.radix's."""
    return [case for case in all_cases() if case["input"].get("eviction") == "radix"]


@pytest.mark.slow
def test_vectors_are_fresh():
    """A spec change that alters behaviour shows up as a vector diff: regenerate and commit.
    In its own process: regenerating every vector under the coverage tracer costs minutes,
    and tests/spec holds the spec's coverage on its own."""
    check = [sys.executable, "-m", "kvcert.conformance.vectors.generate", "--check"]
    done = subprocess.run(check, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.slow  # a sweep of every vector: .ci/run's slow stage (README budget)
def test_vectors_validate_and_ids_are_unique():
    problems = [error for _, _, error in iter_cases() if error]
    assert problems == []
    ids = [c["id"] for c in all_cases()]
    assert len(ids) == len(set(ids))
    assert set(ids).isdisjoint(gen.RETIRED)


def test_no_two_committed_cases_ask_the_same_thing():
    """Once alloc.duplicates.earliest-served repeated alloc.visibility.same-step-miss."""
    seen = {}
    for case in all_cases():
        key = json.dumps([case["input"], case["expect"]], sort_keys=True)
        assert key not in seen, f"{case['id']} repeats {seen.get(key)}"
        seen[key] = case["id"]


def test_the_generator_refuses_duplicates_and_retired_ids():
    case = all_cases()[0]
    with pytest.raises(gen.DuplicateVector, match="same input and expectation as"):
        gen.refuse_duplicates({"a.json": [case], "b.json": [{**case, "id": "hit.twin"}]})
    with pytest.raises(gen.DuplicateVector, match="used twice or retired"):
        gen.refuse_duplicates({"a.json": [case, {**case, "input": {}}]})
    retired = next(iter(gen.RETIRED))
    with pytest.raises(gen.DuplicateVector, match="used twice or retired"):
        gen.refuse_duplicates({"a.json": [{**case, "id": retired}]})
    gen.refuse_duplicates({"a.json": [case, {**case, "id": "hit.other", "expect": {}}]})


# The byte-layout rules are certified on kvcert.kernels (tests/kernels, byte for byte); engines
# answer no address queries in the vectors yet. Listed so the gap is visible; this test fails
# once a vector cites one of them.
AWAITING_KERNEL_SUITE = {
    "PAGE-ADDR-1",
    "PAGE-ADDR-2",
    "PAGE-ADDR-3",
    "PAGE-ADDR-4",
    "PAGE-ADDR-5",
    "PAGE-SLOT-1",
}


# EVICT-LIVE-1 is the meaning the hybrid profile is checked against (tests/spec/test_eviction):
# which blocks some lookup could be served. No operation of the alloc protocol observes it;
# what engines are held to is EVICT-DEAD-1/EVICT-HYB-1, which the vectors cite.
MEANING_ONLY = {"EVICT-LIVE-1"}
# Checkpoint placement (§12) is the scheduler's chunking, which the alloc protocol receives as
# budgets, not as rules: tests/differential/test_scheduling.py holds kvcert.reference to them,
# and `kvcert simulate` exercises them. A `schedule` suite would be the way to certify engines.
SCHEDULER_RULES = {"BRANCH-1", "CKPT-ALL-1", "CKPT-ALIGN-1", "CKPT-BRANCH-1"}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["eviction", "visibility", "retention"])
def test_a_case_that_names_no_profile_of_a_family_answers_alike_under_each(family):
    """An engine skips only the cases whose `requires` names a profile it lacks, so a case
    naming none must mean the same under every profile of that family. Once
    alloc.sparse.sliding-window.release-with-nulls did not: sparse retention freed its window
    blocks unkeyed in the op that allocates, where the free order picks the next block."""
    profiles = {"eviction": Eviction, "visibility": Visibility, "retention": Retention}[family]
    checked = 0
    for case in all_cases():
        data = case["input"]
        if data["suite"] != "alloc" or any(r.startswith(f"{family}.") for r in case["requires"]):
            continue
        checked += 1
        for other in profiles:
            if other.value != data.get(family, cases.PROFILE_DEFAULTS[family].value):
                answer, _ = cases.spec_answer({**data, family: other.value})
                if answer == cases.REFUSED:  # the spec defines no such configuration (the
                    continue  # radix profile beside a window, hybrid eviction under `unit U`)
                assert answer == case["expect"], f"{case['id']} under {family} {other.value}"
    assert checked > 40


@pytest.mark.slow  # a sweep of every vector: .ci/run's slow stage (README budget)
def test_every_rule_is_cited_by_a_vector():
    cited = {rule for c in all_cases() for rule in c["rules"] + c.get("focus", [])}
    exempt = AWAITING_KERNEL_SUITE | MEANING_ONLY | SCHEDULER_RULES
    assert {r.tag for r in all_rules()} - exempt <= cited
    assert not AWAITING_KERNEL_SUITE & cited, "a layout rule has vectors now: drop its exemption"
    assert not (MEANING_ONLY | SCHEDULER_RULES) & cited, "cited now: drop the exemption"
    assert all(c["rules"] for c in all_cases())


def test_every_seed_and_noted_bug_has_a_vector():
    origins = {c.get("origin") for c in all_cases()}
    for origin in (
        "vllm#32802",
        "vllm#40624",
        "vllm#42948",
        "vllm#36493",
        "vllm#41838",
        "vllm#33775",
        "vllm#44701",
        "vllm#39450",
    ):
        assert origin in origins


@pytest.mark.slow  # a sweep of every vector: .ci/run's slow stage (README budget)
def test_the_reference_passes_every_vector():
    """kvcert.reference, an implementation independent of the spec, agrees on every case."""
    report = run_vectors(ReferenceEngine())
    assert report.ok, render_report(report)
    assert report.counts() == Counter({"passed": len(all_cases())})
    assert radix_cases()  # the radix profile's too, through kvcert.reference.radix


@pytest.mark.slow
def test_the_spec_engine_reproduces_its_own_vectors():
    """The generator wrote these expectations with this engine, so this shows no more than
    that the committed files, the codec and the comparison agree (no drift between them);
    the spec's correctness is argued in tests/spec and checked against the reference."""
    report = run_vectors(SpecEngine())
    assert report.counts() == Counter({"passed": len(all_cases())}), render_report(report)


@pytest.mark.slow
def test_reference_over_stdio_passes_every_vector():
    command = f"{sys.executable} -m kvcert.conformance.cli serve --engine reference"
    engine = StdioEngine(command)
    try:
        report = run_vectors(engine)
    finally:
        engine.close()
    assert report.ok, render_report(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_engine_fails_and_the_report_names_its_rule(name):
    engine_class, rule = BROKEN[name]
    report = run_vectors(engine_class())
    assert not report.ok
    text = render_report(report)
    named = next(line for line in text.splitlines() if "written for" in line)
    assert rule in named, text


@pytest.mark.slow
def test_vectors_alone_cover_every_branch_of_the_behavioural_spec(tmp_path):
    """Coverage gate: the spec as an engine, driven by the vectors only, takes every branch of
    the modules engines exercise (invariants and the rule index are checked by tests/spec).

    Lines marked `# type guard` reject wrong Python types, which JSON input cannot produce
    (the parser converts first), and `# direct callers only` guards a rule against calls no
    plan makes; tests/spec covers both.
    """
    modules = [
        "acceptance",
        "alloc",
        "retention",
        "errors",
        "hashing",
        "hybrid",
        "layout",
        "view",
        "layers",
        "plan",
    ]
    include = ",".join(str(ROOT / "spec" / f"{m}.py") for m in modules)
    rcfile = tmp_path / "gate.ini"
    rcfile.write_text(
        "[run]\nbranch = True\n[report]\nexclude_also =\n    type guard: Python callers only\n"
        "    direct callers only\n"
    )
    coverage = [sys.executable, "-m", "coverage"]
    common = [f"--rcfile={rcfile}", f"--data-file={tmp_path / '.coverage'}"]
    certify = ["-m", "kvcert.conformance.cli", "certify", "--engine", "spec", "--quiet"]
    run = subprocess.run(
        [*coverage, "run", *common, f"--include={include}", *certify],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = subprocess.run(
        [*coverage, "report", *common, "--show-missing", "--fail-under=100"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert report.returncode == 0, report.stdout


# --- the runner under bad input ---------------------------------------------------------------


class Crashing(ReferenceEngine):
    def run(self, case):
        raise RuntimeError("engine bug")


class Garbage(ReferenceEngine):
    def run(self, case):
        return {"hit": "lots"} if case["suite"] == "hit" else {"observations": 7}


class Hanging(ReferenceEngine):
    def run(self, case):
        import time

        time.sleep(5)


class Lacking(ReferenceEngine):
    def describe(self):
        return {**super().describe(), "features": ["kind.full"], "profiles": []}


@pytest.mark.slow
def test_crashing_and_garbage_engines_are_reported_per_case():
    crashed = run_vectors(Crashing())
    assert crashed.counts() == Counter({"errored": len(all_cases())})
    assert "RuntimeError: engine bug" in crashed.results[0].detail
    garbage = run_vectors(Garbage())
    assert garbage.counts() == Counter({"failed": len(all_cases())})
    assert "malformed answer" in garbage.results[0].detail


def test_a_hanging_engine_times_out_per_case_and_the_run_goes_on(tmp_path):
    """On the hit scenarios alone (each case waits out its 0.05 s)."""
    from kvcert.conformance.certify.vector_files import user_manifest

    source = resources.files("kvcert.conformance.vectors") / "hit" / "scenarios.json"
    (tmp_path / "scenarios.json").write_text(source.read_text(encoding="utf-8"))
    (tmp_path / "manifest.json").write_text(json.dumps(user_manifest(tmp_path)))
    report = run_vectors(Hanging(), timeout=0.05, root=tmp_path)
    cases = json.loads(source.read_text(encoding="utf-8"))["cases"]
    assert report.counts()["errored"] == len(cases) > 20
    assert all("no answer within 0.05 s" in r.detail for r in report.results)


@pytest.mark.slow
def test_missing_features_skip_with_a_reason_and_are_counted():
    report = run_vectors(Lacking())
    skipped = [r for r in report.results if r.status == "skipped"]
    assert skipped
    assert all(r.detail.startswith("engine lacks ") for r in skipped)
    assert report.ok
    assert len(report.results) == len(all_cases())


@pytest.mark.slow
def test_expected_failures_are_strict_and_stale_entries_fail():
    case_id = all_cases()[0]["id"]
    xpassed = run_vectors(ReferenceEngine(), xfails={case_id: "thought broken"})
    assert not xpassed.ok
    assert [r.status for r in xpassed.results if r.id == case_id] == ["xpassed"]
    xfailed = run_vectors(Crashing(), xfails={c["id"]: "known" for c in all_cases()})
    assert xfailed.ok
    stale = run_vectors(ReferenceEngine(), skips={"hit.no-such-case": "gone"})
    assert not stale.ok
    assert stale.results[-1].detail.startswith("skip/xfail entry names no vector")


def test_malformed_vector_files_are_reported_not_skipped(tmp_path):
    root = tmp_path / "vectors"
    source = resources.files("kvcert.conformance.vectors")
    (root / "hit").mkdir(parents=True)
    good = json.loads((source / "hit" / "scenarios.json").read_text(encoding="utf-8"))
    good["cases"] = good["cases"][:3]
    del good["cases"][1]["expect"]
    text = json.dumps(good)
    (root / "hit" / "a.json").write_text(text, encoding="utf-8")
    (root / "hit" / "b.json").write_text("{broken", encoding="utf-8")
    import hashlib

    manifest = {
        "files": {
            "hit/a.json": {"sha256": hashlib.sha256(text.encode()).hexdigest(), "cases": 3},
            "hit/b.json": {"sha256": hashlib.sha256(b"{broken").hexdigest(), "cases": 1},
            "hit/c.json": {"sha256": "0" * 64, "cases": 1},
        }
    }
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    report = run_vectors(ReferenceEngine(), root=root)
    statuses = [(r.id, r.status) for r in report.results]
    assert statuses.count(("hit/a.json", "errored")) == 1  # the bad case, reported
    assert ("hit/b.json", "errored") in statuses
    assert ("hit/c.json", "errored") in statuses
    assert sum(1 for _, s in statuses if s == "passed") == 2


def test_engines_load_by_name_and_by_module_factory():
    assert isinstance(load_engine("reference"), ReferenceEngine)
    assert isinstance(load_engine("kvcert.conformance.engines.spec_engine:make_spec"), SpecEngine)
    with pytest.raises(EngineError, match="vLLM is not installed"):
        load_engine("vllm")  # registered, but its engine lives in its own venv
    with pytest.raises(EngineError, match="no engine named 'tensorrt'"):
        load_engine("tensorrt")
    with pytest.raises(EngineError, match="cannot load engine"):
        load_engine("kvcert.nothing:here")
    with pytest.raises(EngineError, match="no describe"):
        load_engine("builtins:object")


@pytest.mark.slow
def test_certify_command_exit_codes_and_json_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["certify", "--quiet", "--json", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("failed, 0 skipped")
    report = json.loads(out.read_text())
    assert report["summary"] == f"{len(all_cases())} passed, 0 failed, 0 skipped"
    assert "HIT-SPEC-2" in report["by_rule"]
    broken = "kvcert.conformance.engines.mutants:PerGroupDropEngine"
    assert main(["certify", "--quiet", "--engine", broken]) == 1
    text = capsys.readouterr().out
    assert "FAILED hit.vllm-c1.eagle-drop-once [vllm#32802]" in text
    assert "HYBRID HIT: 48 tokens" in text  # the failing case's diagram, from kvcert explain
    skips = tmp_path / "skips.json"
    skips.write_text(json.dumps({"hit.vllm-c1.eagle-drop-once": ""}))
    assert main(["certify", "--quiet", "--skips", str(skips)]) == 2
    assert "non-empty reasons" in capsys.readouterr().err


def test_a_misbehaving_stdio_engine_is_reported_per_case_and_restarted():
    """Hang (timeout, process killed and restarted), exit, garbage: each is reported against
    its case and every other case of their file still passes (the file's 29 cases are the
    run: a whole suite over stdio proves no more about restarts)."""
    import shlex

    from tests.conformance import flaky_stdio_engine as flaky

    by_id = {c["id"]: c for c in all_cases()}
    markers = [
        json.dumps(by_id[i]["input"]["layout"], sort_keys=True)
        for i in (flaky.HANG, flaky.EXIT, flaky.GARBAGE)
    ]
    command = " ".join(
        shlex.quote(p)
        for p in [sys.executable, "-m", "tests.conformance.flaky_stdio_engine", *markers]
    )
    engine = StdioEngine(command, timeout=2)
    try:
        found = [f for f in iter_cases() if f[0] == "hit/scenarios.json"]
        report = run_vectors(engine, suites=("hit",), timeout=5, found=found)
    finally:
        engine.close()
    bad = {r.id: r.detail for r in report.results if r.status not in {"passed", "skipped"}}
    assert set(bad) == {flaky.HANG, flaky.EXIT, flaky.GARBAGE}
    assert report.counts()["passed"] == len(found) - 3 > 20
    assert "no answer to the run (seq" in bad[flaky.HANG]
    assert "message within 2 s" in bad[flaky.HANG]
    assert "exited (exit status 3)" in bad[flaky.EXIT]
    assert "'this is not json'" in bad[flaky.GARBAGE]


class PicksyEngine(ReferenceEngine):
    """The reference, except that it declares alloc cases inexpressible."""

    def run(self, case):
        if case["suite"] == "alloc":
            return {"unsupported": "no block tables here"}
        return super().run(case)


def test_unsupported_answers_are_skipped_with_the_reason_never_passed():
    report = run_vectors(PicksyEngine(), suites=("alloc",))
    alloc = [r for r in report.results if r.suite == "alloc"]
    assert alloc
    assert all(r.status == "skipped" for r in alloc)
    ran = [r for r in alloc if "no block tables here" in r.detail]
    assert ran, "no alloc case reached the engine"
    xfail = {ran[0].id: "would be an xfail"}
    again = run_vectors(PicksyEngine(), suites=("alloc",), xfails=xfail)
    assert {r.status for r in again.results if r.id == ran[0].id} == {"skipped"}
    assert {r.status for r in again.results} == {"skipped"}  # nothing unexpected...
    assert not again.ok  # ...but nothing ran either: a run that tested nothing fails
    assert "NOTHING RAN" in render_report(again)


# --- a user's own vectors: --vectors DIR, --write-manifest --------------------------------------


def _user_vectors(folder: Path, mutate=None) -> Path:
    """Three bundled window cases as a user's own file (optionally edited), the first of which
    the off-by-one window engine fails."""
    from kvcert.conformance.certify.runner import run_case
    from kvcert.conformance.engines.mutants import WindowOffByOneEngine

    body = json.loads((resources.files("kvcert.conformance.vectors") / "hit" / "scenarios.json")
                      .read_text(encoding="utf-8"))  # fmt: skip
    windows = [c for c in body["cases"] if "HIT-SW-1" in c["rules"]]
    caught = [c for c in windows if run_case(WindowOffByOneEngine(), c, 5).status == "failed"]
    body["cases"] = [caught[0], *[c for c in windows if c is not caught[0]][:2]]
    assert len(body["cases"]) == 3
    if mutate is not None:
        mutate(body["cases"][0])
    folder.mkdir(exist_ok=True)
    (folder / "mine.json").write_text(json.dumps(body, indent=1), encoding="utf-8")
    return folder


def test_a_users_vectors_certify_once_their_manifest_is_written(tmp_path, capsys):
    folder = _user_vectors(tmp_path / "v")
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 2
    assert "--write-manifest" in capsys.readouterr().err
    assert main(["certify", "--vectors", str(folder), "--write-manifest"]) == 0
    assert "1 files, 3 cases, each the spec's answer" in capsys.readouterr().out
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 0
    assert "suite hit: 3 passed" in capsys.readouterr().out
    # a broken engine fails them, with the diagram of the failed hit
    engine = "kvcert.conformance.engines.mutants:WindowOffByOneEngine"
    assert main(["certify", "--vectors", str(folder), "--quiet", "--engine", engine]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "HIT-SW-1" in out
    # an edit after the manifest is an error against the file, never a silent pass
    text = (folder / "mine.json").read_text(encoding="utf-8")
    (folder / "mine.json").write_text(text.replace('"comment": "', '"comment": "edited '))
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    assert "does not match its manifest sha256" in capsys.readouterr().out


def test_a_wrong_expectation_gets_no_manifest(tmp_path, capsys):
    def wrong(case):
        case["expect"]["hit"] = case["expect"]["hit"] + 16

    folder = _user_vectors(tmp_path / "v", wrong)
    assert main(["certify", "--vectors", str(folder), "--write-manifest"]) == 1
    assert "the spec disagrees" in capsys.readouterr().err
    assert not (folder / "manifest.json").exists()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.update(rules=["HIT-NOPE-1"]), "cites HIT-NOPE-1, which the spec does not"),
        (lambda c: c.pop("expect"), "schema: 'expect' is a required property"),
    ],
)
def test_bad_user_vectors_are_refused_by_file_and_case(tmp_path, capsys, mutate, message):
    folder = _user_vectors(tmp_path / "v", mutate)
    assert main(["certify", "--vectors", str(folder), "--write-manifest"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "mine.json" in err


def test_write_manifest_needs_a_folder(tmp_path, capsys):
    assert main(["certify", "--write-manifest"]) == 2
    assert "needs --vectors DIR" in capsys.readouterr().err
    assert main(["certify", "--vectors", str(tmp_path / "none"), "--write-manifest"]) == 2
    assert "not a folder of vector files" in capsys.readouterr().err
    assert main(["certify", "--vectors", str(tmp_path), "--write-manifest"]) == 2
    assert "no *.json vector files" in capsys.readouterr().err


def test_format_two_carries_layer_shapes_and_format_one_may_not(tmp_path, capsys):
    """Shapes (kvcert-vector/2) reach engines untouched and never change the spec's answer;
    a /1 file cannot use them, and a bad shape is refused with its place."""
    shaped = [c for c in all_cases() if c["id"].startswith("hit.shape.")]
    assert shaped
    assert all(any("shape" in g for g in c["input"]["layout"]["groups"]) for c in shaped)
    for case in shaped[:20]:
        bare = json.loads(json.dumps(case["input"]))
        for group in bare["layout"]["groups"]:
            group.pop("shape", None)
        assert SpecEngine().run(bare) == SpecEngine().run(case["input"])

    def write(body):
        folder = tmp_path / "v"
        folder.mkdir(exist_ok=True)
        (folder / "mine.json").write_text(json.dumps(body), encoding="utf-8")
        return main(["certify", "--vectors", str(folder), "--write-manifest"])

    body = {"format": "kvcert-vector/2", "spec_version": gen.SPEC_VERSION, "suite": "hit",
            "cases": [shaped[0]]}  # fmt: skip
    assert write(body) == 0
    capsys.readouterr()
    assert write({**body, "format": "kvcert-vector/1"}) == 2
    assert "schema" in capsys.readouterr().err
    bad = json.loads(json.dumps(shaped[0]))
    bad["input"]["layout"]["groups"][0]["shape"]["dtype"] = "fp4"
    assert write({**body, "cases": [bad]}) == 2
    assert "'fp4' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"num_kv_heads": 0, "head_size_k": 8, "dtype": "fp16"}, "num_kv_heads: expected a pos"),
        ({"num_kv_heads": 1, "head_size_k": 8}, "missing field(s) ['dtype']"),
        ({"num_kv_heads": 1, "head_size_k": 8, "dtype": "fp4"}, "dtype: expected one of"),
        ({"num_kv_heads": 1, "head_size_k": 8, "dtype": "fp16", "heads": 2}, "unknown field"),
    ],
)
def test_a_bad_shape_is_an_input_error_naming_where(shape, message):
    from kvcert.conformance.contract.codec import InputError, layout_from_json

    layout = {"groups": [{"kind": "full", "block_size": 4, "shape": shape}]}
    with pytest.raises(InputError, match=r"layout\.groups\[0\]\.shape") as error:
        layout_from_json(layout)
    assert message in str(error.value)
    mamba = {"groups": [{"kind": "mamba", "block_size": 4, "shape": shape}]}
    with pytest.raises(InputError, match="unknown field"):
        layout_from_json(mamba)


def test_an_alloc_case_names_its_visibility_by_value_or_not_at_all():
    from kvcert.conformance.contract.codec import InputError, visibility_from_json
    from kvcert.spec import alloc as spec_alloc

    assert visibility_from_json(None) is spec_alloc.Visibility.STEP_END
    assert visibility_from_json("same-pass") is spec_alloc.Visibility.SAME_PASS
    for bad in ("SAME_PASS", "eventually", 1):
        with pytest.raises(InputError, match="visibility must be one of step-end, same-pass"):
            visibility_from_json(bad)
    layout = {"groups": [{"kind": "full", "block_size": 4}]}
    case = {"suite": "alloc", "layout": layout, "num_blocks": 8, "ops": [], "visibility": "x"}
    assert SpecEngine().run(case).get("refused") is True
