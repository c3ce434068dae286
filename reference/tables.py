"""Table planning: which positions of a request's tables a step writes, keeps and releases.

Pure over a request's tables (no pool, no keys): the manager asks what a chunk changes,
allocates and releases accordingly. Implements ALLOC-HOLD-1, ALLOC-WRITE-1, ALLOC-SKIP-1 and
CKPT-INNER-1's held blocks (`changes`), ALLOC-SPEC-1's decode bounds (`plan_quiet`) and
ALLOC-SPEC-2's checkpoint placement (`check_checkpoint`), with the per-kind position
arithmetic of kvcert.reference.groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvcert.reference.block_pool import NULL_BLOCK
from kvcert.reference.config import CacheConfig, Kind, MambaMode
from kvcert.reference.errors import RequestStateError
from kvcert.reference.groups import (
    checkpoint_position,
    first_read,
    first_release,
    first_written,
    table_end,
)
from kvcert.reference.inputs import TOKEN_LIMIT, token_count
from kvcert.reference.requests import Request

NO_POSITIONS: list[int] = []  # shared, never mutated: a group that needs no new block
Released = list[tuple[int, int, int]]  # (group, position, block) table entries given back


class Positions(Sequence[int]):
    """Table positions: some scattered ones, then a run, without listing the run (a request
    asking for far more blocks than the pool holds is counted, then refused, in O(1))."""

    __slots__ = ("_run", "_scattered")

    def __init__(self, scattered: list[int], run: Sequence[int]) -> None:
        self._scattered, self._run = scattered, run

    def __len__(self) -> int:
        return len(self._scattered) + len(self._run)

    @property
    def size(self) -> int:
        """len(), also past sys.maxsize (where len() of a range raises OverflowError)."""
        return len(self._scattered) + size(self._run)

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        count = len(self)
        if not -count <= index < count:
            raise IndexError(index)
        index %= count
        first = len(self._scattered)
        return self._scattered[index] if index < first else self._run[index - first]

    def __iter__(self) -> Iterator[int]:
        yield from self._scattered
        yield from self._run


def size(positions: Sequence[int]) -> int:
    """How many positions, counted without listing them, also past sys.maxsize (a lookahead
    of 10**30 tokens wants 10**30 // 16 positions of a 16-token group: answered Waiting)."""
    if type(positions) is range:  # step 1, as `changes` makes them
        return max(0, positions.stop - positions.start)
    if type(positions) is Positions:
        return positions.size
    return len(positions)


def wanted_count(wanted: Sequence[Sequence[int]]) -> int:
    """The new blocks `changes`' wanted positions take, every group together."""
    return sum(map(size, wanted))


def held_from(table: list[int]) -> int:
    """The first position of a lookup table that holds a block: a hit's table is null
    blocks, then blocks (find_hit), so that is how many null blocks it has."""
    return table.count(NULL_BLOCK)


class TablePlanner:
    """Per cache configuration, the table arithmetic of every group (built once)."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        # state groups that hold ALLOC-SPEC-1's positions for decode chunks
        self.drafting_states = any(g.speculative_blocks for g in config.groups)
        # `changes`' view of the groups: (index, group or None for cross attention, block size,
        # whether it holds state, whether it keeps every position)
        self._change_groups = [
            (
                g,
                None if group.kind is Kind.CROSS else group,
                group.block_size,
                group.kind is Kind.MAMBA,
                group.kind is Kind.FULL,
            )
            for g, group in enumerate(config.groups)
        ]
        # `plan_quiet`'s view of the groups: (index, group, block size, whether it releases,
        # whether it holds state, speculative blocks)
        self._quiet_groups = [
            (
                g,
                group,
                group.block_size,
                first_release(group, 0) is not None,
                group.kind is Kind.MAMBA,
                group.speculative_blocks,
            )
            for g, group in enumerate(config.groups)
            if group.kind is not Kind.CROSS
        ]

    def changes(self, request: Request) -> tuple[Released, list[Sequence[int]]]:
        """What computing the scheduled tokens changes in the tables: the (group, position,
        block) entries released, latest position first (ALLOC-SKIP-1), and per group the
        positions written that hold no block yet (ALLOC-WRITE-1).

        Implements ALLOC-HOLD-1, ALLOC-SKIP-1 and ALLOC-WRITE-1 (with groups.first_read and
        groups.first_written), and CKPT-INNER-1 (a chunk's inner checkpoint is written too).
        Only positions that can change are visited: past the new end (a shrunk lookahead),
        from the first position still held up to the first one still read, and the written
        range: a decode step visits one or two positions per group."""
        released: list[tuple[int, int, int]] = []
        # positions as ranges where they run on: a request grown by far more than the pool
        # holds is then counted (and refused Waiting) without a list of its positions
        wanted: list[Sequence[int]] = []
        computed = request.computed
        in_flight = computed + request.scheduled
        attention_end = in_flight + request.lookahead
        # a chunk scheduled behind the one in flight moves the running state further
        state_end = max(in_flight, request.pipelined)
        limit = self.config.max_model_len
        for g, group, block_size, state, keeps_all in self._change_groups:
            if group is None:  # cross attention
                wanted.append(NO_POSITIONS)
                continue
            end = state_end if state else attention_end
            last = (
                table_end(group, end, request.decoding, limit) if state else -(-end // block_size)
            )
            table = request.tables[g]
            size, low = len(table), request.held_from[g]
            # the blocks of inner checkpoints not registered yet (a chunk in flight or
            # scheduled behind it saves them) stay held until their step ends
            saving = (
                {checkpoint_position(block_size, q, in_flight) for q in request.checkpoints}
                if request.checkpoints and state and group.mode is MambaMode.ALIGN
                else ()
            )
            if size > last or (low < last and not keeps_all):
                # a state group reads where the chunk in flight starts, whatever follows it
                first = first_read(group, computed, in_flight if state else end)
                for j in range(size - 1, max(last, low) - 1, -1):
                    if table[j] != NULL_BLOCK and j not in saving:
                        released.append((g, j, table[j]))
                for j in range(min(first, last, size) - 1, low - 1, -1):
                    if table[j] != NULL_BLOCK and j not in saving:
                        released.append((g, j, table[j]))
            first = first_written(group, computed, end)
            held = min(last, size)
            if first >= held:
                wanted.append(range(first, last) if first < last else NO_POSITIONS)
            else:
                gaps = [j for j in range(first, held) if table[j] == NULL_BLOCK]
                growth = range(held, last) if held < last else NO_POSITIONS
                wanted.append(Positions(gaps, growth) if gaps and growth else gaps or growth)
            if saving:
                new = [j for j in saving if j >= size or table[j] == NULL_BLOCK]
                if new:
                    wanted[-1] = sorted({*wanted[-1], *new})
        return released, wanted

    def to_reach(self, request: Request, tokens: int) -> int:
        """How many new blocks `request` takes to have its first `tokens` tokens computed in
        one step from where it is (ALLOC-WRITE-1's positions, nothing allocated)."""
        token_count(tokens)
        before = (request.scheduled, request.lookahead)
        request.scheduled = max(0, min(tokens, len(request.tokens)) - request.computed)
        request.lookahead = max(0, tokens - request.computed - request.scheduled)
        try:
            return wanted_count(self.changes(request)[1])
        finally:
            request.scheduled, request.lookahead = before

    def to_hold(self, request: Request, tokens: int) -> int:
        """How many new blocks `request` holds at once when it has computed its first
        `tokens` tokens in steps of its current chunk: every position its last step keeps
        (ALLOC-HOLD-1) that holds no block now. A window has released the earlier ones by
        then, so a long prompt fits where its whole table would not."""
        token_count(tokens)
        start = max(request.computed, tokens - max(request.scheduled, 1))
        count = 0
        limit = self.config.max_model_len
        for g, group, _, _, _ in self._change_groups:
            if group is None:  # cross attention
                continue
            table = request.tables[g]
            low = first_read(group, start, tokens)
            high = table_end(group, tokens, request.decoding, limit)
            held = min(high, len(table))
            count += max(0, high - max(low, held)) + table[low:held].count(NULL_BLOCK)
        return count

    def holds_slots(self, request: Request, end: int, pipelined: int) -> bool:
        """Whether every group already holds a block at each position ALLOC-WRITE-1 would ask
        for: attention groups up to `end` tokens, state groups at the running state of a
        chunk ending at `pipelined` (when that lies past the chunk in flight). A table's held
        positions from the first one still read are contiguous (windows release a prefix, a
        shrunk lookahead a suffix, and allocation fills gaps), so the last needed position
        holding a block is enough."""
        in_flight = request.computed + request.scheduled
        limit = self.config.max_model_len
        for g, group, _, state, _ in self._change_groups:
            if group is None or (state and pipelined <= in_flight):  # cross attention
                continue
            table = request.tables[g]
            last = table_end(group, pipelined if state else end, request.decoding, limit) - 1
            if last >= len(table) or table[last] == NULL_BLOCK:
                return False
        return True

    def lacks_slot(self, request: Request, end: int) -> int | None:
        """The first group whose table holds no slot for token `end - 1` (None: all do)."""
        for g, group, size, _, _ in self._change_groups:
            if group is not None and len(request.tables[g]) * size < end:
                return g
        return None

    def plan_quiet(self, request: Request) -> None:
        """Set the bounds within which a decode step changes no table, so that `extend` only
        appends its tokens. A step computing [c, e) with slots up to e + L (lookahead) keeps
        the tables as they are when, per group: every position ALLOC-WRITE-1 asks for holds a
        block already, below the first position from c on that holds none (an attention
        group's up to e + L; a state group's up to its chunk's end, the later of e and where a
        chunk reserved earlier ends, `pipelined`, taken as decoding for ALLOC-SPEC-1, whose
        max_model_len cap only lowers it); an attention group holds no position past them (a
        shrunk lookahead would release it; a state group's positions only grow with its end);
        and c is below the first `computed` whose step no longer reads the first held position
        (ALLOC-HOLD-1, ALLOC-SKIP-1; asked of e > c, so that one bound covers it). And e stays
        within max_model_len. The bounds depend on neither the lookahead nor `pipelined`, so a
        `reserve` that changes no table keeps them. An open inner checkpoint's block is held
        already and neither path drops it."""
        slots = state_end = TOKEN_LIMIT
        end, slots_floor = self.config.max_model_len or TOKEN_LIMIT, 0
        computed = request.computed + request.scheduled
        tables, lows = request.tables, request.held_from
        for g, group, size, releases, state, spare in self._quiet_groups:
            table = tables[g]
            held = len(table)
            p = computed // size  # the first position from c on that holds no block
            while p < held and table[p] != NULL_BLOCK:
                p += 1
            if not state:  # an attention group holds up to cdiv(e + L, B) positions
                top = held
                while top and table[top - 1] == NULL_BLOCK:  # past the last one held
                    top -= 1
                slots = min(slots, p * size)
                slots_floor = max(slots_floor, (top - 1) * size + 1)
            else:  # cdiv(e + S, B) + S positions, or cdiv(e, B) without speculative blocks
                state_end = min(state_end, (p - spare) * size - spare if spare else p * size)
            if releases and lows[g] < held:
                release = first_release(group, lows[g])
                if release is not None:
                    end = min(end, release)
        request.quiet_end = min(end, slots, state_end)  # e is at most its slots' end
        request.quiet_state = state_end
        request.quiet_slots, request.quiet_slots_floor = slots, slots_floor

    def check_checkpoint(
        self,
        computed: int,
        end: int,
        checkpoint: object,
        decoding: bool = False,
        prefill: bool = False,
    ) -> None:
        """CKPT-INNER-1's placement: a block boundary of every state group in mode align (one
        at least) strictly inside the chunk [computed, end), past the position the chunk
        reads its state from, or in a decode chunk of a group with speculative blocks at
        that position too (ALLOC-SPEC-2: the drafts' verification copied the state there);
        or CKPT-INNER-2's: under `unit U`, in a prefill chunk (not `decoding`, or `prefill`: an
        admission's, whose drafts' positions lie past its running one), a multiple of U inside
        a block, saved before the running position, past the one read."""
        unit = self.config.hit_unit
        inside = unit is not None and (prefill or not decoding)
        if type(checkpoint) is not int or not computed < checkpoint < end:
            raise RequestStateError(
                f"checkpoint {checkpoint!r} is not strictly inside the chunk "
                f"[{computed}, {end}); name a block boundary inside it, or 0 for none"
            )
        aligned = [
            (g, group.block_size, decoding and group.speculative_blocks > 0)
            for g, group in enumerate(self.config.groups)
            if group.kind is Kind.MAMBA and group.mode is MambaMode.ALIGN
        ]
        if not aligned:
            raise RequestStateError("a checkpoint needs a state group in mode align; pass 0")
        for g, size, copied in aligned:
            if inside and checkpoint % size and not checkpoint % (unit or 1):
                read = (computed - 1) // size if computed else -1
                if checkpoint_position(size, checkpoint, end) > read:
                    continue
                raise RequestStateError(
                    f"checkpoint {checkpoint} cannot be saved by the chunk [{computed}, {end}) "
                    f"in state group {g} (B={size}): the position before its running one, "
                    f"{checkpoint_position(size, checkpoint, end)}, holds the state the chunk "
                    "reads; pass 0 (stop a chunk there instead)"
                )
            if copied:
                low = ((computed - 1) // size + 1) * size
            else:
                low = ((computed - 1) // size + 2) * size if computed else size
            if checkpoint % size or checkpoint < low:
                raise RequestStateError(
                    f"checkpoint {checkpoint} is not a block boundary of state group {g} "
                    f"(B={size}) at or after {low}, the first one past the position the chunk "
                    f"[{computed}, {end}) reads its state from; name such a boundary, or 0"
                    + (
                        f" (or, in a prefill chunk, a multiple of U={unit} inside a block)"
                        if inside
                        else ""
                    )
                )
