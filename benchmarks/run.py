"""Allocator benchmarks: kvcert.reference against baselines measured in the same run.

    .venv/bin/python benchmarks/run.py            full sizes (about two minutes)
    .venv/bin/python benchmarks/run.py --quick    tiny sizes, a smoke run

Baselines: `naive` (benchmarks/naive.py: list free queue, literal every-length search,
one digest chain per group) at full size, and the executable spec (kvcert.spec.alloc) at a
size it can handle (its keys grow with the prefix, by design). Every figure is a ratio
baseline / reference from the same process; answers are checked equal before timing counts.
Wall-clock figures vary with the machine; the ratios are the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.naive import NaiveManager
from kvcert.conformance.contract.codec import layout_to_json
from kvcert.conformance.engines.reference_engine import config_from_json
from kvcert.reference.config import CacheConfig, HashAlgorithm
from kvcert.reference.hashing import Chain, hasher
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.reference.radix import RadixCacheManager
from kvcert.spec import FullAttention, Layout, SlidingWindow, Speculative, radix
from kvcert.spec import alloc as spec

LAYOUTS = {
    "deepseek-v4-flash": Layout(
        (
            FullAttention(256, name="mla"),
            SlidingWindow(64, 128),
            SlidingWindow(64, 128),
            SlidingWindow(4, 128),
            SlidingWindow(8, 128),
        )
    ),
    "gpt-oss": Layout((FullAttention(16), SlidingWindow(16, 128))),
    "gemma4-dflash": Layout(
        (FullAttention(16), SlidingWindow(32, 1024), FullAttention(64, draft=True)),
        Speculative.DROP,
    ),
}


def config_of(layout, num_blocks, eviction="lru"):
    """A spec layout as the reference's configuration (through the vector JSON)."""
    return config_from_json(layout_to_json(layout), num_blocks, {"eviction": eviction})


def hashing_every_time(config: CacheConfig) -> CacheConfig:
    """The configuration with the digest memo off (a re-sent prompt is hashed again)."""
    return dataclasses.replace(config, digest_memo_bytes=0)


def best(repeat: int, run: Callable[..., object], *args: object) -> float:
    """Median of `repeat` timings of run(*args), in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prompt(length: int, seed: int = 1) -> list[int]:
    return [(seed * 7919 + i * 104729) % 50_000 for i in range(length)]


def blocks_for(layout: Layout, tokens: int, copies: int = 1) -> int:
    per_copy = sum(-(-tokens // g.block_size) for g in layout.groups)
    return per_copy * copies + 64


def warm(manager: KVCacheManager, tokens: list[int]) -> None:
    result = manager.admit("warm", tokens, len(tokens))
    if not isinstance(result, Scheduled):
        raise RuntimeError("the benchmark pool is too small for its own prompt")
    manager.end_step()
    manager.finish("warm")


def spec_lookup_seconds(layout: Layout, tokens: list[int], repeat: int) -> tuple[float, int]:
    config = spec.PoolConfig(layout, blocks_for(layout, len(tokens)))
    state, _ = spec.step(spec.initial_state(config), spec.Admit("w", tuple(tokens), len(tokens)))
    state, _ = spec.step(state, spec.EndStep())
    state, _ = spec.step(state, spec.Finish("w"))
    hit = spec.lookup(state, tuple(tokens), ())[0]
    return best(repeat, spec.lookup, state, tuple(tokens), ()), hit


def lookup_rows(quick: bool) -> list[tuple[str, str, float, str, float]]:
    rows = []
    sizes = {"deepseek-v4-flash": 131_072, "gpt-oss": 32_768, "gemma4-dflash": 32_768}
    spec_size = 256 if quick else 2048
    for name, layout in LAYOUTS.items():
        size = 1024 if quick else sizes[name]
        tokens = prompt(size)
        # the memo off: a repeated lookup must hash, as the baselines do
        reference = KVCacheManager(hashing_every_time(config_of(layout, blocks_for(layout, size))))
        naive = NaiveManager(config_of(layout, blocks_for(layout, size)))
        warm(reference, tokens)
        warm(naive, tokens)
        if reference.lookup(tokens) != naive.lookup(tokens):
            raise RuntimeError(f"{name}: the naive baseline disagrees with the reference")
        repeat = 3
        ref_s = best(repeat, reference.lookup, tokens)
        naive_s = best(1, naive.lookup, tokens)
        rows.append((f"lookup {name}", f"{size} tokens", ref_s, "naive", naive_s))
        small = prompt(spec_size)
        small_ref = KVCacheManager(
            hashing_every_time(config_of(layout, blocks_for(layout, spec_size)))
        )
        warm(small_ref, small)
        spec_s, spec_hit = spec_lookup_seconds(layout, small, 1)
        if spec_hit != small_ref.lookup(small)[0]:
            raise RuntimeError(f"{name}: the spec disagrees with the reference")
        rows.append(
            (
                f"lookup {name}",
                f"{spec_size} tokens",
                best(repeat, small_ref.lookup, small),
                "spec",
                spec_s,
            )
        )
    return rows


class Shape(NamedTuple):
    """A stream: requests sharing a system prompt, each with unique tokens, then decoding."""

    requests: int
    system: int
    unique: int
    decode: int
    concurrency: int


def stream_prompts(shape: Shape) -> list[list[int]]:
    """The stream's prompts, in the order they are admitted from the end."""
    base = prompt(shape.system, seed=3)
    return [base + prompt(shape.unique, seed=100 + r) for r in range(shape.requests)]


