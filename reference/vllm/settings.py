"""How the vLLM integration is configured: eviction profile, hash, draft keying, hold-back.

vLLM builds its scheduler (and so the manager) itself, so the choices come from the
environment when no `Settings` is given:

    KVCERT_EVICTION     lru (default) | hybrid | lru-unkeyed-first
    KVCERT_HASH         sha256 (default) | blake2b
    KVCERT_SPECULATIVE  exact (default) | drop    (draft-layer keying; read with a drafter)
    KVCERT_HOLD_BACK    state (default) | all | never
    KVCERT_VISIBILITY   same-pass | step-end   (default: same-pass under vLLM's fcfs policy,
                        step-end under priority; a manager built without a scheduler: step-end)
    KVCERT_RETENTION    dense (default) | sparse   (which window and state blocks stay cached:
                        spec RET-DENSE-1 / RET-SPARSE-2; vLLM's own default is sparse, kvcert's
                        dense keeps every hit vLLM's does and more, for more cached memory;
                        a positive --prefix-cache-retention-interval is honoured as sparse)
    KVCERT_VLLM_HASH_VIEW  off (default) | on   (the manager remembers which request and
                        length each of vLLM's block hashes names, so `block_pool.
                        get_cached_block` can answer with kvcert's cache; costs a dict entry
                        per hashed block and keeps those requests alive: for vLLM's tests)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from kvcert.reference.config import (
    DraftKeying,
    Eviction,
    HashAlgorithm,
    Retention,
    Visibility,
    as_choice,
)
from kvcert.reference.errors import ConfigError

E = TypeVar("E", bound=StrEnum)

ENVIRONMENT = {
    "eviction": "KVCERT_EVICTION",
    "hash_algorithm": "KVCERT_HASH",
    "speculative": "KVCERT_SPECULATIVE",
    "hold_back": "KVCERT_HOLD_BACK",
    "visibility": "KVCERT_VISIBILITY",
    "retention": "KVCERT_RETENTION",
    "vllm_hash_view": "KVCERT_VLLM_HASH_VIEW",
}


class HoldBack(StrEnum):
    """Which models' waiting requests wait a step when the steps in flight are writing a
    longer hit for them (they would otherwise be admitted without it: ALLOC-VIS-1)."""

    STATE = "state"  # models with state groups (vLLM holds those back too)
    ALL = "all"  # every model (vLLM serves attention blocks in the step writing them)
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Settings:
    """kvcert's choices for a vLLM deployment (vLLM's own flags set everything else)."""

    eviction: Eviction = Eviction.LRU
    hash_algorithm: HashAlgorithm = HashAlgorithm.SHA256
    # exact (None means exact): draft-layer blocks keyed one token further (HIT-SPEC-1, as
    # vLLM's lookahead block hashes); drop: keyed like the target's, the last one not served
    # (HIT-SPEC-2, vLLM's EAGLE block drop, which serves stale draft KV: acceptance only)
    speculative: DraftKeying | None = None
    hold_back: HoldBack = HoldBack.STATE
    # same-pass: attention blocks serve hits from their chunk's scheduling on, as vLLM's own
    # manager does (spec ALLOC-VIS-2); needs vLLM's fcfs policy, whose preemptions never
    # drop a chunk already scheduled (the priority policy does: ALLOC-VIS-3). None: the
    # scheduler picks by its policy (`for_policy`)
    visibility: Visibility | None = None
    # dense keeps every committed window and state block cached until evicted; sparse only
    # those a hit at a retained length needs (spec §6b), saving memory, losing other hits
    retention: Retention = Retention.DENSE
    # remember what vLLM's block hashes name (an inspection view, never a hit decision)
    vllm_hash_view: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "eviction", as_choice(Eviction, self.eviction, "eviction"))
        algorithm = as_choice(HashAlgorithm, self.hash_algorithm, "hash_algorithm")
        object.__setattr__(self, "hash_algorithm", algorithm)
        if self.speculative is not None:
            keying = as_choice(DraftKeying, self.speculative, "speculative")
            object.__setattr__(self, "speculative", keying)
        object.__setattr__(self, "hold_back", as_choice(HoldBack, self.hold_back, "hold_back"))
        if self.visibility is not None:
            visibility = as_choice(Visibility, self.visibility, "visibility")
            object.__setattr__(self, "visibility", visibility)
        object.__setattr__(self, "retention", as_choice(Retention, self.retention, "retention"))
        if not isinstance(self.vllm_hash_view, bool):
            raise ConfigError(f"vllm_hash_view must be True or False, got {self.vllm_hash_view!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from KVCERT_EVICTION, KVCERT_HASH, KVCERT_SPECULATIVE, KVCERT_HOLD_BACK,
        KVCERT_VISIBILITY, KVCERT_RETENTION and KVCERT_VLLM_HASH_VIEW."""
        env = os.environ if environ is None else environ
        return cls(
            eviction=_choice(env, "eviction", Eviction) or Eviction.LRU,
            hash_algorithm=_choice(env, "hash_algorithm", HashAlgorithm) or HashAlgorithm.SHA256,
            speculative=_choice(env, "speculative", DraftKeying),
            hold_back=_choice(env, "hold_back", HoldBack) or HoldBack.STATE,
            visibility=_choice(env, "visibility", Visibility),
            retention=_choice(env, "retention", Retention) or Retention.DENSE,
            vllm_hash_view=_switch(env, "vllm_hash_view"),
        )

    def for_policy(self, policy: str) -> Settings:
        """These settings for a scheduler of `policy` (fcfs or priority): the visibility, when
        none was chosen, is same-pass under fcfs and step-end otherwise; same-pass chosen
        under another policy is refused (its preemptions drop scheduled chunks)."""
        fcfs = policy.lower() == "fcfs"
        if self.visibility is None:
            chosen = Visibility.SAME_PASS if fcfs else Visibility.STEP_END
            return dataclasses.replace(self, visibility=chosen)
        if self.visibility is Visibility.SAME_PASS and not fcfs:
            raise ConfigError(
                f"same-pass visibility with the {policy!r} scheduling policy: it preempts "
                "requests already scheduled in the step, whose blocks a request scheduled after "
                "them may have hit (spec ALLOC-VIS-3); use --scheduling-policy fcfs or "
                "KVCERT_VISIBILITY=step-end"
            )
        return self


def _choice(env: Mapping[str, str], field: str, enum: type[E]) -> E | None:
    """The variable's value (None when unset or empty)."""
    name = ENVIRONMENT[field]
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return enum(raw.lower())
    except ValueError:
        choices = ", ".join(e.value for e in enum)
        raise ConfigError(f"{name}={raw!r} is not one of: {choices}") from None


def _switch(env: Mapping[str, str], field: str) -> bool:
    """An on/off variable (off when unset or empty)."""
    name = ENVIRONMENT[field]
    raw = env.get(name, "").strip().lower()
    if raw not in ("", "on", "off"):
        raise ConfigError(f"{name}={env[name]!r} is not one of: on, off")
    return raw == "on"
