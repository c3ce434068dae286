"""The SGLang adapter's engine-free readings: a request's extra keys, Llama 4's chunked
layers as a window (no SGLang needed)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.sglang import alloc
from kvcert.conformance.sglang import chunked as chunked_module
from kvcert.conformance.sglang import request_steps as request_steps_module
from kvcert.conformance.vllm import expected


def test_a_salt_and_an_adapter_are_read_by_kind():
    extras = [{"kind": "cache_salt", "value": "s"}, {"kind": "lora", "value": "a"}]
    assert alloc._request_extras(extras, 8) == {"cache_salt": "s", "lora": "a"}
    assert alloc._request_extras([], 8) == {}


@pytest.mark.parametrize(
    "extra",
    [
        {"kind": "cache_salt", "value": 3},  # not a string
        {"kind": "lora", "value": "a", "end": 4},  # request-wide, given a span
        {"kind": "cache_salt", "value": "s", "start": 2},
        {"kind": "watermark", "value": "w"},  # a kind the spec does not know
        {"kind": "multimodal", "value": "img"},  # a span is needed
        {"kind": "multimodal", "value": "img", "start": 4, "end": 9},  # past the prompt
    ],
)
def test_extras_the_spec_refuses_are_refused(extra):
    assert alloc._request_extras([extra], 8) is None


def test_extras_sglang_cannot_key_are_unsupported():
    with pytest.raises(alloc.Unsupported, match="multimodal"):
        alloc._request_extras([{"kind": "multimodal", "value": "i", "start": 0, "end": 4}], 8)
    two_salts = [{"kind": "cache_salt", "value": "s"}, {"kind": "cache_salt", "value": "t"}]
    with pytest.raises(alloc.Unsupported, match="one cache_salt"):
        alloc._request_extras(two_salts, 8)


def test_a_chunked_group_is_cached_as_llama_4s_window():
    full = {"kind": "full", "block_size": 2}
    chunked = {"kind": "chunked_local", "block_size": 2, "chunk": 4}
    assert chunked_module.as_window(chunked) == {
        "kind": "sliding_window",
        "block_size": 2,
        "window": 5,  # C tokens besides the query's own
    }
    assert chunked_module.as_window(full) is full
    assert chunked_module.chunked_problem([full, chunked]) is None
    window = {"kind": "sliding_window", "block_size": 2, "window": 3}
    assert "one sliding window" in str(chunked_module.chunked_problem([full, chunked, window]))
    assert "Llama 4 only" in str(chunked_module.chunked_problem([chunked]))


def test_chunked_as_window_is_named_only_for_the_window_twins_hit():
    """hit.enum.008.5.00037: B 2, C 3, the spec owes 4; cached as a window of 3 tokens the
    tree serves 0. A failure serving some other hit is not this cause."""
    case = next(c for _, c, _ in iter_cases() if c and c["id"] == "hit.enum.008.5.00037")
    assert case["expect"]["hit"] == 4
    assert chunked_module.window_twin_hit(case["input"]) == 0
    twin = {"id": case["id"], "detail": "hit 0 != expected 4"}
    assert expected.cause(twin, case) == "chunked-as-window"
    other = {"id": case["id"], "detail": "hit 2 != expected 4"}
    assert expected.cause(other, case) != "chunked-as-window"


def _recorder() -> tuple[list[tuple], SimpleNamespace]:
    calls: list[tuple] = []

    def record(name):
        return lambda *args, **kwargs: calls.append((name, args, kwargs))

    return calls, SimpleNamespace(
        lock=record("lock"), unlock=record("unlock"), inc_lock_ref=record("inc_lock_ref"),
        dec_lock_ref=record("dec_lock_ref"), cache_unfinished_req=record("cache_unfinished_req"),
    )  # fmt: skip


def test_each_release_plays_its_own_spelling_of_a_request_step():
    """request_steps: 0.5.23's checkpoint steps, and the earlier cache_unfinished_req ones."""
    calls, tree = _recorder()
    common = SimpleNamespace(
        checkpoint_kv_cache=lambda req, t: calls.append(("checkpoint_kv_cache",)),
        release_kv_cache=lambda req, t, **kw: calls.append(("release_kv_cache", kw)),
        maybe_cache_unfinished_req=lambda req, t, **kw: calls.append(("maybe_cache", kw)),
    )
    req = SimpleNamespace(last_node="n", extend_end=None)
    new = request_steps_module.RequestSteps(common, checkpoints=True)
    new.lock(tree, req)
    new.set_range(req, 4, 12)
    new.publish_prefill(req, tree, prompt_done=False)
    new.release(req, tree, insert=False)
    assert req.extend_end == 12
    assert [c[0] for c in calls] == ["lock", "checkpoint_kv_cache", "release_kv_cache"]
    assert calls[-1][1] == {"checkpoint": False}
    calls.clear()
    ranges: list[tuple[int, int]] = []
    old_req = SimpleNamespace(last_node="n", set_extend_range=lambda a, b: ranges.append((a, b)))
    old = request_steps_module.RequestSteps(common, checkpoints=False)
    handle = old.lock(tree, old_req)
    old.unlock(tree, handle)
    old.set_range(old_req, 4, 12)
    old.publish_prefill(old_req, tree, prompt_done=False)
    old.release(old_req, tree, insert=True)
    assert [c[0] for c in calls] == ["inc_lock_ref", "dec_lock_ref", "maybe_cache",
                                     "release_kv_cache"]  # fmt: skip
    assert calls[2][1] == {"chunked": True}
    assert calls[3][1] == {"is_insert": True}
    assert ranges == [(4, 12)]


def test_the_openai_layers_salt_composition_is_compiled_from_its_own_source(tmp_path, monkeypatch):
    """serving_extra_key runs the release's `_compute_extra_key` without importing its
    HTTP-server module (annotations naming its types are dropped)."""
    layer = tmp_path / "sglang" / "srt" / "entrypoints" / "openai"
    layer.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (layer / "serving_base.py").write_text(
        "import fastapi  # never imported\n"
        "class OpenAIServingBase:\n"
        "    def _compute_extra_key(self, request: OpenAIServingRequest) -> Optional[str]:\n"
        "        parts = [v for v in (request.cache_salt, request.extra_key) if v]\n"
        "        return ''.join(parts) if parts else None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    request_steps_module._compute_extra_key.cache_clear()
    try:
        assert request_steps_module.serving_extra_key("salt") == "salt"
    finally:
        request_steps_module._compute_extra_key.cache_clear()
