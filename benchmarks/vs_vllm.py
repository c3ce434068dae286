"""kvcert.reference side by side with vLLM's own KVCacheManager, same workloads, same run.

    bash scripts/engine-venv.sh vllm 0.33.0
    .engines/vllm-0.33.0/bin/python benchmarks/vs_vllm.py [--quick]

Workloads (every answer is checked equal before a timing counts):
* lookup: a request of a 128k-token prompt arrives and asks for its hit on the
  DeepSeek-V4-Flash-like layout (MLA full attention B=256 plus four sliding-window groups of
  B=64, 64, 4, 8 and W=128), after the same prompt was computed and freed. Both sides hash
  the prompt and search: vLLM builds its Request (block hasher) and calls get_computed_blocks;
  the reference calls lookup().
* stream: the allocate/commit/free stream of benchmarks/run.py (requests sharing a system
  prompt, each with unique tokens, decoding, finishing) through both managers, vLLM driven
  with the calls its scheduler makes.
* hashing: the 128k-token prompt's block keys at the layout's common granularity (4 tokens),
  vLLM's request block hasher with its sha256 against the reference's sha256 chain.

Each line prints vLLM's time / the reference's time: above 1 means the reference is faster.
"""

from __future__ import annotations

import argparse
import math
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.run import LAYOUTS, Shape, best, blocks_for, config_of, prompt, stream, warm
from kvcert.conformance.adapters.vllm import Session
from kvcert.conformance.codec import layout_to_json
from kvcert.reference.config import HashAlgorithm
from kvcert.reference.hashing import Chain, hasher
from kvcert.reference.manager import KVCacheManager, Scheduled

DSV4 = LAYOUTS["deepseek-v4-flash"]


class VllmStream:
    """vLLM's manager behind the call names `stream` uses, as vLLM's scheduler calls it."""

    def __init__(self, layout_json: dict[str, Any], num_blocks: int) -> None:
        self.session = Session(layout_json, num_blocks)
        self.manager = self.session.manager
        self.requests: dict[str, Any] = {}
        self.scheduled: dict[str, int] = {}

    def admit(self, rid: str, tokens: list[int], budget: int) -> object:
        request = self.session.new_request(rid, tokens, [])
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


def lookup_row(size: int) -> tuple[str, str, float, float]:
    tokens = prompt(size)
    blocks = blocks_for(DSV4, size)
    reference = KVCacheManager(config_of(DSV4, blocks))
    warm(reference, tokens)
    driver = VllmStream(layout_to_json(DSV4), blocks)
    driver.admit("warm", tokens, len(tokens))
    driver.end_step()
    driver.finish("warm")

    def vllm_lookup() -> int:
        request = driver.session.new_request("reader", tokens, [])
        return int(driver.manager.get_computed_blocks(request)[1])

    ref_hit, vllm_hit = reference.lookup(tokens)[0], vllm_lookup()
    if ref_hit != vllm_hit:
        raise RuntimeError(f"lookup: vLLM hits {vllm_hit}, the reference {ref_hit}")
    ref_s = best(5, reference.lookup, tokens)
    return (
        "hash + lookup, DSv4-Flash layout",
        f"{size} tokens, hit {ref_hit}",
        ref_s,
        best(5, vllm_lookup),
    )


def stream_row(shape: Shape) -> tuple[str, str, float, float]:
    layout = LAYOUTS["gpt-oss"]
    length = shape.system + shape.unique + shape.decode
    blocks = blocks_for(layout, length, shape.concurrency + 2)
    calls = stream(lambda: KVCacheManager(config_of(layout, blocks)), shape)
    ref_s = best(3, stream, lambda: KVCacheManager(config_of(layout, blocks)), shape)
    vllm_s = best(3, stream, lambda: VllmStream(layout_to_json(layout), blocks), shape)
    return (
        "allocate/commit/free stream",
        f"{calls} calls ({shape.requests} requests)",
        ref_s,
        vllm_s,
    )


def hashing_row(size: int) -> tuple[str, str, float, float]:
    tokens = prompt(size)
    granularity = math.gcd(*(g.block_size for g in DSV4.groups))
    session = Session(layout_to_json(DSV4), 8)
    block_hasher = session.api.utils.get_request_block_hasher(granularity, session.api.sha256)
    request = session.new_request("h", tokens, [])

    def vllm_hash() -> int:
        request.block_hashes = []
        return len(block_hasher(request))

    def reference_hash() -> int:
        chain = Chain(granularity, 0, (), hasher(HashAlgorithm.SHA256))
        chain.extend(tokens)
        return size // granularity

    if vllm_hash() != reference_hash():
        raise RuntimeError("hashing: the two sides key a different number of blocks")
    return ("hash prompt (sha256)", f"{size} tokens", best(5, reference_hash), best(5, vllm_hash))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    args = parser.parse_args(argv)
    size = 4096 if args.quick else 131_072
    shape = Shape(16, 256, 64, 8, 4) if args.quick else Shape(200, 2048, 256, 32, 16)
    rows = [lookup_row(size), stream_row(shape), hashing_row(size)]
    print(f"kvcert.reference vs vLLM {version('vllm')} (its own KVCacheManager), same process")
    print(f"{'workload':34} {'size':32} {'reference':>11} {'vLLM':>11} {'ratio':>9}")
    for workload, label, ref_s, vllm_s in rows:
        print(
            f"{workload:34} {label:32} {ref_s * 1e3:9.2f}ms {vllm_s * 1e3:9.2f}ms "
            f"{vllm_s / ref_s:8.2f}x"
        )
    print("ratio = vLLM time / reference time, both measured in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
