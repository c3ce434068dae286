"""kvcert.reference.radix at the door: what it builds from, what it refuses and how it says
so, and its counts through one request's life (its behaviour against the spec is
tests/differential/test_radix.py's)."""

from __future__ import annotations

import pytest

from kvcert.reference.config import CacheConfig, Eviction, GroupConfig, Kind, Visibility
from kvcert.reference.errors import (
    ConfigError,
    MaxLengthError,
    RequestStateError,
    UnknownRequestError,
)
from kvcert.reference.manager import KVCacheManager
from kvcert.reference.radix import RadixCacheManager
from kvcert.reference.requests import Scheduled, Waiting

FULL = GroupConfig(Kind.FULL, 4)


def tree(num_blocks: int = 9, **fields: object) -> RadixCacheManager:
    return RadixCacheManager(CacheConfig((FULL,), num_blocks, eviction="radix", **fields))


def test_the_profile_is_chosen_by_its_enum_or_its_exact_value():
    assert tree().config.eviction is Eviction.RADIX
    by_enum = RadixCacheManager(CacheConfig((FULL,), 9, eviction=Eviction.RADIX))
    assert by_enum.page == 4
    with pytest.raises(ConfigError, match="eviction"):
        CacheConfig((FULL,), 9, eviction="Radix")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (CacheConfig((FULL,), 9), "block-pool profile: build a KVCacheManager"),
        (
            CacheConfig((FULL, GroupConfig(Kind.SLIDING_WINDOW, 4, window=8)), 9, eviction="radix"),
            "one full-attention group",
        ),
        (CacheConfig((FULL,), 9, eviction="radix", hit_unit=2), "no hit unit"),
        (
            CacheConfig((FULL,), 9, eviction="radix", visibility=Visibility.SAME_PASS),
            "leave visibility 'step-end'",
        ),
    ],
)
def test_a_configuration_outside_the_profile_is_refused_with_the_fix(config, why):
    with pytest.raises(ConfigError, match=why):
        RadixCacheManager(config)


def test_the_block_pool_refuses_the_radix_profile_and_names_the_class_to_use():
    with pytest.raises(ConfigError, match="RadixCacheManager"):
        KVCacheManager(CacheConfig((FULL,), 9, eviction="radix"))


def test_misuse_is_a_typed_error_that_changes_nothing():
    t = tree(max_model_len=12)
    with pytest.raises(RequestStateError, match="no lookahead"):
        t.admit("a", [1, 2, 3], 3, lookahead=1)
    with pytest.raises(RequestStateError, match="no inner checkpoint"):
        t.admit("a", [1, 2, 3], 3, checkpoint=2)
    with pytest.raises(MaxLengthError, match="max_model_len=12"):
        t.admit("a", list(range(13)), 4)
    with pytest.raises(UnknownRequestError, match="not running"):
        t.extend("zz", 1, [5])
    assert isinstance(t.admit("a", [1, 2, 3, 4, 5], 8), Scheduled)
    with pytest.raises(RequestStateError, match="chunk in flight"):
        t.extend("a", 1, [5])
    t.end_step()
    with pytest.raises(RequestStateError, match="one token"):
        t.extend("a", 2, [6, 7])
    assert t.free_blocks == 6  # 8 pages, 2 held by "a"; nothing changed by the refusals


def test_a_request_life_publishes_its_pages_and_a_follow_up_hits_them():
    t = tree()
    admitted = t.admit("a", list(range(1, 10)), 16)  # 9 tokens: 3 pages
    assert admitted == Scheduled(0, 9, ((1, 2, 3),), ((1, 2, 3),))
    assert t.end_step() == 2  # its 2 whole pages join the tree (RADIX-PUB-1)
    assert t.cached_blocks == 2
    assert t.extend("a", 1, [42]) == Scheduled(0, 1, ((),))
    assert t.end_step() == 0  # a decode step publishes nothing (RADIX-PUB-2)
    assert t.finish("a") == 3
    follow = t.admit("b", list(range(1, 10)), 16)
    assert isinstance(follow, Scheduled)
    assert follow.hit == 8  # the tree's 2 pages (its last token left to compute)
    assert follow.tables == ((1, 2, 3),)  # page 3, freed at the finish, handed out again
    assert isinstance(t.admit("c", list(range(100, 130)), 30), Waiting)  # 8 pages needed
    assert not t.reset_prefix_cache()  # b still runs (RADIX-RESET-1)
    t.preempt("b")
    assert t.reset_prefix_cache()
    assert t.free_blocks == 8
    assert t.cached_blocks == 0
