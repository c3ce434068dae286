"""Digest chains: the documented encoding, injectivity, kind tags, algorithms."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.reference.config import HashAlgorithm
from kvcert.reference.errors import ConfigError, RequestStateError
from kvcert.reference.hashing import (
    Chain,
    ExtraKey,
    ExtraKind,
    encode_extras,
    encode_tokens,
    hasher,
)


def test_first_digest_follows_the_documented_format():
    """Re-derive digest 0 from the module docstring's formula with hashlib directly."""
    root = hashlib.sha256(b"kvcert-root-v1").digest()
    tokens = struct.pack(">I4q", 4, 7, 8, 9, 1)
    salt = b"W" + struct.pack(">I", 10) + b"cache_salt" + struct.pack(">I", 2) + b"t1"
    extras = struct.pack(">I", 1) + salt
    expected = hashlib.sha256(b"kvcert-block-v1\x00" + root + tokens + extras).digest()
    chain = Chain(4, 0, [ExtraKey(ExtraKind.CACHE_SALT, "t1")], hasher(HashAlgorithm.SHA256))
    chain.extend([7, 8, 9, 1, 2])
    assert chain.digests == [expected]


def test_digests_are_stable_across_processes():
    code = (
        "from kvcert.reference.hashing import Chain, hasher;"
        "from kvcert.reference.config import HashAlgorithm as H;"
        "c = Chain(2, 0, (), hasher(H.SHA256)); c.extend([1, 2, 3, 4]);"
        "print(c.digests[-1].hex())"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2)
    }
    assert len(runs) == 1


TOKENS = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6)
EXTRA = st.builds(
    lambda kind, value, start, length: (
        ExtraKey(kind, value)
        if kind in {ExtraKind.CACHE_SALT, ExtraKind.LORA, ExtraKind.ENCODER_INPUT}
        else ExtraKey(kind, value, start, start + length)
    ),
    st.sampled_from(list(ExtraKind)),
    st.text(max_size=3),
    st.integers(0, 6),
    st.integers(1, 4),
)


@given(TOKENS, TOKENS)
def test_token_encoding_is_injective(a, b):
    assert (encode_tokens(a) == encode_tokens(b)) == (a == b)


@given(st.lists(EXTRA, max_size=3), st.lists(EXTRA, max_size=3))
def test_extra_encoding_is_injective_on_what_the_block_sees(a, b):
    """Equal encodings exactly when the (kind, value, relative span) multisets are equal."""

    def seen(extras):
        return sorted(
            (e.kind.value, e.value, e.start, e.end) for e in extras if e.end is None or e.start < 8
        )

    assert (encode_extras(a, 0, 8) == encode_extras(b, 0, 8)) == (seen(a) == seen(b))


def test_lora_and_salt_with_equal_text_differ():
    """vLLM #44701: the kind tag separates the sources."""
    lora = encode_extras([ExtraKey(ExtraKind.LORA, "x")], 0, 4)
    salt = encode_extras([ExtraKey(ExtraKind.CACHE_SALT, "x")], 0, 4)
    assert lora != salt


def test_blake2b_is_available_and_differs_from_sha256():
    data = b"kvcert"
    assert hasher(HashAlgorithm.BLAKE2B)(data) != hasher(HashAlgorithm.SHA256)(data)
    assert len(hasher(HashAlgorithm.BLAKE2B)(data)) == 32


def test_bad_tokens_and_extras_are_refused():
    with pytest.raises(RequestStateError, match=r"token ids must be integers in \[-2\*\*63"):
        encode_tokens([2**63])
    with pytest.raises(ConfigError, match="need 0 <= start < end"):
        ExtraKey(ExtraKind.MULTIMODAL, "img")
    with pytest.raises(ConfigError, match="take no span"):
        ExtraKey(ExtraKind.LORA, "x", 0, 4)
    with pytest.raises(ConfigError, match="ExtraKind"):
        ExtraKey("lora", "x")


def test_shifted_chain_waits_for_the_next_token():
    chain = Chain(4, 1, (), hasher(HashAlgorithm.SHA256))
    chain.extend([1, 2, 3, 4])
    assert chain.digests == []
    chain.extend([1, 2, 3, 4, 5])
    assert len(chain.digests) == 1
    assert chain.key(4, 0) == chain.digests[0]
    assert chain.key(4, 1) is None
