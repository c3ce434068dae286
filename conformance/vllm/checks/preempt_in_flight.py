"""vLLM's own Scheduler serves KV that no forward pass wrote, after a same-step preemption.

Run in a vLLM release venv (`scripts/engine-venv.sh vllm 0.33.0`):

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.preempt_in_flight \
        [priority|fcfs] [--kvcert]

The scheduler is vLLM's (`vllm.v1.core.sched.scheduler.Scheduler`, prefix caching on, its
defaults otherwise); only the model runner is played, by a ledger that records which token
each forward pass writes into each KV slot. Every step checks that each scheduled request's
already-computed tokens sit in the slots its block table names. On 0.33.0, priority policy:

    block size 16, 8 usable blocks, 48 tokens per step, prefill chunks of at most 32 when
    two requests compete
    step 1  X (priority 1), prompt of 112 tokens, alone: computes [0, 48), blocks 1 2 3
    step 2  Y (priority 0), prompt of 16, arrives; X computes [48, 80) in blocks 4 5; Y its
            prompt; 2 blocks stay free
    step 3  X is scheduled [80, 112) and gets blocks 7 8, which allocate_slots registers in
            the prefix cache; then Y's decode needs a block, none is free, and the scheduler
            preempts X, the lowest priority, although it already scheduled X in this step.
            X's blocks return to the free queue with their hashes; Y takes block 8.
    step 4  X is resumed: its lookup hits 96 tokens, blocks 1 2 3 4 5 7, and block 7
            (positions 80..95) was never written: X's step-3 chunk never ran.

Exit 1 when reproduced (0.15.0 to 0.33.0 all reproduce it; releases before 0.33 chunk a lone
prefill at 32, so the script also tries a pool of 7). `fcfs` is the control: FCFS preempts
the last running request, never one scheduled earlier in the step; on 0.33.0 it preempts and
resumes Y and the ledger finds every read sound (exit 0). On older releases the FCFS sequence
never preempts and resumes anyone (exit 2), so the control is established on 0.33.0 only.

Known upstream: open pull request vllm#43569 describes this mechanism (eager registration in
allocate_slots survives an uncommitted free) and rolls the registrations back; vllm#56525 and
#57580 concern the Mamba/state-group variant. This script adds a deterministic replay through
the unmodified Scheduler on every pinned release, checked by the ledger.
"""

from __future__ import annotations

import inspect
import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvcert.conformance.vllm import runtime

BLOCK = 16


def make_scheduler(usable_blocks: int, policy: str, cls: type = Scheduler) -> Scheduler:
    config = runtime.engine_config(
        runtime.Settings(
            max_len=1024,
            block_size=BLOCK,
            budget=48,
            long_prefill=32,
            max_num_seqs=8,
            policy=policy,
            # vLLM's default for its own Scheduler; kvcert's synchronous Scheduler says so
            # (its AsyncScheduler serves async scheduling)
            async_scheduling=None if cls is Scheduler else False,
        )
    )
    config.cache_config.num_gpu_blocks = usable_blocks + 1  # what the engine core sets
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=16, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=usable_blocks + 1,  # + vLLM's null block
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )
    return cls(config, kv_cache, StructuredOutputManager(config), block_size=BLOCK)


