"""The SGLang adapter's release-independent pieces, checked without SGLang installed."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from kvcert.conformance.sglang import adapter, unified


def test_insert_ends_cover_every_live_run_state_and_the_prefix():
    wanted = unified.Wanted(pages=6, live_windows=((0, 2), (3, 5)), states=(2, 4, 6))
    assert unified.insert_ends(wanted) == [2, 4, 5, 6]
    assert unified.insert_ends(unified.Wanted(0, (), ())) == []


def test_every_insert_gets_slots_of_its_own():
    """Each insert is a finished request that computed its whole key: slots are never shared."""
    wanted = unified.Wanted(pages=3, live_windows=((0, 1),), states=())
    plain = unified.Shape(page=4, exclusive_window=3, state_grid=None)
    assert unified.slots_needed(plain, wanted, num_tokens=13) == 4 + 12 + 13
    eagle = unified.Shape(page=4, exclusive_window=3, state_grid=None, eagle=True)
    assert unified.slots_needed(eagle, wanted, num_tokens=13) == 5 + 13 + 14


def test_a_node_continues_a_key_in_either_key_representation():
    """Raw tokens (every release since 0.5.15) and 0.5.9's (token, next token) pairs."""
    key = array("q", [5, 6, 7, 8, 9])
    assert unified._continues(SimpleNamespace(token_ids=[7, 8]), key, 2)
    assert not unified._continues(SimpleNamespace(token_ids=[7, 9]), key, 2)
    assert unified._continues(SimpleNamespace(token_ids=[(6, 7), (7, 8)]), key, 1)
    assert not unified._continues(SimpleNamespace(token_ids=[(6, 8)]), key, 1)


class _Pool:
    def __init__(self, *, size: int, enable_kvcache_transpose: bool) -> None:
        self.size, self.transpose = size, enable_kvcache_transpose


class _CudaPool:
    def __init__(self, *, size: int, mamba_layer_ids: list[int]) -> None:
        raise AssertionError("Torch not compiled with CUDA enabled")


class _BrokenPool:
    def __init__(self, *, size: int) -> None:
        raise AssertionError("size must be a multiple of the page")


def test_pools_take_the_arguments_their_release_knows():
    pool = unified._on_cpu(_Pool, size=4, mamba_layer_ids=[0])
    assert (pool.size, pool.transpose) == (4, False)  # 0.5.9's required flag, the default


def test_a_pool_that_needs_cuda_is_a_case_the_release_cannot_express_not_a_crash():
    with pytest.raises(unified.Inexpressible, match="CUDA"):
        unified._on_cpu(_CudaPool, size=4, mamba_layer_ids=[0])
    with pytest.raises(AssertionError, match="multiple of the page"):
        unified._on_cpu(_BrokenPool, size=4)  # any other failure stays a failure


def test_stand_ins_answer_names_but_not_the_attributes_python_reads():
    """A stood-in module or class yields placeholders, and keeps __file__ & co. absent so
    that `inspect` and import machinery see a plain module."""
    value = adapter._stand_in("decode_jpeg")
    assert isinstance(value, adapter._Placeholder)
    mode = adapter._stand_in("InterpolationMode")
    assert isinstance(mode.NEAREST_EXACT, adapter._Placeholder)
    with pytest.raises(AttributeError):
        adapter._stand_in("__file__")
    with pytest.raises(AttributeError):
        _ = mode.__wrapped__


SW4 = {"kind": "sliding_window", "block_size": 4, "window": 8}


@pytest.mark.parametrize(
    ("groups", "cached", "why"),
    [
        ([SW4, {**SW4, "window": 16}], [[], []], "one sliding window size and page"),
        ([SW4, {**SW4, "block_size": 8}], [[], []], "one sliding window size and page"),
        ([SW4, SW4], [[[0, 1]], []], "cached alike"),
        ([SW4], [[[0, 1], [2, 3]]], "after a gap"),
        ([{"kind": "mamba", "block_size": 4, "mode": "all"}, SW4], [[], []], "Mamba state"),
    ],
)
def test_an_all_swa_layout_maps_to_one_plain_prefix_tree_or_says_why_not(groups, cached, why):
    """Answered before SGLang is imported: PureSWARadixCache holds one plain prefix for
    every layer, so the groups must agree and the cached blocks must be a prefix."""
    case = {"suite": "hit", "layout": {"groups": groups}, "num_tokens": 17, "cached": cached}
    assert why in adapter.SglangEngine().run(case)["unsupported"]
