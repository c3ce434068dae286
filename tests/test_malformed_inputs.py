"""Malformed input, generated: vector files, manifests, Hugging Face configs and library calls,
each bent at a random place into a value of the wrong kind, a huge or negative number, a
reversed range or an unknown field. Every one must end in the package's typed error (or a
result that says what is wrong), within a bound far above its cost, and never in a
traceback, a hang or a silent acceptance.

Run against main 9f67cc5 (before issue 38's fixes, `ulimit -v 5000000`), these properties
failed at once: a manifest `{}` (KeyError 'files') and a manifest `true` (TypeError);
CacheConfig(max_model_len="4096") (TypeError); CacheConfig(hash_algorithm=None) and value
strings accepted without becoming members; block_at past the tables (IndexError) and
budgets of None (TypeError); a layout with an unknown field read by the reference and
refused by the spec; a case of `null` (AttributeError) and a cached range not of two numbers
(ValueError); a config.json of 1,384,312,644 layers (memory exhausted: the process died).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcert.conformance.certify.runner import run_vectors
from kvcert.conformance.cli import main
from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.engines.reference_engine import ReferenceEngine
from kvcert.conformance.engines.spec_engine import SpecEngine
from kvcert.conformance.tools.catalog import load_model
from kvcert.reference import config as ref
from kvcert.reference.errors import KVCacheError
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.spec import SpecError
from tests.tiers import tiered

HANG = 60.0  # seconds: a bound hundreds of times what any example costs, so load cannot trip it
EXAMPLES = settings(
    max_examples=tiered(150, 1500),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def bounded(call: Callable[[], Any]) -> Any:
    """call() in a thread: its result or exception, or a failure when it runs past HANG."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as error:  # re-raised below, in the test's thread
            box["error"] = error

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(HANG)
    if worker.is_alive():
        pytest.fail(f"no answer within {HANG:g} s: a hang or a runaway on malformed input")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- malformed JSON values ------------------------------------------------------------------

BAD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, -5, 10**18, 10**30, 2**31 - 1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["exact", "drop", "full", "mamba", "lru", "4096", "all", "none"]),
)
BAD_VALUES = st.one_of(
    BAD_SCALARS,
    st.lists(BAD_SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=4), BAD_SCALARS, max_size=2),
    st.sampled_from([[[5, 2]], [[0, 10**9]], [[3, 3]], [[-1, 4]], [[True, 2]], [[0]]]),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (the document itself included)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += paths(inner, (*prefix, index))
    return found


@st.composite
def bent(draw: st.DrawFn, document: Any) -> Any:
    """`document` with one place replaced, removed, or given an unknown field."""
    document = copy.deepcopy(document)
    path = draw(st.sampled_from(paths(document)[1:]))
    *parents, last = path
    holder = document
    for step in parents:
        holder = holder[step]
    how = draw(st.sampled_from(["replace", "remove", "add"]))
    if how == "replace":
        holder[last] = draw(BAD_VALUES)
    elif how == "remove" and isinstance(holder, dict):
        del holder[last]
    elif isinstance(holder, dict):
        holder[draw(st.sampled_from(["bogus", "priority", "Kind"]))] = draw(BAD_SCALARS)
    else:
        holder.append(draw(BAD_VALUES))
    return document


# --- vector files and manifests ---------------------------------------------------------------


def _bundled_cases(name: str, indices: tuple[int, ...]) -> dict[str, Any]:
    body = json.loads((resources.files("kvcert.conformance.vectors") / name).read_text())
    return {**body, "cases": [body["cases"][i] for i in indices]}


VECTOR_FILES = {
    "hit/scenarios.json": _bundled_cases("hit/scenarios.json", (0, 5)),
    "alloc/scenarios.json": _bundled_cases("alloc/scenarios.json", (0, 7)),
    "page/scenarios.json": _bundled_cases("page/scenarios.json", (0,)),
}


