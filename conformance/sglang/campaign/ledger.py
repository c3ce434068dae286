"""The model runner of the SGLang campaign: a ledger of the KV each token slot holds, and the
oracle of the hit each admission was owed.

Soundness: a pass first checks that every slot its attention reads (positions 0..p-1 of its
request's row) holds KV computed from the same token prefix, and for a hybrid that the state
it starts from is the state after its last computed token; then it records what it writes.
A Mamba state carries its identity in its own values (SGLang copies states itself: a match's
copy-on-write, the tree's checkpoints), as an integer `state_id`; 0 is a cleared state.

Completeness: at each admission the spec's hit (`hybrid_hit` over one full-attention group
of SGLang's page, and for a hybrid a Mamba group of block 1 in mode `all`: a state after any
token can end a hit; for a sliding-window model a sliding-window group over the SWA slots'
own ledger) is taken over the pages that hold the request's prefix, written by a step that
has ended (ALLOC-VIS-1, step-end visibility) and not since overwritten, and the states some
slot of the state pool carries: the vLLM campaign's definition of "held"
(`kvcert.conformance.vllm.campaign.owed`). A page SGLang freed but has not handed out again
still holds its KV; serving less is a lost hit, whatever the reason, and the loop says where
the lost page or state is. Engine-free: tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvcert.conformance.vllm.campaign.ledger import extend_identities
from kvcert.spec.hybrid import hybrid_hit
from kvcert.spec.layout import FullAttention, Layout, MambaMode, MambaState, SlidingWindow
from kvcert.spec.view import CacheView, keyable_blocks


def identities(tokens: Sequence[int]) -> list[bytes]:
    """The identity of the KV at each position: a digest of the tokens up to it."""
    return extend_identities([], list(tokens))


@dataclass(frozen=True)
class Owed:
    """The hit an admission was owed, and the physical page holding each owed page."""

    length: int
    pages: tuple[int, ...]  # physical page index per owed page, in order
    # a sliding-window group: per page the hit reads, the SWA page holding it
    window_pages: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """A sliding-window group: its window W (SGLang's sliding_window_size + 1) and the ledger
    of its own slots (SGLang's SWA pool)."""

    size: int
    ledger: Ledger


@dataclass
class Ledger:
    """slot -> identity of the KV written there, with the step that wrote it."""

    page: int
    content: dict[int, bytes] = field(default_factory=dict)
    written: dict[int, int] = field(default_factory=dict)
    holders: dict[bytes, set[int]] = field(default_factory=dict)  # identity -> slots
    state_ids: dict[bytes, int] = field(default_factory=dict)  # identity -> its state's id
    # under EAGLE: a slot's identity -> the target model's part of it (the tokens up to it)
    targets: dict[bytes, bytes] = field(default_factory=dict)

    def state_id(self, ident: bytes) -> int:
        """The integer a state after the position of `ident` carries (1, 2, ...)."""
        return self.state_ids.setdefault(ident, len(self.state_ids) + 1)

    def write(self, slots: Sequence[int], idents: Sequence[bytes], step: int) -> None:
        """A pass wrote the KV `idents` into `slots` (pairwise)."""
        for slot, ident in zip(slots, idents, strict=True):
            old = self.content.get(slot)
            if old is not None and old != ident:
                self.holders[old].discard(slot)
            self.content[slot] = ident
            self.written[slot] = step
            self.holders.setdefault(ident, set()).add(slot)

    def unsound(self, slots: Sequence[int], idents: Sequence[bytes]) -> list[int]:
        """The positions whose slot does not hold the KV the reader's prefix gives."""
        return [
            p
            for p, (slot, ident) in enumerate(zip(slots, idents, strict=True))
            if self.content.get(slot) != ident
        ]

    def owed(
        self,
        idents: Sequence[bytes],
        step: int,
        state_held: Callable[[int], bool] | None = None,
        window: Window | None = None,
        state_idents: Sequence[bytes] | None = None,
    ) -> Owed:
        """The spec's hit for a request of these identities, admitted in `step`, over the
        pages held (every slot of a page-aligned run written by an earlier step) and, for a
        hybrid, the states `state_held` says are held (a Mamba group of block 1, mode `all`:
        the checkpointing strategy decides which states exist, the loop which count) or the
        sliding window's pages its own ledger holds (HIT-SW-1). A state is named by
        `state_idents` where they differ from the KV's (under EAGLE a state is the target
        model's alone)."""
        page, count = self.page, len(idents)
        groups: tuple[FullAttention | MambaState | SlidingWindow, ...] = (FullAttention(page),)
        if state_held is not None:
            groups += (MambaState(1, MambaMode.ALL),)
        if window is not None:
            groups += (SlidingWindow(page, window.size),)
        layout = Layout(groups)
        held: dict[int, int] = {}
        for j in range(keyable_blocks(layout, 0, count)):
            physical = self._holder(idents[j * page : (j + 1) * page], step)
            if physical is None:
                break  # a hit is a prefix: nothing past a gap can be owed
            held[j] = physical
        cached = [frozenset(held)]
        if state_held is not None:
            ends = range(keyable_blocks(layout, 1, count))
            states = idents if state_idents is None else state_idents
            cached.append(frozenset(j for j in ends if state_held(self.state_id(states[j]))))
        live: dict[int, int] = {}
        if window is not None:
            for j in range(keyable_blocks(layout, len(groups) - 1, count)):
                physical = window.ledger._holder(idents[j * page : (j + 1) * page], step)
                if physical is not None:
                    live[j] = physical
            cached.append(frozenset(live))
        hit = hybrid_hit(CacheView(layout, count, tuple(cached)))
        read = hit.blocks[-1] if window is not None else ()
        return Owed(
            hit.length,
            tuple(held[j] for j in range(hit.length // page)),
            {j: live[j] for j in read if j is not None},
        )

    def _holder(self, run: Sequence[bytes], step: int) -> int | None:
        """A physical page whose slots hold `run` in order, each written before `step`."""
        for first in sorted(self.holders.get(run[0], ())):
            if first % self.page:
                continue
            slots = range(first, first + self.page)
            if all(
                self.content.get(s) == ident and self.written[s] < step
                for s, ident in zip(slots, run, strict=True)
            ):
                return first // self.page
        return None
