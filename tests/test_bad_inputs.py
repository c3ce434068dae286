"""Every bad input of the hardening round (issue 38), exactly as it was tried, with the typed
error or message it must now get: before the fixes each one raised a traceback, hung, or was
silently accepted or misread. tests/test_malformed_inputs.py generates more of each kind."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from kvcert.conformance.cli import main
from kvcert.conformance.contract.codec import InputError, from_ranges
from kvcert.reference.config import CacheConfig, GroupConfig, Kind
from kvcert.reference.errors import ConfigError, KVCacheError, RequestStateError
from kvcert.reference.manager import KVCacheManager, Scheduled, Waiting

FULL = GroupConfig(Kind.FULL, 16)

# --- library calls ------------------------------------------------------------------------------


def running_manager() -> KVCacheManager:
    manager = KVCacheManager(CacheConfig((FULL, GroupConfig(Kind.FULL, 16, name="b")), 64))
    assert isinstance(manager.admit("a", list(range(40)), 64), Scheduled)
    return manager


LIBRARY: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    "CacheConfig speculative 'bogus'": (
        lambda: CacheConfig((FULL, GroupConfig(Kind.FULL, 16, draft=True)), 8, speculative="bogus"),  # type: ignore[arg-type]
        ConfigError,
        "speculative must be one of exact, drop",
    ),
    "CacheConfig hash_algorithm 'md5'": (
        lambda: CacheConfig((FULL,), 8, hash_algorithm="md5"),  # type: ignore[arg-type]
        ConfigError,
        "hash_algorithm must be one of sha256, blake2b",
    ),
    "CacheConfig hash_algorithm 'nonsense'": (
        lambda: CacheConfig((FULL,), 8, hash_algorithm="nonsense"),  # type: ignore[arg-type]
        ConfigError,
        "hash_algorithm must be one of",
    ),
    "CacheConfig max_model_len '4096'": (
        lambda: CacheConfig((FULL,), 8, max_model_len="4096"),  # type: ignore[arg-type]
        ConfigError,
        "max_model_len must be an integer >= 1",
    ),
    "CacheConfig max_model_len 4096.5": (
        lambda: CacheConfig((FULL,), 8, max_model_len=4096.5),  # type: ignore[arg-type]
        ConfigError,
        "max_model_len must be an integer >= 1",
    ),
    "block_at past the groups": (
        lambda: running_manager().block_at("a", 5, 0),
        RequestStateError,
        r"group must be in \[0, 2\) \(a group index\)",
    ),
    "block_at group -1 (once another group's block)": (
        lambda: running_manager().block_at("a", -1, 0),
        RequestStateError,
        r"group must be in \[0, 2\) \(a group index\)",
    ),
    "block_at position -1": (
        lambda: running_manager().block_at("a", 0, -1),
        RequestStateError,
        "position must be a table position",
    ),
    "admit extras='salt'": (
        lambda: KVCacheManager(CacheConfig((FULL,), 8)).admit("a", [1, 2], 4, extras="salt"),  # type: ignore[arg-type]
        RequestStateError,
        "extras must be a sequence of ExtraKey",
    ),
    "admit extras=['salt']": (
        lambda: KVCacheManager(CacheConfig((FULL,), 8)).admit("a", [1, 2], 4, extras=["salt"]),  # type: ignore[list-item]
        RequestStateError,
        "extras must be ExtraKey values",
    ),
    "admit bool token ids": (
        lambda: KVCacheManager(CacheConfig((FULL,), 8)).admit("a", [5] * 40 + [True], 64),
        RequestStateError,
        "position 40 holds True, not a token id",
    ),
    "admit a 2-D array": (
        lambda: KVCacheManager(CacheConfig((FULL,), 8)).admit("a", _Array([[1, 2], [3, 4]]), 4),  # type: ignore[arg-type]
        RequestStateError,
        "must be 1-D",
    ),
}


class _Array:
    """An array-like with tolist() and no sequence protocol, as numpy's and torch's are."""

    def __init__(self, rows: list[object]) -> None:
        self.rows = rows
        self.shape = (len(rows),)

    def tolist(self) -> list[object]:
        return self.rows


@pytest.mark.parametrize("label", sorted(LIBRARY))
def test_bad_library_calls_raise_typed_errors(label):
    call, error, fragment = LIBRARY[label]
    with pytest.raises(error, match=fragment):
        call()
    assert issubclass(error, KVCacheError)


def test_a_one_dimensional_integer_array_is_a_prompt():
    manager = KVCacheManager(CacheConfig((FULL,), 8))
    result = manager.admit("a", _Array(list(range(20))), 32)  # type: ignore[arg-type]
    manager.end_step()
    again = manager.admit("b", list(range(20)), 32)
    assert isinstance(result, Scheduled)
    assert isinstance(again, Scheduled)
    assert (result.hit, result.scheduled, again.hit) == (0, 20, 16)


def test_a_prompt_that_can_never_fit_says_so():
    manager = KVCacheManager(CacheConfig((FULL,), 8))  # 7 usable blocks of 16 tokens
    never = manager.admit("a", list(range(400)), 400)
    assert isinstance(never, Waiting)
    assert never.never.startswith("can never fit: the request would hold 25 blocks at once")
    later = manager.admit("b", list(range(100)), 100)  # 7 blocks: fits an empty pool
    assert isinstance(later, Scheduled)
    busy = manager.admit("c", list(range(50)), 50)  # fits once b is done: no `never`
    assert isinstance(busy, Waiting)
    assert busy.never == ""
    assert busy == Waiting(busy.needed, busy.free)  # `never` takes no part in comparisons


def test_ranges_are_checked_before_a_set_is_built():
    for ranges in ([[5, 2]], [[3, 3]], [[0, 10**9]], [[-1, 2]], [[True, 2]], [[0]], "0-3"):
        with pytest.raises(InputError, match=r"not a block range|expected a list"):
            from_ranges(ranges)


# --- files: vector folders and manifests -----------------------------------------------------


def _vector_folder(
    tmp_path: Path, manifest: object, files: dict[str, object] | None = None
) -> Path:
    folder = tmp_path / "vectors"
    for name, body in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(body), encoding="utf-8")
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def _bundled(name: str, count: int = 2) -> dict[str, object]:
    body = json.loads((resources.files("kvcert.conformance.vectors") / name).read_text())
    return {**body, "cases": body["cases"][:count]}


def _entry(body: object) -> dict[str, object]:
    text = json.dumps(body)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "cases": len(body["cases"])}  # type: ignore[index]


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        ({}, 'expected an object with "files"'),
        ([], 'expected an object with "files"'),
        ({"files": ["hit/h.json"]}, 'expected an object with "files"'),
        ({"files": {"hit/h.json": {"cases": 1}}}, 'must be {"sha256"'),
        ({"files": {}}, "lists no vector files"),
        ({"files": {"../other/h.json": {"sha256": "0" * 64, "cases": 1}}}, "without '..'"),
        ({"files": {"/etc/h.json": {"sha256": "0" * 64, "cases": 1}}}, "relative path"),
    ],
)
def test_a_malformed_manifest_is_an_input_error_naming_it(tmp_path, capsys, manifest, fragment):
    folder = _vector_folder(tmp_path, manifest)
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "manifest.json" in err
    assert fragment in err


def test_a_file_of_zero_cases_or_a_wrong_count_is_reported_against_it(tmp_path, capsys):
    good = _bundled("hit/scenarios.json")
    empty = {**good, "cases": []}
    manifest = {"files": {"hit/a.json": {**_entry(good), "cases": 5}, "hit/b.json": {
        "sha256": hashlib.sha256(json.dumps(empty).encode()).hexdigest(), "cases": 1}}}  # fmt: skip
    folder = _vector_folder(tmp_path, manifest, {"hit/a.json": good, "hit/b.json": empty})
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "hit/a.json: holds 2 cases but the manifest says 5" in out
    assert "hit/b.json: holds 0 cases but the manifest says 1" in out


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda c: c["requires"].append("kind.fulll"), "requires kind.fulll, which no engine"),
        (lambda c: c.update(id="alloc" + c["id"].removeprefix("hit")), "the id names suite"),
        (lambda c: c["rules"].append("HIT-NOPE-1"), "cites HIT-NOPE-1"),
    ],
)
def test_a_misplaced_case_is_reported_against_it(tmp_path, capsys, edit, fragment):
    body = _bundled("hit/scenarios.json")
    edit(body["cases"][0])
    folder = _vector_folder(tmp_path, {"files": {"hit/a.json": _entry(body)}}, {"hit/a.json": body})
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    assert fragment in capsys.readouterr().out


def test_a_hit_case_in_an_alloc_file_and_a_repeated_id_are_reported(tmp_path, capsys):
    hits = _bundled("hit/scenarios.json")
    allocs = _bundled("alloc/scenarios.json")
    allocs["cases"].append(hits["cases"][0])
    files = {"hit/a.json": hits, "alloc/b.json": allocs}
    manifest = {"files": {name: _entry(body) for name, body in files.items()}}
    folder = _vector_folder(tmp_path, manifest, files)
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "this hit case sits in a file of suite alloc" in out
    assert "case ids are unique across files" in out  # its twin in hit/a.json, too
    assert "3 passed, 2 failed" in out  # neither copy runs


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda i: i.update(num_tokens=10**18), "is greater than the maximum of 1048576"),
        (lambda i: i.update(num_tokens=10**30), "is greater than the maximum of 1048576"),
        (lambda i: i.update(cached=[[[0, 10**9]]] * len(i["cached"])), "greater than the maximum"),
    ],
)
def test_hit_inputs_beyond_the_format_limits_are_refused_by_the_schema(tmp_path, capsys, edit,
                                                                       fragment):  # fmt: skip
    body = _bundled("hit/scenarios.json", 1)
    edit(body["cases"][0]["input"])
    folder = _vector_folder(tmp_path, {"files": {"hit/a.json": _entry(body)}}, {"hit/a.json": body})
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    assert fragment in capsys.readouterr().out


def test_an_alloc_pool_beyond_the_format_limit_and_unknown_op_fields_are_refused(tmp_path, capsys):
    body = _bundled("alloc/scenarios.json")
    body["cases"][0]["input"]["num_blocks"] = 2**31 - 1
    body["cases"][1]["input"]["ops"][0]["priority"] = 3
    folder = _vector_folder(tmp_path, {"files": {"alloc/a.json": _entry(body)}},
                            {"alloc/a.json": body})  # fmt: skip
    assert main(["certify", "--vectors", str(folder), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "2147483647 is greater than the maximum of 65536" in out
    assert "case 1" in out


def test_write_manifest_says_an_invalid_case_is_invalid(tmp_path, capsys):
    body = _bundled("hit/scenarios.json", 1)
    body["cases"][0]["input"]["layout"]["groups"][0]["block_size"] = 0
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(body))
    assert main(["certify", "--vectors", str(folder), "--write-manifest"]) == 1
    err = capsys.readouterr().err
    assert "the input is invalid: the spec refuses it" in err
    assert "block_size must be >= 1" in err
    assert "refused valid input" not in err


def test_write_manifest_refuses_an_engine(tmp_path, capsys):
    argv = ["certify", "--vectors", str(tmp_path), "--write-manifest", "--engine", "spec"]
    assert main(argv) == 2
    assert "--write-manifest checks your vectors against the spec" in capsys.readouterr().err


def test_a_skip_file_that_is_not_json_is_named(tmp_path, capsys):
    bad = tmp_path / "skips.json"
    bad.write_text("{oops")
    assert main(["certify", "--skips", str(bad)]) == 2
    assert f"{bad}: cannot read the skip file" in capsys.readouterr().err


# --- the command line ------------------------------------------------------------------------

QWEN3_NEXT_NO_FULL = {
    "model_type": "qwen3_next", "num_hidden_layers": 8, "full_attention_interval": 64,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "torch_dtype": "bfloat16",
}  # fmt: skip
JAMBA_NO_ATTENTION = {
    "model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 8,
    "attn_layer_offset": 9, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_d_state": 16,
    "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.mark.parametrize("config", [QWEN3_NEXT_NO_FULL, JAMBA_NO_ATTENTION])
@pytest.mark.parametrize("json_out", [False, True])
def test_plan_a_model_without_attention_layers(tmp_path, capsys, config, json_out):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", str(path), *(["--json", "-"] if json_out else [])]) == 0
    out = capsys.readouterr().out
    if json_out:
        assert json.loads(out)["plan"]["token_capacity"] == 0
    else:
        assert "no per-token KV (state layers only)" in out
        assert "no layer is attention" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["plan", "llama-3.1-8b", "--memory", "inf"], "--memory: must be a positive number"),
        (["plan", "llama-3.1-8b", "--memory", "nan"], "--memory: must be a positive number"),
        (["plan", "llama-3.1-8b", "--json", "/no/such/folder/p.json"], "no folder /no/such"),
        (["certify", "--json", "/no/such/folder/r.json"], "no folder /no/such"),
        (["check", "--json", "/no/such/folder/c.json"], "no folder /no/such"),
        (["simulate", "gpt-oss-20b", "--placement", "bogus"], "'bogus' is not one of"),
        (["simulate", "gpt-oss-20b", "--output-tokens", "-1"], "must be an integer >= 0"),
        (["simulate", "gpt-oss-20b", "--blocks", "3", "--pool-requests", "2"], "not allowed"),
        (["explain", "--example", "nope"], "no bundled example 'nope'"),
        (["fuzz", "--runs", "0"], "--runs: must be an integer >= 1"),
    ],
)
def test_bad_arguments_exit_2_with_what_to_fix(capsys, argv, fragment):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def _scenario(
    num_tokens: int, names: tuple[str, str] = ("a", "b"), block: int = 1
) -> dict[str, object]:
    return {
        "layout": {"groups": [{"kind": "full", "block_size": block, "name": names[0]},
                              {"kind": "full", "block_size": block, "name": names[1]}]},
        "request": {"num_tokens": num_tokens},
        "cached": ["all", "all"],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("scenario", "fragment"),
    [
        (_scenario(10**9), "is over the 1,048,576 tokens a scenario may explain"),
        (_scenario(10**12), "is over the 1,048,576 tokens a scenario may explain"),
        (_scenario(64, ("x", "x"), 16), "group names ['x', 'x'] repeat"),
    ],
)
def test_explain_refuses_what_it_cannot_report(tmp_path, capsys, scenario, fragment):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    assert main(["explain", str(path)]) == 2
    assert fragment in capsys.readouterr().err


def test_version_and_help_texts(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kvcert ")
    for command, words in (("serve", "kvcert-stdio/1"), ("examples", "bundled"),
                           ("rules", "spec's rules")):  # fmt: skip
        assert main([command, "--help"]) == 0
        description = capsys.readouterr().out.split("options:")[0]
        assert words in description.split("\n", 2)[-1], command


def test_check_list_without_z3_names_the_extra(monkeypatch, capsys):
    from kvcert.conformance.checks import check

    monkeypatch.setattr(check.importlib.util, "find_spec", lambda name: None)
    assert main(["check", "--list"]) == 2
    assert "pip install 'kvcert[proofs]'" in capsys.readouterr().err


def test_a_dead_engine_is_reported_once(tmp_path, capsys):
    assert main(["certify", "--cmd", "false", "--timeout", "5"]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("failed to start (attempt") == 2  # the retries, announced
    assert captured.out.count("engine unavailable") == 1
    assert "NOTHING RAN" in captured.out
    assert len(captured.out.splitlines()) < 20


def test_an_engine_that_supports_nothing_fails_the_run(tmp_path, capsys):
    engine = tmp_path / "nothing.py"
    engine.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    m = json.loads(line)\n"
        "    if m['cmd'] == 'start':\n"
        "        print(json.dumps({'protocol': 'kvcert-stdio/1', 'engine': {'name': 'none',"
        " 'features': ['kind.full'], 'profiles': []}}), flush=True)\n"
        "    elif m['cmd'] == 'run':\n"
        "        print(json.dumps({'seq': m['seq'], 'result': {'unsupported': 'nothing'}}),"
        " flush=True)\n"
        "    else:\n"
        "        break\n"
    )
    import sys

    assert main(["certify", "--cmd", f"{sys.executable} {engine}", "--quiet"]) == 1
    assert "NOTHING RAN" in capsys.readouterr().out


def test_fuzz_merge_names_a_bad_report(tmp_path, capsys):
    bad = tmp_path / "shard.json"
    bad.write_text("{}")
    assert main(["fuzz", "--merge", str(bad)]) == 2
    assert f"--merge {bad}: not a kvcert fuzz --json report" in capsys.readouterr().err
