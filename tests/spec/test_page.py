"""§8-§10: page bytes, the page plan and the byte layout, by worked example and by property."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given

from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.spec import (
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    InvalidLayout,
    InvalidPlan,
    InvalidRequest,
    MambaMode,
    MambaState,
    NoPageLayout,
    SlidingWindow,
    SpecError,
    Speculative,
    hit_alignment,
)
from kvcert.spec.layers import (
    AttentionKind,
    AttentionLayer,
    KVDtype,
    LatentLayer,
    StateLayer,
    StateTensor,
    page_bytes,
    state_tensor_offsets,
)
from kvcert.spec.page_layout import (
    Part,
    attention_offset,
    attention_scale_offset,
    latent_offset,
    latent_scale_offset,
    slot_address,
    state_offset,
)
from kvcert.spec.plan import (
    KernelLimits,
    Objective,
    Plan,
    PlanInput,
    alignment_caps,
    anchor_block_size,
    block_step,
    capped_block_size,
    capped_plan,
    chosen_option,
    expected_recompute,
    fitted_block_size,
    group_size,
    padding_slots,
    plan,
    plan_options,
    pool_blocks,
    shared_page_size,
    split_bucket,
    token_capacity,
)
from tests.strategies import plan_inputs

GIB = 1 << 30
FP8 = KVDtype.FP8
SW, FULL = AttentionKind.SLIDING_WINDOW, AttentionKind.FULL
GEMMA_SW = AttentionLayer(SW, 8, 256, 256, window=1024, name="sw")
GEMMA_GLOBAL = AttentionLayer(FULL, 2, 512, 512, name="global")
GEMMA_26B = tuple(([GEMMA_SW] * 5 + [GEMMA_GLOBAL]) * 5)
GDN_08B = StateLayer(
    (StateTensor((3, 6144), KVDtype.BF16), StateTensor((16, 128, 128), KVDtype.FP32)), name="gdn"
)
QWEN_FULL = AttentionLayer(FULL, 2, 256, 256, name="full")


# --- worked examples: every number in the rules' diagrams -----------------------------------


def test_page_bytes_examples():
    assert page_bytes(GEMMA_SW, KVDtype.INT8_PER_TOKEN_HEAD, 16) == 66560
    assert page_bytes(GEMMA_SW, KVDtype.INT8, 16) == 65536
    latent = LatentLayer(FULL, 512, 64, ratio=4)
    assert page_bytes(latent, KVDtype.FP8, 256) == 36864
    assert page_bytes(GDN_08B, KVDtype.BF16, 16) == 36864 + 1048576
    # the seed's per-token-head factors: 520 and 1032 bytes per (token, head)
    assert page_bytes(AttentionLayer(FULL, 1, 256, 256), KVDtype.INT8_PER_TOKEN_HEAD, 1) == 520
    assert page_bytes(AttentionLayer(FULL, 1, 512, 512), KVDtype.FP8_PER_TOKEN_HEAD, 1) == 1032


def test_latent_blocks_hold_whole_entries():
    with pytest.raises(NoPageLayout, match="multiple of 4"):
        page_bytes(LatentLayer(FULL, 512, 64, ratio=4), KVDtype.FP8, 6)


def test_state_tensors_are_aligned_to_their_element():
    layer = StateLayer((StateTensor((3,), KVDtype.BF16), StateTensor((2,), KVDtype.FP32)))
    assert state_tensor_offsets(layer) == (0, 8)  # 6 bytes of bf16, then fp32 at 8
    assert page_bytes(layer, KVDtype.FP8, 1) == 16


def test_gemma4_per_token_head_plan():
    """Seed 002: the 520 vs 1032 bytes per token-head layout plans instead of crashing."""
    chosen = plan(PlanInput(GEMMA_26B, KVDtype.INT8_PER_TOKEN_HEAD, 30 * GIB))
    assert chosen.page_size == 66560
    assert [(g.kind, g.block_size, g.page_bytes) for g in chosen.groups] == [
        ("sliding_window", 16, 66560)
    ] * 5 + [("full", 32, 66048)]
    assert chosen.groups[0].layers == (0, 6, 12, 18, 24)
    assert chosen.groups[5].layers == (5, 11, 17, 23, 29)
    assert chosen.tensors[0] == (0, 1, 2, 3, 4, 5)
    assert chosen.num_blocks == 30 * GIB // (5 * 66560) == 96791
    assert chosen.token_capacity == 281570
    assert hit_alignment(chosen.layout) == 32


def test_qwen35_anchor_block_is_vllms_544():
    layers = tuple(([GDN_08B] * 3 + [QWEN_FULL]) * 6)
    plan_input = PlanInput(layers, KVDtype.BF16, 10 * GIB)
    assert anchor_block_size(plan_input) == 544
    chosen = plan(plan_input)
    assert chosen.page_size == 544 * 2048 == 1114112
    assert {g.block_size for g in chosen.groups} == {544}
    assert [g.kind for g in chosen.groups] == ["mamba"] * 3 + ["full"]


def test_state_chunk_moves_the_anchor_in_mode_all():
    layers = (GDN_08B, QWEN_FULL)
    base = PlanInput(layers, KVDtype.BF16, GIB, mamba_mode=MambaMode.ALL)
    assert anchor_block_size(base) == 544
    chunked = PlanInput(layers, KVDtype.BF16, GIB, mamba_mode=MambaMode.ALL, state_chunk=64)
    assert anchor_block_size(chunked) == 576
    aligned = PlanInput(layers, KVDtype.BF16, GIB, state_chunk=64)  # align mode ignores it
    assert anchor_block_size(aligned) == 544


def test_fit_examples():
    plan_input = PlanInput(GEMMA_26B, KVDtype.INT8_PER_TOKEN_HEAD, GIB)
    assert fitted_block_size(GEMMA_GLOBAL, plan_input, 16, 66560) == 32
    assert fitted_block_size(GEMMA_SW, plan_input, 16, 66560) == 16
    # a layer whose entry ratio exceeds the anchor gets anchor x 2^k >= its ratio
    hca = LatentLayer(FULL, 448, 64, ratio=128)
    assert fitted_block_size(hca, plan_input, 16, 66560) == 4096
    capped = PlanInput(GEMMA_26B, KVDtype.INT8, GIB, kernel=KernelLimits(16, 64))
    with pytest.raises(NoPageLayout, match="no block size anchor x 2"):
        fitted_block_size(hca, capped, 16, 66560)


def test_group_size_examples():
    assert group_size((25, 5), Fraction(1, 20)) == 5
    assert padding_slots((25, 5), 7) == 5
    assert group_size((12, 13), Fraction(1, 20)) == 13
    assert group_size((3, 7), Fraction(0)) == 1
    assert group_size((3, 7), Fraction(1, 4)) == 4  # 4 + 8 slots, 2 empty (vLLM: 3)


def test_split_example():
    assert split_bucket((3, 4, 5, 6, 7, 8, 9), 3) == ((3, 6, 9), (4, 7, None), (5, 8, None))


def test_pool_and_capacity_examples():
    assert pool_blocks(30 * GIB, 5, 66560) == 96791
    assert token_capacity([16, 16, 32], 1001) == 6400
    assert token_capacity([], 10) == 0
    with pytest.raises(NoPageLayout, match="at least 2"):
        pool_blocks(1000, 1, 600)


def test_peer_grouping_examples_from_the_notes():
    """vLLM's documented groupings (notes §4.3), reproduced where our rule agrees."""
    full = AttentionLayer(FULL, 8, 128, 128)
    sw = AttentionLayer(SW, 8, 128, 128, window=128)

    def shape(layers, share=Fraction(1, 20)):
        chosen = plan(PlanInput(tuple(layers), KVDtype.BF16, GIB, group_padding=share))
        return [g.layers for g in chosen.groups]

    assert shape([full, sw]) == [(0,), (1,)]
    assert shape([full, full, sw, sw, sw, sw]) == [(0, 1), (2, 4), (3, 5)]
    assert shape([full] * 6 + [sw] * 5, Fraction(1, 10)) == [
        tuple(range(6)),
        (6, 7, 8, 9, 10, None),
    ]


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: AttentionLayer(FULL, 0, 64, 64), InvalidPlan, "num_kv_heads"),
        (lambda: AttentionLayer("paged", 1, 64, 64), InvalidPlan, "kind must be one of full"),
        (lambda: AttentionLayer("FULL", 1, 64, 64), InvalidPlan, "kind must be one of full"),
        (lambda: AttentionLayer(FULL, 1, 64, 64, draft=1), InvalidPlan, "draft must be"),
        (lambda: LatentLayer(FULL, 8, 0, draft="no"), InvalidPlan, "draft must be"),
        (lambda: StateTensor([4], KVDtype.FP32), InvalidPlan, "non-empty shape"),
        (lambda: StateTensor((), KVDtype.FP32), InvalidPlan, "non-empty shape"),
        (lambda: PlanInput((QWEN_FULL,), "fp4", GIB), InvalidPlan, "dtype must be one of fp32"),
        (
            lambda: PlanInput((QWEN_FULL,), "fp8", GIB, mamba_mode="some"),
            InvalidPlan,
            "mamba_mode must be one of",
        ),
        (
            lambda: PlanInput((QWEN_FULL,), "fp8", GIB, speculative="Exact"),
            InvalidPlan,
            "speculative must be one of",
        ),
        (lambda: AttentionLayer(SW, 1, 64, 64), InvalidPlan, "window"),
        (lambda: AttentionLayer(FULL, 1, 64, 64, window=4), InvalidPlan, "only sliding_window"),
        (lambda: AttentionLayer(FULL, 1, 64, 64, chunk=4), InvalidPlan, "only chunked_local"),
        (lambda: LatentLayer(AttentionKind.CROSS, 512, 64), InvalidPlan, "full or sliding"),
        (lambda: LatentLayer(FULL, 512, -1), InvalidPlan, "rope_size must be >= 0"),
        (lambda: LatentLayer(FULL, 512, 1.5), InvalidPlan, "rope_size must be an integer"),
        (lambda: StateTensor((0,), KVDtype.FP32), InvalidPlan, "dimension"),
        (lambda: StateTensor((4,), KVDtype.FP8), InvalidPlan, "dtype"),
        (lambda: StateLayer(()), InvalidPlan, "at least one tensor"),
        (lambda: KernelLimits(16, 8), InvalidPlan, "below the block multiple"),
        (lambda: KernelLimits(0, 8), InvalidPlan, "multiple"),
        (lambda: PlanInput((), KVDtype.FP8, GIB), InvalidPlan, "at least one layer"),
        (lambda: PlanInput((QWEN_FULL,), KVDtype.FP8, 0), InvalidPlan, "memory_bytes"),
        (lambda: PlanInput((QWEN_FULL,), KVDtype.FP8, GIB, 20), InvalidPlan, "multiples of 16"),
        (
            lambda: PlanInput((QWEN_FULL,), KVDtype.FP8, GIB, group_padding=Fraction(1)),
            InvalidPlan,
            "group_padding",
        ),
    ],
)
def test_malformed_inputs_are_refused_with_what_to_fix(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_infeasible_plans_name_the_constraint():
    small = PlanInput((GDN_08B, QWEN_FULL), KVDtype.BF16, GIB, kernel=KernelLimits(16, 256))
    with pytest.raises(NoPageLayout, match="state layers need a 1085440-byte page"):
        plan(small)
    with pytest.raises(NoPageLayout, match="pool needs at least 2"):
        plan(PlanInput(GEMMA_26B, KVDtype.BF16, 1 << 20))
    state_only = PlanInput((GDN_08B,), KVDtype.BF16, GIB, mamba_mode=MambaMode.ALL,
                           state_chunk=5000, kernel=KernelLimits(16, 4096))  # fmt: skip
    with pytest.raises(NoPageLayout, match="allowed anchor block sizes"):
        plan(state_only)


def test_a_state_only_model_plans_on_its_state_page():
    chosen = plan(PlanInput((GDN_08B, GDN_08B), KVDtype.BF16, GIB))
    assert chosen.page_size == 1085440
    assert chosen.token_capacity == 0  # no group holds tokens in align mode


def test_draft_layers_need_a_speculative_profile():
    draft = AttentionLayer(FULL, 8, 64, 64, draft=True)
    with pytest.raises(InvalidLayout, match="no speculative profile"):
        plan(PlanInput((QWEN_FULL, draft), KVDtype.BF16, GIB))


# --- properties on random layer mixes ---------------------------------------------------------


@given(plan_inputs())
def test_every_plan_satisfies_the_page_invariants(obj):
    try:
        plan_input = plan_input_from_json(obj)
        chosen = plan(plan_input)
        options = plan_options(plan_input)
    except (InputError, SpecError):  # refusals have their own tests
        return
    assert chosen in options
    assert options[-1] == capped_plan(plan_input, None)  # the coarsest option is PAGE-FIT-1's
    for option in options:
        _check_page_invariants(plan_input, option)
    # PAGE-OBJ-1, stated as properties of the choice
    alignments = [hit_alignment(x.layout) for x in options]
    aligned = hit_alignment(chosen.layout)
    most = max(x.token_capacity for x in options)
    if plan_input.objective is Objective.CAPACITY:
        assert chosen.token_capacity == most
    elif plan_input.objective is Objective.ALIGNMENT:
        assert aligned == min(alignments)
    else:
        assert chosen.token_capacity >= plan_input.capacity_share * most
        finer = [x for x, a in zip(options, alignments, strict=True) if a < aligned]
        assert all(x.token_capacity < plan_input.capacity_share * most for x in finer)
    assert alignments == sorted(set(alignments))  # finest first, one plan per alignment


def _check_page_invariants(plan_input: PlanInput, chosen: Plan) -> None:
    page, g = chosen.page_size, len(chosen.tensors)
    anchor = anchor_block_size(plan_input)
    cacheable = [x.block_size for x in chosen.groups if x.kind != "cross"]
    cap = hit_alignment(chosen.layout) if cacheable else anchor
    base = min(anchor, cap)
    # THM-PAGE-EQUAL / FITS: one page size, every layer's data fits it
    for group in chosen.groups:
        assert len(group.layers) == g
        assert group.page_bytes <= page
        members = [plan_input.layers[i] for i in group.layers if i is not None]
        for layer in members:
            assert page_bytes(layer, plan_input.dtype, group.block_size) == group.page_bytes
        if group.kind != "mamba":
            # THM-PAGE-FIT / PAGE-ALIGN-1: doubling once more would not fit, not be allowed,
            # or exceed the cap
            first = anchor if group.kind == "cross" else base
            assert group.block_size % first == 0
            assert (group.block_size // first).bit_count() == 1
            bigger = group.block_size * 2
            step = block_step(members[0], plan_input.kernel)
            assert (
                bigger > plan_input.kernel.maximum
                or page_bytes(members[0], plan_input.dtype, bigger) > page
                or bigger % step
                or (group.kind != "cross" and bigger > cap)
            )
        else:
            assert group.block_size == base
    if base == anchor:
        assert max(x.page_bytes for x in chosen.groups) == page  # the anchor's (or a state's)
    # every layer exactly once, tensors are the transposed groups
    placed = sorted(i for group in chosen.groups for i in group.layers if i is not None)
    assert placed == list(range(len(plan_input.layers)))
    assert [tuple(gr.layers[i] for gr in chosen.groups) for i in range(g)] == list(chosen.tensors)
    # pool and alignment
    assert chosen.num_blocks * g * page <= plan_input.memory_bytes
    assert (chosen.num_blocks + 1) * g * page > plan_input.memory_bytes
    if cacheable:
        assert hit_alignment(chosen.layout) == max(cacheable)  # the doubling chain


# --- the byte layout --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(KVDtype))
def test_attention_addresses_tile_the_page_exactly(dtype):
    layer = AttentionLayer(FULL, 2, 3, 5)
    block = 4
    data = [
        attention_offset(layer, dtype, block, token=t, head=h, part=part, index=d)
        for t, h in itertools.product(range(block), range(2))
        for part, size in ((Part.K, 3), (Part.V, 5))
        for d in range(size)
    ]
    scales: list[int] = []
    if dtype.value.endswith("per_token_head"):
        scales = [
            attention_scale_offset(layer, dtype, block, token=t, head=h, part=p)
            for t, h, p in itertools.product(range(block), range(2), Part)
        ]
        assert all(s % 4 == 0 for s in scales)
    else:
        with pytest.raises(InvalidRequest, match="hold no scales"):
            attention_scale_offset(layer, dtype, block, token=0, head=0, part=Part.K)
    width = {KVDtype.FP32: 4, KVDtype.FP16: 2, KVDtype.BF16: 2}.get(dtype, 1)
    covered = {b for s in scales for b in range(s, s + 4)}
    covered |= {b for x in data for b in range(x, x + width)}
    assert all(x % width == 0 for x in data)
    assert len(covered) == 4 * len(scales) + width * len(data)  # no overlaps
    assert covered == set(range(page_bytes(layer, dtype, block)))  # no gaps, nothing outside


def test_addresses_of_the_docstring_examples():
    layer = AttentionLayer(FULL, 2, 4, 4)
    dtype = KVDtype.INT8_PER_TOKEN_HEAD
    assert attention_offset(layer, dtype, 2, token=1, head=0, part=Part.K, index=3) == 43
    assert attention_offset(layer, dtype, 2, token=0, head=1, part=Part.V, index=0) == 52
    assert attention_scale_offset(layer, dtype, 2, token=1, head=1, part=Part.K) == 12
    assert attention_scale_offset(layer, dtype, 2, token=0, head=0, part=Part.V) == 16
    latent = LatentLayer(FULL, 4, 2, ratio=2)
    assert latent_offset(latent, KVDtype.FP8_PER_TOKEN_HEAD, 4, entry=1, index=5) == 19
    assert latent_scale_offset(latent, KVDtype.FP8_PER_TOKEN_HEAD, 4, entry=1) == 4
    with pytest.raises(InvalidRequest, match="hold no scales"):
        latent_scale_offset(latent, KVDtype.FP16, 4, entry=0)
    with pytest.raises(InvalidRequest, match="entry must be in"):
        latent_scale_offset(latent, KVDtype.FP8_PER_TOKEN_HEAD, 4, entry=2)
    assert state_offset(GDN_08B, 1, 5) == 36884
    assert slot_address((7, 3), 16, 66560, 20) == (3, 4, 199680)


def test_latent_and_state_addresses_tile_their_pages():
    latent = LatentLayer(FULL, 3, 1, ratio=2)
    dtype = KVDtype.FP16
    offsets = [
        latent_offset(latent, dtype, 8, entry=j, index=d) for j in range(4) for d in range(4)
    ]
    assert sorted(offsets) == list(range(0, page_bytes(latent, dtype, 8), 2))
    layer = StateLayer((StateTensor((3,), KVDtype.BF16), StateTensor((2,), KVDtype.FP32)))
    assert [state_offset(layer, k, i) for k, n in ((0, 3), (1, 2)) for i in range(n)] == [
        0, 2, 4, 8, 12,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "call",
    [
        lambda: attention_offset(GEMMA_SW, KVDtype.FP8, 16, token=16, head=0, part=Part.K, index=0),
        lambda: attention_offset(GEMMA_SW, KVDtype.FP8, 16, token=0, head=8, part=Part.K, index=0),
        lambda: attention_offset(
            GEMMA_SW, KVDtype.FP8, 16, token=0, head=0, part=Part.V, index=256
        ),
        lambda: latent_offset(LatentLayer(FULL, 4, 0, ratio=2), KVDtype.FP8, 4, entry=2, index=0),
        lambda: state_offset(GDN_08B, 2, 0),
        lambda: state_offset(GDN_08B, 0, 3 * 6144),
        lambda: slot_address((1,), 16, 100, 16),
    ],
)
def test_out_of_range_addresses_are_refused(call):
    with pytest.raises(InvalidRequest, match="must be in"):
        call()


def test_capacity_is_the_largest_fitting_token_count():
    for sizes, blocks in [([16, 32], 101), ([544], 7), ([16, 16, 64, 2048], 1000)]:
        capacity = token_capacity(sizes, blocks)
        per = sum(Fraction(1, b) for b in sizes)
        assert capacity * per <= blocks - 1 < (capacity + 1) * per
        assert math.floor((blocks - 1) / per) == capacity


# --- PAGE-ALIGN / PAGE-RECOMP / PAGE-OBJ: the diagrams' numbers -------------------------------


def _bundled(name: str, **fields: object) -> PlanInput:
    from kvcert.conformance.tools.catalog import load_model

    model = load_model(name)
    obj = {"layers": list(model.layers), "kv_cache_dtype": model.dtype,
           "memory_bytes": 40 * GIB, **fields}  # fmt: skip
    return plan_input_from_json(obj)


def test_alignment_examples_deepseek_v4_flash():
    plan_input = _bundled("deepseek-v4-flash")
    assert alignment_caps(plan_input) == (128, 256, 512, 1024, 2048)  # 16..64: not x 128
    hca = next(x for x in plan_input.layers if getattr(x, "ratio", 1) == 128)
    page = shared_page_size(plan_input, 16)
    assert page == 16384
    assert page_bytes(hca, plan_input.dtype, 128) == 1024
    assert fitted_block_size(hca, plan_input, 16, page) == 2048
    assert capped_block_size(hca, plan_input, 16, page, 256) == 256
    assert page_bytes(hca, plan_input.dtype, 256) == 2048  # 87.5% of the page is padding
    with pytest.raises(NoPageLayout, match="multiples of 128"):
        capped_block_size(hca, plan_input, 16, page, 64)
    options = [(hit_alignment(p.layout), p.token_capacity) for p in plan_options(plan_input)]
    assert options == [(128, 762599), (256, 798913), (512, 808538), (1024, 813439),
                       (2048, 815911)]  # fmt: skip
    # by hand for the cap 256: 9 sliding groups of 16, 4 full of 64, 4 of 256 and the 4 capped
    # from 2048 to 256, in 524,288 blocks (40 GiB of 5 x 16 KiB pages), block 0 null
    per_token = Fraction(9, 16) + Fraction(4, 64) + Fraction(8, 256)
    assert math.floor(Fraction(40 * GIB // (5 * 16384) - 1) / per_token) == 798913
    assert [options[chosen_option(tuple(options), o, Fraction(19, 20))][0] for o in Objective] == [
        2048,
        256,
        128,
    ]
    assert hit_alignment(plan(plan_input).layout) == 256  # the default objective: balanced


def test_alignment_examples_qwen35():
    plan_input = _bundled("qwen3.5-35b-a3b")
    assert anchor_block_size(plan_input) == 1056
    assert alignment_caps(plan_input) == (16, 32, 64, 128, 256, 512, 528, 1024, 1056)
    capped = capped_plan(plan_input, 1024)
    assert {g.block_size for g in capped.groups} == {1024}  # states included
    assert capped.page_size == capped_plan(plan_input, None).page_size  # P never moves


def test_expected_recompute_examples():
    assert expected_recompute(2048) == Fraction(2047, 2)
    assert expected_recompute(256) == Fraction(255, 2)
    hit = 8191 // 2048 * 2048
    assert (hit, 8191 - hit) == (6144, 2047)
    assert 8191 - 8191 // 256 * 256 == 255
    for alignment in (1, 16, 544):
        losses = [c % alignment for c in range(10 * alignment)]
        assert Fraction(sum(losses), len(losses)) == expected_recompute(alignment)


def test_objective_ties_go_to_the_finer_alignment_then_the_larger_capacity():
    options = ((16, 100), (32, 100), (64, 90))
    assert chosen_option(options, Objective.CAPACITY, Fraction(1)) == 0
    assert chosen_option(((16, 90), (16, 95)), Objective.ALIGNMENT, Fraction(1)) == 1
    assert chosen_option(((16, 94), (32, 100)), Objective.BALANCED, Fraction(19, 20)) == 1
    assert chosen_option(((16, 95), (32, 100)), Objective.BALANCED, Fraction(19, 20)) == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"objective": "fastest"}, "objective: expected one of"),
     ({"capacity_share": "0"}, "capacity_share must be in"),
     ({"capacity_share": "3/2"}, "capacity_share must be in")],
)  # fmt: skip
def test_bad_objectives_are_refused(fields, message):
    with pytest.raises((InputError, InvalidPlan), match=message):
        _bundled("gpt-oss-20b", **fields)


