"""§9 Page planning: from a model's layers to KV-cache groups, block sizes and one page size.

An engine carves its KV memory into `g` tensors of equal *pages*. Block n of a group is page n
of every tensor, and tensor i holds the i-th layer of each group, so every layer of every
group must fit one page size P. The plan answers, in this order:

    PAGE-ANCHOR-1  the block size of the layers with the most bytes per token (the *anchor*)
    PAGE-SIZE-1    the shared page P: the anchor layers' page
    PAGE-FIT-1     every other attention layer: the largest anchor x 2^k block whose page fits P
    PAGE-STATE-1   state layers: the anchor block, their page padded to P
    PAGE-GROUP-1   how many layers share a group (g), trading padding slots for fewer groups
    PAGE-SPLIT-1   which layers share a group: strided, so pipeline stages stay balanced
    PAGE-POOL-1    how many blocks the memory holds
    PAGE-CAP-1     how many tokens that is
    PAGE-ALIGN-1   a cap on the hit alignment: no block above it, more padding below it
    PAGE-ALIGN-2   which caps are weighed
    PAGE-RECOMP-1  what a hit alignment costs: tokens recomputed per lookup
    PAGE-OBJ-1     which capped plan is chosen, by a named objective

For a fixed P, PAGE-FIT-1 leaves each layer the least padding among the block sizes that keep
the hit alignment equal to the largest block (THM-PAGE-FIT proves it), which maximises the
token capacity at that alignment. But large blocks make hits coarse: every hit is a multiple
of the alignment, so a re-sent prompt recomputes up to alignment - 1 tokens even in an
unbounded pool. PAGE-ALIGN-1 trades capacity for alignment, PAGE-RECOMP-1 prices the
alignment in tokens, and PAGE-OBJ-1 names the trade the plan makes (default `balanced`: the
finest alignment within 95% of the best capacity). `kvcert plan` prints every option.
Another rule, scaling a block size only when one page divides the other and otherwise padding
the smaller page with the block size unchanged, pads far more when head sizes differ;
`kvcert plan --compare` shows both.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from kvcert.spec.errors import InvalidPlan, NoPageLayout, as_choice, refuse
from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    KVDtype,
    LatentLayer,
    Layer,
    StateLayer,
    page_bytes,
)
from kvcert.spec.layout import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    hit_alignment,
)


@dataclass(frozen=True)
class KernelLimits:
    """Block sizes the attention kernels accept: multiples of `multiple` up to `maximum`."""

    multiple: int = 16  # every block size is a multiple of this
    maximum: int = 4096  # the largest block size the kernels take

    def __post_init__(self) -> None:
        for name in ("multiple", "maximum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                refuse(InvalidPlan, f"kernel {name} must be a positive integer, got {value!r}")
        if self.maximum < self.multiple:
            refuse(
                InvalidPlan,
                f"kernel maximum {self.maximum} is below the block multiple {self.multiple}",
            )


class Objective(enum.StrEnum):
    """What a plan maximises when capacity and hit alignment pull apart (PAGE-OBJ-1)."""

    CAPACITY = "capacity"  # most tokens; hits as coarse as the largest block
    BALANCED = "balanced"  # finest hits whose capacity is within `capacity_share` of the most
    ALIGNMENT = "alignment"  # finest hits, whatever the capacity


@dataclass(frozen=True)
class PlanInput:
    """Everything the plan depends on, for one worker."""

    layers: tuple[Layer, ...]  # in model order; the index is the layer's id
    dtype: KVDtype  # how attention and latent elements are stored
    memory_bytes: int  # KV-cache memory of this worker
    block_size: int = 16  # requested block size of the anchor layers (hit granularity)
    kernel: KernelLimits = field(default_factory=KernelLimits)  # allowed block sizes
    mamba_mode: MambaMode = MambaMode.ALIGN  # where state layers write checkpoints
    state_chunk: int = 1  # mode "all": checkpoints only at multiples of the state kernel chunk
    speculative: Speculative | None = None  # how draft layers are keyed, if there are any
    group_padding: Fraction = Fraction(1, 20)  # most padding slots accepted for fewer groups
    objective: Objective = Objective.BALANCED  # PAGE-OBJ-1
    capacity_share: Fraction = Fraction(19, 20)  # `balanced`: least share of the most capacity

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple) or not self.layers:
            refuse(InvalidPlan, "a plan needs at least one layer")
        object.__setattr__(self, "dtype", as_choice(KVDtype, self.dtype, "dtype", InvalidPlan))
        mode = as_choice(MambaMode, self.mamba_mode, "mamba_mode", InvalidPlan)
        object.__setattr__(self, "mamba_mode", mode)
        if self.speculative is not None:
            speculative = as_choice(Speculative, self.speculative, "speculative", InvalidPlan)
            object.__setattr__(self, "speculative", speculative)
        objective = as_choice(Objective, self.objective, "objective", InvalidPlan)
        object.__setattr__(self, "objective", objective)
        for name in ("memory_bytes", "block_size", "state_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                refuse(InvalidPlan, f"{name} must be a positive integer, got {value!r}")
        if self.block_size % self.kernel.multiple or self.block_size > self.kernel.maximum:
            refuse(
                InvalidPlan,
                f"block_size {self.block_size} is not a block size the kernels take "
                f"(multiples of {self.kernel.multiple} up to {self.kernel.maximum})",
            )
        if not 0 <= self.group_padding < 1:
            refuse(InvalidPlan, f"group_padding must be in [0, 1), got {self.group_padding}")
        if not 0 < self.capacity_share <= 1:
            refuse(InvalidPlan, f"capacity_share must be in (0, 1], got {self.capacity_share}")


def bucket_key(layer: Layer) -> tuple[object, ...]:
    """Layers with equal keys are interchangeable: same hit rule, same page at every block size.

    Draft layers join the target layers they equal; a group holding one is a draft group.
    """
    if isinstance(layer, AttentionLayer):
        return (
            "attention",
            layer.kind,
            layer.window,
            layer.chunk,
            layer.num_kv_heads,
            layer.head_size_k,
            layer.head_size_v,
        )
    if isinstance(layer, LatentLayer):
        return ("latent", layer.kind, layer.window, layer.latent_size, layer.rope_size, layer.ratio)
    return ("state", layer.tensors)


def bytes_per_token(layer: AttentionLayer | LatentLayer, dtype: KVDtype) -> Fraction:
    """Page bytes per token: pages grow linearly with the block size."""
    ratio = layer.ratio if isinstance(layer, LatentLayer) else 1
    return Fraction(page_bytes(layer, dtype, ratio), ratio)


def block_step(layer: Layer, kernel: KernelLimits) -> int:
    """Allowed block sizes of a layer are the multiples of this (whole latent entries)."""
    return math.lcm(kernel.multiple, layer.ratio if isinstance(layer, LatentLayer) else 1)


def _token_layers(plan_input: PlanInput) -> list[AttentionLayer | LatentLayer]:
    return [x for x in plan_input.layers if not isinstance(x, StateLayer)]


def _state_layers(plan_input: PlanInput) -> list[StateLayer]:
    return [x for x in plan_input.layers if isinstance(x, StateLayer)]


def anchor_layers(plan_input: PlanInput) -> list[AttentionLayer | LatentLayer]:
    """The attention or latent layers with the most page bytes per token."""
    token_layers = _token_layers(plan_input)
    most = max((bytes_per_token(x, plan_input.dtype) for x in token_layers), default=None)
    return [x for x in token_layers if bytes_per_token(x, plan_input.dtype) == most]


def anchor_block_size(plan_input: PlanInput) -> int:
    """PAGE-ANCHOR-1: The anchor layers get the smallest allowed block size, at least the requested
    one, whose page holds every state layer.

        requested B=16, anchor 2048 B/token, GDN state 1085440 B:
            16 x 2048 = 32768 < 1085440  ...  528 x 2048 < 1085440 <= 544 x 2048
            -> anchor block 544

    Allowed: multiples of the kernel multiple, of each anchor layer's entry ratio and, in
    mamba mode `all`, of the state chunk, up to the kernel maximum. Without attention layers
    the requested size stands.

    pre: plan_input.block_size >= 1
    post: __return__ >= plan_input.block_size
    """
    anchors = anchor_layers(plan_input)
    states = _state_layers(plan_input)
    step = math.lcm(*(block_step(x, plan_input.kernel) for x in [*anchors, *states]))
    if states and plan_input.mamba_mode is MambaMode.ALL:
        step = math.lcm(step, plan_input.state_chunk)
    state_bytes = max((page_bytes(x, plan_input.dtype, 1) for x in states), default=0)
    first = -(-plan_input.block_size // step) * step
    for size in range(first, plan_input.kernel.maximum + 1, step):
        if not anchors or page_bytes(anchors[0], plan_input.dtype, size) >= state_bytes:
            return size
    largest = plan_input.kernel.maximum // step * step
    holds = page_bytes(anchors[0], plan_input.dtype, largest) if anchors and largest else 0
    refuse(
        NoPageLayout,
        f"the state layers need a {state_bytes}-byte page, but the allowed anchor block sizes "
        f"(multiples of {step} from {plan_input.block_size} up to the kernel maximum "
        f"{plan_input.kernel.maximum}) give at most {holds} bytes; raise the kernel maximum, "
        "or check the state shapes",
    )


def shared_page_size(plan_input: PlanInput, anchor_block: int) -> int:
    """PAGE-SIZE-1: The shared page is the anchor layers' page at the anchor block size, or the
    largest state page in a model without attention layers.

        anchor: 8 heads x (256+256) int8 + 2 scales x 4 B per head, B=16  ->  P = 66560

    pre: anchor_block >= 1
    post: __return__ >= 1
    """
    anchors = anchor_layers(plan_input)
    if anchors:
        return page_bytes(anchors[0], plan_input.dtype, anchor_block)
    return max(page_bytes(x, plan_input.dtype, 1) for x in _state_layers(plan_input))


def fitted_block_size(
    layer: AttentionLayer | LatentLayer, plan_input: PlanInput, anchor_block: int, page: int
) -> int:
    """PAGE-FIT-1: Every attention or latent layer gets the largest block size of the form anchor x
    2^k whose page fits in the shared page.

        P = 66560 (Gemma 4 sliding, 8 x 520 B per token, anchor block 16)
        global, 2 x 1032 = 2064 B/token:   16 -> 33024,  32 -> 66048 <= 66560,  64 -> 132096
            -> block 32, padding 512 B (0.8%)     (block 16 would pad 33536 B, 50%)

    Doubling from the anchor keeps every block size a multiple of every smaller one, so the
    hit alignment (their lcm) is the largest block size. Any multiple of the kernel's would
    pad less in rare cases but can explode the alignment: 16, 64 and 240 align hits to 3840.
    The block must also be allowed (a multiple of the layer's step, at most the maximum).

    pre: anchor_block >= 1 and page >= 1
    post: __return__ % anchor_block == 0 and (__return__ // anchor_block).bit_count() == 1
    post: __return__ % block_step(layer, plan_input.kernel) == 0
    post: page_bytes(layer, plan_input.dtype, __return__) <= page
    """
    fitting = _doublings(layer, plan_input, anchor_block, page, plan_input.kernel.maximum)
    if not fitting:
        step = block_step(layer, plan_input.kernel)
        refuse(
            NoPageLayout,
            f"layer {layer.name!r} has no block size anchor x 2^k (anchor {anchor_block}) that "
            f"is a multiple of {step}, at most the kernel maximum {plan_input.kernel.maximum}, "
            f"and fits the shared page of {page} bytes; request a block_size that is a multiple "
            f"of {step} or raise the kernel maximum",
        )
    return max(fitting)


def _doublings(
    layer: AttentionLayer | LatentLayer, plan_input: PlanInput, base: int, page: int, most: int
) -> list[int]:
    """The blocks base x 2^k that are allowed for the layer, at most `most`, and fit the page."""
    step = block_step(layer, plan_input.kernel)
    candidates = [base << k for k in range(most.bit_length())]
    return [
        size
        for size in candidates
        if size % step == 0 and size <= most and page_bytes(layer, plan_input.dtype, size) <= page
    ]


def state_block_size(anchor_block: int) -> int:
    """PAGE-STATE-1: A state layer's block is the anchor block, so its checkpoints fall on the
    anchor layers' block boundaries, and its page is padded to the shared page.

        anchor block 544  ->  state checkpoints at 544, 1088, ...; page 1085440 of P 1114112

    pre: anchor_block >= 1
    post: __return__ == anchor_block
    """
    return anchor_block


def capped_block_size(
    layer: AttentionLayer | LatentLayer,
    plan_input: PlanInput,
    anchor_block: int,
    page: int,
    cap: int,
) -> int:
    """PAGE-ALIGN-1: Under a hit-alignment cap M, every attention or latent layer that takes part
    in hits gets the largest block b x 2^k, b = min(anchor, M), that is at most M and fits the
    shared page; state layers get b, cross-attention layers keep their PAGE-FIT-1 block.

        DeepSeek-V4-Flash, anchor 16, P = 16384; a layer of 1 entry (1024 B) per 128 tokens:
            uncapped (PAGE-FIT-1)   block 2048 = 16 entries, page 16384, padding 0
            M = 256                 block  256 =  2 entries, page  2048, padding 87.5%
            M = 64                  no block: 64 is not a multiple of 128 (refused)

    The blocks stay on one doubling chain below M, so every block divides M and the hit
    alignment is M itself; the pages shrink and their padding buys finer hits. Below the
    anchor (a state forced the anchor up) every layer takes M.

    pre: anchor_block >= 1 and page >= 1 and cap >= 1
    pre: cap <= anchor_block or (cap % anchor_block == 0 and (cap // anchor_block).bit_count() == 1)
    raises: NoPageLayout
    post: cap % __return__ == 0 and page_bytes(layer, plan_input.dtype, __return__) <= page
    """
    base = min(anchor_block, cap)
    fitting = _doublings(layer, plan_input, base, page, min(cap, plan_input.kernel.maximum))
    if not fitting:  # pragma: no cover - plan() weighs only caps PAGE-ALIGN-2 allows
        step = block_step(layer, plan_input.kernel)
        refuse(
            NoPageLayout,
            f"layer {layer.name!r} needs blocks that are multiples of {step}; under the "
            f"hit-alignment cap {cap} none of {base} x 2^k is one: choose a cap that is a "
            f"multiple of {step}",
        )
    return max(fitting)


def slot_count(bucket_sizes: tuple[int, ...], size: int) -> int:
    """Layer slots when every bucket is cut into groups of `size` layers."""
    return sum(-(-n // size) * size for n in bucket_sizes)


def padding_slots(bucket_sizes: tuple[int, ...], size: int) -> int:
    """Layer slots left empty when every bucket is cut into groups of `size` layers."""
    return slot_count(bucket_sizes, size) - sum(bucket_sizes)


def group_size(bucket_sizes: tuple[int, ...], share: Fraction) -> int:
    """PAGE-GROUP-1: Groups hold g layers each, the largest g whose empty layer slots are at most
    the accepted share of all slots.

        buckets 25 sliding + 5 global, accepted 1/20:
            g=25: 20 empty of 50   g=7: 5 of 35   g=6: 6 of 36   g=5: 0 of 30   -> g = 5
        buckets 12 sliding + 13 full (one a draft):  g=13: 1 empty of 26 (3.8%)  -> g = 13

    g = 1 (a group per layer) leaves no slot empty, so some g always qualifies. Fewer groups
    mean fewer block tables; empty slots waste a page per block.

    pre: len(bucket_sizes) >= 1 and min(bucket_sizes) >= 1 and 0 <= share < 1
    post: padding_slots(bucket_sizes, __return__) <= share * slot_count(bucket_sizes, __return__)
    """
    for size in range(max(bucket_sizes), 0, -1):
        if padding_slots(bucket_sizes, size) <= share * slot_count(bucket_sizes, size):
            return size
    return 1  # pragma: no cover - size 1 always qualifies


def split_bucket(members: tuple[int, ...], size: int) -> tuple[tuple[int | None, ...], ...]:
    """PAGE-SPLIT-1: A bucket of n layers becomes cdiv(n, g) groups, group i taking every cdiv(n,
    g)-th layer from the i-th, with empty slots (None) last.

        7 sliding layers [3..9], g = 3  ->  3 groups:  (3, 6, 9)  (4, 7, None)  (5, 8, None)

    Striding spreads each group over the model's depth, so every pipeline stage holds a share
    of every group.

    pre: len(members) >= 1 and size >= 1
    post: sorted(x for g in __return__ for x in g if x is not None) == sorted(members)
    post: all(len(g) == size for g in __return__)
    """
    count = -(-len(members) // size)
    groups = []
    for i in range(count):
        chosen: list[int | None] = list(members[i::count])
        groups.append(tuple(chosen + [None] * (size - len(chosen))))
    return tuple(groups)


def pool_blocks(memory_bytes: int, size: int, page: int) -> int:
    """PAGE-POOL-1: The pool has as many blocks as fit when every block takes one page in each of
    the g tensors, and needs two (the null block and one more).

        30 GiB, g = 5, P = 66560:   32212254720 // (5 x 66560) = 96791 blocks

    pre: memory_bytes >= 1 and size >= 1 and page >= 1
    raises: NoPageLayout
    post: __return__ * size * page <= memory_bytes and __return__ >= 2
    """
    blocks = memory_bytes // (size * page)
    if blocks < 2:
        refuse(
            NoPageLayout,
            f"{memory_bytes} bytes hold {blocks} block(s) of {size} x {page} bytes; the pool "
            f"needs at least 2 (the null block and one more): give at least {2 * size * page}",
        )
    return blocks


def token_capacity(block_sizes: Iterable[int], num_blocks: int) -> int:
    """PAGE-CAP-1: The capacity is the most tokens whose blocks fit the usable pool when every
    counted group holds every token.

        groups with blocks 16, 16, 32 and 1001 blocks (1000 usable, block 0 is null):
            T / 16 + T / 16 + T / 32 <= 1000  ->  T = 6400

    Counted: full, sliding-window and chunked-local groups, and state groups in mode `all`
    (a checkpoint per block). A sliding window or chunk frees blocks behind it in a real run,
    so this is the capacity of one request that never lets a block go.

    pre: num_blocks >= 2 and all(b >= 1 for b in block_sizes)
    post: __return__ >= 0
    """
    per_token = sum(Fraction(1, b) for b in block_sizes)
    return math.floor((num_blocks - 1) / per_token) if per_token else 0


@dataclass(frozen=True)
class PlannedGroup:
    """One KV-cache group of the plan."""

    kind: str  # full | sliding_window | chunked_local | cross | mamba
    layers: tuple[int | None, ...]  # layer ids in tensor order; None is an empty slot
    block_size: int  # tokens per block
    page_bytes: int  # bytes of one member layer's page (before padding to the shared page)
    window: int | None = None  # sliding_window only
    chunk: int | None = None  # chunked_local only
    draft: bool = False  # holds a speculative-decoding draft layer


@dataclass(frozen=True)
class Plan:
    """The planned KV cache of one worker."""

    groups: tuple[PlannedGroup, ...]  # buckets in first-layer order, then split order
    page_size: int  # P: bytes of every page of every tensor
    num_blocks: int  # pages per tensor, the null block included
    tensors: tuple[tuple[int | None, ...], ...]  # tensor i: the i-th layer of every group
    token_capacity: int  # PAGE-CAP-1
    layout: Layout  # the groups as the hit rules of §1-§4 see them


def _kind(layer: Layer) -> str:
    if isinstance(layer, StateLayer):
        return "mamba"
    return layer.kind.value


def _spec_group(group: PlannedGroup, mode: MambaMode, name: str) -> Group:
    if group.kind == "mamba":
        return MambaState(group.block_size, mode, name=name)
    if group.kind == AttentionKind.CROSS:
        return CrossAttention(group.block_size, name=name)
    if group.kind == AttentionKind.SLIDING_WINDOW:
        return SlidingWindow(group.block_size, group.window or 0, group.draft, name=name)
    if group.kind == AttentionKind.CHUNKED_LOCAL:
        return ChunkedLocal(group.block_size, group.chunk or 0, group.draft, name=name)
    return FullAttention(group.block_size, group.draft, name=name)


def capped_plan(plan_input: PlanInput, cap: int | None) -> Plan:
    """The plan with every block at most `cap` (PAGE-ALIGN-1), or uncapped (PAGE-FIT-1) for None;
    the other §9 rules apply unchanged."""
    anchor = anchor_block_size(plan_input)
    page = shared_page_size(plan_input, anchor)
    buckets: dict[tuple[object, ...], list[int]] = {}
    for index, layer in enumerate(plan_input.layers):
        buckets.setdefault(bucket_key(layer), []).append(index)
    size = group_size(tuple(len(m) for m in buckets.values()), plan_input.group_padding)
    groups: list[PlannedGroup] = []
    for members in buckets.values():
        first = plan_input.layers[members[0]]
        if isinstance(first, StateLayer):
            block = state_block_size(anchor if cap is None else min(anchor, cap))
        elif cap is None or first.kind is AttentionKind.CROSS:
            block = fitted_block_size(first, plan_input, anchor, page)
        else:
            block = capped_block_size(first, plan_input, anchor, page, cap)
        for slots in split_bucket(tuple(members), size):
            drafts = [plan_input.layers[i] for i in slots if i is not None]
            groups.append(
                PlannedGroup(
                    kind=_kind(first),
                    layers=slots,
                    block_size=block,
                    page_bytes=page_bytes(first, plan_input.dtype, block),
                    window=getattr(first, "window", None),
                    chunk=getattr(first, "chunk", None),
                    draft=any(getattr(x, "draft", False) for x in drafts),
                )
            )
    blocks = pool_blocks(plan_input.memory_bytes, size, page)
    counted = [
        g.block_size
        for g in groups
        if g.kind not in ("cross", "mamba")
        or (g.kind == "mamba" and plan_input.mamba_mode is MambaMode.ALL)
    ]
    layout = Layout(
        tuple(_spec_group(g, plan_input.mamba_mode, f"{i}:{g.kind}") for i, g in enumerate(groups)),
        plan_input.speculative,
    )
    return Plan(
        groups=tuple(groups),
        page_size=page,
        num_blocks=blocks,
        tensors=tuple(tuple(g.layers[i] for g in groups) for i in range(size)),
        token_capacity=token_capacity(counted, blocks),
        layout=layout,
    )


def alignment_caps(plan_input: PlanInput) -> tuple[int, ...]:
    """PAGE-ALIGN-2: The caps weighed are the anchor's doublings and halvings from the requested
    block up to the uncapped plan's hit alignment U, and, when a state forced the anchor above
    the requested block, the requested block's doublings below the anchor; each a multiple of
    every layer's step.

        DeepSeek-V4-Flash: anchor 16, U = 2048          ->  16 32 64 128 256 512 1024 2048
        Qwen3.5 35B (GDN): requested 16, anchor 1056    ->  16 32 64 128 256 512 1024
                                                            and 528 (1056 / 2), 1056

    On one chain a finer cap divides a coarser one, so it loses no token on any prompt
    (THM-PAGE-ALIGN-DOMINATES); between chains (1024 against 1056) a finer alignment that
    does not divide the coarser one loses more on some prompts (TWIN-PAGE-ALIGN-NONDIVISOR)
    and only PAGE-RECOMP-1's mean compares them.

    pre: plan_input.layers
    raises: NoPageLayout
    post: __return__ == tuple(sorted(set(__return__)))
    """
    anchor = anchor_block_size(plan_input)
    top = max(anchor, hit_alignment(capped_plan(plan_input, None).layout))
    step = math.lcm(*(block_step(x, plan_input.kernel) for x in plan_input.layers))
    if _state_layers(plan_input) and plan_input.mamba_mode is MambaMode.ALL:
        step = math.lcm(step, plan_input.state_chunk)
    first = -(-plan_input.block_size // step) * step
    doublings = [anchor << j for j in range(top.bit_length()) if anchor << j <= top]
    halvings = [anchor >> j for j in range(1, anchor.bit_length()) if anchor % (1 << j) == 0]
    below = [first << i for i in range(anchor.bit_length()) if first << i < anchor]
    chosen = [*doublings, *below, *(x for x in halvings if x >= first)]
    return tuple(sorted({x for x in chosen if x % step == 0}))


def expected_recompute(alignment: int) -> Fraction:
    """PAGE-RECOMP-1: With the reusable prefix's length uniform modulo the hit alignment A, a
    lookup recomputes (A - 1) / 2 reusable tokens on average: the hit stops at the last
    multiple of A.

        A = 2048, reusable 8191  ->  hit 6144, 2047 recomputed;  mean over 0..2047: 1023.5
        A =  256, reusable 8191  ->  hit 7936,  255 recomputed;  mean over 0..255:   127.5

    A model, not a measurement: `kvcert simulate --compare-plans` measures it on a trace.

    pre: alignment >= 1
    post: __return__ == sum(range(alignment)) / Fraction(alignment)
    """
    return Fraction(alignment - 1, 2)


def plan_options(plan_input: PlanInput) -> tuple[Plan, ...]:
    """The plan under every weighed cap (PAGE-ALIGN-2, PAGE-ALIGN-1), finest alignment first.

    Every weighed cap has a plan: the cap is a multiple of every layer's step and at most the
    uncapped alignment, so min(uncapped block, cap) is allowed and fits wherever the uncapped
    plan does.
    """
    return tuple(capped_plan(plan_input, cap) for cap in alignment_caps(plan_input))


def chosen_option(
    options: tuple[tuple[int, int], ...], objective: Objective, share: Fraction
) -> int:
    """PAGE-OBJ-1: Of the (alignment, capacity) options, `capacity` takes the most capacity,
    `alignment` the finest alignment, and `balanced` the finest alignment whose capacity is at
    least `share` of the most; ties go to the fewer recomputed tokens (PAGE-RECOMP-1), then to
    the larger capacity.

        DeepSeek-V4-Flash, 40 GiB:  (128, 762599) (256, 798913) (512, 808538) ... (2048, 815911)
            capacity -> 2048      balanced (95%: >= 775115.45) -> 256      alignment -> 128

    Returns the index of the chosen option.

    pre: len(options) >= 1 and 0 < share <= 1
    post: 0 <= __return__ < len(options)
    """
    most = max(capacity for _, capacity in options)
    if objective is Objective.CAPACITY:
        eligible = [i for i, (_, c) in enumerate(options) if c == most]
    elif objective is Objective.BALANCED:
        eligible = [i for i, (_, c) in enumerate(options) if c >= share * most]
    else:
        eligible = list(range(len(options)))
    return min(eligible, key=lambda i: (expected_recompute(options[i][0]), -options[i][1]))


def plan(plan_input: PlanInput) -> Plan:
    """The plan: the §9 rules applied in order (see the module docstring), the capped plan that
    the input's objective chooses (PAGE-OBJ-1).

    raises: NoPageLayout
    """
    options = plan_options(plan_input)
    scores = tuple((hit_alignment(p.layout), p.token_capacity) for p in options)
    return options[chosen_option(scores, plan_input.objective, plan_input.capacity_share)]
