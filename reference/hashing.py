"""Block digests: collision-resistant prefix digests over one canonical byte stream.

Implements HASH-CHAIN-1, HASH-EXTRA-1 and HASH-DRAFT-1 of the spec. The spec's key of a block
is the sequence of (tokens, extras) links of its whole prefix; here one SHA-256 (or
BLAKE2b-256) stream certifies the same information and is digested at every block boundary:

    stream  = DOMAIN | lookahead (1 byte) | request-wide extras | tokens...
    tokens  = each token id as a little-endian int64 (ids are in [0, 2**63))
    record  = -1 as int64 | count | positioned extras (kind, value, absolute start, end),
              inserted right before the token at which those extras start
    digest(t) = H(the stream up to and including the t-th token)

The encoding is injective: every field is length-prefixed, every extra carries its kind tag,
and a record is told from a token by its negative marker. Request-wide extras (salt, LoRA,
encoder input) belong to block 0, so every key of the request includes them; a positioned
extra (image, prompt embeddings) enters every digest past its start, which is exactly the
blocks it overlaps. So digest((j+1)*B + lookahead) matches exactly when the spec's key of
block j does, unless SHA-256 itself collides. No pickle, no Python `hash()`: digests are
stable across processes and machines.

One stream serves every non-draft group: block j of a group of size B is keyed by the digest
after (j+1)*B tokens, computed at the gcd of the block sizes. A draft group under exact keying
also covers the token after each block (lookahead 1), so it gets its own stream.

Cost: the prompt is encoded once; the hash state is advanced over a run of boundaries at a
time, reading the digest after each (`py_boundaries` defines it; with the compiled
`_chain.Sha256`, reference/_chain.c, the run is one C call). A `DigestMemo` keeps recent
prompts' chains, so a prompt sharing a prefix with one of them (a system prompt, a chat
re-sent with one more turn) digests only what follows the shared blocks.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

from kvcert.reference.config import HashAlgorithm, as_choice
from kvcert.reference.errors import ConfigError
from kvcert.reference.native import native

_compiled = native("_chain")

DOMAIN = b"kvcert-block-v2\x00"
MARKER = struct.pack("<q", -1)  # precedes a record of positioned extras; never a token id


class ExtraKind(StrEnum):
    """Sources of extra keys; the tag keeps equal strings of different kinds apart."""

    CACHE_SALT = "cache_salt"
    LORA = "lora"
    ENCODER_INPUT = "encoder_input"
    MULTIMODAL = "multimodal"
    PROMPT_EMBEDS = "prompt_embeds"


REQUEST_WIDE = frozenset({ExtraKind.CACHE_SALT, ExtraKind.LORA, ExtraKind.ENCODER_INPUT})


@dataclass(frozen=True, slots=True)
class ExtraKey:
    """An extra input that changes a block's KV: request-wide (no span) or positioned."""

    kind: ExtraKind
    value: str
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", as_choice(ExtraKind, self.kind, "an extra key's kind"))
        if not isinstance(self.value, str):
            raise ConfigError(f"an extra key needs a string value, got {self.value!r}")
        for name in ("start", "end"):
            bound = getattr(self, name)
            if isinstance(bound, bool) or not isinstance(bound, int | None):
                raise ConfigError(f"an extra key's {name} must be an integer, got {bound!r}")
        positioned = self.kind not in REQUEST_WIDE
        if (
            positioned != (self.end is not None)
            or (positioned and not 0 <= self.start < (self.end or 0))
            or (not positioned and self.start != 0)
        ):
            raise ConfigError(
                f"{self.kind.value}: request-wide extras (cache_salt, lora, encoder_input) take "
                "no span; positioned ones need 0 <= start < end"
            )


