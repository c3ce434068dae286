"""Broken twins for the campaign's oracle: each switches off one safeguard, of vLLM's prefix
cache (`kvcert fuzz --mutant NAME`) or of kvcert's manager (`--kvcert --mutant NAME`), so the
ledger must find a violation where the real code is sound. A campaign that finds nothing
proves little unless it is seen to fail where it should: CI requires each twin to be caught
(kvcert.conformance.vllm.campaign.check); each function says what its twin breaks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kvcert.conformance.vllm import runtime
from kvcert.reference import tables as planning
from kvcert.reference.config import GroupConfig, Kind, MambaMode
from kvcert.reference.groups import first_read, table_end
from kvcert.reference.vllm.checkpoints import RunnerCheckpoints


def _no_eagle_drop(wired: Any) -> None:
    """The hybrid coordinator drops no block of an EAGLE group's hit, so a hit ending at a
    block boundary keeps draft KV computed from the next token of whichever request wrote it
    (the `drop` keying)."""
    scheduler = wired.scheduler
    coordinator = scheduler.kv_cache_manager.coordinator
    if hasattr(coordinator, "drop_eagle_group_ids"):  # 0.33
        coordinator.drop_eagle_group_ids = set()
    for manager in coordinator.single_type_managers:
        manager.use_eagle = False
    coordinator.use_eagle = False
    scheduler.kv_cache_manager.use_eagle = False


def _no_lookahead_hashes(wired: Any) -> None:
    """Requests hashed without the drafter's next tokens (0.33's default `exact` keying),
    with the same consequence as no-eagle-drop."""
    v = runtime.vllm()
    wired.hasher = v.utils.get_request_block_hasher(wired.hash_block, v.sha256)


def _no_aligned_split(wired: Any) -> None:
    """The scheduler cuts prefill chunks without Mamba align mode's block alignment, so a full
    block can be cached holding the running state of a position inside it."""
    wired.scheduler.need_mamba_block_aligned_split = False


def _without_compiled_lane(wired: Any) -> None:
    """Turn the core's compiled decode lane off (the drop-in's compiled calls then pass to
    the Python methods too): a twin that breaks a Python definition the lane computes for
    itself must run on that definition everywhere, not mixed with the lane's correct one."""
    core = wired.scheduler.kv_cache_manager.core
    core._lane, core._lane_registers = None, False


