"""The digest memo: reused digests are exactly the recomputed ones, reuse really happens, the
byte budget holds, and its compiled path leaves the chain and the memo as the definition
(`DigestMemo.digest`) leaves them."""

from __future__ import annotations

import hashlib
import sys
import threading
from array import array
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference import hashing
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


compiled_memo = pytest.mark.skipif(
    hashing._memo_digest is None, reason="the _chain extension is not built (or not wanted)"
)


@contextmanager
def memo_path(compiled: bool) -> Iterator[list[bool]]:
    """Serve the memo by its compiled path (each answer recorded, so a test can see it served)
    or by the definition alone."""
    answers: list[bool] = []
    served = hashing._memo_digest

    def recorded(memo, chain, count):
        answers.append(served(memo, chain, count))
        return answers[-1]

    hashing._memo_digest = recorded if compiled else None
    try:
        yield answers
    finally:
        hashing._memo_digest = served


def chain_state(chain: Chain) -> tuple:
    saved = [(k, fed, state.digest()) for k, fed, state in chain._checkpoints]
    return chain.digests, chain._fed, chain._state.digest(), bytes(chain._stream), saved


def memo_state(memo: DigestMemo) -> tuple:
    entries = [
        (family, entry.stream, entry.digests, [(k, f, s.digest()) for k, f, s in entry.checkpoints])
        for family, entry in memo._entries.items()
    ]
    return entries, memo._used


def through(memo: DigestMemo, tokens: list[int], cuts: list[int], size, lookahead, extras) -> Chain:
    """A fresh chain extended over growing prefixes of `tokens` through `memo` (a cut that
    completes no boundary leaves the stream growing: a bytearray when the memo sees it)."""
    chain = Chain(size, lookahead, extras, NEW)
    for cut in [*sorted(cuts), len(tokens)]:
        chain.extend_encoded(encode_tokens(array("q", tokens[:cut])), memo)
    return chain


@compiled_memo
@settings(max_examples=tiered(150, 2000), deadline=None)
@given(
    size=st.integers(1, 4),
    lookahead=st.integers(0, 1),
    extras=SALTS,
    budget=st.sampled_from([0, 200, 1_500, 5_000, 1 << 20]),
    shared=st.lists(st.integers(0, 3), max_size=150),
    tails=st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 8), max_size=2),
    turns=st.lists(st.booleans(), min_size=7, max_size=7),
)
def test_the_compiled_path_leaves_what_the_definition_leaves(
    size, lookahead, extras, budget, shared, tails, cuts, turns
):
    """Prompts sharing a prefix (diverging anywhere: inside the first block, a checkpoint's
    span, past the remembered prompt), each through two memos: one served by the definition
    alone, one by either path in turn. Every chain and both memos end alike: digests, hash
    states, checkpoints, entries in their order, the bytes counted; and the compiled path
    served every prompt it was given."""
    alone, mixed = DigestMemo(budget), DigestMemo(budget)
    for tail, compiled in zip(tails + tails[:1], turns, strict=False):  # the first re-sent
        tokens = shared + tail
        kept = [remembered(alone), remembered(mixed)]
        with memo_path(False):
            expected = through(alone, tokens, cuts, size, lookahead, extras)
        with memo_path(compiled) as answers:
            got = through(mixed, tokens, cuts, size, lookahead, extras)
        assert all(answers)
        assert chain_state(got) == chain_state(expected)
        assert memo_state(mixed) == memo_state(alone)
        assert got.digests == digests(tokens, size, lookahead, extras)
        # the same digests reused (not recomputed): a re-sent prompt takes them all
        assert reused(got, kept[1]) == reused(expected, kept[0])


def remembered(memo: DigestMemo) -> dict[int, bytes]:
    """The digest objects the memo holds, by id (held here, so no id is reused meanwhile)."""
    return {id(d): d for entry in memo._entries.values() for d in entry.digests}


def reused(chain: Chain, before: dict[int, bytes]) -> int:
    return sum(before.get(id(d)) is d for d in chain.digests)


