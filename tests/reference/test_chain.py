"""The compiled digest chain (reference/_chain.c) equals its pure-Python definitions: the
SHA-256 state equals hashlib's, `Sha256.boundaries` equals `hashing.py_boundaries`,
`pack_tokens` equals the array packing `inputs.token_ids` falls back to, and a Chain digests
the same on either state, with records of positioned extras, lookahead and the memo."""

from __future__ import annotations

import contextlib
import hashlib
import platform
import struct
import subprocess
import sys
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcert.reference import hashing, inputs, native
from kvcert.reference.config import CacheConfig, GroupConfig, HashAlgorithm, Kind
from kvcert.reference.errors import RequestStateError
from kvcert.reference.hashing import (
    CHECKPOINT_EVERY,
    Chain,
    DigestMemo,
    ExtraKey,
    ExtraKind,
    copy_chains,
    decode_tokens,
    encode_tokens,
    py_boundaries,
    py_first_difference,
)
from kvcert.reference.manager import KVCacheManager
from tests.tiers import tiered

compiled = pytest.importorskip("kvcert.reference._chain")

CHUNKS = st.lists(st.binary(max_size=150), max_size=8)


@settings(max_examples=tiered(200, 2000))
@given(CHUNKS, st.lists(st.integers(0, 7), max_size=8))
def test_the_state_equals_hashlibs(chunks, copies_at):
    """update / digest / copy as hashlib's: the digest leaves the state running, a copy is
    independent of its original."""
    ours, theirs = compiled.Sha256(b"head"), hashlib.sha256(b"head")
    for k, chunk in enumerate(chunks):
        ours.update(chunk)
        theirs.update(memoryview(chunk))
        assert ours.digest() == theirs.digest()
        if k in copies_at:
            twin, their_twin = ours.copy(), theirs.copy()
            twin.update(b"x")
            their_twin.update(b"x")
            assert twin.digest() == their_twin.digest() != ours.digest()
    assert ours.digest() == theirs.digest()
    assert ours.digest_size == 32


def run_boundaries(run, state, data, bounds):
    out = [b"earlier"]
    try:
        run(out, data, *bounds)
    except ValueError:
        return "refused", out, state.digest()
    return "ran", out, state.digest()


@contextlib.contextmanager
def lanes_or_skip(on: bool) -> Iterator[None]:
    """`boundaries` finishing its digests in lanes (on) or one at a time, for the block; a
    CPU without the SHA extensions skips the lanes."""
    try:
        before = compiled.use_lanes(on)
    except ValueError:
        pytest.skip("this CPU has no SHA extensions: the lanes are never used here")
    try:
        yield
    finally:
        compiled.use_lanes(before)


LOOPS = pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "one-at-a-time"])


