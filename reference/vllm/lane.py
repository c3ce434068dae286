"""Which drop-in managers answer vLLM's calls for a decode chunk compiled
(reference/_decodelane_dropin.c).

vLLM's Scheduler calls `allocate_slots` once per running request and step, and kvcert's
scheduler `start_pending` and `end_step` once per step. For a decode chunk the drop-in's
Python methods cost several microseconds a call around the core's decode lane, which itself
takes a fraction of one. The compiled `DropIn` answers such a chunk through the core's lane
directly: one that extends the request (synchronous scheduling), one scheduled behind the
chunk in flight whose slots are held already (asynchronous), the start of such a chunk, and
the end of a step (the core's end_step through the lane, with no events to publish).
Every other call it passes, unchanged, to the Python method, which stays the definition;
kvcert.conformance.vllm.checks.drop_in_lane holds the two equal through vLLM's own Scheduler.

It serves a manager whose core runs its decode lane (kvcert.reference.decode_lane) and that
computes nothing more per chunk than the lane does: no hash view (`vllm_hash_view`), no
runner checkpoints and no drafts' state blocks, and the class's own methods (a subclass
overriding them is served by them). With state groups (a Mamba/GDN hybrid) it serves the
same chunks, each checked after it for the running state's column of every state table, as
`_check_runner_columns` checks it; a chunk that gives a state layout new blocks has them
handed out by the Python `_handed_out`. Else, or unbuilt, or with KVCERT_PURE_PYTHON=1, the
Python methods answer every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.utils import ConstantList

from kvcert.reference.native import native

if TYPE_CHECKING:
    from kvcert.reference.vllm.manager import KVCacheManager

# the drop-in's methods the compiled calls answer (set on the manager, instance-wide)
COMPILED = ("allocate_slots", "start_pending", "end_step")
# the methods the compiled calls stand for, or call back
DEFINITIONS = (
    "allocate_slots",
    "start_pending",
    "end_step",
    "_start_chunk",
    "_check_started",
    "_handed_out",
    "_check_runner_columns",
)


def serves(manager: Any, definitions: type[KVCacheManager]) -> bool:
    """Whether the compiled calls' contract covers `manager` (the module docstring's list);
    `definitions`: the drop-in class whose methods define them."""
    core = manager.core
    return (
        core._lane is not None
        and all(getattr(type(manager), name) is getattr(definitions, name) for name in DEFINITIONS)
        and manager.hash_view is None
        and manager._runner_checkpoints is None
        and not manager._draft_state_block
        and not any(group.speculative_blocks for group in core.config.groups)
    )


def token_list() -> type | None:
    """vLLM's ConstantList (a request's `all_token_ids`) when it slices the list it keeps in
    `_x`, as 0.33.0's does: the compiled calls then slice that list without calling into
    Python; else None, and they slice the sequence as the Python method does."""
    kept = [3, 5, 7]
    probe = ConstantList(kept)
    wraps = getattr(probe, "_x", None) is kept and probe[1:9] == kept[1:9]
    return ConstantList if wraps else None


def install(manager: Any, definitions: type[KVCacheManager]) -> None:
    """Serve `manager`'s allocate_slots, start_pending and end_step compiled where `serves`
    says so, else by the class's methods; called again whenever the manager rebuilds its
    core."""
    for name in COMPILED:
        vars(manager).pop(name, None)
    compiled = native("_decodelane")
    if compiled is None or not serves(manager, definitions):
        return
    drop_in = compiled.DropIn(
        manager=manager,
        general=definitions.allocate_slots,
        pending=definitions.start_pending,
        start_chunk=definitions._start_chunk,
        end_step=definitions.end_step,
        state_columns=tuple((g, size) for g, size, _ in manager._state_columns),
        token_list=token_list(),
    )
    manager.allocate_slots = drop_in
    manager.start_pending = drop_in.start_pending
    manager.end_step = drop_in.end_step
