"""The page planner: KV-cache groups, block sizes and one shared page size for a model.

Implements PAGE-BYTES-1, PAGE-ANCHOR-1, PAGE-SIZE-1, PAGE-FIT-1, PAGE-STATE-1, PAGE-GROUP-1,
PAGE-SPLIT-1, PAGE-POOL-1, PAGE-CAP-1, PAGE-ALIGN-1/2, PAGE-RECOMP-1 and PAGE-OBJ-1 of
kvcert.spec.plan. The spec enumerates candidate
block sizes; this module solves for them in closed form, which is equivalent because every
page grows linearly in the block size (B / ratio entries of `entry` bytes):
  * the anchor block is the smallest multiple of `step` >= max(requested, state x ratio / entry);
  * a fitted block anchor x 2^k fits iff 2^k <= m = floor(P x ratio / entry) // anchor, so the
    largest is anchor << (m.bit_length() - 1); when it is not a multiple of the layer's step
    no smaller one is (fewer factors of two).
tests/differential checks the two agree on random layer mixes; THM-PAGE-FIT (Z3) proves the
closed form is the maximum.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from fractions import Fraction

from kvcert.reference.config import (
    CacheConfig,
    DraftKeying,
    GroupConfig,
    Kind,
    MambaMode,
    as_choice,
)
from kvcert.reference.errors import ConfigError


class PlanError(ConfigError):
    """No page layout exists for these inputs; the message names the constraint."""


ELEMENT_BYTES = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "fp8_per_token_head": 1,
    "int8_per_token_head": 1,
}
STATE_DTYPES = ("fp32", "fp16", "bf16")


def _scale(dtype: str) -> int:
    return 4 if dtype.endswith("_per_token_head") else 0


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """An attention layer: K and V heads, stored per token."""

    kind: Kind
    num_kv_heads: int
    head_size_k: int
    head_size_v: int
    window: int = 0
    chunk: int = 0
    draft: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or self.kind
        object.__setattr__(self, "kind", as_choice(Kind, self.kind, f"layer {label!r}: kind"))
        if self.kind is Kind.MAMBA:
            raise ConfigError(f"layer {label!r}: {self.kind.value} is not an attention kind")
        _positive(self.num_kv_heads, f"layer {label!r}: num_kv_heads")
        _positive(self.head_size_k, f"layer {label!r}: head_size_k")
        _positive(self.head_size_v, f"layer {label!r}: head_size_v")
        if (self.kind is Kind.SLIDING_WINDOW) != (self.window > 0):
            raise ConfigError(f"layer {label!r}: a window exactly for sliding_window layers")
        if (self.kind is Kind.CHUNKED_LOCAL) != (self.chunk > 0):
            raise ConfigError(f"layer {label!r}: a chunk exactly for chunked_local layers")


@dataclass(frozen=True, slots=True)
class LatentShape:
    """An MLA layer: one latent (+ rope) entry per `ratio` tokens."""

    kind: Kind
    latent_size: int
    rope_size: int
    window: int = 0
    ratio: int = 1
    draft: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or self.kind
        object.__setattr__(self, "kind", as_choice(Kind, self.kind, f"layer {label!r}: kind"))
        if self.kind not in (Kind.FULL, Kind.SLIDING_WINDOW):
            raise ConfigError(f"layer {label!r}: a latent layer is full or sliding_window")
        _positive(self.latent_size, f"layer {label!r}: latent_size")
        if isinstance(self.rope_size, bool) or not isinstance(self.rope_size, int):
            raise ConfigError(f"layer {label!r}: rope_size must be an integer")
        if self.rope_size < 0:
            raise ConfigError(f"layer {label!r}: rope_size must be >= 0")
        _positive(self.ratio, f"layer {label!r}: ratio")
        if (self.kind is Kind.SLIDING_WINDOW) != (self.window > 0):
            raise ConfigError(f"layer {label!r}: a window exactly for sliding_window layers")


@dataclass(frozen=True, slots=True)
class StateShape:
    """A recurrent layer: state tensors of (shape, dtype), laid out in order."""

    tensors: tuple[tuple[tuple[int, ...], str], ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.tensors:
            raise ConfigError(f"layer {self.name!r}: a state layer needs at least one tensor")
        for shape, dtype in self.tensors:
            if not shape:
                raise ConfigError(f"layer {self.name!r}: a state tensor needs a shape")
            for size in shape:
                _positive(size, f"layer {self.name!r}: a state tensor dimension")
            if dtype not in STATE_DTYPES:
                raise ConfigError(f"layer {self.name!r}: state dtype must be one of {STATE_DTYPES}")

    @property
    def nbytes(self) -> int:
        end = 0
        for shape, dtype in self.tensors:
            size = ELEMENT_BYTES[dtype]
            end = -(-end // size) * size + math.prod(shape) * size
        return end


LayerShape = AttentionShape | LatentShape | StateShape


def entry(layer: AttentionShape | LatentShape, dtype: str) -> tuple[int, int]:
    """(bytes per stored entry, tokens per entry): a page of B tokens is B / ratio entries."""
    element, scale = ELEMENT_BYTES[dtype], _scale(dtype)
    if isinstance(layer, LatentShape):
        return (layer.latent_size + layer.rope_size) * element + scale, layer.ratio
    return layer.num_kv_heads * ((layer.head_size_k + layer.head_size_v) * element + 2 * scale), 1


def page_bytes(layer: LayerShape, dtype: str, block_size: int) -> int:
    """Bytes of one block's page. Implements PAGE-BYTES-1 (the caller guarantees whole
    entries)."""
    if isinstance(layer, StateShape):
        return layer.nbytes
    size, ratio = entry(layer, dtype)
    return block_size // ratio * size


@dataclass(frozen=True, slots=True)
class Group:
    """One planned KV-cache group."""

    kind: Kind
    layers: tuple[int | None, ...]  # layer ids in tensor order; None is an empty slot
    block_size: int
    page_bytes: int
    window: int = 0
    chunk: int = 0
    draft: bool = False


@dataclass(frozen=True, slots=True)
class CachePlan:
    """The planned KV cache of one worker."""

    groups: tuple[Group, ...]
    page_size: int
    num_blocks: int
    tensors: tuple[tuple[int | None, ...], ...]
    token_capacity: int
    mamba_mode: MambaMode = MambaMode.ALIGN
    speculative: DraftKeying | None = None

    @property
    def alignment(self) -> int:
        """Every hit is a multiple of this."""
        return math.lcm(*(g.block_size for g in self.groups if g.kind is not Kind.CROSS))

    def padding(self, group: Group) -> Fraction:
        """Share of the group's pages (empty slots included) that holds no KV."""
        used = sum(1 for x in group.layers if x is not None) * group.page_bytes
        return 1 - Fraction(used, len(group.layers) * self.page_size)

    def cache_config(self, max_model_len: int | None = None) -> CacheConfig:
        """The allocator configuration for this plan (kvcert.reference.manager)."""
        return CacheConfig(
            tuple(
                GroupConfig(
                    g.kind,
                    g.block_size,
                    window=g.window,
                    chunk=g.chunk,
                    mode=self.mamba_mode if g.kind is Kind.MAMBA else None,
                    draft=g.draft,
                    name=f"{i}:{g.kind}",
                )
                for i, g in enumerate(self.groups)
            ),
            self.num_blocks,
            speculative=self.speculative,
            max_model_len=max_model_len,
        )