def _text(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def encode_extras(extras: Sequence[ExtraKey]) -> bytes:
    """Extras as one canonical, count-prefixed field, each tagged by its kind and positioned
    ones by their absolute span. Implements HASH-EXTRA-1 (with the stream's placement: the
    request-wide ones in the header, the positioned ones before their first token)."""
    parts = sorted(
        (b"W" if e.end is None else b"P")
        + _text(e.kind.value)
        + _text(e.value)
        + (b"" if e.end is None else struct.pack("<qq", e.start, e.end))
        for e in extras
    )
    return struct.pack("<I", len(parts)) + b"".join(parts)


def decode_tokens(encoded: bytes) -> array[int]:
    """The ids `encode_tokens` encoded, as an int64 array."""
    tokens = array("q")
    tokens.frombytes(encoded)
    if sys.byteorder == "big":
        tokens.byteswap()
    return tokens


def encode_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian int64 (the caller has checked they are in [0, 2**63))."""
    if _compiled is not None and type(tokens) in (list, tuple):
        encoded: bytes | None = _compiled.pack_tokens(tokens)
        if encoded is not None:
            return encoded
    packed = tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)
    if sys.byteorder == "big":
        packed = array("q", packed)
        packed.byteswap()
    return packed.tobytes()


def hasher(algorithm: HashAlgorithm) -> Callable[[bytes], Any]:
    """A fresh hash object of the algorithm, fed `data` (`.update`, `.copy`, `.digest`): for
    SHA-256 the compiled state with its boundary loop when built, else hashlib's."""
    if algorithm is HashAlgorithm.SHA256:
        return hashlib.sha256 if _compiled is None else _compiled.Sha256
    return lambda data: hashlib.blake2b(data, digest_size=32)


def py_boundaries(  # noqa: PLR0917 (the compiled method's signature, bound to `state`)
    state: Any,
    out: list[bytes],
    data: bytes | bytearray | memoryview,
    start: int,
    first_end: int,
    step: int,
    count: int,
) -> None:
    """Feed data[start:first_end] to `state` and append its digest to `out`, then `count - 1`
    times the next `step` bytes and the digest (the compiled Sha256.boundaries is this loop).
    The bounds are checked before the state moves."""
    size = memoryview(data).nbytes
    if not (0 <= start <= first_end and step > 0 and count >= 0) or (
        count and first_end + (count - 1) * step > size
    ):
        raise ValueError(
            f"boundaries: spans from {start} to {first_end} then {max(count - 1, 0)} x {step} "
            f"bytes do not fit in {size} bytes"
        )
    update, digest, append = state.update, state.digest, out.append
    with memoryview(data) as view:
        for _ in range(count):
            update(view[start:first_end])
            append(digest())
            start, first_end = first_end, first_end + step


def py_first_difference(
    a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview, start: int, stop: int
) -> int:
    """The first offset in [start, stop) at which buffers `a` and `b` differ, or `stop` where
    they agree throughout (both must hold `stop` bytes): a binary search of prefix
    comparisons, each one call (the compiled `first_difference` is one pass)."""
    x, y = memoryview(a).cast("B"), memoryview(b).cast("B")
    if not 0 <= start <= stop <= min(x.nbytes, y.nbytes):
        raise ValueError(
            f"first_difference: [{start}, {stop}) is not within buffers of {x.nbytes} and "
            f"{y.nbytes} bytes"
        )
    with x, y:
        if x[start:stop].tobytes() == y[start:stop].tobytes():
            return stop
        low, high = start, stop  # they agree on [start, low) and differ inside [low, high)
        while high - low > 1:
            middle = (low + high) // 2
            if x[low:middle].tobytes() == y[low:middle].tobytes():
                low = middle
            else:
                high = middle
        return low


first_difference = py_first_difference if _compiled is None else _compiled.first_difference


class Chain:
    """The digests of one request's stream, at one granularity: `digests[k]` certifies tokens
    [0, (k+1)*size + lookahead) and every extra starting before that; it exists once those
    tokens do."""

    __slots__ = (
        "_checkpoints",
        "_fed",
        "_header",
        "_positions",
        "_records",
        "_state",
        "_stream",
        "digests",
        "lookahead",
        "size",
    )

    def __init__(
        self,
        size: int,
        lookahead: int,
        extras: Sequence[ExtraKey],
        new: Callable[[bytes], Any],
    ) -> None:
        self.size = size
        self.lookahead = lookahead
        wide = [e for e in extras if e.end is None]
        self._header = DOMAIN + bytes((lookahead,)) + encode_extras(wide)
        self._state = new(self._header)
        starts: dict[int, list[ExtraKey]] = {}
        for extra in extras:
            if extra.end is not None:
                starts.setdefault(extra.start, []).append(extra)
        self._records = {p: MARKER + encode_extras(e) for p, e in starts.items()}
        self._positions = sorted(self._records)
        self._stream: bytes | bytearray = b""  # the encoded tokens so far
        self._fed = 0  # tokens the hash state has consumed
        self.digests: list[bytes] = []
        self._checkpoints: list[Checkpoint] = []  # kept only for a DigestMemo

    def extend(self, tokens: Sequence[int], memo: DigestMemo | None = None) -> None:
        """Digest every boundary whose tokens all exist (`tokens` is the whole sequence so
        far; `memo`: reuse and remember a prompt's digests). Implements HASH-CHAIN-1."""
        count = self._boundaries(len(tokens))
        if count > len(self.digests):  # tokens are encoded only when a boundary completes
            known = len(self._stream) // 8
            if len(tokens) > known:
                self._append(encode_tokens(tokens[known:]))
            self._digest(count, memo)

    def extend_encoded(self, encoded: bytes, memo: DigestMemo | None = None) -> None:
        """`extend`, given the whole sequence in its encoding (`encode_tokens`)."""
        count = self._boundaries(len(encoded) // 8)
        if count > len(self.digests):
            known = len(self._stream)
            if len(encoded) > known:
                self._append(encoded[known:] if known else encoded)
            self._digest(count, memo)

    def _boundaries(self, length: int) -> int:
        """How many boundaries `length` tokens complete."""
        return max(0, (length - self.lookahead) // self.size)

    def _append(self, encoded: bytes) -> None:
        if not self._stream and type(encoded) is bytes:
            self._stream = encoded  # immutable: shared, not copied, until it grows
            return
        if type(self._stream) is bytes:
            self._stream = bytearray(self._stream)
        self._stream += encoded

    def _digest(self, count: int, memo: DigestMemo | None) -> None:
        if memo is None or self._records or self.digests:  # the memo keeps fresh prompts
            self._digest_to(count, False)
        else:
            with memo.lock:
                if _memo_digest is None or not _memo_digest(memo, self, count):
                    memo.digest(self, count)

    def _digest_to(self, count: int, checkpoints: bool) -> None:
        """Digest boundaries len(digests) .. count - 1 in runs: a run stops where a record of
        positioned extras enters the stream (fed right before its token) and, when
        `checkpoints`, every CHECKPOINT_EVERY boundaries (the state saved there for a memo)."""
        size, lookahead, state, digests = self.size, self.lookahead, self._state, self.digests
        run = getattr(state, "boundaries", None)
        if run is None:  # hashlib's state: the definition's loop
            run = partial(py_boundaries, state)
        fed, k = self._fed, len(digests)
        if not (self._records or checkpoints):  # one run (a decode's one boundary, a prompt)
            run(
                digests,
                self._stream,
                8 * fed,
                8 * ((k + 1) * size + lookahead),
                8 * size,
                count - k,
            )
            self._fed = count * size + lookahead
            return
        positions = self._positions
        pending = bisect.bisect_left(positions, fed)  # records not fed yet
        with memoryview(self._stream) as view:
            while k < count:
                end = (k + 1) * size + lookahead
                if pending < len(positions) and positions[pending] < end:
                    at = positions[pending]  # inside boundary k's span: feed up to it, then it
                    state.update(view[8 * fed : 8 * at])
                    state.update(self._records[at])
                    fed, pending = at, pending + 1
                    continue
                stop = count
                if pending < len(positions):  # the boundaries ending at or before the record
                    stop = min(stop, (positions[pending] - lookahead) // size)
                if checkpoints:
                    stop = min(stop, (k // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY)
                run(digests, view, 8 * fed, 8 * end, 8 * size, stop - k)
                fed, k = stop * size + lookahead, stop
                if checkpoints and k % CHECKPOINT_EVERY == 0:
                    self._checkpoints.append((k, fed, state.copy()))
        self._fed = fed

    def copy(self) -> Chain:
        """An independent chain in the same state (a request's own, from a shared Prompt)."""
        twin = Chain.__new__(Chain)
        twin.size, twin.lookahead = self.size, self.lookahead
        twin._state = self._state.copy()
        twin._records, twin._positions = self._records, self._positions
        twin._stream = self._stream if type(self._stream) is bytes else bytearray(self._stream)
        twin._fed = self._fed
        twin.digests = list(self.digests)
        twin._header = self._header
        twin._checkpoints = []
        return twin

    def keys(self, block_size: int) -> list[bytes]:
        """The digests keying blocks 0, 1, ... of a group of `block_size` (a multiple of
        this chain's size); a block whose tokens do not all exist yet has no key. At the
        chain's own size this is the chain's list itself, not a copy: read it, never change it."""
        step = block_size // self.size
        return self.digests if step == 1 else self.digests[step - 1 :: step]

    def keys_between(self, block_size: int, first: int, stop: int) -> list[bytes]:
        """The keys of blocks first .. stop - 1 (fewer when the last ones have none yet)."""
        step = block_size // self.size
        return self.digests[(first + 1) * step - 1 : stop * step : step]

    def key(self, block_size: int, index: int) -> bytes | None:
        """The digest keying block `index` of a group with `block_size` (None: no key yet)."""
        link = ((index + 1) * block_size) // self.size - 1
        return self.digests[link] if link < len(self.digests) else None


def copy_chains(chains: Sequence[Chain | None]) -> list[Chain | None]:
    """Independent copies of per-group chains (None stays None): a chain several groups
    share is copied once, and the copy is shared by the same groups."""
    copies: dict[int, Chain] = {}
    copied: list[Chain | None] = []
    for chain in chains:
        twin = None if chain is None else copies.get(id(chain))
        if chain is not None and twin is None:
            twin = copies[id(chain)] = chain.copy()
        copied.append(twin)
    return copied


CHECKPOINT_EVERY = 16  # boundaries between saved hash states in a memo entry
Checkpoint = tuple[int, int, Any]  # (digests before it, tokens fed, the hash state there)


@dataclass(frozen=True, slots=True)
class _Entry:
    stream: bytes  # the encoded tokens the digests cover
    digests: list[bytes]
    checkpoints: list[Checkpoint]


DIGEST_COST, CHECKPOINT_COST = 100, 400  # bytes a digest object, a saved hash state keep


def _cost(stream_bytes: int, digests: int, checkpoints: int) -> int:
    """Bytes a memo entry keeps alive, roughly: the stream, digest objects, hash states."""
    return stream_bytes + DIGEST_COST * digests + CHECKPOINT_COST * checkpoints


class DigestMemo:
    """Recent prompts' digest chains: a prompt sharing whole blocks with one of them reuses
    those digests and hashes only the rest (a system prompt shared by every request is
    hashed once, not once per request).

    Reuse is decided by comparing the encoded bytes, never by a hash, so a reused digest is
    exactly the one recomputing would give: keys and their collision resistance do not
    change. One entry per family (same chain header, block size and first block), the most
    recent prompt of that family; least recently used entries go once `budget` bytes are
    exceeded. A saved hash state every CHECKPOINT_EVERY boundaries lets a prompt diverging
    mid-way resume there and catch up with one update call."""

    __slots__ = ("_entries", "_used", "budget", "lock")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[tuple[int, bytes, bytes], _Entry] = OrderedDict()
        self._used = 0
        # held through each digest: an engine may digest arriving prompts on another thread
        # than its steps' (vLLM's block hasher), and the Python path is many statements
        self.lock = threading.Lock()

    @staticmethod
    def _family(chain: Chain) -> tuple[int, bytes, bytes]:
        first = 8 * (chain.size + chain.lookahead)
        return chain.size, chain._header, bytes(chain._stream[:first])

    def digest(self, chain: Chain, count: int) -> None:
        """Digest a fresh chain without records up to `count` boundaries through the memo:
        resume from its family's entry, digest the rest (saving a hash state every
        CHECKPOINT_EVERY boundaries when the prompt could be kept), then remember it. With
        the extension built, reference/_chain_memo.c runs these same steps in one call."""
        self.resume(chain, count)
        keep = self.could_keep(len(chain._stream), count)  # else no checkpoints to save
        chain._digest_to(count, keep)
        if keep:
            self.record(chain)

    def resume(self, chain: Chain, count: int) -> None:
        """Give a fresh chain the digests (at most `count`) it shares with its family's entry,
        and the hash state after the last of them."""
        family = self._family(chain)
        entry = self._entries.get(family)
        if entry is None:
            return
        self._entries.move_to_end(family)
        size, lookahead, stream = chain.size, chain.lookahead, chain._stream
        theirs = memoryview(entry.stream)
        # the family fixes the first block's tokens: the streams agree up to boundary 1 at
        # least, and up to the last boundary (at most `high`) before their first difference
        high = min(count, len(entry.digests))
        first = 8 * (size + lookahead)
        differ = first_difference(stream, theirs, first, 8 * (high * size + lookahead))
        low = min(high, (differ // 8 - lookahead) // size)
        if not low:
            return
        kept = [c for c in entry.checkpoints if c[0] <= low]
        fed = low * size + lookahead
        if kept:
            chain._state = kept[-1][2].copy()
            start = kept[-1][1]
        else:
            start = 0
        chain._state.update(theirs[8 * start : 8 * fed])
        chain._checkpoints = kept
        chain.digests = entry.digests[:low]
        chain._fed = fed

    def could_keep(self, stream_bytes: int, digests: int) -> bool:
        """Whether a prompt of this size fits the budget at all."""
        return _cost(stream_bytes, digests, digests // CHECKPOINT_EVERY) <= self.budget

    def record(self, chain: Chain) -> None:
        """Remember a prompt's chain as its family's entry (unless it alone exceeds the
        budget)."""
        family = self._family(chain)
        old = self._entries.pop(family, None)
        if old is not None:
            self._used -= _cost(len(old.stream), len(old.digests), len(old.checkpoints))
        cost = _cost(8 * chain._fed, len(chain.digests), len(chain._checkpoints))
        if cost > self.budget:
            return
        stream = chain._stream
        if type(stream) is not bytes or len(stream) != 8 * chain._fed:
            stream = bytes(stream[: 8 * chain._fed])
        self._entries[family] = _Entry(stream, list(chain.digests), list(chain._checkpoints))
        self._used += cost
        while self._used > self.budget:
            _, dropped = self._entries.popitem(last=False)
            self._used -= _cost(len(dropped.stream), len(dropped.digests), len(dropped.checkpoints))


def _compiled_memo() -> Callable[[DigestMemo, Chain, int], bool] | None:
    """DigestMemo.digest compiled (reference/_chain_memo.c): it answers False, changing
    nothing, for what it does not serve (another state than the compiled SHA-256)."""
    if _compiled is None:
        return None
    _compiled.memo_definitions(
        DigestMemo, Chain, _Entry, CHECKPOINT_EVERY, DIGEST_COST, CHECKPOINT_COST
    )
    return _compiled.memo_digest  # type: ignore[no-any-return]


_memo_digest = _compiled_memo()