def test_enum_inputs_take_the_member_or_its_exact_value_and_nothing_else():
    by_value = PlanInput((QWEN_FULL,), "bf16", GIB, objective="capacity", mamba_mode="all")  # type: ignore[arg-type]
    assert by_value.dtype is KVDtype.BF16
    assert by_value.objective is Objective.CAPACITY
    assert by_value.mamba_mode is MambaMode.ALL
    assert by_value == PlanInput(
        (QWEN_FULL,), KVDtype.BF16, GIB, objective=Objective.CAPACITY, mamba_mode=MambaMode.ALL
    )
    for wrong in ("Capacity", " capacity", 0, None):
        with pytest.raises(InvalidPlan, match="objective must be one of capacity"):
            PlanInput((QWEN_FULL,), KVDtype.BF16, GIB, objective=wrong)  # type: ignore[arg-type]


def test_a_plan_names_every_kind_of_group_as_the_hit_rules_see_it():
    """capped_plan's layout: each planned bucket becomes the spec group of its kind, a state
    group in the plan's mode, and the plan's speculative keying (given by its value string)."""
    gdn = StateLayer((StateTensor((3, 64), KVDtype.BF16), StateTensor((4, 16, 16), KVDtype.FP32)))
    layers = (
        AttentionLayer(FULL, 2, 128, 128),
        AttentionLayer(SW, 2, 128, 128, window=128),
        AttentionLayer(AttentionKind.CHUNKED_LOCAL, 2, 128, 128, chunk=256),
        AttentionLayer(AttentionKind.CROSS, 2, 128, 128),
        gdn,
        AttentionLayer(FULL, 2, 128, 128, draft=True),
    )
    plan_input = PlanInput(layers, KVDtype.BF16, GIB, mamba_mode="all", speculative="exact")
    layout = plan(plan_input).layout
    assert layout.speculative is Speculative.EXACT
    assert [type(g) for g in layout.groups] == [
        FullAttention, FullAttention, SlidingWindow, ChunkedLocal, CrossAttention, MambaState
    ]  # fmt: skip
    assert [getattr(g, "draft", False) for g in layout.groups] == [False, True, *[False] * 4]
    assert (layout.groups[2].window, layout.groups[3].chunk) == (128, 256)
    assert layout.groups[5].mode is MambaMode.ALL


def test_the_caps_weighed_in_mode_all_are_multiples_of_the_state_chunk():
    """PAGE-ALIGN-2: under mode all a cap must also be a multiple of the state kernel's chunk;
    mode align ignores the chunk."""
    layers = (GDN_08B, QWEN_FULL)
    aligned = alignment_caps(PlanInput(layers, KVDtype.BF16, GIB, state_chunk=128))
    assert 544 in aligned  # vLLM's Qwen3.5 block, the anchor in mode align
    assert any(cap % 128 for cap in aligned)  # align ignores the chunk
    chunked = PlanInput(layers, KVDtype.BF16, GIB, mamba_mode=MambaMode.ALL, state_chunk=128)
    caps = alignment_caps(chunked)
    assert all(cap % 128 == 0 for cap in caps)
    assert -(-544 // 128) * 128 in caps  # the anchor made a multiple of the chunk: 640
