"""cProfile of the reference on vs_vllm.py's two slowest workloads (no engine needed).

    .venv/bin/python benchmarks/profile_reference.py

Where the reference's time goes, function by function: the allocate/commit/free stream
(per-call Python overhead, mostly admissions' now that decode steps run compiled) and the
128k-token DeepSeek-V4-Flash hash + lookup (one SHA-256 update and digest per 4-token block
of the finest group).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.run import (
    LAYOUTS,
    Shape,
    blocks_for,
    config_of,
    prompt,
    stream,
    stream_prompts,
    warm,
)
from benchmarks.vs_vllm import without_memo
from kvcert.reference.manager import KVCacheManager


def profile_stream(runs: int = 3) -> pstats.Stats:
    shape = Shape(200, 2048, 256, 32, 16)
    layout = LAYOUTS["gpt-oss"]
    blocks = blocks_for(layout, shape.system + shape.unique + shape.decode, shape.concurrency + 2)
    config = config_of(layout, blocks)
    prompts = stream_prompts(shape)  # built before: the profile is the manager's
    stream(lambda: KVCacheManager(config), shape, prompts)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        stream(lambda: KVCacheManager(config), shape, prompts)
    profiler.disable()
    return pstats.Stats(profiler)


def profile_lookup(runs: int = 5) -> pstats.Stats:
    layout, tokens = LAYOUTS["deepseek-v4-flash"], prompt(131_072)
    reference = KVCacheManager(without_memo(config_of(layout, blocks_for(layout, len(tokens)))))
    warm(reference, tokens)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        reference.lookup(tokens)
    profiler.disable()
    return pstats.Stats(profiler)


def main() -> int:
    print("== allocate/commit/free stream, 200 requests (3 runs) ==")
    profile_stream().sort_stats("tottime").print_stats(12)
    print("== hash + lookup, deepseek-v4-flash, 131,072 tokens, memo off (5 runs) ==")
    profile_lookup().sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
