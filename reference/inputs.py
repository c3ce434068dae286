"""What a KVCacheManager accepts: token ids, counts, positions and request ids, each checked
at the door with a RequestStateError that names the argument and the fix.

Token lists are checked in C where they are long (the compiled `_chain.pack_tokens` when
built; else struct packing checks type and range and the sign byte of each int64 shows a
negative id), one by one where they are short (a decode step's sampled tokens), so
validation costs little beside hashing.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from kvcert.reference.errors import RequestStateError
from kvcert.reference.hashing import ExtraKey, decode_tokens, encode_tokens
from kvcert.reference.native import native

_chain = native("_chain")  # its pack_tokens checks and packs a list in one C loop

TOKEN_LIMIT = 2**63
LIST_OR_TUPLE = (list, tuple)
SIGN_BYTE = 7 if sys.byteorder == "little" else 0  # of an int64 in native order
LOW_BYTE = 7 - SIGN_BYTE
SHORT = 16  # token lists this short are checked id by id (packing costs more)


def token_ids(tokens: object, what: str) -> array[int]:
    """`tokens` as an int64 array of ids in [0, 2**63); RequestStateError naming the first bad
    one. Packing checks types and the upper bound in C; a negative id is one whose most
    significant byte has its top bit set (not ASCII), also checked in C. A bool packs as 0 or
    1, so those two ids are looked up in the packed bytes and checked for bools there. A 1-D
    integer array with `tolist()` (numpy, torch) is read through it."""
    if (  # a step's sampled tokens: checked one by one, packing costs more
        type(tokens) is list
        and len(tokens) <= SHORT
        and all(type(t) is int and 0 <= t < TOKEN_LIMIT for t in tokens)
    ):
        return array("q", tokens)
    if not isinstance(tokens, str | bytes | Sequence | array) and hasattr(tokens, "tolist"):
        tokens = _listed(tokens, what)
    if _chain is not None and type(tokens) in LIST_OR_TUPLE:
        encoded = _chain.pack_tokens(tokens)  # None: some item is not an id; found below
        if encoded is not None:
            return decode_tokens(encoded)
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | array):
        raise RequestStateError(
            f"{what} must be a sequence of token ids (integers), got {type(tokens).__name__}"
        )
    packed = b""
    try:
        if isinstance(tokens, array):
            checked = array("q", tokens)
        else:  # struct checks types and range in C, several times faster than array(list)
            packed = struct.pack(f"{len(tokens)}q", *tokens)
            checked = array("q")
            checked.frombytes(packed)
    except (TypeError, OverflowError, struct.error):
        checked = None
    if (
        checked is None
        or not checked.tobytes()[SIGN_BYTE::8].isascii()
        or (packed and _bool_at(tokens, packed, checked) is not None)
    ):
        bad = next(
            (i, t)
            for i, t in enumerate(tokens)
            if type(t) is bool or not isinstance(t, int) or not 0 <= t < TOKEN_LIMIT
        )
        raise RequestStateError(
            f"{what}: position {bad[0]} holds {bad[1]!r}, not a token id (an integer in [0, 2**63))"
        )
    return checked


def encoded_token_ids(tokens: object, what: str) -> bytes:
    """`token_ids(tokens, what)` in the digest chain's encoding (little-endian int64,
    kvcert.reference.hashing.encode_tokens), packed once."""
    if _chain is not None:
        listed = tokens
        if type(tokens) not in LIST_OR_TUPLE and isinstance(tokens, Sequence):
            # an engine's read-only view of its list (vLLM's ConstantList), listed in one C
            # pass; an array is packed below as it is, and str and bytes are refused there
            plain = not isinstance(tokens, str | bytes | array)
            listed = list(tokens) if plain else None
        encoded: bytes | None = _chain.pack_tokens(listed)  # None: not a list of ids
        if encoded is not None:
            return encoded
    return encode_tokens(token_ids(tokens, what))


def _listed(tokens: Any, what: str) -> list[Any]:
    """A 1-D array's elements (numpy, torch); anything else is refused with the fix."""
    listed = tokens.tolist()
    if not isinstance(listed, list):
        raise RequestStateError(
            f"{what} must be a 1-D sequence of token ids, got a 0-D {type(tokens).__name__}"
        )
    if listed and isinstance(listed[0], list):
        raise RequestStateError(
            f"{what} must be 1-D, got a {type(tokens).__name__} of shape "
            f"{getattr(tokens, 'shape', '?')}; pass one request's tokens, e.g. tokens[0]"
        )
    return listed


def _bool_at(tokens: Sequence[Any], packed: bytes, checked: array[int]) -> int | None:
    """The first position of a bool in `tokens`, given them packed as int64: a bool packs as
    0 or 1, so only ids whose low byte is 0 or 1 are looked at, found with memchr in the low
    bytes (a prompt's few such ids cost a comparison each)."""
    low = packed[LOW_BYTE::8]
    for value in (0, 1):
        byte = bytes((value,))
        at = low.find(byte)
        while at >= 0:
            if checked[at] == value and type(tokens[at]) is bool:
                return at
            at = low.find(byte, at + 1)
    return None


def one_token(tokens: Sequence[int]) -> bool:
    """Whether `tokens` is a list or tuple of one valid token id (a decode step's)."""
    return (
        type(tokens) in LIST_OR_TUPLE
        and len(tokens) == 1
        and type(tokens[0]) is int
        and 0 <= tokens[0] < TOKEN_LIMIT
    )


def counts(**values: object) -> None:
    """Each value None or an integer >= 0, else RequestStateError naming it."""
    for name, value in values.items():
        if value is not None and (type(value) is not int or value < 0):
            raise RequestStateError(f"{name} must be an integer >= 0, got {value!r}")


def token_count(value: object, what: str = "a token count") -> None:
    """An integer >= 0, else RequestStateError naming `what`."""
    if type(value) is not int or value < 0:
        raise RequestStateError(f"{what} must be an integer >= 0, got {value!r}")


def position(value: object, what: str) -> None:
    if type(value) is not int or value < 0:
        raise RequestStateError(f"{what} must be a table position, an integer >= 0, got {value!r}")


def request_id(rid: object) -> str:
    if not isinstance(rid, str) or not rid:
        raise RequestStateError(f"a request id is a non-empty string, got {rid!r}")
    return rid


def budget_and_lookahead(budget: object, lookahead: object) -> None:
    """A step budget >= 1 and a lookahead >= 0, both integers (bools refused)."""
    if not (type(budget) is int and budget >= 1) or not (type(lookahead) is int and lookahead >= 0):
        raise RequestStateError(
            f"budget must be an integer >= 1 and lookahead an integer >= 0, "
            f"got {budget!r} and {lookahead!r}"
        )


def extra_keys(extras: object) -> tuple[ExtraKey, ...]:
    """A sequence of ExtraKey values, as a tuple; anything else refused with an example."""
    if type(extras) is tuple and not extras:  # the usual request: none
        return ()
    example = "e.g. [ExtraKey(ExtraKind.CACHE_SALT, 'tenant-7')]"
    if isinstance(extras, str | bytes | ExtraKey) or not isinstance(extras, Sequence):
        raise RequestStateError(
            f"extras must be a sequence of ExtraKey, got {type(extras).__name__} "
            f"{extras!r}; {example}"
        )
    keys = tuple(extras)
    if not all(isinstance(e, ExtraKey) for e in keys):
        raise RequestStateError(
            f"extras must be ExtraKey values (kvcert.reference.hashing), got {keys!r}; {example}"
        )
    return keys