class Objective(enum.StrEnum):
    """What the plan maximises when capacity and hit alignment pull apart."""

    CAPACITY = "capacity"  # most tokens
    BALANCED = "balanced"  # finest hits within `capacity_share` of the most tokens
    ALIGNMENT = "alignment"  # finest hits


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """The planner's inputs (see kvcert.spec.plan.PlanInput for each field's meaning)."""

    layers: tuple[LayerShape, ...]
    dtype: str
    memory_bytes: int
    block_size: int = 16
    multiple: int = 16
    maximum: int = 4096
    mamba_mode: MambaMode = MambaMode.ALIGN
    state_chunk: int = 1
    group_padding: Fraction = field(default=Fraction(1, 20))
    speculative: DraftKeying | None = None
    objective: Objective = Objective.BALANCED
    capacity_share: Fraction = field(default=Fraction(19, 20))

    def __post_init__(self) -> None:
        if not self.layers:
            raise ConfigError("a plan needs at least one layer")
        object.__setattr__(self, "mamba_mode", as_choice(MambaMode, self.mamba_mode, "mamba_mode"))
        if self.speculative is not None:
            object.__setattr__(
                self, "speculative", as_choice(DraftKeying, self.speculative, "speculative")
            )
        object.__setattr__(self, "objective", as_choice(Objective, self.objective, "objective"))
        if self.dtype not in ELEMENT_BYTES:
            raise ConfigError(
                f"unknown KV-cache dtype {self.dtype!r}; one of {list(ELEMENT_BYTES)}"
            )
        for name in ("memory_bytes", "block_size", "multiple", "maximum", "state_chunk"):
            _positive(getattr(self, name), name)
        if self.maximum < self.multiple:
            raise ConfigError(
                f"kernel maximum {self.maximum} is below the multiple {self.multiple}"
            )
        if self.block_size % self.multiple or self.block_size > self.maximum:
            raise ConfigError(
                f"block_size {self.block_size} is not a block size the kernels take "
                f"(multiples of {self.multiple} up to {self.maximum})"
            )
        if not 0 <= self.group_padding < 1:
            raise ConfigError(f"group_padding must be in [0, 1), got {self.group_padding}")
        if not 0 < self.capacity_share <= 1:
            raise ConfigError(f"capacity_share must be in (0, 1], got {self.capacity_share}")
        drafts = any(getattr(x, "draft", False) for x in self.layers)
        if drafts != (self.speculative is not None):
            raise ConfigError(
                "draft layers and a speculative keying go together: mark the draft layers "
                "with draft=True and set speculative ('exact' or 'drop'), or neither"
            )


