"""Block digests: a collision-resistant hash chain over a canonical byte encoding.

Implements HASH-CHAIN-1, HASH-EXTRA-1 and HASH-DRAFT-1 of the spec. The abstract key of a
block is the sequence of (tokens, extras) links of its whole prefix; here each link is folded
into a SHA-256 (or BLAKE2b-256) chain:

    digest(j) = H(DOMAIN | digest(j-1) | encode(tokens of link j) | encode(extras of link j))

The encoding is injective (every field is length-prefixed, every extra carries its kind tag),
so equal digests mean equal prefixes unless the hash itself collides. No pickle, no Python
`hash()`: digests are stable across processes and machines.

One chain serves every non-draft group: group block j of size B is keyed by the chain digest
after (j+1)*B tokens, computed at the gcd of the block sizes. Because each digest certifies
its entire prefix (tokens and every extra overlapping it, with its absolute span), that key
matches exactly when the spec's per-group key does. Draft groups under exact keying also
cover the token after each block, so they get their own chain at their own block size.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvcert.reference.config import HashAlgorithm
from kvcert.reference.errors import ConfigError, RequestStateError

DOMAIN = b"kvcert-block-v1\x00"
ROOT = hashlib.sha256(b"kvcert-root-v1").digest()


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
        if not isinstance(self.kind, ExtraKind) or not isinstance(self.value, str):
            raise ConfigError(f"an extra key needs an ExtraKind and a string value: {self!r}")
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


def _bytes(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">I", len(raw)) + raw


def encode_extras(extras: Sequence[ExtraKey], start: int, end: int) -> bytes:
    """The extras of the link covering tokens [start, end), canonically ordered."""
    parts = []
    for extra in extras:
        if extra.end is None:
            if start == 0:
                parts.append(b"W" + _bytes(extra.kind.value) + _bytes(extra.value))
        elif extra.start < end and start < extra.end:
            span = struct.pack(">qq", extra.start - start, extra.end - start)
            parts.append(b"P" + _bytes(extra.kind.value) + _bytes(extra.value) + span)
    parts.sort()
    return struct.pack(">I", len(parts)) + b"".join(parts)


def encode_tokens(tokens: Sequence[int]) -> bytes:
    """Length-prefixed signed 64-bit big-endian token ids."""
    try:
        return struct.pack(f">I{len(tokens)}q", len(tokens), *tokens)
    except struct.error as error:
        raise RequestStateError(f"token ids must be integers in [-2**63, 2**63): {error}") from None


def hasher(algorithm: HashAlgorithm) -> Callable[[bytes], bytes]:
    """The digest function for an algorithm name."""
    if algorithm is HashAlgorithm.SHA256:
        return lambda data: hashlib.sha256(data).digest()
    return lambda data: hashlib.blake2b(data, digest_size=32).digest()


class Chain:
    """The growing digest chain of one request at one granularity.

    `digests[k]` certifies tokens [0, (k+1)*size + lookahead) and every extra overlapping
    them; it exists once those tokens do.
    """

    __slots__ = ("_digest", "digests", "extras", "lookahead", "size")

    def __init__(
        self,
        size: int,
        lookahead: int,
        extras: Sequence[ExtraKey],
        digest: Callable[[bytes], bytes],
    ) -> None:
        self.size = size
        self.lookahead = lookahead
        self.extras = tuple(extras)
        self._digest = digest
        self.digests: list[bytes] = []

    def extend(self, tokens: Sequence[int]) -> None:
        """Digest every link whose tokens now all exist."""
        size, lookahead = self.size, self.lookahead
        parent = self.digests[-1] if self.digests else ROOT
        for k in range(len(self.digests), max(0, (len(tokens) - lookahead) // size)):
            start, end = k * size, (k + 1) * size + lookahead
            parent = self._digest(
                DOMAIN
                + parent
                + encode_tokens(tokens[start:end])
                + encode_extras(self.extras, start, end)
            )
            self.digests.append(parent)

    def key(self, block_size: int, index: int) -> bytes | None:
        """The digest keying block `index` of a group with `block_size` (None: no key yet)."""
        link = ((index + 1) * block_size) // self.size - 1
        return self.digests[link] if link < len(self.digests) else None
