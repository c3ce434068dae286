"""§5 Block keys: an abstract hash chain that decides which blocks a request can reuse.

The spec's keys are tuples, not digests: a tuple equals another only when every component
does, so the abstract chain is injective by construction and a key match can be reasoned
about exactly. kvcert.reference hashes a canonical byte encoding of the same structure with a
collision-resistant function; its tests check that encoding is injective too.

    link(j) = (tokens[jB:(j+1)B], extras(j))
    key(0)  = (ROOT, link(0))
    key(j)  = key(j-1) + (link(j),)

Because key(j) extends key(j-1), a match of key(j) certifies the whole prefix [0, (j+1)B):
a hit can never return a block whose tokens differ from the request's. The key is the flat
tuple of every link of the prefix, so that certificate can be read off the key itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvcert.spec.errors import InvalidRequest, as_choice, refuse
from kvcert.spec.layout import Group, Layout, Speculative, is_draft

ROOT = ("kvcert-block-key", 1)  # parent of block 0; versioned so a format change never collides

BlockKey = tuple[object, ...]


class ExtraKind(StrEnum):
    """What an extra key is. Every extra is tagged with its kind, so sources never collide."""

    CACHE_SALT = "cache_salt"  # tenant isolation: different salts never share a block
    LORA = "lora"  # the adapter that produced the KV
    ENCODER_INPUT = "encoder_input"  # the encoder input cross-attention layers read
    MULTIMODAL = "multimodal"  # an image/audio item whose embeddings occupy token positions
    PROMPT_EMBEDS = "prompt_embeds"  # caller-supplied embeddings in place of token ids


REQUEST_WIDE = frozenset({ExtraKind.CACHE_SALT, ExtraKind.LORA, ExtraKind.ENCODER_INPUT})


@dataclass(frozen=True)
class Extra:
    """One extra input besides the token ids that changes the KV a block holds."""

    kind: ExtraKind  # what the value identifies
    value: str  # an identifier: salt, adapter name, content hash of an item
    start: int = 0  # first token position of a positioned extra
    end: int | None = None  # one past its last position; None for a request-wide extra

    def __post_init__(self) -> None:
        kind = as_choice(ExtraKind, self.kind, "extra kind", InvalidRequest)
        object.__setattr__(self, "kind", kind)
        if not isinstance(self.value, str):
            refuse(InvalidRequest, f"{self.kind.value} extra value must be a string")
        if self.kind in REQUEST_WIDE:
            if self.end is not None or self.start != 0:
                refuse(
                    InvalidRequest,
                    f"{self.kind.value} applies to the whole request; give no start or end",
                )
        elif self.end is None or not 0 <= self.start < self.end:
            refuse(
                InvalidRequest,
                f"{self.kind.value} extra needs the token span it occupies: 0 <= start < end, "
                f"got start={self.start}, end={self.end}",
            )


def extras_within(extras: Sequence[Extra], end: int) -> tuple[Extra, ...]:
    """The extras KV of tokens [0, end) depends on: request-wide ones and those overlapping."""
    return tuple(e for e in extras if e.end is None or e.start < end)


def block_extras(extras: Sequence[Extra], start: int, end: int) -> tuple[tuple[object, ...], ...]:
    """HASH-EXTRA-1: A block's extra keys are the request-wide extras in block 0 and every
    positioned extra overlapping the block, each tagged by its kind and positioned ones by
    their span relative to the block start.

    Request-wide extras need only block 0: every later key contains it through the chain.
    The tag keeps sources apart: a LoRA named "x" and a cache salt "x" give different keys
    (vLLM #44701 let them collide).

        block 0 [0,16), salt "t1", image at [10, 30):
            (("cache_salt", "t1"), ("multimodal", "img", 10, 30))
        block 1 [16,32):  (("multimodal", "img", -6, 14),)

    pre: 0 <= start < end
    post: all(isinstance(x[0], str) for x in __return__)
    """
    tagged: list[tuple[object, ...]] = []
    for extra in extras:
        if extra.kind in REQUEST_WIDE:
            if start == 0:
                tagged.append((extra.kind.value, extra.value))
        elif extra.end is not None and extra.start < end and start < extra.end:
            tagged.append((extra.kind.value, extra.value, extra.start - start, extra.end - start))
    return tuple(sorted(tagged, key=repr))


def block_keys(
    tokens: Sequence[int], block_size: int, extras: Sequence[Extra] = (), lookahead: int = 0
) -> tuple[BlockKey, ...]:
    """HASH-CHAIN-1: Block j's key is its parent's key extended by the block's tokens (plus
    `lookahead` tokens after it) and extra keys; only blocks whose tokens all exist get a key.

        B=4, tokens 7 8 9 1 | 2 3 4 5 | 6
        key(0) = (ROOT, ((7,8,9,1), ()))
        key(1) = (ROOT, ((7,8,9,1), ()), ((2,3,4,5), ()))    token 6 fills no block: no key

    pre: block_size >= 1 and lookahead >= 0
    post: len(__return__) == max(0, (len(tokens) - lookahead) // block_size)
    """
    keys: list[BlockKey] = []
    chain: BlockKey = (ROOT,)
    for j in range(max(0, (len(tokens) - lookahead) // block_size)):
        start, end = j * block_size, (j + 1) * block_size + lookahead
        chain = (*chain, (tuple(tokens[start:end]), block_extras(extras, start, end)))
        keys.append(chain)
    return tuple(keys)


def partial_key(
    tokens: Sequence[int],
    block_size: int,
    position: int,
    extras: Sequence[Extra] = (),
    lookahead: int = 0,
) -> BlockKey:
    """HASH-UNIT-1: Under `unit U` the partial key at a position P inside block j = P // B is
    the key of block j - 1 extended by a link tagged "partial" holding tokens [jB, P) (plus
    `lookahead` tokens after them) and their extras; the tag keeps it apart from every block
    key, whose links are untagged pairs, so a partial key never matches a whole block.

        B=4, tokens 7 8 9 1 | 2 3 4 5, P=6
        partial key(6) = (ROOT, ((7,8,9,1), ()), ("partial", (2,3), ()))
        block key(1)   = (ROOT, ((7,8,9,1), ()), ((2,3,4,5), ()))       never equal

    pre: block_size >= 1 and position % block_size != 0 and position + lookahead <= len(tokens)
    post: __return__[0] == ROOT and __return__[-1][0] == "partial"
    """
    start = position - position % block_size
    end = position + lookahead
    parent: BlockKey = (ROOT,)
    if start:
        parent = block_keys(tokens[: start + lookahead], block_size, extras, lookahead)[-1]
    return (*parent, ("partial", tuple(tokens[start:end]), block_extras(extras, start, end)))


def draft_lookahead(is_draft_group: bool, exact: bool, reach: int = 1) -> int:
    """HASH-DRAFT-1: Under the exact speculative profile a draft group's block key also covers
    the `reach` tokens after the block (the layout's draft_reach), on which the block's last
    draft position depends.

        B=4, reach 1 (EAGLE), tokens 7 8 9 1 | 2 3 4 5 | 6
        draft key(0) = (ROOT, ((7,8,9,1,2), ()))     target: (ROOT, ((7,8,9,1), ()))
        draft key(1) = draft key(0) + (((2,3,4,5,6), ()),)
        reach 2 (two MTP modules): draft key(0) = (ROOT, ((7,8,9,1,2,3), ())), no key(1)

    pre: reach >= 1
    post: __return__ == (reach if is_draft_group and exact else 0)
    """
    return reach if is_draft_group and exact else 0


def key_lookahead(layout: Layout, group: Group) -> int:
    """Tokens past a block that `group`'s keys cover in `layout` (HASH-DRAFT-1): the draft
    reach for a draft group under exact keying, else 0 (the rule is not consulted then, so
    only vectors it applies to cite it)."""
    exact = layout.speculative is Speculative.EXACT
    return draft_lookahead(True, exact, layout.draft_reach) if is_draft(group) else 0


def keys_reach(layout: Layout) -> int:
    """The most tokens past a block any of `layout`'s keys cover (HASH-DRAFT-1): the draft
    reach under exact keying with draft groups, else 0; a re-send of a prompt names keys
    only up to its length less this (RET-SPARSE-1, ALLOC-UNIT-2)."""
    return max(key_lookahead(layout, group) for group in layout.groups)


def matched_blocks(keys: Sequence[BlockKey], cached_keys: frozenset[BlockKey]) -> frozenset[int]:
    """HASH-MATCH-1: A group has block j of a request cached when it holds a block under the
    request's key for block j.

        request keys  k0 k1 k2 k3      group holds {k1, k3, x}   -> cached {1, 3}

    pre: True
    post: all(keys[j] in cached_keys for j in __return__)
    """
    return frozenset(j for j, key in enumerate(keys) if key in cached_keys)