def stream(
    factory: Callable[[], object], shape: Shape, prompts: list[list[int]] | None = None
) -> int:
    """Run the stream through a fresh manager; returns the calls made. `prompts`: the
    stream's prompts built beforehand, so a timing measures the manager, not their making."""
    manager = factory()
    waiting = list(stream_prompts(shape) if prompts is None else prompts)
    running: dict[str, int] = {}
    calls = 0
    serial = 0
    while waiting or running:
        while waiting and len(running) < shape.concurrency:
            rid = f"r{serial}"
            serial += 1
            result = manager.admit(rid, waiting.pop(), 1 << 30)  # type: ignore[attr-defined]
            calls += 1
            if not isinstance(result, Scheduled):
                raise RuntimeError("stream pool too small")
            running[rid] = shape.decode
        manager.end_step()  # type: ignore[attr-defined]
        calls += 1
        for rid in list(running):
            if running[rid] == 0:
                manager.finish(rid)  # type: ignore[attr-defined]
                del running[rid]
            else:
                running[rid] -= 1
                manager.extend(rid, 1, appended=[running[rid] % 7])  # type: ignore[attr-defined]
            calls += 1
    return calls


def stream_rows(quick: bool) -> list[tuple[str, str, float, str, float]]:
    """The allocate/commit/free stream: the reference (lru) against the naive baseline and the
    spec; then the hybrid profile's cost against lru and against the spec's hybrid profile."""
    layout = LAYOUTS["gpt-oss"]
    full = Shape(16, 256, 64, 8, 4) if quick else Shape(200, 2048, 256, 32, 16)
    small = Shape(8, 64, 16, 4, 2) if quick else Shape(24, 256, 64, 8, 4)
    plans = [
        ("allocate/commit/free stream", "lru", full, "naive"),
        ("allocate/commit/free stream", "lru", small, "spec"),
        ("stream, hybrid eviction", "hybrid", full, "lru"),
        ("stream, hybrid eviction", "hybrid", small, "spec"),
    ]
    rows = []
    for workload, eviction, shape, baseline in plans:
        length = shape.system + shape.unique + shape.decode
        blocks = blocks_for(layout, length, shape.concurrency + 2)
        reference = partial(KVCacheManager, config_of(layout, blocks, eviction))
        prompts = stream_prompts(shape)
        calls = stream(reference, shape, prompts)
        ref_s = best(3, stream, reference, shape, prompts)
        other = {
            "naive": partial(NaiveManager, config_of(layout, blocks)),
            "lru": partial(KVCacheManager, config_of(layout, blocks)),
            "spec": partial(SpecManager, spec.PoolConfig(layout, blocks, spec.Eviction(eviction))),
        }[baseline]
        size = f"{calls} calls ({shape.requests} requests)"
        rows.append((workload, size, ref_s, baseline, best(1, stream, other, shape, prompts)))
    return [*rows, radix_row(small)]