def _write_folder(folder: Path, files: dict[str, Any], manifest: Any = None) -> None:
    entries = {}
    for name, body in files.items():
        text = json.dumps(body)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
        cases = body.get("cases") if isinstance(body, dict) else None
        entries[name] = {
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "cases": max(1, len(cases)) if isinstance(cases, list) else 1,
        }
    manifest = {"files": entries} if manifest is None else manifest
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


@st.composite
def bent_vector_file(draw: st.DrawFn) -> tuple[str, Any]:
    name = draw(st.sampled_from(sorted(VECTOR_FILES)))
    return name, draw(bent(VECTOR_FILES[name]))


@EXAMPLES
@given(bent_vector_file())
def test_a_bent_vector_file_is_reported_never_a_traceback(tmp_path_factory, named):
    """Run by the reference and by the spec: every case of the file is accounted for with a
    status, and where a case runs, the two engines agree on it (both refuse, or both answer
    the same), so neither reads a malformed value as something else."""
    name, body = named
    folder = tmp_path_factory.mktemp("vectors")
    _write_folder(folder, {name: body})
    for engine in (ReferenceEngine(), SpecEngine()):
        report = bounded(lambda e=engine: run_vectors(e, root=folder, timeout=HANG))
        assert report.results, "a run accounts for every case, or the file"
        for result in report.results:
            assert result.status in {"passed", "failed", "errored", "skipped"}, result
            assert result.status == "passed" or result.detail, result
    cases = body.get("cases") if isinstance(body, dict) else None
    for case in cases if isinstance(cases, list) else []:
        if not isinstance(case, dict) or not isinstance(case.get("input"), dict):
            continue
        spec = _answer(SpecEngine(), case["input"])
        reference = _answer(ReferenceEngine(), case["input"])
        if spec is not None and reference is not None and "refused" in spec:
            assert "refused" in reference, (case["input"], spec, reference)


def _answer(engine: Any, case_input: dict[str, Any]) -> Any:
    """The engine's answer, or None when the input is too broken to reach it (the runner
    reports such a case against the schema before any engine sees it)."""
    try:
        return bounded(lambda: engine.run(case_input))
    except (KeyError, TypeError, AttributeError, IndexError):
        return None  # a shape the schema refuses; the certify run above reported it


@EXAMPLES
@given(
    st.one_of(
        BAD_VALUES,
        bent({"files": {"hit/scenarios.json": {"sha256": "0" * 64, "cases": 2}}}),
        bent({"format": "kvcert-vector/2", "files": {}, "retired_ids": []}),
    )
)
def test_a_bent_manifest_is_an_input_error_or_reported(tmp_path_factory, manifest):
    folder = tmp_path_factory.mktemp("vectors")
    _write_folder(folder, {"hit/scenarios.json": VECTOR_FILES["hit/scenarios.json"]}, manifest)
    try:
        report = bounded(lambda: run_vectors(ReferenceEngine(), root=folder, timeout=HANG))
    except InputError as error:
        refusal = str(error)
    else:
        refusal = ""
    if refusal:
        assert "manifest.json" in refusal
        return
    assert report.results
    for result in report.results:
        assert result.status == "passed" or result.detail, result


# --- Hugging Face configs ---------------------------------------------------------------------

CONFIGS = {
    "llama": {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
              "max_position_embeddings": 131072},
    "qwen3_next": {"model_type": "qwen3_next", "num_hidden_layers": 8,
                   "full_attention_interval": 4, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
                   "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                   "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                   "torch_dtype": "bfloat16", "max_position_embeddings": 262144},
    "jamba": {"model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 8,
              "attn_layer_offset": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_d_state": 16,
              "torch_dtype": "bfloat16", "max_position_embeddings": 262144},
}  # fmt: skip


@EXAMPLES
@given(st.sampled_from(sorted(CONFIGS)).flatmap(lambda name: bent(CONFIGS[name])))
def test_a_bent_config_is_planned_or_refused_never_a_traceback(tmp_path_factory, capsys, config):
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(config))
    code = bounded(lambda: main(["plan", str(path), "--memory", "1"]))
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert code == 0 or err.startswith("kvcert: error: "), err
    if code == 0 and "max_position_embeddings" in config:
        assert load_model(str(path)).max_model_len == config["max_position_embeddings"]


