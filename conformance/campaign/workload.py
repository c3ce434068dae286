"""Workloads of the soundness campaign: what arrives when, and how to make one smaller.

Pure and engine-free: a workload is data (JSON round-trips), generated from a seed, and
shrunk by removing or simplifying one thing at a time while a violation persists. The
engine loop (`kvcert.conformance.vllm.campaign.loop`) plays it; this module never imports an engine.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.conformance.tools.catalog import load_model
from kvcert.spec.layers import AttentionKind, StateLayer
from kvcert.spec.plan import anchor_block_size

# Attention-only bundled models whose layers vLLM's own planner can group (no state layers,
# no compressed latents): a single full-attention group, and sliding-window + full hybrids.
MODELS = ("llama-3.1-8b", "gpt-oss-20b", "gemma-4-31B")
# Drawn by a second random stream (4 seeds in 10), so that the other seeds keep the workloads
# they had before these existed: MLA latents and chunked local attention (as vLLM plans them),
# and models served with an EAGLE drafter (the model file's draft layer, else one of the
# target's attention shape).
OTHER_MODELS = ("deepseek-v3", "llama-4-scout")
DRAFT_MODELS = ("gpt-oss-20b-eagle3", "llama-3.1-8b", "gemma-4-31B", "deepseek-v3")
# Models whose file declares no drafter, served with a multi-module MTP drafter (`--mtp`): one
# module per draft token, each a layer of the target's attention shape.
MTP_MODELS = ("llama-3.1-8b", "gemma-4-31B", "deepseek-v3")
# Hybrids of attention and recurrent state (Mamba align mode), drawn by a third stream among
# the seeds the second leaves on MODELS. Their blocks are hundreds of tokens (vLLM enlarges
# the attention block until its page holds a state), so their workloads are drawn in units of
# block / 16 tokens: the same shapes, in blocks, as the attention-only workloads.
STATE_MODELS = ("qwen3.5-0.8b", "jamba-v0.1")
# state models whose 0.33 prefill kernel can save checkpoints inside a chunk (GDN on
# FlashInfer; Jamba's Mamba1 saves state at pass ends only)
CHECKPOINTING_MODELS = ("qwen3.5-0.8b",)
SPEC_KEYINGS = ("default", "drop")  # the release's default EAGLE keying, or blocks dropped
POLICIES = ("fcfs", "priority")
VOCAB = 900  # token ids stay below the weightless model's vocabulary


@dataclass(frozen=True)
class Arrival:
    """A request joining the waiting queue before the scheduler's `step`-th schedule call."""

    step: int
    rid: str
    prompt: tuple[int, ...]
    priority: int
    max_tokens: int
    # a multi-turn follow-up: the next turn of request `follows`, sent once that request has
    # finished (and not before `step`), its prompt being that request's prompt, the tokens the
    # engine answered, then `prompt`
    follows: str | None = None