@LOOPS
@settings(max_examples=tiered(300, 3000))
@given(
    st.binary(max_size=200),
    st.integers(-2, 210),
    st.integers(-2, 210),
    st.integers(-1, 40),
    st.integers(-1, 12),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_boundaries_equal_the_definition(lanes, data, start, first_end, step, count, wrap):
    """The same digests appended after what `out` held, the same state after; bounds that
    do not fit are refused by both before anything moves."""
    ours, theirs = compiled.Sha256(b"h"), hashlib.sha256(b"h")
    bounds = (start, first_end, step, count)
    with lanes_or_skip(lanes):
        got = run_boundaries(ours.boundaries, ours, wrap(data), bounds)
    want = run_boundaries(lambda *a: py_boundaries(theirs, *a), theirs, wrap(data), bounds)
    assert got == want
    if got[0] == "refused":
        assert got[1] == [b"earlier"]
        assert got[2] == hashlib.sha256(b"h").digest()


@LOOPS
@settings(max_examples=tiered(300, 3000))
@given(st.binary(max_size=130), st.binary(max_size=1200), st.integers(0, 200), st.integers(1, 150))
def test_long_runs_equal_the_definition(lanes, head, data, first, step):
    """Runs long enough for several blocks between boundaries and for many boundaries in one
    block (the lanes' queue full), from a state part-way into a block (`head`), and a state
    that keeps running after: the digests and the state equal hashlib's."""
    count = 0 if first > len(data) else 1 + (len(data) - first) // step
    ours, theirs = compiled.Sha256(head), hashlib.sha256(head)
    out: list[bytes] = []
    with lanes_or_skip(lanes):
        ours.boundaries(out, data, 0, first, step, count)
    want: list[bytes] = []
    py_boundaries(theirs, want, data, 0, first, step, count)
    assert out == want
    ours.update(b"tail")
    theirs.update(b"tail")
    assert ours.digest() == theirs.digest()


@LOOPS
def test_every_partial_block_at_a_boundary_is_finished_right(lanes):
    """Each length a boundary can leave in the partial block (0-63 bytes: under 56 the
    padding fits it, from 56 on it takes a second block), under steps that complete a block
    every few boundaries, every boundary, and every second one."""
    data = bytes(range(256)) * 3
    for head in range(64):
        for step in (1, 8, 24, 32, 56, 60, 64, 72, 120, 128, 200):
            ours, theirs = compiled.Sha256(bytes(head)), hashlib.sha256(bytes(head))
            count = 1 + (len(data) - step) // step
            out: list[bytes] = []
            with lanes_or_skip(lanes):
                ours.boundaries(out, data, 0, step, step, count)
            want: list[bytes] = []
            py_boundaries(theirs, want, data, 0, step, step, count)
            assert (head, step, out) == (head, step, want)
            assert ours.digest() == theirs.digest()


def test_the_loop_switch_takes_a_bool_and_answers_the_previous_setting():
    with lanes_or_skip(True):
        assert compiled.use_lanes(False) is True
        assert compiled.use_lanes(True) is False
        for wrong in (1, "yes", None):
            with pytest.raises(TypeError, match="True or False"):
                compiled.use_lanes(wrong)
        assert compiled.use_lanes(True) is True


def test_the_lanes_are_on_exactly_where_the_cpu_has_sha_extensions():
    """A fresh import chooses the lanes where the kernel reports the SHA extensions (and
    SSSE3, SSE4.1), and refuses them elsewhere: a detection that never finds them would
    leave every machine on the slower loop without a word."""
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() != "x86_64" or not cpuinfo.exists():
        pytest.skip("the lanes are built for x86-64 only; CPU flags are read from Linux here")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    has = {"sha_ni", "ssse3", "sse4_1"} <= flags
    probe = (
        "from kvcert.reference import _chain\n"
        "try:\n    print(_chain.use_lanes(True))\n"
        "except ValueError:\n    print('refused')"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert answer == ("True" if has else "refused")


def test_boundaries_check_their_arguments():
    state = compiled.Sha256()
    with pytest.raises(TypeError, match="out must be a list"):
        state.boundaries((), b"abcd", 0, 4, 4, 1)
    with pytest.raises(TypeError, match="6 arguments"):
        state.boundaries([], b"abcd", 0, 4, 4)
    with pytest.raises(TypeError):
        state.boundaries([], "text", 0, 4, 4, 1)
    with pytest.raises(TypeError, match="by position"):
        compiled.Sha256(data=b"x")


def first_difference_or_refusal(find, a, b, start, stop):
    try:
        return find(a, b, start, stop)
    except ValueError as why:
        return f"refused: {why}"


@settings(max_examples=tiered(300, 3000))
@given(
    st.binary(max_size=300),
    st.lists(st.tuples(st.integers(0, 299), st.binary(min_size=1, max_size=9)), max_size=3),
    st.integers(-1, 310),
    st.integers(-1, 310),
    st.integers(0, 5),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_first_difference_equals_the_definition(data, edits, start, stop, shorter, wrap):
    """Where two buffers first differ in [start, stop), or stop: one of them edited anywhere
    (so differences before, inside and after the range), maybe cut shorter; bounds outside
    either buffer are refused by both, with the same message."""
    other = bytearray(data)
    for at, patch in edits:
        other[at : at + len(patch)] = patch
    other = other[: max(0, len(other) - shorter)]
    a, b = wrap(data), wrap(bytes(other))
    got = first_difference_or_refusal(compiled.first_difference, a, b, start, stop)
    assert got == first_difference_or_refusal(py_first_difference, a, b, start, stop)
    if isinstance(got, int):  # the answer itself, from its definition
        assert start <= got <= stop
        assert data[start:got] == bytes(other[start:got])
        assert got == stop or data[got] != other[got]


def test_first_difference_finds_a_late_difference_past_its_pages():
    """A difference past the first 4 KiB pages the compiled search compares at once."""
    data = bytes(range(256)) * 64
    other = data[:12345] + b"\xff" + data[12346:]
    assert compiled.first_difference(data, other, 8, len(data)) == 12345
    assert compiled.first_difference(data, data, 8, len(data)) == len(data)
    with pytest.raises(TypeError, match="4 arguments"):
        compiled.first_difference(data, other, 0)


ID = st.integers(0, 2**63 - 1)
NOT_ID = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=2),
    st.none(),
)


@settings(max_examples=tiered(300, 3000))
@given(st.lists(ID, max_size=40), st.sampled_from([list, tuple]))
def test_pack_tokens_is_the_little_endian_encoding(tokens, wrap):
    packed = compiled.pack_tokens(wrap(tokens))
    little_endian = struct.pack(f"<{len(tokens)}q", *tokens)  # on any host
    assert packed == little_endian == encode_tokens(array("q", tokens))
    assert decode_tokens(packed).tolist() == tokens


EDGES = [0, 1, 2**30 - 1, 2**30, 2**31, 2**60, 2**63 - 1]  # one 30-bit digit, then more


def test_pack_tokens_reads_ints_of_every_size():
    """The one-digit shortcut and the API's path agree at the digit boundaries."""
    assert compiled.pack_tokens(EDGES) == struct.pack(f"<{len(EDGES)}q", *EDGES)
    for bad in (-1, -(2**30), -(2**31), 2**63, 2**64):
        assert compiled.pack_tokens([*EDGES, bad]) is None


@settings(max_examples=tiered(200, 2000))
@given(st.lists(ID, max_size=20), st.integers(0, 20), NOT_ID)
def test_pack_tokens_refuses_what_is_not_an_id(tokens, at, bad):
    """None, not a guess: the caller then names the bad position (a bool is no id)."""
    tokens.insert(min(at, len(tokens)), bad)
    assert compiled.pack_tokens(tokens) is None
    with pytest.raises(RequestStateError, match=f"position {min(at, len(tokens) - 1)} holds"):
        inputs.token_ids(tokens * 2 if len(tokens) <= inputs.SHORT else tokens, "tokens")


class Flag(int):
    """An int subclass: packed by the fallback's struct path, never by the C loop."""


def test_pack_tokens_leaves_other_inputs_to_the_fallback():
    assert compiled.pack_tokens(array("q", [1, 2])) is None
    assert compiled.pack_tokens(range(3)) is None
    assert compiled.pack_tokens([Flag(3)]) is None
    long_list = [Flag(3)] * (inputs.SHORT + 1)
    assert inputs.token_ids(long_list, "tokens").tolist() == [3] * (inputs.SHORT + 1)
    assert inputs.encoded_token_ids(long_list, "tokens") == encode_tokens([3] * len(long_list))


SPANNED = st.builds(
    lambda kind, value, start, width: ExtraKey(kind, value, start, start + width),
    st.sampled_from([ExtraKind.MULTIMODAL, ExtraKind.PROMPT_EMBEDS]),
    st.text(max_size=3),
    st.integers(0, 60),
    st.integers(1, 9),
)
WIDE = st.builds(
    ExtraKey, st.sampled_from([ExtraKind.CACHE_SALT, ExtraKind.LORA]), st.text(max_size=3)
)


def chain_digests(new, tokens, cuts, size, lookahead, extras, memo):
    """Digests after extending over growing prefixes of `tokens` (cut where `cuts` say)."""
    chain = Chain(size, lookahead, extras, new)
    for cut in [*sorted(cuts), len(tokens)]:
        if memo is None:
            chain.extend(tokens[:cut])
        else:
            chain.extend_encoded(encode_tokens(tokens[:cut]), memo)
    return chain.digests, chain.copy().digests


@settings(max_examples=tiered(200, 2000))
@given(
    st.lists(st.integers(0, 9), max_size=70),
    st.lists(st.integers(0, 70), max_size=3),
    st.integers(1, 5),
    st.integers(0, 2),
    st.lists(st.one_of(SPANNED, WIDE), max_size=3),
    st.booleans(),
)
def test_a_chain_digests_the_same_on_either_state(tokens, cuts, size, lookahead, extras, memo):
    """Runs split at records, at memo checkpoints and across extends give the digests the
    definition's loop over hashlib gives."""
    memos = (DigestMemo(1 << 20), DigestMemo(1 << 20)) if memo else (None, None)
    if memo:  # a family entry to resume from: a prompt sharing a prefix
        shared = tokens[: len(tokens) // 2] + [1] * (CHECKPOINT_EVERY * size + 3)
        for new, entry in zip((compiled.Sha256, hashlib.sha256), memos, strict=True):
            chain_digests(new, shared, [], size, lookahead, extras, entry)
    ours = chain_digests(compiled.Sha256, tokens, cuts, size, lookahead, extras, memos[0])
    theirs = chain_digests(hashlib.sha256, tokens, cuts, size, lookahead, extras, memos[1])
    assert ours == theirs


def test_the_extension_is_built_and_chosen():
    """Built where OpenSSL's headers are (this machine, CI's); chosen for SHA-256 unless
    KVCERT_PURE_PYTHON=1 asks for hashlib."""
    chosen = hashing.hasher(HashAlgorithm.SHA256)
    assert chosen is (hashlib.sha256 if native.PURE_PYTHON else compiled.Sha256)
    assert hashing.first_difference is (
        py_first_difference if native.PURE_PYTHON else compiled.first_difference
    )
    assert (
        hashing.hasher(HashAlgorithm.BLAKE2B)(b"").digest()
        == hashlib.blake2b(b"", digest_size=32).digest()
    )
    code = (
        "from kvcert.reference import hashing as h, config as c;"
        "print(h.hasher(c.HashAlgorithm.SHA256))"
    )
    fallback = subprocess.run(
        [sys.executable, "-c", code],
        env={"KVCERT_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "openssl_sha256" in fallback.stdout


class ReadOnlyView(Sequence[int]):
    """An engine's read-only view of its token list, as vLLM's ConstantList is."""

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def __getitem__(self, index):  # type: ignore[override]
        return self._tokens[index]

    def __len__(self) -> int:
        return len(self._tokens)


def test_any_sequence_of_ids_packs_as_its_list_does():
    """A read-only view, a range and an array pack as the list of their ids; str and bytes
    are refused, never read as ids."""
    ids = [5, 0, 2**63 - 1, 7] * 10
    want = encode_tokens(ids)
    for same in (ReadOnlyView(ids), tuple(ids), array("q", ids)):
        assert inputs.encoded_token_ids(same, "tokens") == want
    assert inputs.encoded_token_ids(range(40), "tokens") == encode_tokens(list(range(40)))
    for text in ("tokens" * 5, b"tokens" * 5):
        with pytest.raises(RequestStateError, match="must be a sequence of token ids"):
            inputs.encoded_token_ids(text, "tokens")
    with pytest.raises(RequestStateError, match="position 3 holds -1"):
        inputs.encoded_token_ids(ReadOnlyView([1, 2, 3, -1] * 5), "tokens")


def test_copied_chains_are_independent_and_keep_their_sharing():
    """copy_chains gives each chain one copy, shared by the groups that shared it, and a copy
    digesting more leaves its original as it was."""
    shared, own = Chain(2, 0, (), hashlib.sha256), Chain(4, 1, (), hashlib.sha256)
    copies = copy_chains([shared, None, shared, own])
    assert copies[1] is None
    assert copies[0] is copies[2]
    assert copies[0] is not shared
    assert copies[3] is not own
    packed = encode_tokens(array("q", range(9)))
    copies[0].extend_encoded(packed)
    copies[3].extend_encoded(packed)
    assert not shared.digests
    assert not own.digests
    fresh = Chain(2, 0, (), hashlib.sha256)
    fresh.extend_encoded(packed)
    assert copies[0].digests == fresh.digests


def test_prompts_without_extras_get_fresh_chains_each():
    """The chains a prompt without extras gets are copies of ones made once: each prompt's
    chain is its own (one, shared by both groups) and keys as a chain made for it does."""
    config = CacheConfig(
        groups=(GroupConfig(Kind.FULL, 4), GroupConfig(Kind.SLIDING_WINDOW, 4, window=8)),
        num_blocks=16,
    )
    manager = KVCacheManager(config)
    first, second = manager.prompt(list(range(12))), manager.prompt(list(range(13, 25)))
    assert first.chains[0] is first.chains[1]
    assert first.chains[0] is not second.chains[0]
    for prompt, tokens in ((first, range(12)), (second, range(13, 25))):
        made = Chain(4, 0, (), hashing.hasher(config.hash_algorithm))
        made.extend_encoded(encode_tokens(array("q", tokens)))
        assert prompt.chains[0].digests == made.digests
