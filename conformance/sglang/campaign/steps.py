"""SGLang 0.5.23's pieces the campaign's loop plays, imported once, and the stand-ins that
let them run on CPU. SGLang is imported only when they are called, so the campaign's
engine-free parts import without it."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import types
from collections.abc import Iterator
from functools import cache
from importlib.metadata import version
from typing import Any

from kvcert.conformance.contract.protocol import EngineError
from kvcert.conformance.sglang import unified


def other_steps() -> str | None:
    """Why this release's request steps are not the ones kvcert plays (0.5.23's), or None."""
    unified.api()  # stands in for what cannot be imported on CPU, publishes nothing yet
    common = importlib.import_module("sglang.srt.mem_cache.common")
    if hasattr(common, "checkpoint_kv_cache"):
        return None
    return (
        f"kvcert plays SGLang 0.5.23's request steps; {version('sglang')} has others "
        "(cache_unfinished_req, no checkpoint_kv_cache)"
    )


@cache
def sglang() -> types.SimpleNamespace:
    problem = other_steps()
    if problem is not None:
        raise EngineError(
            f"{problem}: run it in the 0.5.23 venv (scripts/engine-venv.sh sglang 0.5.23)"
        )
    batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    policy = importlib.import_module("sglang.srt.managers.schedule_policy")
    common = importlib.import_module("sglang.srt.mem_cache.common")
    spec = importlib.import_module("sglang.srt.speculative.spec_info")
    results = importlib.import_module(
        "sglang.srt.managers.scheduler_components.batch_result_processor"
    )
    ratio = importlib.import_module(
        "sglang.srt.managers.scheduler_components.new_token_ratio_tracker"
    )
    runtime = importlib.import_module("sglang.srt.runtime_context")
    return types.SimpleNamespace(
        SchedulerBatchResultProcessor=results.SchedulerBatchResultProcessor,
        ScheduleBatch=batch.ScheduleBatch,
        PrefillAdder=policy.PrefillAdder,
        SchedulePolicy=policy.SchedulePolicy,
        AddReqResult=policy.AddReqResult,
        NewTokenRatioTracker=ratio.NewTokenRatioTracker,
        checkpoint_kv_cache=common.checkpoint_kv_cache,
        release_kv_cache=common.release_kv_cache,
        mamba_track_grid=runtime.mamba_track_grid,
        get_schedule=runtime.get_schedule,
        NONE=spec.SpeculativeAlgorithm.NONE,
        EAGLE=spec.SpeculativeAlgorithm.EAGLE,
    )


MAMBA_CHUNK = 64  # the GDN kernel's chunk (FLA's CHUNK_SIZE; the server's mamba chunk size)


def model_config(context_len: int, vocab_size: int = 1000) -> types.SimpleNamespace:
    """The model config ScheduleBatch reads: a decoder-only text model of `context_len`
    tokens whose Mamba layers (if any) run the GDN kernel's chunk."""
    return types.SimpleNamespace(
        vocab_size=vocab_size,
        is_encoder_decoder=False,
        context_len=context_len,
        hf_config=None,
        hf_text_config=types.SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK),
        is_multimodal=False,
        is_matryoshka=False,  # 0.5.9 asks: not an embedding model
    )


def states_per_row(extra_buffer: bool, overlap: bool, lazy: bool = False) -> int:
    """The Mamba states the server sizes its pool with per running request (its
    configurator caps max_running_requests at the pool size over this ratio): a base for
    the running state and the tree's, plus the extra buffer's track slots (one
    synchronously, two under overlap scheduling, one in the lazy variant)."""
    configurator = importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator")
    sizing = importlib.import_module("sglang.srt.mem_cache.allocation_sizing")
    tracking = sizing.get_mamba_tracking_slots(
        extra_buffer=extra_buffer, overlap=overlap, lazy=lazy
    )
    return int(configurator.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO) + int(tracking)


@contextlib.contextmanager
def host_memory_unpinned() -> Iterator[None]:
    """Tensor.pin_memory as the identity: the extra buffer's decode step pins its track mask
    unconditionally, which raises without an accelerator; pinning only speeds up a copy to
    one, so on CPU the tensor itself is the answer."""
    tensor = unified.api().torch.Tensor
    pin = tensor.pin_memory
    tensor.pin_memory = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        tensor.pin_memory = pin


def result_steps(sg: types.SimpleNamespace, tree: Any) -> Any:
    """The scheduler as BatchResultProcessor's per-request step sees it: SGLang's own methods
    for the Mamba bookkeeping and the release, on a scheduler without disaggregation,
    speculative decoding, MoE routing capture or multimodal inputs."""
    processor = sg.SchedulerBatchResultProcessor
    borrowed = {
        name: inspect.getattr_static(processor, name)
        for name in (
            "_handle_finish_state_updated_req",
            "_mamba_prefix_cache_update",
            "_mamba_can_cache_finished_req",
            "_mamba_check_track_boundary",
            "_mamba_assert_committed_len_lookahead",
            "mamba_lazy_post_decode_at_boundary",
            "_prepare_kv_cache_release",
        )
    }
    nothing = staticmethod(lambda *args: None)
    quiet = dict.fromkeys(
        ("_maybe_collect_routed_experts", "_maybe_collect_indexer_topk",
         "_maybe_collect_customized_info"),
        nothing,
    )  # fmt: skip
    steps = type("ResultSteps", (), {**borrowed, **quiet})()
    steps.tree_cache = tree
    steps.draft_worker = None
    steps.model_worker = None
    steps.decode_offload_manager = None
    return steps
