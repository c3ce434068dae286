"""The SGLang adapter's engine-free readings: a request's extra keys, Llama 4's chunked
layers as a window (no SGLang needed)."""

from __future__ import annotations

import pytest

from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.sglang import alloc
from kvcert.conformance.sglang import chunked as chunked_module
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
