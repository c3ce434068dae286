"""Where a lost hit's page or state was before the lookup: the SGLang campaign's causes.

A lost hit is explained only by where the ledger's copy of what was owed sat when the
request looked it up (kvcert.conformance.sglang.campaign.command names the explained ones):
in a running request's row and not yet published, free in an allocator, or in the tree.
Engine-free: built from plain slot lists, so tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Where a lost page or state was before the lookup (Holders): SGLang publishes a request's
# decoded tokens (and under no buffer its state) only when it finishes; it evicts whole tree
# nodes, more than an allocation needs.
DECODED = "decoded tokens of a running request (SGLang publishes them when it finishes)"
FREED = "free in the allocator (evicted or freed, not handed out again)"
RUNNING_STATE = "the running state of a decoding request (SGLang saves it when it finishes)"
FREED_STATE = "a state slot freed or evicted, not handed out again"
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
class Holders:
    """Who held which slots before a lookup: why SGLang's tree lacks what the ledger holds."""

    in_tree: set[int]  # the token slots the tree holds
    rows: list[Row]  # the running requests' rows
    free_pages: set[int]
    states: list[int] = field(default_factory=list)  # per physical state slot, its identity
    running_states: set[int] = field(default_factory=set)  # running requests' state slots
    free_states: set[int] = field(default_factory=set)
    track_slots: set[int] = field(default_factory=set)  # handed to running requests' tracks
    window_rows: list[Row] = field(default_factory=list)  # the same rows' SWA slots
    window_free: set[int] = field(default_factory=set)  # the SWA allocator's free pages

    def page(self, physical: int, size: int) -> str:
        first = physical * size
        if first in self.in_tree:
            return MATCH
        for row in self.rows:
            if first in row.slots:
                return row.holding(row.slots.index(first) + size, DECODED, PROMPT)
        return FREED if physical in self.free_pages else MATCH

    def window(self, physicals: Iterable[int], size: int) -> str:
        """Where the first SWA page of the owed hit's window that is not live in the tree
        was; SWA_MATCH when every one is (the tree held the window and did not match it)."""
        for physical in physicals:
            if physical in self.window_free:
                return SWA_FREED
            for row in self.window_rows:
                if physical * size in row.slots[row.protected :]:
                    end = row.slots.index(physical * size, row.protected) + size
                    return row.holding(end, SWA_DECODED, SWA_PROMPT)
        return SWA_MATCH

    def state(self, state: int) -> str:
        slots = {i for i, value in enumerate(self.states) if value == state}
        if slots & self.running_states:
            return RUNNING_STATE
        return FREED_STATE if slots & self.free_states else STATE_MATCH