def _kvcert_state_source_released(wired: Any) -> None:
    """ALLOC-HOLD-1 as kvcert stated it before 2026-11-24: a state group in align mode holds
    only its running state's position, releasing the one vLLM's runner copies the state from
    (the hit's checkpoint, or the previous step's running state) before that copy runs. The
    core's compiled decode lane is turned off first: it plans a state group's decode steps
    with its own first_read."""
    _without_compiled_lane(wired)

    def running_state_only(group: GroupConfig, computed: int, end: int) -> int:
        if group.kind is Kind.MAMBA and group.mode is not MambaMode.ALL:
            return -(-end // group.block_size) - 1
        return first_read(group, computed, end)

    vars(planning)["first_read"] = running_state_only  # this process only


def _kvcert_tables_without_nulls(wired: Any) -> None:
    """The blocks handed to a running request leave out the null blocks of skipped positions,
    so the runner's append-only table shifts them into the wrong columns (a state group skips
    every column but its last)."""
    manager = wired.scheduler.kv_cache_manager
    handed_out = manager._handed_out

    def compacted(rid: str, result: Any) -> Any:
        blocks = handed_out(rid, result)
        if blocks is None:
            return None
        groups = tuple([b for b in group if not b.is_null] for group in blocks.blocks)
        return manager.create_kv_cache_blocks(groups)

    manager._handed_out = compacted


def _kvcert_checkpoint_a_block_early(wired: Any) -> None:
    """The inner checkpoint passed to the allocator is one block before the one vLLM's runner
    saves (a column index taken for a boundary): kvcert holds and registers a block the
    runner never writes."""
    manager = wired.scheduler.kv_cache_manager
    runner = manager._runner_checkpoints
    if runner is None:
        return

    class Early(RunnerCheckpoints):
        def checkpoint(
            self, request: Any, start: int, end: int, unit: int | None, retention: int | None
        ) -> int:
            position = super().checkpoint(request, start, end, unit, retention)
            block_size = next(group[0] for group in self.state_groups if group is not None)
            return position - block_size if position - block_size > start else position

    manager._runner_checkpoints = Early(**vars(runner))


def _kvcert_no_draft_state_blocks(wired: Any) -> None:
    """ALLOC-SPEC-1 forgotten: a decode chunk holds its running state's block only, and the
    integration's own check of the runner's columns is off, so the oracle must catch it. The
    core's compiled decode lane is turned off first: it plans a state group's decode steps
    itself (its own table_end), which would mix the mutant's tables with correct ones."""
    _without_compiled_lane(wired)

    def running_state_only(
        group: GroupConfig, end: int, decoding: bool, limit: int | None = None
    ) -> int:
        return table_end(group, end, False, limit)  # every chunk as a prefill one

    vars(planning)["table_end"] = running_state_only  # this process only
    vars(wired.scheduler.kv_cache_manager)["_check_runner_columns"] = lambda *_: None


def _kvcert_draft_reach_ignored(wired: Any) -> None:
    """HASH-DRAFT-1 and ALLOC-COMMIT-1 with the drafter's reach forgotten: a multi-module MTP
    drafter's blocks keyed and registered as an EAGLE head's (one token ahead), which is
    what lifting the integration's old refusal without passing the reach would do."""
    manager = wired.scheduler.kv_cache_manager
    config = manager.core.config
    if config.draft_reach > 1:  # before any request: the allocator starts afresh
        manager.core = type(manager.core)(dataclasses.replace(config, draft_reach=1))


def _kvcert_block_multiple_unregistered(wired: Any) -> None:
    """ALLOC-COMMIT-1 off by one at block multiples: a full-attention block whose chunk ends
    exactly at its end is passed over and never registered (a checkpoint skipped at an exact
    block multiple). Every read stays sound; only later hits are lost, which the
    completeness oracle must catch. The core's compiled decode lane is turned off first:
    it registers and publishes decode chunks' blocks itself, which would pass the mutant by
    (the Python registrar it stands for is the definition, so nothing else changes)."""
    _without_compiled_lane(wired)
    registrar = wired.scheduler.kv_cache_manager.core._commits
    register_run = registrar._register_run

    def skipping(pool: Any, rid: str, request: Any, g: int, positions: range) -> int:
        group = registrar.config.groups[g]
        ends_here = positions.stop * group.block_size == request.computed
        if group.kind is Kind.FULL and ends_here:
            registered = int(
                register_run(pool, rid, request, g, range(positions.start, positions.stop - 1))
            )
            request.registered[g] = positions.stop  # passed over for good
            return registered
        return int(register_run(pool, rid, request, g, positions))

    registrar._register_run = skipping


def _kvcert_retention_one_block_short(wired: Any) -> None:
    """RET-SPARSE-2 one block short: each bounded group's kept positions (sparse retention,
    or dense where a block no aligned hit reads is masked, spec 0.12.0) lose the lowest of
    the request's table, the first block some retained length's hit needs. Every read stays
    sound; the hits at that length are lost, which the completeness oracle must catch."""
    registrar = wired.scheduler.kv_cache_manager.core._commits
    kept = registrar.kept

    class Short:
        """The registrar's kept positions less the lowest of the request's table."""

        def __init__(self, positions: Any, table: list[int]) -> None:
            self.positions = positions
            self.lowest = next((j for j in range(len(table)) if j in positions), None)

        def __contains__(self, j: object) -> bool:
            return j != self.lowest and j in self.positions

    def short(g: int, request: Any) -> Short | None:
        positions = kept(g, request)
        return None if positions is None else Short(positions, request.tables[g])

    registrar.kept = short


# each changes the wired scheduler or hasher in place
MUTANTS: dict[str, Callable[[Any], None]] = {
    "no-eagle-drop": _no_eagle_drop,
    "no-lookahead-hashes": _no_lookahead_hashes,
    "no-aligned-split": _no_aligned_split,
}
KVCERT_MUTANTS: dict[str, Callable[[Any], None]] = {
    "kvcert-state-source-released": _kvcert_state_source_released,
    "kvcert-tables-without-nulls": _kvcert_tables_without_nulls,
    "kvcert-checkpoint-a-block-early": _kvcert_checkpoint_a_block_early,
    "kvcert-no-draft-state-blocks": _kvcert_no_draft_state_blocks,
    "kvcert-draft-reach-ignored": _kvcert_draft_reach_ignored,
    "kvcert-block-multiple-unregistered": _kvcert_block_multiple_unregistered,
    "kvcert-retention-one-block-short": _kvcert_retention_one_block_short,
}
# what each twin's findings are (`command.finding_role`): an unsound read of the drafter's
# KV, Mamba state or the target's KV, or a lost hit
CAUGHT_AS: dict[str, str] = {
    "no-eagle-drop": "draft",
    "no-lookahead-hashes": "draft",
    "no-aligned-split": "state",
    "kvcert-state-source-released": "state",
    "kvcert-tables-without-nulls": "target",
    "kvcert-checkpoint-a-block-early": "state",
    "kvcert-no-draft-state-blocks": "state",
    "kvcert-draft-reach-ignored": "draft",
    "kvcert-block-multiple-unregistered": "lost",
    "kvcert-retention-one-block-short": "lost",
}