# --- library calls ----------------------------------------------------------------------------

ENUM_FIELDS = {
    "speculative": ref.DraftKeying,
    "hash_algorithm": ref.HashAlgorithm,
    "eviction": ref.Eviction,
}
TARGET = ref.GroupConfig(ref.Kind.FULL, 16)
DRAFT = ref.GroupConfig(ref.Kind.FULL, 16, draft=True)


@EXAMPLES
@given(
    st.sampled_from(sorted(ENUM_FIELDS)),
    st.one_of(st.text(max_size=20), st.sampled_from(["exact", "drop", "sha256", "blake2b", "lru",
                                                     "hybrid", "md5", "EXACT"]), BAD_SCALARS),
)  # fmt: skip
def test_an_enum_setting_is_its_member_or_a_config_error(field, value):
    choices = ENUM_FIELDS[field]
    try:
        config = ref.CacheConfig((TARGET, DRAFT), 16, **{"speculative": "exact", field: value})
    except ref.ConfigError:
        assert value not in {m.value for m in choices} or not isinstance(value, str)
        return
    assert getattr(config, field) is choices(value)


@EXAMPLES
@given(
    st.dictionaries(
        st.sampled_from(["num_blocks", "max_model_len", "draft_reach", "digest_memo_bytes",
                         "record_events", "count_dead_evictions"]),
        BAD_SCALARS,
        max_size=2,
    )
)  # fmt: skip
def test_a_cache_config_of_bad_numbers_is_a_config_error(fields):
    with contextlib.suppress(ref.ConfigError):
        ref.CacheConfig((TARGET,), **{"num_blocks": 16, **fields})


ARGUMENT = st.one_of(
    BAD_VALUES,
    st.just([ExtraKey(ExtraKind.LORA, "x")]),
    st.just("salt"),
    st.just(["salt"]),
    st.lists(st.integers(0, 9), max_size=4),
)
CALLS: dict[str, Callable[[KVCacheManager, list[Any]], Any]] = {
    "admit": lambda m, a: m.admit("b", a[0], a[1], a[2], a[3]),
    "extend": lambda m, a: m.extend("a", a[0], a[1], a[2]),
    "reserve": lambda m, a: m.reserve("a", a[0], a[1], a[2]),
    "accept": lambda m, a: m.accept("a", a[0]),
    "lookup": lambda m, a: m.lookup(a[0], a[1], a[2]),
    "lookup_packed": lambda m, a: m.lookup_packed(a[0], a[1], a[2]),
    "block_at": lambda m, a: m.block_at("a", a[0], a[1]),
    "holds": lambda m, a: m.holds("a", a[0], a[1], a[2]),
    "table_tails": lambda m, a: m.table_tails("a", a[0]),
    "first_unheld": lambda m, a: m.first_unheld("a", a[0]),
    "first_unheld_span": lambda m, a: m.first_unheld("a", [(a[0], a[1], a[2])]),
    "finish": lambda m, a: m.finish(a[0]),
}


@EXAMPLES
@given(st.sampled_from(sorted(CALLS)), st.lists(ARGUMENT, min_size=4, max_size=4))
def test_a_manager_call_with_bad_arguments_is_a_typed_error(method, arguments):
    manager = KVCacheManager(ref.CacheConfig((TARGET, ref.GroupConfig(ref.Kind.FULL, 8)), 32))
    assert isinstance(manager.admit("a", list(range(40)), 64), Scheduled)
    manager.end_step()
    with contextlib.suppress(KVCacheError):
        bounded(lambda: CALLS[method](manager, arguments))


def test_the_spec_refuses_bad_cache_views_with_spec_errors():
    """A control for the vector property: the spec's own refusals are SpecErrors."""
    from kvcert.spec import CacheView, FullAttention, Layout

    with pytest.raises(SpecError):
        CacheView(Layout((FullAttention(16),)), 0, (frozenset(),))