def request(rid: str, tokens: list[int], priority: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    kwargs = {"priority": priority, "block_hasher": get_request_block_hasher(BLOCK, sha256)}
    if "eos_token_id" in inspect.signature(Request.__init__).parameters:  # <= 0.16
        kwargs["eos_token_id"] = None
    return Request(rid, tokens, params, None, **kwargs)


class Ledger:
    """The model runner's writes: slot (block, offset) -> the token whose KV it holds."""

    def __init__(self) -> None:
        self.slots: dict[tuple[int, int], int] = {}

    def forward(self, scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
        ids = list(output.num_scheduled_tokens)
        for rid in ids:
            req = scheduler.requests[rid]
            (table,) = scheduler.kv_cache_manager.get_block_ids(rid)
            start = req.num_computed_tokens - output.num_scheduled_tokens[rid]
            for p in range(start, req.num_computed_tokens):
                self.slots[(table[p // BLOCK], p % BLOCK)] = req.all_token_ids[p]
        sampled = [
            [7]
            if scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens
            else []
            for rid in ids
        ]
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )

    def unwritten(self, scheduler: Scheduler, rid: str, computed: int) -> list[int]:
        """Positions below `computed` whose slot does not hold the request's token."""
        req = scheduler.requests[rid]
        (table,) = scheduler.kv_cache_manager.get_block_ids(rid)
        return [
            p
            for p in range(computed)
            if self.slots.get((table[p // BLOCK], p % BLOCK)) != req.all_token_ids[p]
        ]


def play(usable_blocks: int, policy: str, cls: type = Scheduler) -> int:
    """The steps above on a pool of `usable_blocks`, run until both requests finish; every
    step checks each scheduled request's already-computed tokens against the ledger.
    Returns 1 when a request reads a slot no forward pass wrote with its token, 0 when some
    request was preempted and resumed and every read was sound, 2 when none was resumed."""
    scheduler = make_scheduler(usable_blocks, policy, cls)
    ledger = Ledger()
    x = request("X", list(range(1000, 1112)), priority=1, max_tokens=4)
    y = request("Y", list(range(2000, 2016)), priority=0, max_tokens=2)
    scheduler.add_request(x)
    resumed: set[str] = set()
    for step in range(1, 13):
        if step == 2:
            scheduler.add_request(y)
        if not scheduler.requests:
            break
        output = scheduler.schedule()
        scheduled = dict(output.num_scheduled_tokens)
        held = scheduler.kv_cache_manager.get_block_ids("X") if "X" in scheduler.requests else ()
        print(
            f"step {step}: scheduled {scheduled}; X preemptions {x.num_preemptions}, "
            f"X blocks {list(held[0]) if held else []}"
        )
        for rid, count in scheduled.items():
            if scheduler.requests[rid].num_preemptions:
                resumed.add(rid)
            computed = scheduler.requests[rid].num_computed_tokens - count
            bad = ledger.unwritten(scheduler, rid, computed)
            if bad:
                print(
                    f"REPRODUCED: {rid} resumes with {computed} computed tokens, but positions "
                    f"{bad[0]}..{bad[-1]} ({len(bad)} tokens) were never written by any "
                    "forward pass"
                )
                return 1
        scheduler.update_from_output(output, ledger.forward(scheduler, output))
    if not resumed:
        print("no request was preempted and resumed: the sequence did not play out")
        return 2
    print(f"{sorted(resumed)} preempted and resumed; every slot read held its token: sound")
    return 0


def main() -> int:
    """`python preempt_in_flight.py [priority|fcfs] [--kvcert]`: exit 1 reproduced, 0 not,
    2 not played. `--kvcert`: the same through kvcert.reference.vllm's Scheduler (vLLM's
    scheduling, kvcert's allocator), which registers blocks only when their step's output
    arrives: X's resumed lookup cannot find block 7.

    Releases chunk differently (0.33 lets a lone prefill use the whole budget), so the pool
    that leaves Y's decode without a block is 8 blocks on 0.33 and 7 before; try both."""
    args = [a for a in sys.argv[1:] if a != "--kvcert"]
    policy = args[0] if args else "priority"
    cls: type = Scheduler
    if "--kvcert" in sys.argv[1:]:
        # the drop-in serves 0.33 only; the replay also runs on releases it does not import on
        from kvcert.reference.vllm import Scheduler as KvcertScheduler  # noqa: PLC0415

        cls = KvcertScheduler
    init_none_hash(sha256)
    for usable_blocks in (8, 7):
        print(f"-- {policy} scheduling, pool of {usable_blocks} blocks, {cls.__module__}")
        result = play(usable_blocks, policy, cls)
        if result != 2:
            return result
    return 2


if __name__ == "__main__":
    sys.exit(main())
