"""Refusals (INPUT-1): invalid layouts, requests and operations every engine must refuse."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvcert.conformance.contract.codec import (
    JSON,
)
from kvcert.conformance.vectors.generate.cases import PROMPT, spec_answer


def raw_case(case_id: str, case_input: JSON, comment: str, needs: Sequence[str] = ()) -> JSON:
    """A case written directly in JSON (invalid input cannot be built from spec types).
    `needs`: the features a valid layout in it uses (an invalid layout needs none)."""
    expect, rules = spec_answer(case_input)
    if expect != {"refused": True} and case_input["suite"] == "hit":
        raise ValueError(f"{case_id} was meant to be refused, got {expect}")
    return {
        "id": case_id,
        "rules": rules or ["HIT-GROUP-1"],
        "requires": sorted(needs),
        "comment": comment,
        "input": case_input,
        "expect": expect,
    }


def refusals() -> Iterator[JSON]:
    """Input every engine must refuse, each with what is wrong."""
    full = {"kind": "full", "block_size": 16}
    bad_layouts = {
        "block-size-zero": ({"groups": [{"kind": "full", "block_size": 0}]}, "block size 0"),
        "block-size-text": ({"groups": [{"kind": "full", "block_size": "16"}]}, "not an integer"),
        "window-zero": (
            {"groups": [full, {"kind": "sliding_window", "block_size": 16, "window": 0}]},
            "window < 1",
        ),
        "chunk-zero": (
            {"groups": [full, {"kind": "chunked_local", "block_size": 16, "chunk": 0}]},
            "chunk < 1",
        ),
        "unknown-kind": ({"groups": [{"kind": "paged", "block_size": 16}]}, "unknown kind"),
        "unknown-mamba-mode": (
            {"groups": [full, {"kind": "mamba", "block_size": 16, "mode": "sometimes"}]},
            "unknown mode",
        ),
        "no-groups": ({"groups": []}, "a layout needs groups"),
        "draft-not-boolean": (
            {"groups": [{**full, "draft": "yes"}], "speculative": "drop"},
            "draft must be true or false",
        ),
        "draft-without-profile": (
            {"groups": [{**full, "draft": True}]},
            "draft layers but no speculative profile",
        ),
        "profile-without-draft": (
            {"groups": [full], "speculative": "drop"},
            "speculative profile but no draft group",
        ),
        "unknown-profile": (
            {"groups": [{**full, "draft": True}], "speculative": "eagle"},
            "unknown speculative profile",
        ),
        "draft-on-state-group": (
            {
                "groups": [full, {"kind": "mamba", "block_size": 16, "draft": True}],
                "speculative": "drop",
            },
            "state groups hold no draft layers",
        ),
        "draft-reach-zero": (
            {"groups": [full, {**full, "draft": True}], "speculative": "exact", "draft_reach": 0},
            "draft_reach < 1",
        ),
        "draft-reach-without-drafts": (
            {"groups": [full], "draft_reach": 2},
            "draft_reach > 1 but no draft layers",
        ),
        "drop-beyond-alignment": (
            {
                "groups": [
                    {"kind": "full", "block_size": 2},
                    {"kind": "full", "block_size": 2, "draft": True},
                ],
                "speculative": "drop",
                "draft_reach": 3,
            },
            "a drop steps down 2 tokens, fewer than the 3 a draft position reads (HIT-SPEC-2)",
        ),
        "max-model-len-zero": ({"groups": [full], "max_model_len": 0}, "max_model_len < 1"),
        "alignment-impossible": (
            {
                "groups": [
                    {"kind": "full", "block_size": 48},
                    {"kind": "sliding_window", "block_size": 64, "window": 128},
                ],
                "max_model_len": 100,
            },
            "lcm 192 exceeds what max_model_len 100 can reuse",
        ),
    }
    for label, (layout, why) in bad_layouts.items():  # layout: a JSON object
        yield raw_case(
            f"hit.refuse.layout-{label}",
            {
                "suite": "hit",
                "layout": layout,
                "num_tokens": 40,
                "cached": [[] for _ in layout["groups"]],  # type: ignore[index]
            },
            why,
            # only an engine that reads draft_reach can be asked to refuse a bad one
            ("speculative.reach",) if "draft_reach" in layout else (),  # type: ignore[operator]
        )
    yield raw_case(
        "hit.refuse.layout-speculative-blocks-outside-align",
        {
            "suite": "hit",
            "layout": {
                "groups": [
                    full,
                    {"kind": "mamba", "block_size": 16, "mode": "none", "speculative_blocks": 2},
                ]
            },
            "num_tokens": 40,
            "cached": [[], []],
        },
        "speculative blocks need a state group in mode align (ALLOC-SPEC-1)",
    )
    ok = {
        "groups": [
            full,
            {"kind": "cross", "block_size": 16},
            {"kind": "mamba", "block_size": 16, "mode": "none"},
        ],
        "max_model_len": 100,
    }
    bad_views = {
        "zero-tokens": (0, [[], [], []], "a request has at least one token"),
        "tokens-not-integer": ("40", [[], [], []], "num_tokens must be an integer"),
        "beyond-max-model-len": (101, [[], [], []], "longer than max_model_len"),
        "cached-entries-per-group": (40, [[]], "one cached entry per group"),
        "block-outside-request": (40, [[[0, 3]], [], []], "block 2 is not a full block"),
        "cross-attention-cached": (40, [[], [[0, 1]], []], "cross attention is never cached"),
        "mode-none-cached": (40, [[], [], [[0, 1]]], "mode none keeps no checkpoints"),
    }
    for label, (tokens, cached, why) in bad_views.items():
        yield raw_case(
            f"hit.refuse.request-{label}",
            {"suite": "hit", "layout": ok, "num_tokens": tokens, "cached": cached},
            why,
            ("kind.full", "kind.cross", "kind.mamba.none"),
        )
    yield from unit_refusals(full)
    yield raw_case(
        "hit.refuse.cross-attention-only",
        {
            "suite": "hit",
            "layout": {"groups": [{"kind": "cross", "block_size": 16}]},
            "num_tokens": 40,
            "cached": [[]],
        },
        "nothing to cache: every group is cross attention",
        ("kind.cross",),
    )
    yield raw_case(
        "alloc.refuse.pool-too-small",
        {"suite": "alloc", "layout": {"groups": [full]}, "num_blocks": 1, "ops": []},
        "a pool needs the null block plus one",
        ("kind.full",),
    )
    yield raw_case(
        "alloc.refuse.pool-size-not-integer",
        {"suite": "alloc", "layout": {"groups": [full]}, "num_blocks": "64", "ops": []},
        "num_blocks must be an integer",
        ("kind.full",),
    )
    window = {"kind": "sliding_window", "block_size": 16, "window": 32}
    for name, retention, interval, why in (
        ("retention-interval-negative", "sparse", -16, "an interval is an integer >= 0"),
        ("retention-interval-dense", "dense", 16, "an interval applies to sparse retention"),
        ("retention-interval-unaligned", "sparse", 8, "no hit ends at 8: not a multiple of 16"),
    ):
        yield raw_case(
            f"alloc.refuse.{name}",
            {
                "suite": "alloc",
                "layout": {"groups": [full, window]},
                "num_blocks": 16,
                "retention": retention,
                "retention_interval": interval,
                "ops": [],
            },
            why,
            ("kind.full", "kind.sliding_window", "retention.sparse-interval"),
        )
    bad_extras = [
        {"kind": "cache_salt", "value": "s", "start": 0, "end": 4},
        {"kind": "multimodal", "value": "img"},
        {"kind": "lora", "value": 3},
        {"kind": "watermark", "value": "w"},
        {"kind": "multimodal", "value": "img", "start": 30, "end": 90},
    ]
    ops = [
        {"op": "admit", "rid": f"r{i}", "tokens": list(PROMPT), "budget": 8, "extras": [e]}
        for i, e in enumerate(bad_extras)
    ]
    yield raw_case(
        "alloc.refuse.malformed-extras",
        {
            "suite": "alloc",
            "layout": {"groups": [full, {"kind": "cross", "block_size": 16}]},
            "num_blocks": 16,
            "ops": [
                *ops,
                {"op": "admit", "rid": "ok", "tokens": list(PROMPT), "budget": 8},
                {"op": "end_step"},
                {"op": "finish", "rid": "ok"},
            ],
        },
        "request-wide extras take no span, positioned ones need one within the prompt, kinds "
        "are closed, values are strings; then a valid request in a layout with cross attention",
        ("kind.full", "kind.cross"),
    )


def unit_refusals(full: JSON) -> Iterator[JSON]:
    """Bad `unit U` layouts and partial keys (HIT-UNIT-1, format /5), for engines claiming
    the profile `hit.unit`."""
    state = {"kind": "mamba", "block_size": 16, "mode": "align"}
    layouts: dict[str, tuple[list[JSON], object, str]] = {
        "unit-not-dividing": ([full, state], 12, "12 does not divide 16"),
        "unit-zero": ([full], 0, "hit_unit < 1"),
        "unit-text": ([full], "8", "hit_unit not an integer"),
    }
    for label, (groups, unit_value, why) in layouts.items():
        layout = {"groups": groups, "hit_unit": unit_value}
        yield raw_case(
            f"hit.refuse.layout-{label}",
            {"suite": "hit", "layout": layout, "num_tokens": 40, "cached": [[] for _ in groups]},
            why,
            ("hit.unit",),
        )
    unit = {"groups": [full, state], "hit_unit": 8}
    views = {
        "partial-off-unit-grid": ([[12], []], "12 is not a multiple of the unit 8"),
        "partial-at-block-end": ([[16], []], "a block end is a whole block, listed in cached"),
        "partial-beyond-request": ([[], [40]], "position 40 names tokens the request lacks"),
        "partial-entries-per-group": ([[8]], "one partial entry per group"),
    }
    yield raw_case(
        "hit.refuse.request-partial-without-unit",
        {"suite": "hit", "layout": {"groups": [full, state]}, "num_tokens": 39,
         "cached": [[], []], "partial": [[8], []]},
        "partial keys exist only under a layout's hit_unit (HIT-UNIT-1)",
        ("hit.unit", "kind.full", "kind.mamba.align"),
    )  # fmt: skip
    none = {"groups": [full, {"kind": "mamba", "block_size": 16, "mode": "none"}], "hit_unit": 8}
    yield raw_case(
        "hit.refuse.request-partial-on-mode-none",
        {"suite": "hit", "layout": none, "num_tokens": 39, "cached": [[], []],
         "partial": [[], [8]]},
        "a state group in mode none keeps no checkpoint, partial or whole (HIT-MAMBA-2)",
        ("hit.unit", "kind.full", "kind.mamba.none"),
    )  # fmt: skip
    for label, (family, value), why in (
        ("hybrid-eviction", ("eviction", "hybrid"),
         "hybrid eviction judges blocks by their whole-block keys only (ALLOC-UNIT-1)"),
    ):  # fmt: skip
        yield raw_case(
            f"alloc.refuse.unit-{label}",
            {"suite": "alloc", "layout": unit, "num_blocks": 8, "ops": [], family: value},
            why,
            ("hit.unit", "kind.full", "kind.mamba.align", f"{family}.{value}"),
        )
    drafted = {"groups": [{"kind": "full", "block_size": 16},
                          {"kind": "full", "block_size": 16, "draft": True}],
               "speculative": "drop", "hit_unit": 8}  # fmt: skip
    yield raw_case(
        "alloc.refuse.unit-draft-groups-dropped",
        {"suite": "alloc", "layout": drafted, "num_blocks": 8, "ops": []},
        "how the drop meets a prompt's tail key is not defined for the allocator "
        "(ALLOC-UNIT-1; draft groups keyed exactly are served)",
        ("hit.unit", "kind.full", "speculative.drop"),
    )
    for label, (partial, why) in views.items():
        yield raw_case(
            f"hit.refuse.request-{label}",
            {"suite": "hit", "layout": unit, "num_tokens": 39, "cached": [[], []],
             "partial": partial},
            why,
            ("hit.unit", "kind.full", "kind.mamba.align"),
        )  # fmt: skip
