"""The digest memo: reused digests are exactly the recomputed ones, reuse really happens, and
the byte budget holds."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference.config import CacheConfig, GroupConfig, HashAlgorithm, Kind
from kvcert.reference.errors import ConfigError
from kvcert.reference.hashing import (
    CHECKPOINT_EVERY,
    Chain,
    DigestMemo,
    ExtraKey,
    ExtraKind,
    encode_tokens,
    hasher,
)
from kvcert.reference.manager import KVCacheManager
from tests.docs import words
from tests.tiers import tiered

NEW = hasher(HashAlgorithm.SHA256)


def digests(tokens: list[int], size: int, lookahead: int, extras, memo=None) -> list[bytes]:
    chain = Chain(size, lookahead, extras, NEW)
    packed = array("q", tokens)
    chain.extend_encoded(encode_tokens(packed), memo)
    return chain.digests


WIDE = st.sampled_from([ExtraKind.CACHE_SALT, ExtraKind.LORA])
SALTS = st.lists(st.builds(ExtraKey, WIDE, st.text(max_size=3)), max_size=1)


@settings(max_examples=tiered(150, 3000), deadline=None)
@given(
    size=st.integers(1, 4),
    lookahead=st.integers(0, 1),
    extras=SALTS,
    budget=st.sampled_from([0, 200, 5_000, 1 << 20]),
    shared=st.lists(st.integers(0, 3), max_size=90),
    tails=st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=5),
)
def test_memoized_digests_equal_recomputed_ones(size, lookahead, extras, budget, shared, tails):
    """Prompts sharing a prefix (any length, so mid-block and mid-checkpoint divergence too)
    through one memo give the digests a fresh chain gives, whatever the budget."""
    memo = DigestMemo(budget)
    for tail in tails + tails[:1]:  # the first again: a re-sent prompt
        tokens = shared + tail
        assert digests(tokens, size, lookahead, extras, memo) == digests(
            tokens, size, lookahead, extras
        )
        assert memo._used <= budget


@settings(max_examples=tiered(40, 400), deadline=None)
@given(size=st.integers(1, 4), lookahead=st.integers(0, 1), length=st.integers(2, 70))
def test_one_changed_token_anywhere_is_seen(size, lookahead, length):
    """A prompt differing from the remembered one in a single token, at every position past
    the first block (which names the family), gets its own digests: the search for the shared
    part compares every byte it relies on, whichever span the difference falls in."""
    base = list(range(length))
    for position in range(size + lookahead, length):
        memo = DigestMemo(1 << 20)
        digests(base, size, lookahead, (), memo)
        changed = [*base[:position], 10**6, *base[position + 1 :]]
        assert digests(changed, size, lookahead, (), memo) == digests(changed, size, lookahead, ())


def test_a_shared_prefix_is_reused_not_rehashed():
    """The second prompt's digests over the shared whole blocks are the first's objects; past
    the divergence they are its own, and equal to a fresh chain's."""
    memo = DigestMemo(1 << 20)
    shared = list(range(5 * CHECKPOINT_EVERY * 4 + 3))  # 83 blocks of 4, then 3 tokens
    first = digests(shared + [7] * 40, 4, 0, (), memo)
    second = digests(shared + [9] * 40, 4, 0, (), memo)
    whole = len(shared) // 4
    assert all(a is b for a, b in zip(first[:whole], second[:whole], strict=True))
    assert not any(a is b for a, b in zip(first[whole:], second[whole:], strict=False))
    assert second == digests(shared + [9] * 40, 4, 0, ())
    assert first[whole] != second[whole]  # the block holding the divergence


def test_families_are_kept_apart_by_header_and_first_block():
    """A salted prompt never reuses an unsalted one's digests, nor a prompt starting
    differently; both still get their own correct digests."""
    memo = DigestMemo(1 << 20)
    tokens = list(range(64))
    plain = digests(tokens, 4, 0, (), memo)
    salt = (ExtraKey(ExtraKind.CACHE_SALT, "s"),)
    salted = digests(tokens, 4, 0, salt, memo)
    assert salted == digests(tokens, 4, 0, salt)
    assert not set(plain) & set(salted)
    assert len(memo._entries) == 2


def test_positioned_extras_bypass_the_memo():
    memo = DigestMemo(1 << 20)
    image = (ExtraKey(ExtraKind.MULTIMODAL, "img", 3, 9),)
    tokens = list(range(40))
    assert digests(tokens, 4, 0, image, memo) == digests(tokens, 4, 0, image)
    assert not memo._entries


def test_the_budget_evicts_the_least_recently_used_family_and_skips_oversized_prompts():
    entry_cost = 8 * 64 + 100 * 16 + 400 * 1  # 64 tokens at block 4: 16 digests, 1 checkpoint
    memo = DigestMemo(2 * entry_cost)
    for first in (1, 2, 3):  # three families, room for two
        digests([first, *range(63)], 4, 0, (), memo)
    assert [family[2][0] for family in memo._entries] == [2, 3]
    assert memo._used <= memo.budget
    digests(list(range(10_000)), 4, 0, (), memo)  # larger than the whole budget
    assert len(memo._entries) == 2


def config(**fields) -> CacheConfig:
    return CacheConfig((GroupConfig(Kind.FULL, 4),), 64, **fields)


def test_the_manager_memo_is_configurable_and_checked():
    with_memo = KVCacheManager(config())
    without = KVCacheManager(config(digest_memo_bytes=0))
    tokens = list(range(50))
    assert with_memo.prompt(tokens).chains[0].digests == without.prompt(tokens).chains[0].digests
    assert with_memo._memo is not None
    assert without._memo is None
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="digest_memo_bytes must be an integer >= 0"):
            config(digest_memo_bytes=bad)


def test_the_docs_state_the_default_budget():
    default = config().digest_memo_bytes
    assert default == 16 * 2**20
    assert "`CacheConfig.digest_memo_bytes`, 16 MiB by default" in words("allocator")
