"""kvcert.reference side by side with vLLM's own KVCacheManager, same workloads, same process.

    bash scripts/engine-venv.sh vllm 0.33.0
    .engines/vllm-0.33.0/bin/python benchmarks/vs_vllm.py [--quick]

Every answer is checked equal before a timing counts; the two sides run alternately, each
time shown is the fastest of its side's runs (this VM's noise only ever adds time), and each
ratio is vLLM's time / the reference's (above 1: the reference is faster), the median over
the back-to-back pairs of runs, which a slow spell of the machine shifts far less.
vLLM is built as a deployment builds it (prefix caching on, KV events off) and driven with
the calls its scheduler makes.

* hash + lookup: a 128k-token prompt, computed and freed before, asks for its hit. vLLM
  builds its Request (the block hasher runs) and calls get_computed_blocks; the reference
  calls lookup(tokens) (validation, digests, search) with its digest memo off, so it hashes
  every block as vLLM does. DeepSeek-V4-Flash-like layout (MLA full B=256, sliding windows
  W=128 at B=64, 64, 4, 8) and GPT-OSS-like (full + W=128, B=16). The "re-sent" row keeps
  the memo on (the default): the prompt was seen before, so its digests are reused after a
  byte comparison.
* lookup alone: a 1M-token prompt already hashed (vLLM: its Request; the reference: a
  Prompt), GPT-OSS-like: get_computed_blocks against lookup_packed(prompt) (the block tables
  as int32 arrays, as vLLM's answer holds block objects that exist already), then against
  lookup(prompt) (tables of Python ints, one made per block).
* stream: benchmarks/run.py's allocate/commit/free stream (requests sharing a system prompt,
  unique tails, decoding, finishing); once with the reference's defaults (the digest memo
  hashes the shared system prompt once) and once with the memo off.
* decode step: 256 running requests of 1,000-token prompts each get one more token per step
  (allocate_slots / extend with the sampled token, then the step's commit), 64 steps, so
  every request crosses four block boundaries.
* hashing: the 128k-token prompt's block keys at 4 tokens, SHA-256 on both sides.
* memory: bytes per cached block, tracemalloc, a pool of 1M blocks holding 1M cached blocks
  (one 16M-token prompt computed and freed; full attention, B=16). Lower is better: the
  ratio is still vLLM / reference.

Each row also shows its floor, measured in the same run: the least any allocator answering
the same calls must spend. Hashing: reading the ids and one SHA-256 pass over their encoding
(a block digest chain over that stream cannot cost less); a prompt seen before: reading its
ids; lookup alone: reading the hit's keys once (int32: `max` compares each), making the
answer's block tables as Python ints (ints); stream and decode: the same calls answered by
a manager doing nothing; memory: the 32-byte digest a cached block is keyed by. ref/floor
says how far the reference is from it (1.0x: at the floor). The lookup and hashing floors
are timed as the reference is, each run right after one of vLLM's
(`side_by_side_with_floor`); the calls-alone floors on their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import math
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

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
from kvcert.conformance.contract.codec import layout_to_json
from kvcert.conformance.vllm.adapter import Session
from kvcert.reference.config import CacheConfig, HashAlgorithm
from kvcert.reference.hashing import Chain, encode_tokens, hasher
from kvcert.reference.keyindex import KEY_SIZE
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.spec import FullAttention, Layout

# workload, size, reference, vLLM, ratio, the row's floor (same unit), what the floor is
Row = tuple[str, str, float, float, float, float, str]


def timed(run: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def side_by_side(
    repeat: int, ours: Callable[[], float], theirs: Callable[[], float]
) -> tuple[float, float, float]:
    """The fastest of `repeat` timings of each side and the median of the per-pair ratios.
    The sides alternate, so a slow spell of the machine hits both runs of a pair; the median
    pair ratio moves far less between runs than the ratio of the two minima."""
    runs = [(ours(), theirs()) for _ in range(repeat)]
    ratios = sorted(t / o for o, t in runs)
    return min(r[0] for r in runs), min(r[1] for r in runs), statistics.median(ratios)


def side_by_side_with_floor(
    repeat: int,
    ours: Callable[[], float],
    theirs: Callable[[], float],
    floor: tuple[Callable[[], object], str],
) -> tuple[float, float, float, float, str]:
    """`side_by_side`, with the floor timed as the reference is: each of its runs right
    after one of vLLM's, which leaves the caches holding vLLM's objects, not the prompt's.
    Timed back to back on its own, the floor read data its previous run had left cached (the
    1M-token lookup's keys: about half its time), so ref/floor compared a search after
    vLLM's run with a warm read. Each round: the reference, vLLM (timed), the floor, vLLM
    again (untimed, so that the next reference run follows one of vLLM's, not the floor's
    read of the same keys)."""
    run, what = floor
    spent: list[float] = []

    def theirs_then_floor() -> float:
        taken = theirs()
        spent.append(timed(run))
        theirs()
        return taken

    reference, vllm, ratio = side_by_side(repeat, ours, theirs_then_floor)
    return reference, vllm, ratio, min(spent), what


class VllmDriver:
    """vLLM's manager behind the call names `stream` uses, as vLLM's scheduler calls it."""

    def __init__(self, layout: Layout, num_blocks: int) -> None:
        self.session = Session(layout_to_json(layout), num_blocks, kv_events=False)
        self.manager = self.session.manager
        self.requests: dict[str, Any] = {}
        self.scheduled: dict[str, int] = {}

    def request(self, rid: str, tokens: list[int]) -> Any:
        return self.session.new_request(rid, tokens, [])

    def admit(self, rid: str, tokens: list[int], budget: int) -> object:
        request = self.request(rid, tokens)
        blocks, hit = self.manager.get_computed_blocks(request)[:2]
        chunk = min(budget, len(tokens) - hit)
        if self.manager.allocate_slots(request, chunk, hit, blocks) is None:
            return None
        request.num_computed_tokens = hit
        self.requests[rid], self.scheduled[rid] = request, chunk
        return Scheduled(hit, chunk, ())

    def extend(self, rid: str, budget: int, appended: list[int]) -> object:
        request = self.requests[rid]
        for token in appended:
            request.append_output_token_ids(token)
        chunk = min(budget, request.num_tokens - request.num_computed_tokens)
        self.scheduled[rid] = chunk
        return self.manager.allocate_slots(request, chunk)

    def end_step(self) -> None:
        for rid, chunk in self.scheduled.items():
            self.requests[rid].num_computed_tokens += chunk
        self.scheduled.clear()
        self.manager.new_step_starts()

    def finish(self, rid: str) -> None:
        self.manager.free(self.requests.pop(rid))
        self.scheduled.pop(rid, None)


def without_memo(config: CacheConfig) -> CacheConfig:
    return dataclasses.replace(config, digest_memo_bytes=0)


def lookup_row(name: str, size: int, memo: bool = False) -> Row:
    """Hash + lookup of a prompt computed and freed before."""
    layout, tokens = LAYOUTS[name], prompt(size)
    blocks = blocks_for(layout, size)
    config = config_of(layout, blocks)
    reference = KVCacheManager(config if memo else without_memo(config))
    warm(reference, tokens)
    driver = VllmDriver(layout, blocks)
    driver.admit("warm", tokens, len(tokens))
    driver.end_step()
    driver.finish("warm")

    def vllm_lookup() -> int:
        return int(driver.manager.get_computed_blocks(driver.request("reader", tokens))[1])

    hit = check_equal("lookup", reference.lookup(tokens)[0], vllm_lookup())
    return (
        f"hash + lookup, {name}" + (", re-sent" if memo else ""),
        f"{size:,} tokens, hit {hit:,}",
        *side_by_side_with_floor(
            11,
            lambda: timed(reference.lookup, tokens),
            lambda: timed(vllm_lookup),
            read_floor(tokens) if memo else hash_floor(tokens),
        ),
    )


def lookup_alone_row(size: int, packed: bool) -> Row:
    """The search alone, the prompt hashed beforehand on both sides; the reference's answer
    as int32 arrays (`lookup_packed`) or as tuples of Python ints (`lookup`)."""
    layout, tokens = LAYOUTS["gpt-oss"], prompt(size)
    blocks = blocks_for(layout, size)
    reference = KVCacheManager(config_of(layout, blocks))
    warm(reference, tokens)
    hashed = reference.prompt(tokens)
    driver = VllmDriver(layout, blocks)
    driver.admit("warm", tokens, len(tokens))
    driver.end_step()
    driver.finish("warm")
    request = driver.request("reader", tokens)

    def vllm_lookup() -> int:
        return int(driver.manager.get_computed_blocks(request)[1])

    answer = reference.lookup_packed if packed else reference.lookup

    def lookup(prompt: Any) -> object:
        # a search each time: the same Prompt asked again of an unchanged cache would get
        # the remembered answer (HitQueries._uncapped), which is not what this row measures
        reference._last_search = None
        return answer(prompt)

    hit, tables = answer(hashed)
    check_equal("lookup alone", (hit, tuple(map(tuple, tables))), reference.lookup(hashed))
    check_equal("lookup alone", hit, vllm_lookup())
    return (
        "lookup alone, gpt-oss (hashed), " + ("int32" if packed else "ints"),
        f"{size:,} tokens, hit {hit:,}",
        *side_by_side_with_floor(
            11,
            lambda: timed(lookup, hashed),
            lambda: timed(vllm_lookup),
            key_floor(hashed.chains, hit, layout.groups[0].block_size)
            if packed
            else table_floor(tables),
        ),
    )


def stream_row(shape: Shape, memo: bool = True) -> Row:
    layout = LAYOUTS["gpt-oss"]
    blocks = blocks_for(layout, shape.system + shape.unique + shape.decode, shape.concurrency + 2)
    config = config_of(layout, blocks)
    if not memo:
        config = without_memo(config)
    prompts = stream_prompts(shape)  # built once: the timings are the managers'
    calls = stream(lambda: KVCacheManager(config), shape, prompts)
    return (
        "allocate/commit/free stream" + ("" if memo else ", memo off"),
        f"{calls:,} calls ({shape.requests} requests)",
        *side_by_side(
            5,
            lambda: timed(stream, lambda: KVCacheManager(config), shape, prompts),
            lambda: timed(stream, lambda: VllmDriver(layout, blocks), shape, prompts),
        ),
        min(timed(stream, NullManager, shape, prompts) for _ in range(5)),
        CALLS_FLOOR,
    )


def decode(manager: Any, requests: int, steps: int) -> None:
    """`steps` decode steps of `requests` running requests, one token each."""
    rids = [f"r{r}" for r in range(requests)]  # an engine holds its requests' ids
    for step in range(steps):
        for rid in rids:
            if manager.extend(rid, 1, [step % 7]) is None:
                raise RuntimeError("decode pool too small")
        manager.end_step()


def decode_row(requests: int, steps: int) -> Row:
    layout = LAYOUTS["gpt-oss"]
    length = 1000
    blocks = blocks_for(layout, length + steps * 5, requests + 1)

    def prefilled(factory: Callable[[], Any]) -> Any:
        manager = factory()
        for r in range(requests):
            manager.admit(f"r{r}", prompt(length, seed=r), length)
        manager.end_step()
        return manager

    def run(factory: Callable[[], Any]) -> float:
        manager = prefilled(factory)
        return timed(decode, manager, requests, steps)

    reference, vllm, ratio = side_by_side(
        5,
        lambda: run(lambda: KVCacheManager(config_of(layout, blocks))),
        lambda: run(lambda: VllmDriver(layout, blocks)),
    )
    check_equal("decode", decode_tables(layout, blocks), decode_tables(layout, blocks, vllm=True))
    floor = min(timed(decode, NullManager(), requests, steps) for _ in range(5))
    return (
        "decode step",
        f"{requests} requests x {steps} steps",
        reference / steps,
        vllm / steps,
        ratio,
        floor / steps,
        CALLS_FLOOR,
    )


def decode_tables(layout: Layout, blocks: int, vllm: bool = False) -> list[int]:
    """How many blocks each request holds after a short decode (both sides must agree)."""
    manager: Any = VllmDriver(layout, blocks) if vllm else KVCacheManager(config_of(layout, blocks))
    for r in range(4):
        manager.admit(f"r{r}", prompt(100, seed=r), 100)
    manager.end_step()
    decode(manager, 4, 40)
    if vllm:
        return [sum(len(g) for g in manager.manager.get_block_ids(f"r{r}")) for r in range(4)]
    return [sum(1 for t in manager.block_tables(f"r{r}") for b in t if b) for r in range(4)]


def hashing_row(size: int) -> Row:
    tokens = prompt(size)
    granularity = math.gcd(*(g.block_size for g in LAYOUTS["deepseek-v4-flash"].groups))
    session = Session(layout_to_json(LAYOUTS["deepseek-v4-flash"]), 8, kv_events=False)
    block_hasher = session.api.utils.get_request_block_hasher(granularity, session.api.sha256)
    request = session.new_request("h", tokens, [])

    def vllm_hash() -> int:
        request.block_hashes = []
        return len(block_hasher(request))

    def reference_hash() -> int:
        chain = Chain(granularity, 0, (), hasher(HashAlgorithm.SHA256))
        chain.extend(tokens)
        return len(chain.digests)

    count = check_equal("hashing", reference_hash(), vllm_hash())
    return (
        "hash prompt (sha256)",
        f"{size:,} tokens, {count:,} keys",
        *side_by_side_with_floor(
            11, lambda: timed(reference_hash), lambda: timed(vllm_hash), hash_floor(tokens)
        ),
    )


def retained_per_block(build: Callable[[], Any], count: int) -> float:
    """Bytes still allocated per cached block after `build()` cached `count` blocks."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (after - before) / count


def memory_row(count: int) -> Row:
    layout = Layout((FullAttention(16),))
    tokens = prompt(16 * count)

    def reference() -> Any:
        manager = KVCacheManager(config_of(layout, count + 1))
        warm(manager, tokens)
        if manager.stats().registered_blocks != count:
            raise RuntimeError("the reference did not cache every block")
        return manager

    def vllm() -> Any:
        driver = VllmDriver(layout, count + 1)
        driver.admit("warm", tokens, len(tokens))
        driver.end_step()
        driver.finish("warm")
        return driver

    ref_bytes = retained_per_block(reference, count)
    vllm_bytes = retained_per_block(vllm, count)
    return (
        "memory per cached block",
        f"{count:,} blocks (bytes, not seconds)",
        ref_bytes,
        vllm_bytes,
        vllm_bytes / ref_bytes,
        float(KEY_SIZE),
        "its key: one 32-byte digest",
    )


# -- each row's floor: what any allocator answering the same call must at least spend ---------

CALLS_FLOOR = "the calls alone (a manager doing nothing)"


def hash_floor(tokens: list[int]) -> tuple[Callable[[], object], str]:
    """Reading the ids once and one SHA-256 pass (C) over their encoding: a chain of block
    digests over the same stream cannot cost less."""
    return (
        lambda: hashlib.sha256(encode_tokens(tokens)).digest(),
        "ids read + one SHA-256 pass (C)",
    )


def read_floor(tokens: list[int]) -> tuple[Callable[[], object], str]:
    """Reading the ids once (packing them, in C): a prompt seen before must at least be read."""
    return lambda: encode_tokens(tokens), "ids read once (C)"


def key_floor(chains: Any, hit: int, block_size: int) -> tuple[Callable[[], object], str]:
    """Reading each key of the hit once (`max` over the digests, in C: one comparison each,
    nothing written): a search must read at least every key it finds served (at
    `block_size`, the full group's blocks). Until stop 83 a join of the digests, which also
    writes what it reads: after vLLM's run it cost more than the search itself."""
    distinct = {id(chain): chain for chain in chains}.values()
    keys = [chain.key(block_size, j) for chain in distinct for j in range(hit // block_size)]
    return lambda: max(keys), "the hit's keys read once (C)"


def table_floor(tables: Any) -> tuple[Callable[[], object], str]:
    """Making the answer: the hit's block tables as Python ints, which lookup returns."""
    packed = [array("i", table) for table in tables]
    return (
        lambda: tuple(tuple(table.tolist()) for table in packed),
        "the hit's tables as Python ints",
    )


class NullManager:
    """The manager calls of a stream or a decode, answered with constants: their floor (one
    answer per budget, made once: building a Scheduled per call would cost more than the
    reference's quiet decode step, which returns a shared one)."""

    def __init__(self) -> None:
        self._answers: dict[int, Scheduled] = {}

    def _answer(self, budget: int) -> Scheduled:
        answer = self._answers.get(budget)
        if answer is None:
            answer = self._answers[budget] = Scheduled(0, budget, ())
        return answer

    def admit(self, rid: str, tokens: list[int], budget: int) -> Scheduled:
        return self._answer(budget)

    def extend(self, rid: str, budget: int, appended: list[int]) -> Scheduled:
        return self._answer(budget)

    def end_step(self) -> None:
        return None

    def finish(self, rid: str) -> None:
        return None


def check_equal(what: str, ours: Any, theirs: Any) -> Any:
    if ours != theirs:
        raise RuntimeError(f"{what}: vLLM answers {theirs}, the reference {ours}")
    return ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    args = parser.parse_args(argv)
    quick = args.quick
    shape = Shape(16, 256, 64, 8, 4) if quick else Shape(200, 2048, 256, 32, 16)
    rows = [
        lookup_row("deepseek-v4-flash", 4096 if quick else 131_072),
        lookup_row("gpt-oss", 4096 if quick else 131_072),
        lookup_row("gpt-oss", 4096 if quick else 131_072, memo=True),
        lookup_alone_row(8192 if quick else 1_048_576, packed=True),
        lookup_alone_row(8192 if quick else 1_048_576, packed=False),
        stream_row(shape),
        stream_row(shape, memo=False),
        decode_row(16 if quick else 256, 16 if quick else 64),
        hashing_row(4096 if quick else 131_072),
        memory_row(10_000 if quick else 1_000_000),
    ]
    print(f"kvcert.reference vs vLLM {version('vllm')} (its own KVCacheManager), same process")
    print(
        f"{'workload':38} {'size':36} {'reference':>11} {'vLLM':>11} {'ratio':>8} "
        f"{'floor':>11} {'ref/floor':>9}  floor is"
    )
    for workload, label, ours, theirs, ratio, floor, what in rows:
        unit = (
            (lambda v: f"{v:9.1f} B")
            if workload.startswith("memory")
            else (lambda v: f"{v * 1e3:9.2f}ms")
        )
        print(
            f"{workload:38} {label:36} {unit(ours)} {unit(theirs)} {ratio:7.2f}x "
            f"{unit(floor)} {ours / floor:8.1f}x  {what}"
        )
    print(
        "times: the fastest run of each side; ratio = vLLM / reference, the median over "
        "back-to-back pairs (bytes per block: the plain quotient); floor: the least any "
        "allocator answering the same calls spends, measured in the same run (the lookup and "
        "hashing floors each right after a vLLM run, as the reference); ref/floor: how far "
        "the reference is from it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