@compiled_memo
@pytest.mark.parametrize("compiled", [False, True])
def test_a_resumed_prompt_too_large_to_keep_still_counts_as_recently_used(compiled):
    """Family A is resumed by a prompt too large to remember: A stays (not re-recorded) but
    is the most recently used, so a third family evicts B, under either path."""
    size = 4
    entry = 8 * 32 + 100 * 8 + 400 * 0  # a 32-token prompt: 8 digests, no checkpoint
    memo = DigestMemo(2 * entry + 50)
    with memo_path(compiled) as answers:
        for first in (1, 2):
            digests([first, *range(31)], size, 0, (), memo)
        digests([1, *range(31), *range(400)], size, 0, (), memo)  # A again, past the budget
        digests([3, *range(31)], size, 0, (), memo)
    assert [family[2][0] for family in memo._entries] == [1, 3]
    assert all(answers)
    assert len(answers) == 4 * compiled


@compiled_memo
def test_the_compiled_path_serves_only_what_it_follows():
    """Another hash state (hashlib's), a subclass of either class, checkpoints not kept in a
    list: answered False with the chain and the memo untouched, so the definition serves
    them."""
    tokens = encode_tokens(list(range(40)))
    memo = DigestMemo(1 << 20)
    digests(list(range(40)), 4, 0, (), memo)  # an entry of the family
    before = memo_state(memo)
    foreign = Chain(4, 0, (), hashlib.sha256)
    foreign._append(tokens)

    class Memo(DigestMemo):
        pass

    class Twig(Chain):
        pass

    own = Twig(4, 0, (), NEW)
    own._append(tokens)
    odd = Chain(4, 0, (), NEW)  # checkpoints kept in something other than a list
    odd._append(tokens)
    odd._checkpoints = ()  # type: ignore[assignment]
    cases = ((memo, foreign), (Memo(1 << 20), Chain(4, 0, (), NEW)), (memo, own), (memo, odd))
    for memo_, chain in cases:
        state = (chain.digests[:], chain._fed, chain._state.digest())
        assert hashing._memo_digest(memo_, chain, 10) is False
        assert (chain.digests, chain._fed, chain._state.digest()) == state
    assert memo_state(memo) == before


@compiled_memo
@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ((DigestMemo, Chain, hashing._Entry, 16, 100), TypeError),  # one missing
        ((DigestMemo, Chain, "entry", 16, 100, 400), TypeError),  # not a class
        ((DigestMemo, Chain, hashing._Entry, 0, 100, 400), ValueError),  # no cadence
        ((DigestMemo, Chain, hashing._Entry, 16, -1, 400), ValueError),
    ],
)
def test_the_compiled_path_refuses_bad_definitions(arguments, error):
    """What hashing.py names at import is checked; a refusal changes nothing (the path still
    serves, as the wiring test below sees)."""
    with pytest.raises(error):
        hashing._compiled.memo_definitions(*arguments)
    with memo_path(True) as answers:
        digests(list(range(64)), 4, 0, (), DigestMemo(1 << 20))
    assert answers == [True]
    with pytest.raises(TypeError, match="takes 3 arguments"):
        hashing._memo_digest(DigestMemo(1), Chain(4, 0, (), NEW))


@compiled_memo
def test_the_compiled_path_is_wired_in():
    """A fresh chain through a memo takes the compiled path (a prompt through the manager's
    memo is served there), and the path is DigestMemo.digest's twin, named to the extension
    once at import."""
    with memo_path(True) as answers:
        digests(list(range(64)), 4, 0, (), DigestMemo(1 << 20))
    assert answers == [True]


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


def test_threads_digesting_through_one_memo_get_recomputed_digests():
    """An engine digests arriving prompts on its input thread while its steps digest on
    another (vLLM's block hasher, kvcert.reference.vllm.hasher): through one memo, by its
    many-statement definition, with threads switching every microsecond, every prompt's
    digests are a fresh chain's, no digest raises, and the memo's byte count is its
    entries' (its twin without the lock miscounts: two threads replacing one family's entry
    at once both add their cost, one entry stays)."""
    memo, failures = DigestMemo(1 << 20), []
    shared = list(range(200))

    def digest_many(seed: int) -> None:
        try:
            for k in range(150):
                tokens = [*shared[: 40 + (seed * 7 + k * 13) % 160], seed, k, *range(k % 9)]
                if digests(tokens, 4, 0, (), memo) != digests(tokens, 4, 0, ()):
                    failures.append((seed, k))
        except Exception as why:  # reported below
            failures.append(why)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with memo_path(False):
            threads = [threading.Thread(target=digest_many, args=(s,)) for s in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures
    costs = [
        hashing._cost(len(e.stream), len(e.digests), len(e.checkpoints))
        for e in memo._entries.values()
    ]
    assert memo._used == sum(costs) <= memo.budget
