"""The campaign's completeness oracle: the hit each admission was owed, and the lost hits.

At every admission (a new request, or one resumed after a preemption) the spec's hybrid hit
(HIT-HYB-1, HIT-SPEC-1/-2) is computed over what the engine holds at that moment, as the
ledger saw it written, not as the engine's own index claims it. A block of group g holds
block j of the request when:

- content: a forward pass wrote every slot of it from the request's tokens [0, (j+1)B), the
  drafter's slots from the tokens after it that its keys cover (HASH-DRAFT-1: under exact
  keying the `draft_reach` tokens after the block; under drop keying none, HIT-SPEC-2 then
  steps the hit down); a state block holds the state after token (j+1)B - 1;
- not evicted: the engine has not since handed it to a request for other content;
- visibility (ALLOC-VIS-1/-2): under step-end it was written by a pass whose output the
  scheduler has taken; under same-pass an attention block also counts from the pass in
  flight, and from the chunk an earlier request was scheduled in the same `schedule()` call;
  a state checkpoint waits for its step's output under both profiles;
- retention (RET-DENSE-1, RET-SPARSE-1/-2): under sparse retention a bounded group's block
  only where a retained length of the request that wrote it needs it.

An admission served less than the hit over those blocks lost a hit: "lost hit: owed X tokens,
served Y", with the groups and blocks that made X owed. Engine-free like the ledger
(tests/campaign drives it with fakes); docs/campaign.md says what it models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.vllm.campaign.ledger import Group, Slots, extend_identities
from kvcert.spec.alloc import Visibility
from kvcert.spec.errors import InvalidOp, as_choice
from kvcert.spec.hashing import key_lookahead
from kvcert.spec.hybrid import hybrid_hit
from kvcert.spec.layout import (
    ChunkedLocal,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    is_draft,
)
from kvcert.spec.retention import (
    Retention,
    dense_lengths,
    is_bounded,
    junction,
    keeps,
    retained_lengths,
)
from kvcert.spec.view import CacheView, keyable_blocks

Key = tuple[bytes, ...] | bytes  # what a block holds: its slots' identities (a state: one)
Stamp = tuple[str, int, int]  # (request, step, pass end) of a block's last write


@dataclass(frozen=True)
class Profiles:
    """The profiles the engine declares, which decide what it owes."""

    visibility: Visibility
    retention: Retention = Retention.DENSE
    interval: int = 0  # sparse retention's interval (0: no multiples retained)
    speculative: Speculative | None = None  # the draft keying; None: served without drafts

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "visibility", as_choice(Visibility, self.visibility, "visibility", InvalidOp)
        )
        object.__setattr__(
            self, "retention", as_choice(Retention, self.retention, "retention", InvalidOp)
        )
        if self.speculative is not None:
            keying = as_choice(Speculative, self.speculative, "speculative", InvalidOp)
            object.__setattr__(self, "speculative", keying)

    def describe(self) -> str:
        retention = self.retention.value + (f" every {self.interval}" if self.interval else "")
        keying = f", {self.speculative.value} keying" if self.speculative else ""
        return f"{self.visibility.value} visibility, {retention} retention{keying}"


@dataclass(frozen=True)
class LostHit:
    """An admission served less than the spec owed it."""

    text: str
    owed: int
    served: int


def layout_of(groups: list[Group], speculative: Speculative | None, reach: int) -> Layout:
    """The spec's layout of the campaign's groups (a state group in align mode)."""
    out: list[Any] = []
    for i, group in enumerate(groups):
        name, size = f"group {i}", group.block_size
        if group.kind == "mamba":
            out.append(MambaState(size, MambaMode.ALIGN, name=name))
        elif group.kind == "sliding_window":
            out.append(SlidingWindow(size, group.window, draft=group.draft, name=name))
        elif group.kind == "chunked_local":
            out.append(ChunkedLocal(size, group.chunk, draft=group.draft, name=name))
        else:
            out.append(FullAttention(size, draft=group.draft, name=name))
    drafting = speculative is not None and any(g.draft for g in groups)
    return Layout(
        tuple(out),
        speculative=speculative if drafting else None,
        draft_reach=reach if drafting else 1,
    )


@dataclass
class Oracle:
    """Judges every admission of one run; `lost` and the token counts are its findings."""

    groups: list[Group]
    profiles: Profiles
    modules: int = 1  # the drafter's modules (the ledger's roles d0, d1, ...), 1: one head
    applied: int = -1  # the last step whose output the scheduler has taken
    owed_tokens: int = 0  # summed over admissions
    served_tokens: int = 0
    beyond_tokens: int = 0  # served past what was owed (a drop the engine did not take)
    lost: list[LostHit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.layout = layout_of(self.groups, self.profiles.speculative, self.modules)
        # per group, the (role, shift, slots per block) a block's content covers
        self._roles = [self._roles_of(g) for g in self.groups]
        self._keys: dict[tuple[int, int], Key] = {}
        self._index: list[dict[Key, set[int]]] = [{} for _ in self.groups]
        self._evicted: set[tuple[int, int]] = set()
        # per request, its admissions: (step, tokens, junction) (RET-SPARSE-1's inputs)
        self._admissions: dict[str, list[tuple[int, int, int]]] = {}
        self._tokens: dict[str, tuple[list[int], list[bytes]]] = {}
        self._slots = Slots()
        # (request, step) -> the last step taken then: a pass in flight (async scheduling)
        # when its request was released (preempted, finished, aborted)
        self._orphaned: dict[tuple[str, int], int] = {}
        # per request, per step it was scheduled in: (step, tokens computed once the step's
        # chunk is, tokens known, the step of its chunk before): when its draft blocks
        # commit (ALLOC-COMMIT-1), and when the chunk enters the allocator (`_entered`)
        self._progress: dict[str, list[tuple[int, int, int, int]]] = {}

    def _roles_of(self, group: Group) -> list[tuple[str, int, int]]:
        size = group.block_size
        if group.kind == "mamba":
            return []
        roles = [("t", 0, size)] if group.target else []
        if group.draft and self.profiles.speculative is not None:
            heads = (
                [("d", 1)] if self.modules == 1 else [(f"d{m}", 1 + m) for m in range(self.modules)]
            )
            # drop keying keys draft blocks on the block's own tokens: the slots that read a
            # token after the block are not part of what the key certifies (HIT-SPEC-2)
            exact = self.profiles.speculative is Speculative.EXACT
            roles += [(role, shift, size if exact else size - shift) for role, shift in heads]
        return roles

    # --- what blocks hold -----------------------------------------------------------------

    def _held_key(self, g: int, block: int) -> Key | None:
        """What physical `block` of group g holds, None while any slot is unwritten."""
        if self.groups[g].kind == "mamba":
            return self._slots.get((g, "s", block, 0))
        parts: list[bytes] = []
        for role, _, count in self._roles[g]:
            for offset in range(count):
                ident = self._slots.get((g, role, block, offset))
                if ident is None:
                    return None
                parts.append(ident)
        return tuple(parts)

    def _wanted_key(self, g: int, j: int, ident: list[bytes]) -> Key | None:
        """What block j of group g holds for a request with these identities (None: the
        request's tokens do not reach as far as the block's content covers)."""
        size = self.groups[g].block_size
        if self.groups[g].kind == "mamba":
            end = (j + 1) * size
            return ident[end - 1] if end <= len(ident) else None
        parts: list[bytes] = []
        for _, shift, count in self._roles[g]:
            first = j * size + shift
            if first + count > len(ident):
                return None
            parts.extend(ident[first : first + count])
        return tuple(parts)

    def _refresh(self) -> None:
        """Re-index the blocks written since the last look; a block written again is no
        longer an evicted one (its new owner's content is what it holds now)."""
        for where in self._slots.dirty:
            g, block = where
            if block <= 0 or g >= len(self.groups):
                continue
            old = self._keys.pop(where, None)
            if old is not None:
                holders = self._index[g][old]
                holders.discard(block)
                if not holders:
                    del self._index[g][old]
            self._evicted.discard(where)
            key = self._held_key(g, block)
            if key is not None:
                self._keys[where] = key
                self._index[g].setdefault(key, set()).add(block)
        self._slots.dirty.clear()

    def _identities(self, rid: str, tokens: list[int]) -> list[bytes]:
        """The ledger's identities of the request's tokens, extended as the request grows
        (computed afresh should its tokens ever change)."""
        known, ident = self._tokens.get(rid, ([], []))
        if tokens[: len(known)] != known:
            ident = []
        self._tokens[rid] = (list(tokens), extend_identities(ident, tokens))
        return ident

    # --- the profiles ---------------------------------------------------------------------

    def _commits(self, g: int, j: int, reached: int) -> bool:
        """ALLOC-COMMIT-1: block j is complete once its tokens are computed; a draft group's
        waits for the draft_reach - 1 tokens after it to be computed too."""
        end = (j + 1) * self.groups[g].block_size
        if is_draft(self.layout.groups[g]):
            end += self.layout.draft_reach - 1
        return reached >= end

    def _keyed(self, g: int, j: int, known: int) -> bool:
        """Whether the engine can key block j of group g with `known` tokens of the request
        known to it: the block's own, and under exact keying the tokens a draft key covers
        past it (HASH-DRAFT-1)."""
        end = (j + 1) * self.groups[g].block_size
        return known >= end + key_lookahead(self.layout, self.layout.groups[g])

    def _visible(self, g: int, j: int, stamp: Stamp) -> bool:
        """ALLOC-VIS-2 publishes an attention block from the scheduling of the chunk that
        commits it on (and a chunk already handed to the executor keeps it, ALLOC-VIS-3);
        otherwise a block commits when that chunk's step ends (ALLOC-VIS-1), which the spec
        defines for a request still running then: a pass that ran after its request was
        released commits nothing. A block commits at the first chunk that completes it with
        its key's tokens known (ALLOC-COMMIT-1). The spec's steps are synchronous, so a
        chunk's tokens are known when it is scheduled; under async scheduling a chunk can
        complete a block whose last tokens are still in flight then, and the engine can key
        it only once that pass's output is taken, when it commits under either visibility."""
        rid, step, _ = stamp
        for at, reached, known, before in self._progress.get(rid, ()):
            if at < step or not self._commits(g, j, reached):
                continue
            released = self._orphaned.get((rid, at))
            if self._keyed(g, j, known):
                if self.profiles.visibility is Visibility.SAME_PASS and (
                    self.groups[g].kind != "mamba"
                ):
                    return self._entered(before, self.applied if released is None else released)
                return released is None and at <= self.applied
            if self._keyed(g, j, reached):  # its tokens in flight when it was scheduled
                return released is None and at <= self.applied
        return False

    def _entered(self, before: int, applied: int | None = None) -> bool:
        """Whether a chunk has entered the allocator, whose steps are synchronous: at once,
        unless its request's chunk of step `before` was still in flight when it was
        scheduled (async scheduling), then once that step's output is taken (`applied`:
        the last step taken, by now or when the request was released)."""
        return before <= (self.applied if applied is None else applied)

    def _retained(self, g: int, j: int, stamp: Stamp) -> bool:
        """RET-SPARSE-2 for the request that wrote the block, as admitted when it wrote it."""
        group = self.layout.groups[g]
        if not is_bounded(group):
            return True
        if self.profiles.retention is Retention.DENSE:
            return keeps(group, dense_lengths(self.layout), j)
        rid, step, _ = stamp
        admissions = [a for a in self._admissions.get(rid, ()) if a[0] <= step]
        if not admissions:
            return False
        _, prompt, joint = admissions[-1]
        lengths = retained_lengths(self.layout, prompt, joint, self.profiles.interval)
        return keeps(group, lengths, j)

    # --- judging --------------------------------------------------------------------------

    def reset(self) -> None:
        """The prefix cache was reset: nothing written so far can be hit."""
        self._refresh()
        self._evicted.update(self._keys)

    def judge(
        self,
        scheduler: Any,
        output: Any,
        step: int,
        slots: Slots,
        runner_tokens: Callable[[Any], list[int]] | None = None,
    ) -> list[LostHit]:
        """Judge the admissions of one `schedule()` output, in the order it scheduled them
        (running requests first, then the waiting queue: `num_scheduled_tokens`' order);
        between two, what the earlier one was handed (evictions) and, under same-pass, what
        its chunk will write. `runner_tokens`: a request's tokens as the runner knows them
        (under async scheduling, also those sampled by passes whose output is not taken
        yet; default: the scheduler's). Returns the lost hits found."""
        self._slots = slots
        self._refresh()
        released = set(getattr(output, "preempted_req_ids", ()) or ())
        released |= set(getattr(output, "finished_req_ids", ()) or ())
        for rid in released:
            for s in range(self.applied + 1, step):
                self._orphaned.setdefault((rid, s), self.applied)
        admitted = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        appended: dict[str, Any] = {}
        for i, rid in enumerate(cached.req_ids):
            appended[rid] = cached.new_block_ids[i]
            if rid in resumed:
                admitted[rid] = cached.num_computed_tokens[i]
        upcoming: list[dict[Key, list[tuple[int, Stamp]]]] = [{} for _ in self.groups]
        found = []
        for rid in output.num_scheduled_tokens:
            request = scheduler.requests[rid]
            tokens = list(request.all_token_ids)
            ident = self._identities(rid, tokens)
            tables = scheduler.kv_cache_manager.get_block_ids(rid)
            # the scheduler counted the chunk already, the drafts it verifies included; the
            # runner computes KV only from tokens it knows
            known_to_runner = len(runner_tokens(request)) if runner_tokens else len(tokens)
            reached = min(request.num_computed_tokens, known_to_runner)
            progress = self._progress.setdefault(rid, [])
            before = progress[-1][0] if progress else -1
            if rid in admitted:  # looked up before its own chunk was scheduled
                lost = self._admission(rid, step, ident, admitted[rid], upcoming)
                if lost is not None:
                    found.append(lost)
                new_columns = [range(len(table)) for table in tables]
            else:
                more = appended.get(rid)
                new_columns = [
                    range(len(table) - (len(more[g]) if more else 0), len(table))
                    for g, table in enumerate(tables)
                ]
            self._hand_out(tables, new_columns, ident)
            progress.append((step, reached, len(tokens), before))
            if self.profiles.visibility is Visibility.SAME_PASS and self._entered(before):
                self._upcoming((rid, step, reached), tables, ident, upcoming)
        self.lost += found
        return found

    def _hand_out(self, tables: Any, columns: list[range], ident: list[bytes]) -> None:
        """A block handed to a request for content it does not hold is evicted: the engine
        let go of what it held (vLLM drops its key when it allocates it). The groups share
        one pool, so a block handed to one group is evicted from every other."""
        for g, (table, new) in enumerate(zip(tables, columns, strict=True)):
            for j in new:
                block = table[j]
                if block <= 0:
                    continue
                for other in range(len(self.groups)):
                    held = self._keys.get((other, block))
                    if held is not None and (other != g or held != self._wanted_key(g, j, ident)):
                        self._evicted.add((other, block))

    def _upcoming(
        self,
        stamp: Stamp,
        tables: Any,
        ident: list[bytes],
        upcoming: list[dict[Key, list[tuple[int, Stamp]]]],
    ) -> None:
        """Same-pass (ALLOC-VIS-2): the attention blocks this chunk completes serve the
        requests scheduled after it in the same call, with the content its known tokens give."""
        for g, table in enumerate(tables):
            if self.groups[g].kind == "mamba":
                continue
            size = self.groups[g].block_size
            end = stamp[2]
            for j in range(min(len(table), end // size)):
                key = self._wanted_key(g, j, ident)
                block = table[j]
                if key is None or block <= 0 or not self._commits(g, j, end):
                    continue
                if self._keys.get((g, block)) != key:
                    upcoming[g].setdefault(key, []).append((block, stamp))

    def _holder(
        self, g: int, j: int, key: Key, upcoming: list[dict[Key, list[tuple[int, Stamp]]]]
    ) -> int | None:
        """A physical block of group g that holds the request's block j, visible and
        retained, or None."""
        for block in sorted(self._index[g].get(key, ())):
            stamp = self._slots.stamps.get((g, block))
            if (g, block) in self._evicted or stamp is None:
                continue
            if self._visible(g, j, stamp) and self._retained(g, j, stamp):
                return block
        for block, stamp in upcoming[g].get(key, ()):  # held by a request scheduled now
            if self._retained(g, j, stamp):
                return block
        return None

    def _admission(
        self,
        rid: str,
        step: int,
        ident: list[bytes],
        served: int,
        upcoming: list[dict[Key, list[tuple[int, Stamp]]]],
    ) -> LostHit | None:
        """The hit this admission was owed, next to the one it was served."""
        count = len(ident)
        cached, holders = [], {}
        for g in range(len(self.groups)):
            held = set()
            for j in range(keyable_blocks(self.layout, g, count)):
                key = self._wanted_key(g, j, ident)
                block = None if key is None else self._holder(g, j, key, upcoming)
                if block is not None:
                    held.add(j)
                    holders[(g, j)] = block
            cached.append(frozenset(held))
        view = CacheView(self.layout, count, tuple(cached))
        hit = hybrid_hit(view)
        self._admissions.setdefault(rid, []).append((step, count, junction(view, served)))
        self.owed_tokens += hit.length
        self.served_tokens += served
        self.beyond_tokens += max(0, served - hit.length)
        if served >= hit.length:
            return None
        made = []
        for g, blocks in enumerate(hit.blocks):
            needed = [j for j in blocks if j is not None]
            if needed:
                physical = ", ".join(str(holders[(g, j)]) for j in needed)
                made.append(
                    f"group {g} ({self.groups[g].kind}) blocks {needed[0]}..{needed[-1]} held "
                    f"as {physical}"
                )
        return LostHit(
            f"step {step}: {rid} ({count} tokens) lost a hit: owed {hit.length} tokens, served "
            f"{served} ({self.profiles.describe()}; {'; '.join(made) or 'no block needed'})",
            hit.length,
            served,
        )
