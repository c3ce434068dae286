"""The model runner of the scheduler campaign: a ledger of what each forward pass computed.

Each pass first checks what it reads (every position its attention needs, a state group's
running state, the drafter's KV) against what an earlier pass computed from the same token
prefix, then records what it writes into the slots the block tables name. vLLM-shaped (it
reads vLLM's scheduler outputs) but needs no vLLM: tests/campaign drives it with fakes.
docs/campaign.md describes what it models (vLLM's runner, drafters, state checkpoints).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcert.conformance.campaign.workload import VOCAB
from kvcert.conformance.vllm import runtime

UNKNOWN = -1  # a token the pass could not know: KV computed from it is garbage


@dataclass(frozen=True)
class Violation:
    """An unsound read: which pass read which position, and whose KV it was."""

    text: str
    role: str  # "target" / "state": the served model's KV / Mamba state (wrong outputs);
    # "draft": the drafter's KV


@dataclass
class Group:
    block_size: int
    kind: str  # full | sliding_window | chunked_local | mamba
    window: int = 0
    chunk: int = 0
    target: bool = True  # holds layers of the served model
    draft: bool = False  # holds the drafter's layers
    # a state group whose kernel saves checkpoints inside a pass: their alignment (else 0)
    checkpoint_alignment: int = 0
    # a state group with MTP/EAGLE drafts: the blocks after the running state's that hold
    # the states after each draft (vLLM's num_speculative_blocks)
    speculative_blocks: int = 0

    def needs(self, start: int) -> range:
        """Positions below `start` that attention at `start` reads (a state group reads its
        running state instead: `Ledger._carry_states`)."""
        if self.kind == "mamba":
            return range(0)
        if self.kind == "sliding_window":
            return range(max(0, start - self.window + 1), start)
        if self.kind == "chunked_local":
            return range(start - start % self.chunk, start)
        return range(start)


def _state_block(end: int, block_size: int) -> int:
    """The block index holding a request's running state after a pass ending at `end`."""
    return -(-end // block_size) - 1


def _state_found(held: bytes | None, ident: list[bytes]) -> str:
    """What a state block held instead of the state a pass needed."""
    if held is None:
        return "holds no state any forward pass wrote"
    if held in ident:
        return f"holds the state after position {ident.index(held)}"
    return "holds the state of another token prefix"


def _readmitted_ids(output: Any) -> set[str]:
    """Requests the scheduler (re)sends whole this step: new ones, and ones resumed after a
    preemption (every pinned release lists them in `resumed_req_ids`)."""
    ids = {r.req_id for r in output.scheduled_new_reqs}
    return ids | set(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ())


def identities(tokens: list[int], end: int) -> list[bytes]:
    """identity[p]: a digest of tokens[0..p], what target KV at position p is a function of
    (and draft KV at p - 1)."""
    return extend_identities([], tokens[:end])


def extend_identities(ident: list[bytes], tokens: list[int]) -> list[bytes]:
    """`ident`, the identities of a prefix of `tokens`, extended in place to all of them."""
    previous = ident[-1] if ident else b""
    for token in tokens[len(ident) :]:
        previous = hashlib.sha256(previous + token.to_bytes(4, "little", signed=True)).digest()
        ident.append(previous)
    return ident


Slot = tuple[int, str, int, int]  # (group, role, block, offset)


class Slots(dict[Slot, bytes]):
    """slot -> identity of the KV (or state) written there, stamping each block with the
    pass that last changed it: (request, step, the pass's end). The completeness oracle
    (`campaign.owed`) reads the stamps (visibility, retention) and re-indexes the blocks
    marked dirty since it last looked."""

    def __init__(self) -> None:
        super().__init__()
        self.stamp: tuple[str, int, int] = ("", -1, 0)  # the pass writing now
        # (group, block) -> the stamp of the pass that last changed one of its slots
        self.stamps: dict[tuple[int, int], tuple[str, int, int]] = {}
        self.dirty: set[tuple[int, int]] = set()

    def __setitem__(self, slot: Slot, ident: bytes) -> None:
        if self.get(slot) != ident:
            block = (slot[0], slot[2])
            self.stamps[block] = self.stamp
            self.dirty.add(block)
        super().__setitem__(slot, ident)

    def pop(self, slot: Slot, default: Any = None) -> Any:
        if slot in self:
            block = (slot[0], slot[2])
            self.stamps[block] = self.stamp
            self.dirty.add(block)
        return super().pop(slot, default)


@dataclass
class _Pending:
    """One output of the runner the scheduler has not taken yet."""

    tokens: list[int]  # accepted drafts, then the bonus token
    rejected: int  # drafts the scheduler still counts as computed
    live: bool = True  # false once the runner re-added the request (its state starts over)


@dataclass
class _Pass:
    """One request's share of a forward pass, as the runner computes it."""

    rid: str
    step: int
    start: int  # the first position computed
    count: int  # positions computed
    known: list[int]  # the request's tokens as the runner knows them
    drafts: list[int]  # the drafts the pass verifies (after the last known token)
    tables: Any  # the request's block table per group
    # the tokens the request ends at (prompt and max_tokens outputs; None: no limit). Near
    # it the scheduler verifies fewer drafts than the modules propose (the outputs left
    # less the bonus token; none once the request is finished, or under async scheduling
    # for a pass run after the output that finishes it), and a module whose draft no pass
    # verifies is not checked: what it reads may come from drafts never scheduled
    limit: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.count


def _limit(request: Any) -> int | None:
    """The tokens a request ends at: its prompt and max_tokens outputs (None: no limit, as
    the tests script requests)."""
    outputs = getattr(request, "max_tokens", None)
    prompt = getattr(request, "num_prompt_tokens", None)
    return prompt + outputs if isinstance(outputs, int) and isinstance(prompt, int) else None


@dataclass
class Ledger:
    """The model runner: slot (group, role, block, offset) -> identity of the KV written
    there, role "t" for the served model's layers and "d" for the drafter's."""

    groups: list[Group]
    seed: int = 0
    spec_tokens: int = 0
    slots: Slots = field(default_factory=Slots)
    unapplied: dict[str, list[_Pending]] = field(default_factory=dict)
    proposed: dict[str, list[int]] = field(default_factory=dict)  # the drafter's last drafts
    # the runner's running-state block index per request (vLLM's `mamba_state_idx`)
    state_index: dict[str, int] = field(default_factory=dict)
    # with drafts on a state model: tokens the last pass accepted, bonus included (vLLM's
    # `num_accepted_tokens`, 1 once a copy moved the accepted state), and the block index
    # each pass reads its state from
    state_accepted: dict[str, int] = field(default_factory=dict)
    state_read: dict[str, int] = field(default_factory=dict)
    # the runner's block tables per request, as the scheduler's outputs build them: a new
    # or resumed request's tables whole, a running request's new blocks appended
    runner_tables: dict[str, list[list[int]]] = field(default_factory=dict)
    drafts: int = 0
    accepted: int = 0
    # passes verifying drafts on a state model whose accepted tokens crossed a block
    # boundary, the runner then copying the state there into the boundary's block
    state_copies: int = 0
    # the runner's prefill checkpoints of a pass (`_runner_checkpoints`), None: it saves none
    checkpoints: Callable[[int, int], tuple[int, int]] | None = None
    # the drafter's modules: 1 (EAGLE: one head, role "d"), else a multi-module MTP drafter
    # (roles "d0", "d1", ...: module s's KV at p reads the tokens up to p + 1 + s)
    modules: int = 1
    # requests whose row of the MTP drafter's input cache holds their own last inputs (what
    # it re-prefills from); a request (re)sent to the runner has not run the drafter yet
    mtp_cached: set[str] = field(default_factory=set)

    def tokens(self, request: Any) -> list[int]:
        """The request's tokens as the runner knows them: the scheduler's, then the ones this
        runner sampled whose outputs the scheduler has not taken yet (async scheduling)."""
        mine = [t for p in self.unapplied.get(request.request_id, ()) if p.live for t in p.tokens]
        return [*request.all_token_ids, *mine]

    def _optimism(self, rid: str) -> int:
        return sum(p.rejected for p in self.unapplied.get(rid, ()) if p.live)

    def _readmitted(self, rid: str) -> None:
        """The scheduler (re)sent the request whole: the runner starts from its tokens and
        count; outputs still in flight are the scheduler's to deliver or drop."""
        for pending in self.unapplied.get(rid, ()):
            pending.live = False
        self.proposed.pop(rid, None)
        self.mtp_cached.discard(rid)
        self.state_index.pop(rid, None)
        self.state_accepted.pop(rid, None)

    def forward(
        self, scheduler: Any, output: Any, step: int
    ) -> tuple[list[list[int]], Violation | None]:
        """Check every read of the pass, write its KV, sample where a request's scheduled
        tokens reach its end. Returns (the tokens sampled per scheduled request, in the
        output's order; the first violation or None)."""
        ids = list(output.num_scheduled_tokens)
        for rid in _readmitted_ids(output):
            self._readmitted(rid)
        self._follow_tables(output)
        passes = []
        for rid in ids:
            request = scheduler.requests[rid]
            count = output.num_scheduled_tokens[rid]
            passes.append(
                _Pass(
                    rid,
                    step,
                    # the scheduler advanced its count already, and counts in-flight drafts as
                    # accepted
                    request.num_computed_tokens - count - self._optimism(rid),
                    count,
                    self.tokens(request),
                    self._drafts(rid, output.scheduled_spec_decode_tokens.get(rid, ())),
                    scheduler.kv_cache_manager.get_block_ids(rid),
                    _limit(request),
                )
            )
        self._carry_states(passes)
        violation = None
        sampled = []
        for one in passes:
            self.slots.stamp = (one.rid, one.step, one.end)
            violation = violation or self._check_table(one) or self._check_reads(one)
            tokens, after = self._sample(one)
            sampled.append(tokens)
            # the target ran on the known tokens and the drafts; the drafter's next token is
            # known up to the bonus token (or the next prompt token), unknown past a rejection
            ran = one.known + one.drafts
            ran += [UNKNOWN] * (one.end - len(ran))  # positions no token is known for: garbage
            self._write(one, "t", identities(ran, one.end), 0)
            self._settle_state(one, len(tokens) if tokens else 1)
            drafts = self._propose(one, after) if tokens and self.spec_tokens else []
            if self.modules > 1:
                violation = violation or self._run_modules(one, tokens, after, drafts)
                continue
            nexts = after + [UNKNOWN] * (one.end + 1 - len(after))
            self._write(one, "d", identities(nexts, one.end + 1), 1)
            if drafts:
                self._write_draft_passes(one, after, drafts)
        return sampled, violation

    def _run_modules(
        self, one: _Pass, tokens: list[int], after: list[int], drafts: list[int]
    ) -> Violation | None:
        """A multi-module MTP drafter after the pass (0.33's `MultiModuleMTPSpeculator`): every
        module runs over the pass's positions less the rejected drafts, plus the last
        `rejected - 1` positions before them, whose KV in the later modules was computed from
        drafts now rejected (re-prefilled from the inputs it cached last pass; a request new to
        the runner has none of its own there). Module s at position p reads token p + 1 + s:
        the known tokens, then the drafts the modules before it sampled. Trailing slots of
        rejected drafts are padded (`pad_trailing_draft_slots`): not written. Before writing,
        each module's attention reads its own KV below the first position it computes, which
        must be what it computes for the tokens now known."""
        rejected = len(one.drafts) - (len(tokens) - 1) if tokens else 0
        reprefilled = max(0, rejected - 1)
        first, stop = max(0, one.start - reprefilled), one.end - rejected
        chain = [*after, *drafts]
        if reprefilled and one.rid not in self.mtp_cached:  # another request's cached inputs
            chain[first + 1 : one.start + 1] = [UNKNOWN] * (one.start - first)
        self.mtp_cached.add(one.rid)
        # the drafts a next pass can verify: the scheduler caps them at the outputs left
        # less the bonus token; module s proposes draft s
        verified = self.modules if one.limit is None else one.limit - len(after) - 1
        reach = max(stop, first + 1) + self.modules
        written = identities(chain + [UNKNOWN] * (reach - len(chain)), reach)
        known = identities(after + [UNKNOWN] * (reach - len(after)), reach)
        violation = None
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not group.draft:
                continue
            for module in range(self.modules):
                role = f"d{module}"
                for p in group.needs(first) if module < verified else ():
                    slot = (g, role, table[p // group.block_size], p % group.block_size)
                    if violation is None and self.slots.get(slot) != known[p + 1 + module]:
                        violation = Violation(
                            f"step {one.step}: {one.rid}'s MTP module {module} computes "
                            f"[{first}, {stop}) but position {p} of group {g} (draft layers, "
                            f"block {slot[2]}) holds KV that no forward pass wrote for this "
                            "prefix",
                            "draft",
                        )
                for p in range(first, stop):
                    block = table[p // group.block_size]
                    if block:
                        ident = written[p + 1 + module]
                        self.slots[(g, role, block, p % group.block_size)] = ident
        return violation

    def _carry_states(self, passes: list[_Pass]) -> None:
        """Before the forward pass, vLLM's runner (`preprocess_mamba`, align mode) moves each
        request's running state into the block of its pass's last token: from the block it
        left it in last pass, or for a request (re)sent to it, from the block of its last
        computed token (its prefix-cache hit's checkpoint). All copies read before any write,
        as one batched copy on the device does. With drafts the state left behind is the
        accepted one: `a - 1` blocks after the last pass's running state (a: the tokens it
        accepted, bonus included); a pass that stays in the same block reads it there."""
        states = [g for g, group in enumerate(self.groups) if group.kind == "mamba"]
        if not states:
            return
        size = self.groups[states[0]].block_size  # align mode: every state group's
        copies = []
        for one in passes:
            current = _state_block(one.end, size)
            previous = self.state_index.get(one.rid, (one.start - 1) // size)
            self.state_index[one.rid] = current
            accepted = self.state_accepted.pop(one.rid, 1)
            if previous in (-1, current):
                self.state_read[one.rid] = current + accepted - 1
                continue
            self.state_read[one.rid] = current
            source = previous + accepted - 1
            for g in states:
                table = one.tables[g]
                held = table[source] if source < len(table) else -1  # no such block
                # a null block (or none: the runner's row is zero-padded) holds no state
                if current < len(table) and table[current]:
                    state = self.slots.get((g, "s", held, 0))
                    copies.append(
                        ((one.rid, one.step, one.end), (g, "s", table[current], 0), state)
                    )
        for stamp, slot, state in copies:
            self.slots.stamp = stamp
            if state is None:
                self.slots.pop(slot, None)
            else:
                self.slots[slot] = state

    def _settle_state(self, one: _Pass, accepted: int) -> None:
        """After sampling, with drafts on a state model (vLLM's `postprocess_mamba`, align
        mode): where the accepted tokens reached a block boundary at or past the running
        state's, the state there is copied from the block holding it (the running state's or
        a draft's) into the boundary's own block, the one the prefix cache keys; a pass that
        copied within its running block leaves the accepted state there (`a` back to 1)."""
        copied = False
        for g, group in enumerate(self.groups):
            if group.kind != "mamba" or not group.speculative_blocks:
                continue
            size, table = group.block_size, one.tables[g]
            current = _state_block(one.end, size)
            running = one.end - len(one.drafts)  # tokens whose state the running block holds
            aligned = (running + accepted - 1) // size * size
            self.state_accepted[one.rid] = accepted
            if aligned < running:
                continue
            bias, dest = aligned - running, aligned // size - 1
            if dest == current:
                self.state_accepted[one.rid] = 1
                if not bias:
                    continue
            source = table[current + bias] if current + bias < len(table) else -1
            if dest < len(table) and table[dest]:
                copied = True
                state = self.slots.get((g, "s", source, 0))
                if state is None:
                    self.slots.pop((g, "s", table[dest], 0), None)
                else:
                    self.slots[(g, "s", table[dest], 0)] = state
        self.state_copies += copied

    def _drafts(self, rid: str, scheduled: Any) -> list[int]:
        """The drafts the pass verifies: the scheduler's (sync), this runner's own where the
        scheduler holds placeholders (async), and for a request the runner has no drafts for,
        padding (0.33 pads a new request's single token to 1 + num_speculative_tokens rows
        with -1 drafts, which the rejection sampler always rejects)."""
        drafts = [int(t) for t in scheduled]
        if all(t >= 0 for t in drafts):
            return drafts
        own = self.proposed.get(rid)
        if own is None:
            return [UNKNOWN] * len(drafts)
        if len(own) < len(drafts):
            raise RuntimeError(
                f"ledger out of step: {rid} has {len(drafts)} draft placeholders and the "
                f"runner proposed {len(own)} drafts"
            )
        return own[: len(drafts)]

    def _follow_tables(self, output: Any) -> None:
        """What the runner's block tables become from this output (vLLM's
        `_update_states`: new and resumed requests replace theirs, others append)."""
        for new in output.scheduled_new_reqs:
            self.runner_tables[new.req_id] = [list(ids) for ids in new.block_ids]
        cached = output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if ids is None:
                continue
            if rid in resumed or rid not in self.runner_tables:
                self.runner_tables[rid] = [list(more) for more in ids]
            else:
                for table, more in zip(self.runner_tables[rid], ids, strict=True):
                    table.extend(more)

    def _check_table(self, one: _Pass) -> Violation | None:
        """The runner's table must name the manager's block at every position the pass
        computes or reads (earlier positions the manager released may hold stale ids, which
        the runner never reads): a difference sends KV or state to another request's block."""
        runner = self.runner_tables.get(one.rid)
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            held = runner[g] if runner is not None else []
            needed = -(-one.end // group.block_size) + group.speculative_blocks
            for j, block in enumerate(table[:needed]):
                if block and (j >= len(held) or held[j] != block):
                    return Violation(
                        f"step {one.step}: {one.rid}'s block table in group {g} "
                        f"({group.kind}) names block {block} at position {j}; the runner's "
                        f"table, built from the scheduler's outputs, holds "
                        f"{held[j] if j < len(held) else 'nothing'} there",
                        "target",
                    )
        return None

    def _check_reads(self, one: _Pass) -> Violation | None:
        """The first read of the pass that finds KV no pass wrote for this prefix."""
        start = one.start
        # a position the runner knows no token for cannot hold KV any pass wrote for it
        ident = identities(one.known + [UNKNOWN] * (start + 1 - len(one.known)), start + 1)
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if group.kind == "mamba":
                held = self.slots.get(self._read_slot(g, one))
                if start and held != ident[start - 1]:
                    return Violation(
                        f"step {one.step}: {one.rid} computes [{start}, {one.end}) from the "
                        f"state in group {g} (mamba, block {self._read_slot(g, one)[2]}), "
                        f"which should be the state after position {start - 1} of this "
                        f"prefix but {_state_found(held, ident[:start])}",
                        "state",
                    )
                continue
            # an EAGLE head reads its KV as the pass starts; MTP modules after it
            # (`_run_modules`)
            eagle = group.draft and self.modules == 1
            for role, shift, present in (("t", 0, group.target), ("d", 1, eagle)):
                if not present:
                    continue
                for p in group.needs(start):
                    slot = (g, role, table[p // group.block_size], p % group.block_size)
                    if self.slots.get(slot) != ident[p + shift]:
                        layers = "draft layers" if role == "d" else group.kind
                        return Violation(
                            f"step {one.step}: {one.rid} computes [{start}, {one.end}) but "
                            f"position {p} of group {g} ({layers}, block {slot[2]}) holds KV "
                            "that no forward pass wrote for this prefix",
                            "draft" if role == "d" else "target",
                        )
        return None

    def _state_slot(self, g: int, one: _Pass, offset: int = 0) -> tuple[int, str, int, int]:
        """The slot of the running state's block (`offset` blocks on: a draft's state)."""
        table = one.tables[g]
        index = _state_block(one.end, self.groups[g].block_size) + offset
        return (g, "s", table[index] if index < len(table) else -1, 0)

    def _read_slot(self, g: int, one: _Pass) -> tuple[int, str, int, int]:
        """The slot the pass reads its state from (`_carry_states`)."""
        table = one.tables[g]
        index = self.state_read.get(one.rid, _state_block(one.end, self.groups[g].block_size))
        return (g, "s", table[index] if index < len(table) else -1, 0)

    def _sample(self, one: _Pass) -> tuple[list[int], list[int]]:
        """(tokens returned to the scheduler, the request's tokens as far as they are known
        after the pass). Nothing is sampled before a request's last token."""
        rid, step, known, drafts = one.rid, one.step, one.known, one.drafts
        if one.end < len(known):
            return [], known
        if not self.spec_tokens:  # the campaign's original stream of tokens, kept for its seeds
            token = (7 * step + 13 * len(known)) % VOCAB
            self.unapplied.setdefault(rid, []).append(_Pending([token], 0))
            return [token], [*known, token]
        rng = random.Random(f"{self.seed}:{step}:{rid}")
        real = drafts.index(UNKNOWN) if UNKNOWN in drafts else len(drafts)  # padding: rejected
        accepted = rng.randint(0, real)
        bonus = rng.randrange(VOCAB)
        if accepted < len(drafts) and bonus == drafts[accepted]:
            bonus = (bonus + 1) % VOCAB  # a draft the target samples is accepted
        tokens = [*drafts[:accepted], bonus]
        self.drafts += real
        self.accepted += accepted
        self.unapplied.setdefault(rid, []).append(_Pending(tokens, len(drafts) - accepted))
        return tokens, [*known, *tokens]

    def _write(self, one: _Pass, role: str, ident: list[bytes], shift: int) -> None:
        """Role `role`'s KV for the pass's positions; ident[p + shift] is position p's."""
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not (group.target if role == "t" else group.draft):
                continue
            if group.kind == "mamba":  # the state after the pass's last token
                # with drafts: after the last known token, then each draft's a block further
                drafts = len(one.drafts) if group.speculative_blocks else 0
                for offset in range(drafts + 1):
                    slot = self._state_slot(g, one, offset)
                    if slot[2] > 0:
                        self.slots[slot] = ident[one.end - 1 - drafts + offset + shift]
                if group.checkpoint_alignment and self.checkpoints is not None:
                    position, column = self.checkpoints(one.start, one.end)
                    if position and column < len(table) and table[column]:  # null: skipped
                        self.slots[(g, "s", table[column], 0)] = ident[position - 1 + shift]
                continue
            for p in range(one.start, one.end):
                block = table[p // group.block_size]
                if block:  # a null block (outside a window) is never written
                    self.slots[(g, role, block, p % group.block_size)] = ident[p + shift]

    def _propose(self, one: _Pass, after: list[int]) -> list[int]:
        """The drafter's next drafts."""
        rng = random.Random(f"{self.seed}:{one.step}:{one.rid}:drafts")
        drafts = [rng.randrange(VOCAB) for _ in range(self.spec_tokens)]
        self.proposed[one.rid] = drafts
        return drafts

    def _write_draft_passes(self, one: _Pass, after: list[int], drafts: list[int]) -> None:
        """The draft KV an EAGLE drafter's extra passes write after the bonus token (pass j
        reads draft j - 1), where the block table already reaches."""
        bonus = len(after) - 1
        ident = identities(after + drafts, len(after) + len(drafts))
        for g, (group, table) in enumerate(zip(self.groups, one.tables, strict=True)):
            if not group.draft:
                continue
            for p in range(bonus, bonus + self.spec_tokens - 1):
                index = p // group.block_size
                if index < len(table) and table[index]:
                    self.slots[(g, "d", table[index], p % group.block_size)] = ident[p + 1]

    def applied(self, runner_output: Any) -> None:
        """The scheduler took these outputs: their tokens are in all_token_ids now (or were
        dropped with a preempted or finished request)."""
        for rid, tokens in zip(runner_output.req_ids, runner_output.sampled_token_ids,
                               strict=True):  # fmt: skip
            if tokens and self.unapplied.get(rid):
                self.unapplied[rid].pop(0)

    def draft_ids(self, runner_output: Any) -> Any:
        """What EngineCore hands the scheduler after a synchronous step: the drafter's drafts
        for every request of the batch."""
        ids = list(runner_output.req_ids)
        return runtime.vllm().DraftTokenIds(ids, [list(self.proposed.get(r, [])) for r in ids])
