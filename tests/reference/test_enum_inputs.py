"""Every enum-typed input of kvcert.reference takes the member or its exact value string and
refuses anything else with a ConfigError (never an identity comparison that silently fails)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvcert.reference import planner
from kvcert.reference.block_pool import BlockPool
from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    Eviction,
    GroupConfig,
    HashAlgorithm,
    Kind,
    MambaMode,
    Retention,
    Visibility,
)
from kvcert.reference.errors import ConfigError
from kvcert.reference.events import Stored
from kvcert.reference.hashing import ExtraKey, ExtraKind
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.reference.scheduling import Placement, next_chunk
from kvcert.reference.vllm.settings import HoldBack, Settings

TARGET = GroupConfig(Kind.FULL, 16, name="target")
DRAFT = GroupConfig(Kind.FULL, 16, draft=True, name="draft")


def shared_prefix_hit(speculative: object) -> int:
    """A's 160-token prompt is cached; B shares its first 144 tokens, then differs. The draft
    KV of position 143 was computed from A's token 144, so B may reuse at most 128 tokens."""
    config = CacheConfig((TARGET, DRAFT), 64, speculative=speculative)  # type: ignore[arg-type]
    manager = KVCacheManager(config)
    a = list(range(1000, 1160))
    assert isinstance(manager.admit("a", a, 512), Scheduled)
    manager.end_step()
    b = [*a[:144], 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    result = manager.admit("b", b, 512)
    assert isinstance(result, Scheduled)
    return result.hit


@pytest.mark.parametrize("keying", [DraftKeying.EXACT, "exact", DraftKeying.DROP, "drop"])
def test_a_draft_keying_given_by_value_keys_drafts_as_the_member_does(keying):
    # The input: "exact" was compared with `is DraftKeying.EXACT` and silently served
    # the draft block whose last position read another next token (hit 144).
    assert shared_prefix_hit(keying) == 128


@pytest.mark.parametrize(
    ("field", "value", "member"),
    [
        ("speculative", "exact", DraftKeying.EXACT),
        ("speculative", "drop", DraftKeying.DROP),
        ("hash_algorithm", "sha256", HashAlgorithm.SHA256),
        ("hash_algorithm", "blake2b", HashAlgorithm.BLAKE2B),
        ("eviction", "hybrid", Eviction.HYBRID),
        ("eviction", "lru-unkeyed-first", Eviction.LRU_UNKEYED_FIRST),
        ("visibility", "same-pass", Visibility.SAME_PASS),
        ("visibility", "step-end", Visibility.STEP_END),
    ],
)
def test_cache_config_turns_value_strings_into_members(field, value, member):
    config = CacheConfig((TARGET, DRAFT), 64, **{"speculative": "exact", field: value})
    assert getattr(config, field) is member


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("speculative", "bogus"),
        ("speculative", "EXACT"),
        ("speculative", True),
        ("hash_algorithm", "md5"),
        ("hash_algorithm", "nonsense"),
        ("hash_algorithm", "SHA256"),
        ("eviction", "fifo"),
        ("eviction", 1),
        ("visibility", "SAME_PASS"),
        ("visibility", "same_pass"),
        ("visibility", None),
    ],
)
def test_cache_config_refuses_other_values_naming_the_choices(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be one of"):
        CacheConfig((TARGET, DRAFT), 64, **{"speculative": "exact", field: value})


def test_a_hash_algorithm_given_by_value_hashes_with_that_algorithm():
    def first_key(algorithm: object) -> bytes:
        config = CacheConfig((TARGET,), 8, hash_algorithm=algorithm, record_events=True)  # type: ignore[arg-type]
        manager = KVCacheManager(config)
        manager.admit("a", list(range(17)), 17)
        manager.end_step()
        return next(e.key for e in manager.take_events() if isinstance(e, Stored))

    assert first_key("blake2b") == first_key(HashAlgorithm.BLAKE2B)
    assert first_key("sha256") == first_key(HashAlgorithm.SHA256)
    assert first_key("blake2b") != first_key("sha256")


def test_group_config_takes_kind_and_mode_by_value():
    assert GroupConfig("sliding_window", 16, window=32).kind is Kind.SLIDING_WINDOW
    state = GroupConfig("mamba", 16, mode="align")
    assert state.mode is MambaMode.ALIGN
    assert GroupConfig("mamba", 16).mode is MambaMode.ALL
    for bad in ("Full", "paged", 0):
        with pytest.raises(ConfigError, match="kind must be one of full"):
            GroupConfig(bad, 16)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mode must be one of none, align, all"):
        GroupConfig("mamba", 16, mode="sometimes")  # type: ignore[arg-type]


def test_extra_keys_take_their_kind_by_value():
    assert ExtraKey("cache_salt", "x").kind is ExtraKind.CACHE_SALT  # type: ignore[arg-type]
    assert ExtraKey("cache_salt", "x") == ExtraKey(ExtraKind.CACHE_SALT, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kind must be one of cache_salt"):
        ExtraKey("salt", "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="start must be an integer"):
        ExtraKey(ExtraKind.MULTIMODAL, "img", start="0", end=4)  # type: ignore[arg-type]


def test_the_planner_takes_its_choices_by_value():
    layers = (planner.AttentionShape("full", 8, 64, 64),)  # type: ignore[arg-type]
    request = planner.PlanRequest(
        layers,
        "fp8",
        1 << 20,
        mamba_mode="all",
        objective="capacity",  # type: ignore[arg-type]
    )
    assert request.mamba_mode is MambaMode.ALL
    assert request.objective is planner.Objective.CAPACITY
    assert planner.LatentShape("full", 512, 64).kind is Kind.FULL  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="objective must be one of"):
        planner.PlanRequest(layers, "fp8", 1 << 20, objective="most")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="capacity_share must be in"):
        planner.PlanRequest(layers, "fp8", 1 << 20, capacity_share=Fraction(2))


def test_vllm_settings_take_their_choices_by_value():
    settings = Settings(
        eviction="hybrid",
        hash_algorithm="blake2b",
        speculative="drop",
        hold_back="all",  # type: ignore[arg-type]
    )
    assert settings == Settings(
        Eviction.HYBRID, HashAlgorithm.BLAKE2B, DraftKeying.DROP, HoldBack.ALL
    )
    with pytest.raises(ConfigError, match="hold_back must be one of state, all, never"):
        Settings(hold_back="always")  # type: ignore[arg-type]


def test_placement_and_pool_eviction_take_their_choices_by_value():
    assert next_chunk("all", 0, 100, 50, 16) == next_chunk(Placement.ALL, 0, 100, 50, 16)  # type: ignore[arg-type]
    assert next_chunk("align", 0, 100, 50, 16) == 48  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="placement must be one of all, align, branch"):
        next_chunk("every", 0, 100, 50, 16)  # type: ignore[arg-type]
    assert BlockPool(8, "hybrid").queue is not None  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eviction must be one of"):
        BlockPool(8, "mru")  # type: ignore[arg-type]