@dataclass(frozen=True)
class Workload:
    """Everything one campaign run depends on."""

    seed: int
    model: str
    policy: str  # fcfs | priority
    async_scheduling: bool
    usable_blocks: int  # pool blocks per KV-cache group (the pool holds this x groups + null)
    budget: int  # max_num_batched_tokens: the per-step token budget
    long_prefill: int  # long_prefill_token_threshold (0: off), so prefills interleave
    arrivals: tuple[Arrival, ...]
    aborts: tuple[tuple[int, str], ...] = ()  # (step, rid): the client aborts before step
    resets: tuple[int, ...] = ()  # steps before which reset_prefix_cache() is called
    # speculative decoding: drafts per step (0: served without the model's drafter), and
    # "drop" to turn off the release's lookahead block hashes where it has them
    spec_tokens: int = 0
    spec_keying: str = "default"
    # the state layers' prefill kernel also saves the state at a block boundary inside the
    # chunk (0.33's FlashInfer GDN: MambaSpec num_prefill_checkpoint_blocks=1 on the block grid)
    state_checkpoints: bool = False
    # the drafter with spec_tokens: "eagle" (one head, run once per draft), or "mtp" (one MTP
    # module per draft token, module i reading i tokens ahead: vLLM re-prefills its KV)
    drafter: str = "eagle"
    # sparse retention with an interval of this many hit-alignment units (the lcm of the
    # served groups' block sizes, so that both managers accept it): vLLM's
    # --prefix-cache-retention-interval (0.33; VLLM_PREFIX_CACHE_RETENTION_INTERVAL before),
    # which kvcert's drop-in honours when positive, 0 being asked of it as
    # KVCERT_RETENTION=sparse. None: each manager's default (vLLM 0.33: sparse with interval
    # 0; 0.25-0.28: dense; kvcert: dense)
    retention_units: int | None = None

    def __post_init__(self) -> None:
        earlier: set[str] = set()
        for arrival in self.arrivals:
            if arrival.follows is not None and arrival.follows not in earlier:
                raise ValueError(
                    f"request {arrival.rid!r} follows {arrival.follows!r}, which is not a "
                    "request listed before it: a follow-up comes after what it follows"
                )
            earlier.add(arrival.rid)

    def to_json(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        # every workload drawn before an option reads the same without it
        if not self.state_checkpoints:
            del body["state_checkpoints"]
        if self.drafter == "eagle":
            del body["drafter"]
        if self.retention_units is None:
            del body["retention_units"]
        for arrival in body["arrivals"]:
            if arrival["follows"] is None:
                del arrival["follows"]
        return body

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Workload:
        arrivals = tuple(
            Arrival(
                a["step"],
                a["rid"],
                tuple(a["prompt"]),
                a["priority"],
                a["max_tokens"],
                a.get("follows"),
            )
            for a in obj["arrivals"]
        )
        fields = {k: v for k, v in obj.items() if k not in ("arrivals", "aborts", "resets")}
        return cls(
            **fields,
            arrivals=arrivals,
            aborts=tuple((int(s), str(r)) for s, r in obj.get("aborts", ())),
            resets=tuple(obj.get("resets", ())),
        )

    @property
    def max_model_len(self) -> int:
        """The max_model_len the campaign serves the workload with: its longest request (prompt
        and output) rounded up to 256 tokens, 256 at least, and never below the long-prefill
        threshold (vLLM refuses a threshold above max_model_len)."""
        longest = longest_request(self.arrivals)
        return max(256, -(-max(longest, self.long_prefill) // 256) * 256)

    @property
    def size(self) -> int:
        """What shrinking minimises: requests first, then tokens, events, arrival steps, pool
        and the simpler settings. Every `smaller` candidate has a smaller size, so shrinking
        ends."""
        tokens = sum(len(a.prompt) + a.max_tokens for a in self.arrivals)
        events = len(self.aborts) + len(self.resets)
        settings = (self.usable_blocks + 4 * self.async_scheduling + self.long_prefill // 16
                    + 2 * self.spec_tokens + (self.spec_keying != "default")
                    + self.state_checkpoints + (self.drafter != "eagle")
                    + (self.retention_units is not None)
                    + sum(a.follows is not None for a in self.arrivals))  # fmt: skip
        steps = sum(a.step for a in self.arrivals)
        return (1000 * len(self.arrivals) + tokens + 100 * events + steps + settings
                + (self.policy != "fcfs"))  # fmt: skip


def request_lengths(arrivals: tuple[Arrival, ...] | list[Arrival]) -> dict[str, int]:
    """The most tokens each request can hold (prompt and output); a follow-up's prompt holds
    the whole conversation it follows (a request it follows that is not among `arrivals`
    adds nothing: the loop then sends the turn alone)."""
    by_rid = {a.rid: a for a in arrivals}
    lengths: dict[str, int] = {}

    def length(arrival: Arrival) -> int:
        if arrival.rid not in lengths:
            source = by_rid.get(arrival.follows) if arrival.follows is not None else None
            before = length(source) if source is not None else 0
            lengths[arrival.rid] = before + len(arrival.prompt) + arrival.max_tokens
        return lengths[arrival.rid]

    for arrival in arrivals:
        length(arrival)
    return lengths


def longest_request(arrivals: tuple[Arrival, ...] | list[Arrival]) -> int:
    """The most tokens any one request can hold (`request_lengths`)."""
    return max(request_lengths(arrivals).values())


def generate(
    seed: int,
    models: tuple[str, ...] = MODELS,
    state_checkpoints: bool = False,
    state_drafts: bool = False,
    mtp: bool = False,
    *,
    families: bool = False,
) -> Workload:
    """`_generate`'s workload; with `families`, about half its later requests are rewritten
    into the shapes that reach lost hits (`_lost_hit_families`), some seeds get the smallest
    pool that serves them (`_pressure`) and some ask for sparse retention with an interval
    (`_retention`), each from a stream of its own: the other options' workloads are
    unchanged."""
    workload = _generate(seed, models, state_checkpoints, state_drafts, mtp)
    if not families:
        return workload
    unit = state_block_size(workload.model) // 16 if workload.model in STATE_MODELS else 1
    rng = random.Random(f"kvcert-fuzz-families:{seed}")
    workload = _lost_hit_families(workload, rng, 16 * unit)
    workload = _pressure(workload, random.Random(f"kvcert-fuzz-pressure:{seed}"), 16 * unit)
    return _retention(workload, random.Random(f"kvcert-fuzz-retention:{seed}"))


def _generate(
    seed: int,
    models: tuple[str, ...],
    state_checkpoints: bool,
    state_drafts: bool,
    mtp: bool,
) -> Workload:
    """A random workload: requests that share prefixes (so lookups hit), arriving over a few
    steps, in a pool small enough that the scheduler must preempt, with chunked prefill.
    `state_checkpoints`: a state model whose layers can save checkpoints inside a prefill
    chunk is served so on most seeds; `state_drafts`: half the state models' seeds decode
    with MTP/EAGLE drafts, some requests past a state block boundary (each from its own
    stream: no other workload changes); `mtp`: half the drafted attention-only seeds are
    served with a multi-module MTP drafter of 2 or 3 modules (its own stream too)."""
    workload = _draw(random.Random(seed), seed, models, 1)
    extra = random.Random(f"kvcert-fuzz-extra:{seed}")
    draw = extra.random()
    if draw < 0.3:
        model = extra.choice(DRAFT_MODELS)
        spec_tokens, spec_keying = extra.randint(1, 3), extra.choice(SPEC_KEYINGS)
        workload = dataclasses.replace(workload, model=model, spec_tokens=spec_tokens,
                                       spec_keying=spec_keying)  # fmt: skip
        modules = random.Random(f"kvcert-fuzz-mtp:{seed}")
        if mtp and modules.random() < 0.5:
            workload = dataclasses.replace(
                workload,
                model=modules.choice(MTP_MODELS),
                spec_tokens=modules.randint(2, 3),
                drafter="mtp",
            )
            workload = _near_misses(workload, modules)
        return workload
    if draw < 0.4:
        return dataclasses.replace(workload, model=extra.choice(OTHER_MODELS))
    state = random.Random(f"kvcert-fuzz-state:{seed}")
    if state.random() < 0.2:
        model = state.choice(STATE_MODELS)
        unit = state_block_size(model) // 16
        saves = (
            state_checkpoints
            and model in CHECKPOINTING_MODELS
            and random.Random(f"kvcert-fuzz-checkpoints:{seed}").random() < 0.75
        )
        workload = dataclasses.replace(
            _draw(random.Random(seed), seed, models, unit), model=model, state_checkpoints=saves
        )
        drafts = random.Random(f"kvcert-fuzz-state-drafts:{seed}")
        if state_drafts and drafts.random() < 0.5:
            spec_tokens, spec_keying = drafts.randint(1, 3), drafts.choice(SPEC_KEYINGS)
            workload = dataclasses.replace(
                workload, spec_tokens=spec_tokens, spec_keying=spec_keying
            )
            workload = _decoding_across_boundaries(workload, unit * 16, drafts)
        return workload
    return workload


def state_block_size(model: str) -> int:
    """The block size vLLM serves a state hybrid with (Mamba align mode): the smallest
    multiple of 16 tokens whose attention page holds one state, which is what vLLM's
    `Platform._align_hybrid_block_size` computes (16 x cdiv(state page, 16 x attention bytes
    per token)) and kvcert's PAGE-ANCHOR-1 gives; tests/campaign/test_workload.py checks the
    two agree on every state model, and LMCache's documented 544 for Qwen3.5-0.8B."""
    return anchor_block_size(_plan_input(model))


def _plan_input(model: str) -> Any:
    """The bundled model's layers as the spec's planner reads them (bf16 KV)."""
    layers = list(load_model(model).layers)
    return plan_input_from_json(
        {"layers": layers, "kv_cache_dtype": "bf16", "memory_bytes": 1 << 30}
    )


def _draw(rng: random.Random, seed: int, models: tuple[str, ...], unit: int) -> Workload:
    """The workload's shape from the seed's main stream, lengths in units of `unit` tokens
    (1 for attention-only models: every seed drawn before state models keeps its workload)."""
    prefixes = [
        tuple(rng.randrange(VOCAB) for _ in range(unit * rng.choice((16, 24, 32, 48, 64, 96))))
        for _ in range(rng.randint(1, 3))
    ]
    arrivals = []
    for index in range(rng.randint(2, 6)):
        prefix = rng.choice(prefixes) if rng.random() < 0.8 else ()
        suffix = tuple(rng.randrange(VOCAB) for _ in range(unit * rng.randint(1, 48)))
        arrivals.append(
            Arrival(
                step=rng.choice((0, 0, 1, 2, 3, 5, 8)),
                rid=f"r{index}",
                prompt=prefix + suffix,
                priority=rng.randint(0, 3),
                max_tokens=rng.randint(1, 24),
            )
        )
    longest = max(len(a.prompt) + a.max_tokens for a in arrivals)
    aborts = tuple((rng.randint(1, 12), a.rid) for a in arrivals if rng.random() < 0.15)
    resets = tuple(rng.randint(1, 12) for _ in range(rng.random() < 0.1))
    model = rng.choice(models)
    return Workload(
        seed=seed,
        model=model,
        policy=rng.choice(POLICIES),
        async_scheduling=rng.random() < 0.3,
        usable_blocks=-(-longest // (16 * unit)) + rng.randint(1, 8),
        budget=unit * rng.choice((32, 48, 64, 128)),
        long_prefill=unit * rng.choice((0, 16, 32)),
        arrivals=tuple(sorted(arrivals, key=lambda a: a.step)),
        aborts=aborts,
        resets=resets,
    )


def _decoding_across_boundaries(workload: Workload, block: int, rng: random.Random) -> Workload:
    """About half the requests whose prompt ends at most half a state block before a
    boundary decode a few tokens past it, so that a step verifying drafts crosses it and the
    runner copies the state there (ALLOC-SPEC-2); drawn outputs alone rarely reach a
    544-token boundary. The pool grows by the blocks they add, keeping the drawn margin."""

    arrivals = []
    for drawn in workload.arrivals:
        ahead = -len(drawn.prompt) % block  # tokens to the next boundary
        longer = drawn
        if 0 < ahead <= block // 2 and rng.random() < 0.5:
            past = ahead + rng.randint(1, 8)
            longer = dataclasses.replace(drawn, max_tokens=max(drawn.max_tokens, past))
        arrivals.append(longer)
    return _with_arrivals(workload, arrivals, block)


def _near_misses(workload: Workload, rng: random.Random) -> Workload:
    """About half the requests after the first are rewritten to share an earlier request's
    prompt up to a block boundary and the `spec_tokens - 1` tokens after it, then differ:
    two blocks an EAGLE head's keys (one token ahead) cannot tell apart and the last MTP
    module's can. Random prompts almost never do this by chance. The pool grows by the blocks
    they add, keeping the drawn margin."""
    shared = workload.spec_tokens - 1
    arrivals = list(workload.arrivals)
    for i in range(1, len(arrivals)):
        source = arrivals[rng.randrange(i)].prompt
        boundaries = (len(source) - shared - 1) // 16
        if boundaries < 1 or rng.random() >= 0.5:
            continue
        cut = 16 * rng.randint(1, boundaries) + shared
        differing = (source[cut] + 1) % VOCAB
        prompt = (*source[:cut], differing, *arrivals[i].prompt)
        arrivals[i] = dataclasses.replace(arrivals[i], prompt=prompt)
    return _with_arrivals(workload, arrivals, 16)


FAMILIES = ("re-send", "extension", "multi-turn", "sibling", "aligned")


def _lost_hit_families(workload: Workload, rng: random.Random, block: int) -> Workload:
    """About half the requests after the first are rewritten from an earlier one's prompt
    into a shape a lost hit shows on: its re-send (in the same step, as a shared system
    prompt arrives, or later); an extension (the prompt and a few tokens more, as a client
    that regenerates an answer sends); a multi-turn follow-up (sent once the earlier request
    has finished: its prompt, the answer the engine gave, the next turn); a sibling diverging
    just before, at or just after a block boundary; or a re-send of a prefix of exactly k
    blocks, or one token more or less. The pool grows by the blocks they add, keeping the
    drawn margin."""
    arrivals = list(workload.arrivals)
    for i in range(1, len(arrivals)):
        if rng.random() >= 0.5:
            continue
        source = arrivals[rng.randrange(i)]
        tokens, family = source.prompt, rng.choice(FAMILIES)
        blocks = len(tokens) // block
        follows = None
        if family == "re-send":
            prompt = tokens
        elif family == "extension":
            extra = rng.randint(1, source.max_tokens + 2 * block)
            prompt = (*tokens, *(rng.randrange(VOCAB) for _ in range(extra)))
        elif family == "multi-turn":
            prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * block)))
            follows = source.rid
        elif blocks < 1:
            continue
        elif family == "sibling":
            cut = block * rng.randint(1, blocks) + rng.choice((-1, 0, 1))
            cut = min(cut, len(tokens) - 1)
            differing = (tokens[cut] + 1) % VOCAB
            suffix = (rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * block)))
            prompt = (*tokens[:cut], differing, *suffix)
        else:  # aligned
            prompt = tokens[: max(1, block * rng.randint(1, blocks) + rng.choice((-1, 0, 1)))]
        step = source.step + rng.choice((0, 0, 1, 3, 6))
        arrivals[i] = dataclasses.replace(
            arrivals[i], prompt=tuple(prompt), step=step, follows=follows
        )
    arrivals.sort(key=lambda a: a.step)  # stable: a follow-up stays after what it follows
    return _with_arrivals(workload, arrivals, block)


