"""Where a lost hit's page or state was before the lookup: the SGLang campaign's causes.

A lost hit is explained only by where the ledger's copy of what was owed sat when the
request looked it up (kvcert.conformance.sglang.campaign.command names the explained ones):
in a running request's row and not yet published, free in an allocator (evicted from the
tree, freed unpublished by a retraction, or never published), or in the tree.
Engine-free: built from plain slot lists, so tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Where a lost page or state was before the lookup (Holders): SGLang publishes a request's
# decoded tokens (and under no buffer its state) only when it finishes; it evicts whole tree
# nodes, more than an allocation needs.
DECODED = "decoded tokens of a running request (SGLang publishes them when it finishes)"
FREED = "free in the allocator, evicted from the tree, not handed out again"
DROPPED = "free in the allocator, the tree never holding it"
RUNNING_STATE = "the running state of a decoding request (SGLang saves it when it finishes)"
PROMPT_STATE = "the running state of a request inside its prompt, not published to the tree"
FREED_STATE = "a state slot evicted from the tree, not handed out again"
DROPPED_STATE = "a state slot freed without the tree ever holding its state"
# SGLang's retraction frees what a request had not published, without an insert
RETRACTED = "decoded tokens a retraction freed without publishing them"
RETRACTED_STATE = "the state of a request a retraction freed without publishing it"
MATCH = "in the tree, not matched"
PROMPT = "the prompt of a running request, not published to the tree"
STATE_MATCH = "a state in the tree, not matched"
SWA_FREED = "an SWA page freed (out of its writer's window, or evicted), not handed out again"
SWA_MATCH = "an SWA page live in the tree, not matched"
SWA_PROMPT = "the SWA of a running request's prompt, not published to the tree"
BRANCHED = (
    "the prompt of a running request admitted at an SWA branch point (its insert after the "
    "prefill stopped there)"
)
SWA_DECODED = "the SWA of a running request's decoded tokens (published when it finishes)"
# Under EAGLE (campaign.eagle) SGLang keys its tree by bigrams: a key over n tokens covers
# n - 1 positions, one page short at page multiples, on both sides of the tree.
BIGRAM_CAP = "past the hit of the request's first n - 1 tokens, where SGLang's match stops"
BIGRAM_INSERT = (
    "KV an insert's bigrams left out (the page just past a running request's insert, or "
    "the last position a finished request computed)"
)
# and what a verify pass committed past a request's stop, freed at its finish
OVERSHOOT = "KV a verify pass committed past its request's stop, freed when it finished"
OVERSHOOT_STATE = "the state after tokens a verify pass committed past its request's stop"


@dataclass(frozen=True)
class Row:
    """A running request's row of slots, as its lookup's causes read it."""

    slots: list[int]
    prompt: int  # prompt tokens
    branched: bool  # admitted at an SWA branch point (its insert stopped there)
    protected: int  # the prefix the tree owns (matched or inserted)

    def holding(self, end: int, if_decoded: str, if_prompt: str) -> str:
        """Where the page ending at `end` in the row lies: among the decoded tokens, the
        prompt, or the prompt past the SWA branch point its insert stopped at."""
        if end > self.prompt:
            return if_decoded
        return BRANCHED if self.branched else if_prompt


@dataclass
class Published:
    """What the tree has held (read after every insert) and what retractions freed without
    publishing: KV identities and state identities. A freed page or state is an eviction
    only if the tree once held it."""

    kv: set[bytes] = field(default_factory=set)
    states: set[int] = field(default_factory=set)
    retracted_kv: set[bytes] = field(default_factory=set)
    retracted_states: set[int] = field(default_factory=set)
    bigram_dropped: set[bytes] = field(default_factory=set)  # EAGLE: freed at a finish
    overshoot_kv: set[bytes] = field(default_factory=set)  # EAGLE: past a request's stop
    overshoot_states: set[int] = field(default_factory=set)


@dataclass
class Holders:
    """Who held which slots before a lookup: why SGLang's tree lacks what the ledger holds."""

    in_tree: set[int]  # the token slots the tree holds
    rows: list[Row]  # the running requests' rows
    free_pages: set[int]
    states: list[int] = field(default_factory=list)  # per physical state slot, its identity
    running_states: set[int] = field(default_factory=set)  # running requests' state slots
    prompt_states: set[int] = field(default_factory=set)  # of those, states inside a prompt
    free_states: set[int] = field(default_factory=set)
    track_slots: set[int] = field(default_factory=set)  # handed to running requests' tracks
    content: dict[int, bytes] = field(default_factory=dict)  # token slot -> KV identity
    published: Published = field(default_factory=Published)
    window_rows: list[Row] = field(default_factory=list)  # the same rows' SWA slots
    window_free: set[int] = field(default_factory=set)  # the SWA allocator's free pages
    bigram_keys: bool = False  # the tree keys bigrams, as under EAGLE (BIGRAM_INSERT)

    def page(self, physical: int, size: int) -> str:
        first = physical * size
        if first in self.in_tree:
            return MATCH
        for row in self.rows:
            if first in row.slots:
                return self._in_row(row, row.slots.index(first), size, DECODED, PROMPT)
        if physical not in self.free_pages:
            return MATCH
        ident = self.content.get(first)
        if ident in self.published.kv:
            return FREED
        if ident in self.published.bigram_dropped:
            return BIGRAM_INSERT
        if ident in self.published.overshoot_kv:
            return OVERSHOOT
        return RETRACTED if ident in self.published.retracted_kv else DROPPED

    def window(self, physicals: Iterable[int], size: int) -> str:
        """Where the first SWA page of the owed hit's window that is not live in the tree
        was; SWA_MATCH when every one is (the tree held the window and did not match it)."""
        for physical in physicals:
            if physical in self.window_free:
                return SWA_FREED
            for row in self.window_rows:
                if physical * size in row.slots[row.protected :]:
                    index = row.slots.index(physical * size, row.protected)
                    return self._in_row(row, index, size, SWA_DECODED, SWA_PROMPT)
        return SWA_MATCH

    def _in_row(self, row: Row, index: int, size: int, if_decoded: str, if_prompt: str) -> str:
        """Where the page at `index` of a running request's row lies; under EAGLE the
        prompt page just past its insert is the one the insert's bigrams left out."""
        if self.bigram_keys and index == row.protected and index + size <= row.prompt:
            return BIGRAM_INSERT
        return row.holding(index + size, if_decoded, if_prompt)

    def state(self, state: int, *, running_owed: bool = True) -> str:
        """Where the owed state was: a running request's slot (only where the profile owes
        a running state: without the extra buffer), a free slot, or the tree."""
        slots = {i for i, value in enumerate(self.states) if value == state}
        if running_owed and slots & self.running_states:
            return PROMPT_STATE if state in self.prompt_states else RUNNING_STATE
        if slots & self.free_states:
            if state in self.published.states:
                return FREED_STATE
            if state in self.published.overshoot_states:
                return OVERSHOOT_STATE
            retracted = state in self.published.retracted_states
            return RETRACTED_STATE if retracted else DROPPED_STATE
        return STATE_MATCH
