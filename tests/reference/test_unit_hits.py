"""kvcert.reference.unit_hits beyond the differential test: what it refuses."""

from __future__ import annotations

import pytest

from kvcert.reference.config import CacheConfig, GroupConfig, Kind
from kvcert.reference.errors import ConfigError
from kvcert.reference.unit_hits import find_unit_hit


def test_the_unit_search_refuses_a_block_profile_config():
    config = CacheConfig((GroupConfig(Kind.FULL, 4),), 8)
    with pytest.raises(ConfigError, match="find_hit"):
        find_unit_hit(config, 9, [[]], [{}])


def test_a_hit_unit_must_divide_every_block_size():
    groups = (GroupConfig(Kind.FULL, 4), GroupConfig(Kind.MAMBA, 8))
    with pytest.raises(ConfigError, match="does not divide"):
        CacheConfig(groups, 8, hit_unit=3)
    with pytest.raises(ConfigError, match="integer >= 1"):
        CacheConfig(groups, 8, hit_unit=0)
    assert CacheConfig(groups, 8, hit_unit=2).alignment == 2