def _pressure(workload: Workload, rng: random.Random, block: int) -> Workload:
    """A quarter of the seeds get the smallest pool the drawn ones can have: one block per
    group beyond the longest conversation. The groups share the pool, so the blocks the
    next request takes evict some groups' cached blocks and leave others' (a hit is the
    shortest over the groups)."""
    if rng.random() >= 1 / 4:
        return workload
    return dataclasses.replace(
        workload, usable_blocks=-(-longest_request(workload.arrivals) // block) + 1
    )


def _retention(workload: Workload, rng: random.Random) -> Workload:
    """About a third of the seeds whose model has a sliding-window or state layer (the groups
    retention applies to) ask for sparse retention with an interval of 0 to 3 hit-alignment
    units."""
    bounded = any(
        getattr(x, "kind", None) is AttentionKind.SLIDING_WINDOW or isinstance(x, StateLayer)
        for x in _plan_input(workload.model).layers
    )
    if not bounded or rng.random() >= 1 / 3:
        return workload
    return dataclasses.replace(workload, retention_units=rng.randint(0, 3))


def _with_arrivals(workload: Workload, arrivals: list[Arrival], block: int) -> Workload:
    """The workload with these arrivals, its pool grown or shrunk to keep the drawn margin of
    `block`-token blocks beyond its longest request."""

    def blocks(requests: tuple[Arrival, ...] | list[Arrival]) -> int:
        return -(-longest_request(requests) // block)

    usable = workload.usable_blocks - blocks(workload.arrivals) + blocks(arrivals)
    return dataclasses.replace(workload, arrivals=tuple(arrivals), usable_blocks=usable)


def smaller(workload: Workload) -> Iterator[Workload]:
    """Workloads one simplification away, the biggest cuts first."""
    replace = dataclasses.replace
    for i in range(len(workload.arrivals)):
        gone = workload.arrivals[i].rid
        rest = tuple(  # its follow-ups are sent alone
            dataclasses.replace(a, follows=None) if a.follows == gone else a
            for a in workload.arrivals[:i] + workload.arrivals[i + 1 :]
        )
        if rest:
            aborts = tuple(x for x in workload.aborts if x[1] != gone)
            # without a request the pool may need to shrink too, to keep the same pressure
            for fewer in (0, 1, 2, 4):
                if workload.usable_blocks - fewer >= 1:
                    yield replace(workload, arrivals=rest, aborts=aborts,
                                  usable_blocks=workload.usable_blocks - fewer)  # fmt: skip
    for i in range(len(workload.aborts)):
        yield replace(workload, aborts=workload.aborts[:i] + workload.aborts[i + 1 :])
    for i in range(len(workload.resets)):
        yield replace(workload, resets=workload.resets[:i] + workload.resets[i + 1 :])
    for i, arrival in enumerate(workload.arrivals):
        for change in _simpler(arrival):
            arrivals = (*workload.arrivals[:i], change, *workload.arrivals[i + 1 :])
            yield replace(workload, arrivals=arrivals)
    if workload.usable_blocks > 1:
        yield replace(workload, usable_blocks=workload.usable_blocks - 1)
    if workload.async_scheduling:
        yield replace(workload, async_scheduling=False)
    if workload.state_checkpoints:
        yield replace(workload, state_checkpoints=False)
    if workload.long_prefill:
        yield replace(workload, long_prefill=0)
    if workload.policy != "fcfs":
        yield replace(workload, policy="fcfs")
    if workload.retention_units is not None:
        yield replace(workload, retention_units=None)
    if workload.spec_tokens > 1:
        yield replace(workload, spec_tokens=workload.spec_tokens - 1)
    if workload.spec_keying != "default":
        yield replace(workload, spec_keying="default")


def _simpler(arrival: Arrival) -> Iterator[Arrival]:
    replace = dataclasses.replace
    if arrival.max_tokens > 1:
        yield replace(arrival, max_tokens=max(1, arrival.max_tokens // 2))
        yield replace(arrival, max_tokens=arrival.max_tokens - 1)
    if len(arrival.prompt) > 1:
        yield replace(arrival, prompt=arrival.prompt[: len(arrival.prompt) // 2 or 1])
        yield replace(arrival, prompt=arrival.prompt[:-1])
    if arrival.step:
        yield replace(arrival, step=arrival.step - 1)
    if arrival.follows is not None:
        yield replace(arrival, follows=None)


def shrink(workload: Workload, fails: Callable[[Workload], bool], budget: int = 400) -> Workload:
    """Greedy: take the first smaller workload that still fails, until none does or `budget`
    runs are spent. Returns the smallest failing workload found (at worst the input)."""
    runs = 0
    current = workload
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in smaller(current):
            runs += 1
            if fails(candidate):
                current, progress = candidate, True
                break
            if runs >= budget:
                break
    return current