def _key(layer: LayerShape) -> tuple[object, ...]:
    if isinstance(layer, AttentionShape):
        return (0, layer.kind, layer.window, layer.chunk, layer.num_kv_heads,
                layer.head_size_k, layer.head_size_v)  # fmt: skip
    if isinstance(layer, LatentShape):
        return (1, layer.kind, layer.window, layer.latent_size, layer.rope_size, layer.ratio)
    return (2, layer.tensors)


def _anchor(request: PlanRequest) -> tuple[int, int]:
    """(anchor block size, shared page size). Implements PAGE-ANCHOR-1 and PAGE-SIZE-1."""
    dtype = request.dtype
    tokens = [x for x in request.layers if not isinstance(x, StateShape)]
    states = [x for x in request.layers if isinstance(x, StateShape)]
    state_bytes = max((s.nbytes for s in states), default=0)
    step = request.multiple
    if states and request.mamba_mode is MambaMode.ALL:
        step = math.lcm(step, request.state_chunk)
    if not tokens:
        block = -(-request.block_size // step) * step
        if block > request.maximum:
            raise PlanError(
                f"the anchor block must be a multiple of {step} (kernel multiple and state "
                f"chunk) from {request.block_size} up to the kernel maximum {request.maximum}, "
                "and none is; raise the kernel maximum or lower the state chunk"
            )
        return block, state_bytes
    # the most bytes per token: compare size / ratio by cross-multiplication
    rates = [entry(x, dtype) for x in tokens]
    best = max(rates, key=lambda r: Fraction(r[0], r[1]))
    for size, ratio in rates:
        if size * best[1] == best[0] * ratio:
            step = math.lcm(step, ratio)
    size, ratio = best
    need = -(-state_bytes * ratio // size)  # fewest tokens whose page holds the state
    block = -(-max(request.block_size, need) // step) * step
    if block > request.maximum:
        largest = request.maximum // step * step
        raise PlanError(
            f"the state layers need a {state_bytes}-byte page, but the allowed anchor block "
            f"sizes (multiples of {step} from {request.block_size} up to the kernel maximum "
            f"{request.maximum}) give at most {largest // ratio * size} bytes; raise the "
            "kernel maximum, or check the state shapes"
        )
    return block, block // ratio * size


def _fit(
    layer: AttentionShape | LatentShape,
    request: PlanRequest,
    anchor: int,
    page: int,
    cap: int | None = None,
) -> int:
    """The largest base x 2^k within the page, the maximum and the cap, base = min(anchor, cap).
    Implements PAGE-FIT-1 (cap None) and PAGE-ALIGN-1 in closed form."""
    size, ratio = entry(layer, request.dtype)
    step = math.lcm(request.multiple, ratio)
    base = anchor if cap is None else min(anchor, cap)
    limit = min(page * ratio // size, request.maximum, cap or request.maximum)
    most = limit // base  # largest multiplier that fits
    if most >= 1:
        block = base << (most.bit_length() - 1)
        if block % step == 0:
            return block
    if cap is not None:
        raise PlanError(
            f"layer {layer.name!r} needs blocks that are multiples of {step}; under the "
            f"hit-alignment cap {cap} none of {base} x 2^k is one: choose a cap that is a "
            f"multiple of {step}"
        )
    raise PlanError(
        f"layer {layer.name!r} has no block size anchor x 2^k (anchor {anchor}) that is a "
        f"multiple of {step}, at most the kernel maximum {request.maximum}, and fits the "
        f"shared page of {page} bytes; request a block_size that is a multiple of {step} or "
        "raise the kernel maximum"
    )


def _group_size(sizes: list[int], most_padding: Fraction) -> int:
    """Scan g downwards; g = 1 never pads. Implements PAGE-GROUP-1."""
    for g in range(max(sizes), 1, -1):
        slots = sum(-(-n // g) * g for n in sizes)
        if (slots - sum(sizes)) <= most_padding * slots:
            return g
    return 1


def _capped(request: PlanRequest, cap: int | None) -> CachePlan:
    """The plan with no block above `cap` (None: uncapped). Implements PAGE-ALIGN-1 (with
    `_fit`), PAGE-STATE-1 (state layers take the base block), PAGE-SPLIT-1, PAGE-POOL-1 and
    PAGE-CAP-1."""
    anchor, page = _anchor(request)
    buckets: dict[tuple[object, ...], list[int]] = {}
    for index, layer in enumerate(request.layers):
        buckets.setdefault(_key(layer), []).append(index)
    g = _group_size([len(m) for m in buckets.values()], request.group_padding)
    base = anchor if cap is None else min(anchor, cap)
    groups: list[Group] = []
    for members in buckets.values():
        first = request.layers[members[0]]
        if isinstance(first, StateShape):
            block = base
        else:  # cross attention takes no hits: its block is never capped
            block = _fit(first, request, anchor, page, None if first.kind is Kind.CROSS else cap)
        kind = Kind.MAMBA if isinstance(first, StateShape) else first.kind
        count = -(-len(members) // g)
        for i in range(count):
            chosen = members[i::count]
            groups.append(
                Group(
                    kind=kind,
                    layers=(*chosen, *([None] * (g - len(chosen)))),
                    block_size=block,
                    page_bytes=page_bytes(first, request.dtype, block),
                    window=getattr(first, "window", 0),
                    chunk=getattr(first, "chunk", 0),
                    draft=any(getattr(request.layers[x], "draft", False) for x in chosen),
                )
            )
    num_blocks = request.memory_bytes // (g * page)
    if num_blocks < 2:
        raise PlanError(
            f"{request.memory_bytes} bytes hold {num_blocks} block(s) of {g} x {page} bytes; "
            f"the pool needs at least 2 (the null block and one more): give at least {2 * g * page}"
        )
    counted = [
        gr.block_size
        for gr in groups
        if gr.kind not in (Kind.CROSS, Kind.MAMBA)
        or (gr.kind is Kind.MAMBA and request.mamba_mode is MambaMode.ALL)
    ]
    per_token = sum(Fraction(1, b) for b in counted)
    capacity = math.floor((num_blocks - 1) / per_token) if per_token else 0
    return CachePlan(
        groups=tuple(groups),
        page_size=page,
        num_blocks=num_blocks,
        tensors=tuple(tuple(gr.layers[i] for gr in groups) for i in range(g)),
        token_capacity=capacity,
        mamba_mode=request.mamba_mode,
        speculative=request.speculative,
    )


def _caps(request: PlanRequest, anchor: int, top: int) -> list[int]:
    """Implements PAGE-ALIGN-2: powers of two times the anchor from the requested block to `top`,
    and the requested block's doublings below the anchor, all multiples of every layer's step."""
    step = request.multiple
    for layer in request.layers:
        if isinstance(layer, LatentShape):
            step = math.lcm(step, layer.ratio)
    if request.mamba_mode is MambaMode.ALL and any(
        isinstance(x, StateShape) for x in request.layers
    ):
        step = math.lcm(step, request.state_chunk)
    first = -(-request.block_size // step) * step
    caps = set()
    low = anchor >> ((anchor & -anchor).bit_length() - 1)  # the anchor's odd part
    value = low
    while value <= top:
        if value >= first and value % step == 0:
            caps.add(value)
        value <<= 1
    value = first
    while value < anchor:
        caps.add(value)
        value <<= 1
    return sorted(caps)


def recompute_per_lookup(alignment: int) -> Fraction:
    """Mean reusable tokens a lookup recomputes. Implements PAGE-RECOMP-1."""
    return Fraction(alignment - 1, 2)


def plan_options(request: PlanRequest) -> list[CachePlan]:
    """The plan under every weighed cap, finest alignment first (PAGE-ALIGN-1, PAGE-ALIGN-2)."""
    uncapped = _capped(request, None)
    anchor, _ = _anchor(request)
    top = max(anchor, uncapped.alignment)
    caps = _caps(request, anchor, top)
    return [uncapped if cap == top else _capped(request, cap) for cap in caps]


def chosen_index(scores: list[tuple[int, int]], objective: Objective, share: Fraction) -> int:
    """Of (alignment, capacity) options, the index the objective picks. Implements PAGE-OBJ-1."""
    most = max(capacity for _, capacity in scores)
    if objective is Objective.CAPACITY:
        eligible = [i for i, (_, c) in enumerate(scores) if c == most]
    elif objective is Objective.BALANCED:
        eligible = [i for i, (_, c) in enumerate(scores) if c >= share * most]
    else:
        eligible = list(range(len(scores)))
    return min(eligible, key=lambda i: (recompute_per_lookup(scores[i][0]), -scores[i][1]))


def choose(options: list[CachePlan], request: PlanRequest) -> CachePlan:
    """The option the request's objective picks (PAGE-OBJ-1, in `chosen_index`)."""
    scores = [(x.alignment, x.token_capacity) for x in options]
    return options[chosen_index(scores, request.objective, request.capacity_share)]


def plan_cache(request: PlanRequest) -> CachePlan:
    """The plan for `request`: the capped plan its objective chooses."""
    return choose(plan_options(request), request)
