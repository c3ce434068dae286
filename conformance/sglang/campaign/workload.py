"""Workloads of the SGLang campaign: what arrives when, drawn from a seed.

Pure and engine-free: a workload is data drawn from its seed. The outputs of the weightless
model are a function of the tokens before them (`next_token`), so a workload can send, while
a request still decodes, a follow-up that repeats the tokens it has produced so far: the case
where a hit on a running request's decoded tokens is owed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass

from kvcert.conformance.campaign.workload import VOCAB  # the campaigns' shared vocabulary

PAGES = (1, 2, 4)  # token slots per page (the server's --page-size)
# The served model: full attention only, or a full-attention + Mamba (GDN) hybrid at page 1,
# which SGLang's `auto` strategy runs without a buffer when it schedules synchronously, or at
# pages 2 and 4 with the extra buffer ("mamba-paged"). The extra buffer saves states only on
# the 64-token kernel chunk grid, so that model's workloads are drawn in units of 16 tokens.
# Or a full-attention + sliding-window hybrid ("swa", GPT-OSS- or Gemma-like), whose window
# is drawn too: short ones, some below the page, so windows slide out within a workload.
# A sliding window beside a Mamba state ("swa-mamba") runs at page 1, without a buffer
# (with the extra buffer under overlap scheduling, as "mamba" does).
MODELS = ("full", "mamba", "mamba-paged", "swa", "swa-mamba")
UNIT = {"full": 1, "mamba": 1, "mamba-paged": 16, "swa": 1, "swa-mamba": 1}
# Under overlap scheduling SGLang runs every Mamba model with the extra buffer, so its
# workloads are drawn on the extra buffer's units too.
OVERLAP_UNIT = {**UNIT, "mamba": UNIT["mamba-paged"], "swa-mamba": UNIT["mamba-paged"]}
# SGLang's sliding_window_size: the tokens before the query a layer reads (W - 1)
WINDOWS = (1, 2, 3, 4, 7, 8)
# SGLANG_SWA_EVICTION_INTERVAL: tokens that slide out of a running request's window before
# its SWA slots are freed, in one go (128 by default, for pools of 10^5 tokens and more;
# the campaign's pools are tens of tokens, so the interval is scaled down with them)
SWA_INTERVALS = (1, 4, 16)
ROWS = 6  # request rows of the pool: the server's max running requests here
# --enable-priority-scheduling: the priorities clients send (larger first, SGLang's default;
# a waiting request preempts running ones more than the default threshold, 10, below it)
# and the fewer rows a priority workload runs in, so the batch fills and preemption is tried
PRIORITIES = (0, 5, 50, 100)
PRIORITY_ROWS = (2, 3, 4)


def next_token(tokens: list[int] | tuple[int, ...]) -> int:
    """What the weightless model samples after `tokens` (greedy: the same prefix, the same
    token), in 1..VOCAB."""
    digest = hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in tokens)).digest()
    return 1 + int.from_bytes(digest[:4], "little") % VOCAB


def outputs(prompt: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The first `count` tokens the model answers `prompt` with."""
    tokens = list(prompt)
    for _ in range(count):
        tokens.append(next_token(tokens))
    return tuple(tokens[len(prompt) :])


@dataclass(frozen=True)
class Arrival:
    """A request joining the waiting queue before the `step`-th scheduling step."""

    step: int
    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int = 0  # under priority scheduling: the request's priority


@dataclass(frozen=True)
class Workload:
    """Everything one campaign run depends on."""

    seed: int
    page: int
    pool_tokens: int  # KV slots of the pool (page multiple; slot 0 padding aside)
    chunk: int  # chunked_prefill_size: tokens of one request's prefill per step
    max_prefill_tokens: int  # the step's prefill token budget
    arrivals: tuple[Arrival, ...]
    model: str = "full"  # one of MODELS
    window: int | None = None  # the SWA models: SGLang's sliding_window_size (W - 1)
    swa_interval: int = 0  # the SWA models: SGLANG_SWA_EVICTION_INTERVAL
    overlap: bool = False  # scheduled as event_loop_overlap (the server's default), or not
    mixed: bool = False  # --enable-mixed-chunk: a prefill batch carries the decode steps too
    # --mamba-radix-cache-strategy extra_buffer_lazy: the extra buffer's second track slot
    # is allocated when a request reaches a checkpoint boundary
    lazy: bool = False
    rows: int = ROWS  # request rows (max running requests)
    # --enable-priority-scheduling: the waiting queue ordered by priority, and a waiting
    # request preempting running ones of lower priority when the batch is full
    priority: bool = False
    # --speculative-algorithm EAGLE (campaign.eagle): bigram keys, spec-v2 decode steps
    eagle: bool = False


