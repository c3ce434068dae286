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
from kvcert.reference.errors import ConfigError
from kvcert.reference.hashing import (
    Chain,
    ExtraKey,
    ExtraKind,
    encode_extras,
    encode_tokens,
    hasher,
)


def test_digests_follow_the_documented_stream():
    """Re-derive the digests from the module docstring's stream with hashlib directly."""
    salt = b"W" + struct.pack("<I", 10) + b"cache_salt" + struct.pack("<I", 2) + b"t1"
    header = b"kvcert-block-v2\x00" + b"\x00" + struct.pack("<I", 1) + salt
    image = b"P" + struct.pack("<I", 10) + b"multimodal" + struct.pack("<I", 3) + b"img"
    record = struct.pack("<q", -1) + struct.pack("<I", 1) + image + struct.pack("<qq", 5, 7)
    stream = header + struct.pack("<4q", 7, 8, 9, 1) + struct.pack("<q", 2) + record
    stream += struct.pack("<3q", 3, 4, 5)
    extras = [ExtraKey(ExtraKind.CACHE_SALT, "t1"), ExtraKey(ExtraKind.MULTIMODAL, "img", 5, 7)]
    chain = Chain(4, 0, extras, hasher(HashAlgorithm.SHA256))
    chain.extend([7, 8, 9, 1, 2, 3, 4, 5, 6])
    assert chain.digests == [
        hashlib.sha256(stream[: len(header) + 32]).digest(),
        hashlib.sha256(stream).digest(),
    ]


def test_a_positioned_extra_changes_exactly_the_digests_past_its_start():
    """HASH-EXTRA-1: an image at [9, 12) leaves blocks ending at or before token 9 alone."""
    tokens = list(range(20))
    plain = Chain(3, 0, (), hasher(HashAlgorithm.SHA256))
    image = Chain(3, 0, [ExtraKey(ExtraKind.MULTIMODAL, "i", 9, 12)], hasher(HashAlgorithm.SHA256))
    for chain in (plain, image):
        chain.extend(tokens)
    same = [a == b for a, b in zip(plain.digests, image.digests, strict=True)]
    assert same == [True, True, True, False, False, False]  # boundaries 3, 6, 9 | 12, 15, 18


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
def test_extra_encoding_is_injective(a, b):
    """Equal encodings exactly when the (kind, value, span) multisets are equal."""

    def seen(extras):
        return sorted((e.kind.value, e.value, e.start, e.end or -1) for e in extras)

    assert (encode_extras(a) == encode_extras(b)) == (seen(a) == seen(b))


def test_lora_and_salt_with_equal_text_differ():
    """vLLM #44701: the kind tag separates the sources."""
    lora = encode_extras([ExtraKey(ExtraKind.LORA, "x")])
    salt = encode_extras([ExtraKey(ExtraKind.CACHE_SALT, "x")])
    assert lora != salt


def test_blake2b_is_available_and_differs_from_sha256():
    data = b"kvcert"
    blake = hasher(HashAlgorithm.BLAKE2B)(data).digest()
    assert blake != hasher(HashAlgorithm.SHA256)(data).digest()
    assert len(blake) == 32


def test_bad_extras_are_refused():
    with pytest.raises(ConfigError, match="need 0 <= start < end"):
        ExtraKey(ExtraKind.MULTIMODAL, "img")
    with pytest.raises(ConfigError, match="take no span"):
        ExtraKey(ExtraKind.LORA, "x", 0, 4)
    with pytest.raises(ConfigError, match="kind must be one of cache_salt"):
        ExtraKey("LoRA", "x")  # type: ignore[arg-type]


def test_shifted_chain_waits_for_the_next_token():
    chain = Chain(4, 1, (), hasher(HashAlgorithm.SHA256))
    chain.extend([1, 2, 3, 4])
    assert chain.digests == []
    chain.extend([1, 2, 3, 4, 5])
    assert len(chain.digests) == 1
    assert chain.key(4, 0) == chain.digests[0]
    assert chain.key(4, 1) is None