def radix_row(shape: Shape) -> tuple[str, str, float, str, float]:
    """The radix profile's tree (§13, one full-attention group): kvcert.reference.radix
    against kvcert.spec.radix on the same stream, each served every call (never Waiting)
    and making as many (tests/differential/test_radix.py holds their answers equal)."""
    layout = Layout((FullAttention(16),))
    length = shape.system + shape.unique + shape.decode
    blocks = blocks_for(layout, length, shape.concurrency + 2)
    reference = partial(RadixCacheManager, config_of(layout, blocks, "radix"))
    config = spec.PoolConfig(layout, blocks, spec.Eviction.RADIX)
    baseline = partial(SpecManager, config, radix.initial_state, radix.step)
    prompts = stream_prompts(shape)
    calls = stream(reference, shape, prompts)
    if stream(baseline, shape, prompts) != calls:
        raise RuntimeError("the spec's radix tree disagrees with the reference's")
    size = f"{calls} calls ({shape.requests} requests)"
    return ("stream, radix tree", size, best(3, stream, reference, shape, prompts), "spec",
            best(1, stream, baseline, shape, prompts))  # fmt: skip


class SpecManager:
    """The spec state machine behind the manager's call names (for the stream baseline):
    §6's block pool, or another machine given as its initial state and step (§13's tree)."""

    def __init__(
        self, config: spec.PoolConfig, start: Callable[..., Any] = spec.initial_state,
        step: Callable[..., Any] = spec.step,
    ) -> None:  # fmt: skip
        self.state = start(config)
        self.step = step

    def _do(self, op: spec.Op) -> spec.Observation:
        self.state, observation = self.step(self.state, op)
        return observation  # type: ignore[no-any-return]

    def admit(self, rid: str, tokens: list[int], budget: int) -> object:
        observation = self._do(spec.Admit(rid, tuple(tokens), budget))
        return Scheduled(0, 0, ()) if isinstance(observation, spec.Admitted) else observation

    def extend(self, rid: str, budget: int, appended: list[int]) -> object:
        return self._do(spec.Extend(rid, budget, tuple(appended)))

    def end_step(self) -> object:
        return self._do(spec.EndStep())

    def finish(self, rid: str) -> object:
        return self._do(spec.Finish(rid))


def shared_chain(digest: Callable[[bytes], bytes], tokens: list[int]) -> None:
    Chain(4, 0, (), digest).extend(tokens)


def per_group_chains(digest: Callable[[bytes], bytes], tokens: list[int]) -> None:
    for group in LAYOUTS["deepseek-v4-flash"].groups:
        Chain(group.block_size, 0, (), digest).extend(tokens)


def hashing_rows(quick: bool) -> list[tuple[str, str, float, str, float]]:
    """One gcd-granularity chain for all groups vs one chain per group (DSv4 layout)."""
    tokens = prompt(4096 if quick else 131_072)
    return [
        (
            f"hash prompt ({algorithm.value})",
            f"{len(tokens)} tokens",
            best(3, shared_chain, hasher(algorithm), tokens),
            "per-group chains",
            best(1, per_group_chains, hasher(algorithm), tokens),
        )
        for algorithm in HashAlgorithm
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    args = parser.parse_args(argv)
    rows = lookup_rows(args.quick) + stream_rows(args.quick) + hashing_rows(args.quick)
    print(f"{'workload':34} {'size':32} {'reference':>11} {'baseline':>18} {'ratio':>9}")
    for workload, size, ref_s, baseline, base_s in rows:
        print(
            f"{workload:34} {size:32} {ref_s * 1e3:9.2f}ms {baseline:>9} "
            f"{base_s * 1e3:7.1f}ms {base_s / ref_s:8.1f}x"
        )
    print("ratio = baseline time / reference time, both measured in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
