"""Check kvcert's model of vLLM's page planning against vLLM's own planner.

`kvcert plan --compare` prints what vLLM 0.26-0.33 would plan (`vllm_padded_plan`,
kvcert's own model of that planner), and the project's page-planning figures lean on it. This
runs vLLM's real planner (`get_kv_cache_groups`, `get_kv_cache_config_from_groups`) on the
same bundled models and compares page size, number of blocks and the groups (kind, block
size, how many), model by model:

    .engines/vllm-0.33.0/bin/python -m kvcert.conformance.vllm.checks.plan [--memory GIB]

Models whose layers vLLM would build from kernels we cannot name here (Mamba/GDN state
shapes, DeepSeek-V4 compressed latents) are listed as not compared, with the reason.
Exit 1 when a compared model disagrees.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from typing import Any

from vllm.v1.core.kv_cache_planning import (
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
)
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, KVCacheSpec

from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.conformance.tools.catalog import load_model, model_names
from kvcert.conformance.vllm import runtime
from kvcert.conformance.vllm.layers import NotCompared, kind_of, spec_of
from kvcert.conformance.vllm.planner_model import vllm_padded_plan
from kvcert.spec.plan import PlanInput

GIB = 1 << 30


def vllm_config(block_size: int) -> Any:
    """A config of a weightless tiny model, vLLM's scheduler defaults: the planner reads
    only cache and scheduler."""
    return runtime.engine_config(
        runtime.Settings(
            max_len=4096, block_size=block_size, budget=2048, max_num_seqs=128,
            async_scheduling=None,
        )
    )  # fmt: skip


def real_plan(config: Any, specs: dict[str, KVCacheSpec], memory: int) -> dict[str, Any]:
    # What VllmConfig decides on a GPU (this CPU platform would switch the hybrid manager
    # off): on, except with chunked local attention, where vLLM turns it off by default
    # (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE unset) and allocates those layers
    # as full attention.
    chunked = any(isinstance(spec, ChunkedLocalAttentionSpec) for spec in specs.values())
    config.scheduler_config.disable_hybrid_kv_cache_manager = chunked
    groups = get_kv_cache_groups(config, dict(specs))
    kv = get_kv_cache_config_from_groups(config, groups, memory)
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    return {
        "page_size": max(pages),
        "num_blocks": kv.num_blocks,
        "groups": Counter((kind_of(g.kv_cache_spec), g.kv_cache_spec.block_size) for g in groups),
        "group_size": max(len(g.layer_names) for g in groups),
    }


def modelled_plan(plan_input: PlanInput) -> dict[str, Any] | str:
    plan = vllm_padded_plan(plan_input)
    if "refused" in plan:
        return str(plan["refused"])
    return {
        "page_size": plan["page_size"],
        "num_blocks": plan["num_blocks"],
        "groups": Counter((g["kind"], g["block_size"]) for g in plan["groups"]),
        "group_size": plan["group_size"],
    }


def show(plan: dict[str, Any]) -> str:
    groups = ", ".join(f"{n}x{kind}/{block}" for (kind, block), n in sorted(plan["groups"].items()))
    size = f"page {plan['page_size']} B, {plan['num_blocks']} blocks"
    return f"{size}, g={plan['group_size']}: {groups}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", type=float, default=30.0, help="KV-cache GiB")
    parser.add_argument(
        "--dtypes",
        default="bf16,fp8,int8_per_token_head",
        help="comma-separated KV dtypes",
    )
    args = parser.parse_args()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    memory = int(args.memory * GIB)
    config = vllm_config(16)
    disagree = compared = 0
    for name in model_names():
        model = load_model(name)
        for dtype in args.dtypes.split(","):
            plan_input = plan_input_from_json(
                {"layers": list(model.layers), "kv_cache_dtype": dtype, "memory_bytes": memory}
            )
            try:
                specs = {
                    f"model.layers.{i}.attn": spec_of(layer, plan_input.dtype, 16)
                    for i, layer in enumerate(plan_input.layers)
                }
            except NotCompared as why:
                print(f"--   {name} {dtype}: not compared ({why})")
                continue
            try:
                real = real_plan(config, specs, memory)
            except Exception as error:  # vLLM refusing is an answer too
                real = None
                real_text = f"vLLM refuses: {type(error).__name__}: {error}"
            modelled = modelled_plan(plan_input)
            compared += 1
            if real is None or isinstance(modelled, str):
                same = real is None and isinstance(modelled, str)
                detail = real_text if real is None else show(real)
                mine = modelled if isinstance(modelled, str) else show(modelled)
            else:
                same = real == modelled
                detail, mine = show(real), show(modelled)
            disagree += not same
            print(f"{'ok  ' if same else 'DIFF'} {name} {dtype}: vLLM {detail}")
            if not same:
                print(f"     {'':{len(name) + len(dtype) + 1}}  model {mine}")
    print(f"{compared} compared, {disagree} disagree")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
