"""kvcert.reference.vllm's configuration, which imports without vLLM."""

from __future__ import annotations

import pytest

from kvcert.reference.config import DraftKeying, Eviction, HashAlgorithm
from kvcert.reference.errors import ConfigError
from kvcert.reference.vllm import HoldBack, Settings, UnsupportedConfigError


def test_settings_come_from_the_environment() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings().speculative is None  # follow vLLM's own flags
    env = {"KVCERT_EVICTION": "Hybrid", "KVCERT_HASH": " blake2b ", "KVCERT_SPECULATIVE": "exact"}
    assert Settings.from_env(env) == Settings(
        Eviction.HYBRID, HashAlgorithm.BLAKE2B, DraftKeying.EXACT
    )
    assert Settings.from_env({"KVCERT_EVICTION": ""}).eviction is Eviction.LRU
    assert Settings().hold_back is HoldBack.STATE  # vLLM's rule: state hybrids wait a step
    assert Settings.from_env({"KVCERT_HOLD_BACK": "ALL"}).hold_back is HoldBack.ALL


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KVCERT_EVICTION", "fifo"),
        ("KVCERT_HASH", "md5"),
        ("KVCERT_SPECULATIVE", "maybe"),
        ("KVCERT_HOLD_BACK", "sometimes"),
        ("KVCERT_VISIBILITY", "eventually"),
    ],
)
def test_a_bad_setting_names_the_variable_and_the_choices(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"{variable}='{value}' is not one of: \w+"):
        Settings.from_env({variable: value})


def test_unsupported_configurations_are_value_errors() -> None:
    assert issubclass(UnsupportedConfigError, ConfigError)
    assert issubclass(UnsupportedConfigError, ValueError)  # what vLLM's config checks raise


def test_the_vllm_classes_need_vllm() -> None:
    import kvcert.reference.vllm as integration

    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            integration.Scheduler  # noqa: B018
    with pytest.raises(AttributeError):
        integration.Nothing  # noqa: B018


def test_visibility_follows_the_scheduling_policy_unless_chosen() -> None:
    """Same-pass under fcfs (it never preempts a scheduled request), step-end under priority
    (which does: ALLOC-VIS-3); same-pass chosen under priority is refused."""
    from kvcert.reference.config import Visibility

    unset = Settings.from_env({})
    assert unset.visibility is None
    assert unset.for_policy("fcfs").visibility is Visibility.SAME_PASS
    assert unset.for_policy("priority").visibility is Visibility.STEP_END
    chosen = Settings.from_env({"KVCERT_VISIBILITY": "step-end"})
    assert chosen.for_policy("fcfs").visibility is Visibility.STEP_END
    with pytest.raises(ConfigError, match="same-pass visibility with the 'priority'"):
        Settings(visibility="same-pass").for_policy("priority")


def test_retention_is_dense_unless_chosen_and_taken_by_value() -> None:
    from kvcert.reference.config import Retention

    assert Settings.from_env({}).retention is Retention.DENSE
    assert Settings.from_env({"KVCERT_RETENTION": "sparse"}).retention is Retention.SPARSE
    assert Settings(retention="sparse").retention is Retention.SPARSE
    with pytest.raises(ConfigError, match="KVCERT_RETENTION='thin' is not one of: dense, sparse"):
        Settings.from_env({"KVCERT_RETENTION": "thin"})
    with pytest.raises(ConfigError, match="retention"):
        Settings(retention="thin")


def test_a_vllm_retention_interval_is_honoured_not_ignored() -> None:
    """--prefix-cache-retention-interval N > 0 becomes sparse retention with interval N; at
    start-up None and vLLM's default 0 leave the choice to the settings, and an interval set
    later (vLLM's tests set the coordinator's) means what it means in vLLM: None dense, 0
    sparse. An interval that cannot act, or is not one, is refused."""
    from kvcert.reference.config import GroupConfig, Kind, Retention
    from kvcert.reference.vllm.layout import UnsupportedConfigError, retention_profile

    hybrid = (GroupConfig(Kind.FULL, 16), GroupConfig(Kind.SLIDING_WINDOW, 16, window=32))
    full = (GroupConfig(Kind.FULL, 16),)
    sparse, dense = Retention.SPARSE, Retention.DENSE
    assert retention_profile(64, hybrid, dense) == {"retention": sparse, "retention_interval": 64}
    assert retention_profile(0, hybrid, dense) == {"retention": dense, "retention_interval": 0}
    assert retention_profile(None, hybrid, sparse) == {"retention": sparse, "retention_interval": 0}
    assert retention_profile(0, hybrid, None) == {"retention": sparse, "retention_interval": 0}
    assert retention_profile(None, hybrid, None) == {"retention": dense, "retention_interval": 0}
    assert retention_profile(0, full, None) == {"retention": sparse, "retention_interval": 0}
    for bad, where in ((16, full), (-16, hybrid), (24, hybrid), ("16", hybrid), (True, hybrid)):
        with pytest.raises(UnsupportedConfigError, match="retention_interval"):
            retention_profile(bad, where, None)


def test_the_hash_view_is_off_unless_switched_on() -> None:
    assert Settings.from_env({}).vllm_hash_view is False
    assert Settings.from_env({"KVCERT_VLLM_HASH_VIEW": "on"}).vllm_hash_view is True
    assert Settings.from_env({"KVCERT_VLLM_HASH_VIEW": "off"}).vllm_hash_view is False
    with pytest.raises(ConfigError, match="KVCERT_VLLM_HASH_VIEW='yes' is not one of: on, off"):
        Settings.from_env({"KVCERT_VLLM_HASH_VIEW": "yes"})
    with pytest.raises(ConfigError, match="vllm_hash_view must be True or False"):
        Settings(vllm_hash_view="on")  # type: ignore[arg-type]
