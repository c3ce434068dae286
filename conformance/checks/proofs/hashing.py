"""Obligations for §5 block keys: tenants never share a block, extras never collide.

The digest is an uninterpreted function assumed injective (collision resistance, the
reference's SHA-256/BLAKE2b): equal outputs imply equal arguments, instantiated for every pair
of terms that appear. A chain of BLOCKS keys per request is built as HASH-CHAIN-1 and
HASH-EXTRA-1 say: request-wide extras (the cache salt, a LoRA) in block 0 only, each extra
tagged by its kind.
"""

from __future__ import annotations

import itertools
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import COUNTEREXAMPLE, PROVED, Obligation

BLOCKS = 4
ROOT = 0
SALT_TAG, LORA_TAG, NO_TAG = 1, 2, 0


def _digest() -> Any:
    return z3.Function("digest", z3.IntSort(), z3.IntSort(), z3.IntSort(), z3.IntSort(),
                       z3.IntSort())  # fmt: skip


def _injective(digest: Any, terms: list[Any]) -> list[Any]:
    """digest(a) == digest(b) implies a == b, for every pair of terms used."""
    axioms = []
    for x, y in itertools.combinations(terms, 2):
        same = z3.And([x.arg(k) == y.arg(k) for k in range(4)])
        axioms.append(z3.Implies(x == y, same))
    return axioms


def _chain(digest: Any, tokens: list[Any], tag: Any, value: Any) -> list[Any]:
    """HASH-CHAIN-1 with one request-wide extra (tag, value) in block 0 (HASH-EXTRA-1)."""
    keys = [digest(ROOT, tokens[0], tag, value)]
    for j in range(1, BLOCKS):
        keys.append(digest(keys[-1], tokens[j], NO_TAG, 0))
    return keys


def isolation(tagged: bool = True, salted: bool = True) -> Any:
    """Two requests with the same tokens whose extras differ share no block key."""

    def build() -> tuple[list[Any], Any]:
        digest = _digest()
        tokens = [z3.Int(f"t{j}") for j in range(BLOCKS)]
        tag_a, tag_b, value_a, value_b = z3.Ints("tag_a tag_b value_a value_b")
        key_tag_a, key_tag_b = (tag_a, tag_b) if tagged else (z3.IntVal(NO_TAG),) * 2
        key_value_a, key_value_b = (value_a, value_b) if salted else (z3.IntVal(0),) * 2
        keys_a = _chain(digest, tokens, key_tag_a, key_value_a)
        keys_b = _chain(digest, tokens, key_tag_b, key_value_b)
        assumptions = [
            *_injective(digest, keys_a + keys_b),
            z3.Or(tag_a == SALT_TAG, tag_a == LORA_TAG),
            z3.Or(tag_b == SALT_TAG, tag_b == LORA_TAG),
            z3.Or(tag_a != tag_b, value_a != value_b),  # the requests' extras differ
            *[k != ROOT for k in keys_a + keys_b],
        ]
        claim = z3.And([a != b for a, b in zip(keys_a, keys_b, strict=True)])
        return assumptions, claim

    return build


OBLIGATIONS = (
    Obligation("THM-HASH-ISOLATION", ("HASH-CHAIN-1", "HASH-EXTRA-1", "HASH-MATCH-1"),
               "4-block chains, one request-wide extra", PROVED, "pr", isolation(),
               about="different salts or LoRAs (or the same value under another kind) never "
               "share a key"),
    Obligation("TWIN-HASH-UNTAGGED", ("HASH-EXTRA-1",), "as THM-HASH-ISOLATION",
               COUNTEREXAMPLE, "pr", isolation(tagged=False), twin_of="THM-HASH-ISOLATION",
               about="vLLM #44701: extras without their kind let a LoRA and a salt collide"),
    Obligation("TWIN-HASH-SALT-IGNORED", ("HASH-EXTRA-1",), "as THM-HASH-ISOLATION",
               COUNTEREXAMPLE, "pr", isolation(salted=False), twin_of="THM-HASH-ISOLATION",
               about="a salt left out of the key shares blocks across tenants"),
)  # fmt: skip