def runs_extra_buffer(model: str, page: int, *, overlap: bool) -> bool:
    """Whether SGLang's `auto` strategy runs this model with the extra buffer: a Mamba
    hybrid above page 1 or under overlap scheduling (without a buffer SGLang refuses
    overlap: validate_mamba_no_buffer)."""
    return model in MAMBA_MODELS and (overlap or page > 1)


MAMBA_MODELS = ("mamba", "mamba-paged", "swa-mamba")


def generate(
    seed: int,
    model: str = "full",
    *,
    overlap: bool = False,
    mixed: bool = False,
    priority: bool = False,
) -> Workload:
    """A random workload: requests sharing system prompts, exact repeats, and follow-ups of
    earlier requests (their prompt, some of their answer, more), arriving over a few steps
    into a pool small enough that the tree must evict and running requests retract; under
    `priority` each request has a priority, in fewer rows (drawn last: the same seed draws
    the same requests either way)."""
    rng = random.Random(seed)
    workload = _draw(seed, rng, model, overlap=overlap, mixed=mixed)
    if not priority:
        return workload
    rows = rng.choice(PRIORITY_ROWS)
    arrivals = tuple(
        dataclasses.replace(a, priority=rng.choice(PRIORITIES)) for a in workload.arrivals
    )
    return dataclasses.replace(workload, arrivals=arrivals, rows=rows, priority=True)


def _draw(seed: int, rng: random.Random, model: str, *, overlap: bool, mixed: bool) -> Workload:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    page = rng.choice(PAGES)
    if model in ("mamba", "swa-mamba"):
        page = 1
    elif model == "mamba-paged":
        page = 2 if page < 4 else 4
    unit = (OVERLAP_UNIT if overlap else UNIT)[model]
    systems = [
        tuple(rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 7) * page * unit))
        for _ in range(rng.randrange(1, 4))
    ]
    arrivals: list[Arrival] = []
    for index in range(rng.randrange(3, 11)):
        step = rng.randrange(0, 12)
        kind = rng.random()
        earlier = [a for a in arrivals if a.step <= step]
        if earlier and kind < 0.2:
            prompt = rng.choice(earlier).prompt
        elif earlier and kind < 0.45:
            before = rng.choice(earlier)
            said = outputs(before.prompt, rng.randrange(0, before.max_tokens + 1))
            more = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randrange(0, 6) * unit))
            prompt = before.prompt + said + more
        else:
            system = rng.choice(systems)
            tail_length = rng.randrange(1, 3 * page + 8) * unit
            if unit > 1:  # any length, so decoding can cross a state checkpoint
                tail_length += rng.randrange(unit)
            tail = tuple(rng.randrange(1, VOCAB) for _ in range(tail_length))
            prompt = system[: rng.randrange(0, len(system) + 1)] + tail
        arrivals.append(Arrival(step, f"r{index}", prompt, rng.randrange(1, 9)))
    arrivals.sort(key=lambda a: a.step)
    longest = max(len(a.prompt) + a.max_tokens for a in arrivals)
    pool_tokens = _round_up(longest + rng.randrange(0, longest), page) + page
    chunk = _round_up(rng.choice((4, 8, 16, 64)) * unit, page)
    budget = chunk * rng.choice((1, 2, 4))
    if model not in ("swa", "swa-mamba"):
        return Workload(
            seed, page, pool_tokens, chunk, budget, tuple(arrivals), model,
            overlap=overlap, mixed=mixed,
        )  # fmt: skip
    window = rng.choice(WINDOWS)
    interval = rng.choice(SWA_INTERVALS)
    pool_tokens = max(pool_tokens, swa_floor(window, interval, page))
    return Workload(
        seed, page, pool_tokens, chunk, budget, tuple(arrivals), model, window, interval,
        overlap, mixed,
    )  # fmt: skip


def swa_floor(window: int, interval: int, page: int, reserve: int = 0) -> int:
    """The least pool of an SWA model: the SWA pool, a share of the full one, must hold what
    a running request keeps (its window, the interval, a page, and under speculative
    decoding a decode step's `reserve`) beside the prefill admission floor."""
    return _round_up(2 * (window + interval + 2 * page + reserve), page)


def _round_up(value: int, page: int) -> int:
    return -(-value // page) * page