def sibling_hit(retention: object) -> int:
    """A 13-token prompt is cached; a sibling shares its first 5 tokens. Dense retention kept
    the window block it needs; sparse kept only the prompt's re-send and extension windows."""
    window = GroupConfig(Kind.SLIDING_WINDOW, 4, window=8)
    config = CacheConfig((GroupConfig(Kind.FULL, 4), window), 32, retention=retention)  # type: ignore[arg-type]
    manager = KVCacheManager(config)
    assert isinstance(manager.admit("w", list(range(100, 113)), 64), Scheduled)
    manager.end_step()
    manager.finish("w")
    return manager.lookup([*range(100, 105), *range(900, 910)])[0]


@pytest.mark.parametrize(("value", "hit"), [(Retention.DENSE, 4), ("dense", 4), ("sparse", 0)])
def test_retention_by_member_or_value(value: object, hit: int) -> None:
    assert sibling_hit(value) == hit


@pytest.mark.parametrize(
    ("retention", "interval", "reason"),
    [
        ("sparce", 0, "retention"),
        ("dense", 4, "sparse retention only"),
        ("sparse", -4, "an integer >= 0"),
        ("sparse", 6, "not a multiple of the hit alignment"),
        ("sparse", 4.0, "an integer >= 0"),
    ],
)
def test_bad_retention_is_refused(retention: object, interval: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        CacheConfig((TARGET,), 8, retention=retention, retention_interval=interval)  # type: ignore[arg-type]
