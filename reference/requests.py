"""The records a KVCacheManager returns (Scheduled, Waiting, Stats), takes (Prompt) and keeps
per running request (Request: its tokens, digest chains, tables and where its computation
stands)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

from kvcert.reference.hashing import Chain, ExtraKey, copy_chains, decode_tokens


@dataclass(frozen=True, slots=True)
class Scheduled:
    """An admission or extension that fits.

    `hit` tokens came from the cache (0 on extend); `new_blocks` holds, per group, the blocks
    this call allocated, in table order; `tables` holds each group's whole table after an
    admission (None after an extension: ask `block_tables(rid)`); `copies` the blocks to
    copy first under `unit U` (a hit inside a block, a state checkpoint kept)."""

    hit: int
    scheduled: int
    new_blocks: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int, ...], ...] | None = None
    # `unit U`: (group, source, target) blocks the engine copies before the step's pass
    copies: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Waiting:
    """Not enough free blocks; nothing changed. Retry in a later step, unless `never` says
    why no later step can serve it (the request would hold more blocks at once than the pool
    has); `never` takes no part in comparisons."""

    needed: int
    free: int
    never: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Stats:
    """Counters an operator reads to see why the hit rate is what it is."""

    num_blocks: int
    free_blocks: int
    registered_blocks: int
    running_requests: int
    admissions: int  # admit() calls that scheduled the request (a Waiting one is retried)
    admitted_tokens: int  # their prompt tokens
    hit_tokens: int  # of which served from the cache: hit rate = hit_tokens / admitted_tokens
    probes: int  # lookup(), hit_length() and branch_point() calls: they take nothing, count no hits


class Progress(NamedTuple):
    """Where a running request stands: one answer for each decision an engine takes."""

    computed: int  # tokens whose KV the steps that ended wrote
    scheduled: int  # tokens its chunk in flight computes (0: none in flight)
    known: int  # tokens known: the prompt and the sampled ones appended so far


class Prompt:
    """A prompt validated and digested for one manager: pass it to `admit` or `lookup` to
    skip the hashing (an engine hashes a prompt once, as it arrives). It keeps the ids in
    their encoding; an admission makes the request's array of them (a lookup never does)."""

    __slots__ = ("__weakref__", "_tokens", "chains", "encoded", "extras", "owner")

    def __init__(
        self,
        owner: object,
        encoded: bytes,
        extras: tuple[ExtraKey, ...],
        chains: list[Chain | None],
    ) -> None:
        self.owner = owner  # the manager that prepared it: its keys are that manager's
        self.encoded = encoded  # the ids, little-endian int64 (hashing.encode_tokens)
        self._tokens: array[int] | None = None
        self.extras = extras
        self.chains = chains

    @property
    def tokens(self) -> array[int]:
        """The ids, in an array of the caller's own (made at each read)."""
        return decode_tokens(self.encoded)

    def decode_ahead(self) -> None:
        """Make the ids' array now, for the admission that takes it (`take_tokens`). An
        engine preparing prompts off its step (vLLM's block hasher runs as a request is
        built) spares the admission a copy of the whole prompt: 8 bytes a token."""
        if self._tokens is None:
            self._tokens = decode_tokens(self.encoded)

    def take_tokens(self) -> array[int]:
        """The ids as an array of the caller's own, to append to: the one `decode_ahead`
        made, handed over once, else a new one. The Prompt keeps only its encoding, so an
        admission appending to its array changes nothing another admission reads."""
        tokens, self._tokens = self._tokens, None
        return decode_tokens(self.encoded) if tokens is None else tokens

    def __len__(self) -> int:
        return len(self.encoded) // 8


class Request:
    """A running request: what the manager knows of it between calls."""

    __slots__ = (
        "chains",
        "checkpoints",
        "commit_at",
        "computed",
        "decoding",
        "extras",
        "held_from",
        "junction",
        "keeps",
        "lookahead",
        "pipelined",
        "prompt_length",
        "published",
        "quiet_end",
        "quiet_slots",
        "quiet_slots_floor",
        "quiet_state",
        "registered",
        "scheduled",
        "sources",
        "tables",
        "tokens",
        "unique_chains",
    )

    def __init__(self, prompt: Prompt) -> None:
        self.tokens = prompt.take_tokens()  # its own array: decoding appends to it
        self.extras = prompt.extras
        self.chains = copy_chains(prompt.chains)
        # each extended once per new token
        self.unique_chains = list({id(c): c for c in self.chains if c is not None}.values())
        self.computed = 0
        self.scheduled = 0
        self.lookahead = 0
        self.pipelined = 0  # where chunks scheduled behind the one in flight end (`reserve`)
        # inner checkpoints (CKPT-INNER-1) of the chunks scheduled and not yet ended
        self.checkpoints: list[int] = []
        self.tables: list[list[int]] = []
        self.registered: list[int] = []  # per group, positions already considered for caching
        # same-pass (ALLOC-VIS-2): per group, where the positions published for the chunk in
        # flight start (they end at `registered`); None when nothing is published
        self.published: list[int] | None = None
        self.held_from: list[int] = []  # per group, every earlier position holds the null block
        # a decode step [c, e) holding slots up to e + L changes no table while
        # e <= quiet_end, pipelined <= quiet_state and quiet_slots_floor <= e + L <= quiet_slots
        self.quiet_end = self.quiet_state = 0
        self.quiet_slots = self.quiet_slots_floor = 0
        self.commit_at = 0  # no block is committed before `computed` reaches this
        self.decoding = False  # it appends sampled tokens: its chunks may verify drafts
        self.prompt_length = len(prompt)  # sparse retention keeps its boundaries
        self.junction = 0  # RET-JUNCTION-1's length when admitted (sparse retention only)
        # `unit U`: (group, position, block) of the blocks the chunk in flight copies into
        # its table, held until its step ends (ALLOC-UNIT-3)
        self.sources: list[tuple[int, int, int]] = []
        # `unit U`: (group, position, block) of the fresh blocks the keyed state block at
        # that position is copied into before the chunk overwrites it (ALLOC-UNIT-4)
        self.keeps: list[tuple[int, int, int]] = []
