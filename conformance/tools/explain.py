"""`kvcert explain`: why a lookup hits what it hits, group by group, citing the rules.

Nothing here is normative; it is the diagnostic an operator needs when the hit rate is 0% (the
DeepSeek-V4 reporter patched four files with logging to learn what one `kvcert explain` run
prints). The reasons come from kvcert.spec (each refusal names the rule that makes it). The
lengths come from kvcert.reference's search, which stops at the first missing block, where the
spec's definition asks every aligned length of every group: a million-token request explains
in well under a second. Up to SPEC_CHECK_TOKENS the spec's own answer is computed as well and
must be the same; above, the report says the cross-check was skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvcert.conformance.contract.codec import InputError, layout_to_json
from kvcert.conformance.engines.reference_engine import block_index_cache, config_from_json
from kvcert.conformance.tools.scenario import example_names, load_example, load_scenario
from kvcert.reference.coordinator import find_hit
from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Group,
    HybridHit,
    MambaState,
    SlidingWindow,
    Speculative,
    group_accepts,
    group_blocks,
    hit_alignment,
    hybrid_hit,
    max_hit_length,
    needed_blocks,
)
from kvcert.spec.acceptance import NEEDED_BY_KIND, state_serves_hits
from kvcert.spec.hybrid import drop_draft_hit
from kvcert.spec.layout import Layout
from kvcert.spec.rules import rule_of

SPEC_CHECK_TOKENS = 16_384  # above this, the spec's every-length definition is not re-run


class ExplainDisagreement(RuntimeError):
    """kvcert.reference's search and kvcert.spec disagree: a kvcert bug, please report it."""


def _tag(function: object) -> str:
    rule = rule_of(function)  # type: ignore[arg-type]
    if rule is None:  # pragma: no cover - guarded by tests/spec/test_rules.py
        raise RuntimeError(f"{function!r} states no rule")
    return rule.tag


@dataclass(frozen=True)
class Refusal:
    """Why one group does not accept one length."""

    length: int  # the refused length
    rule: str  # the tag of the rule that refuses it
    reason: str  # one line for a person
    missing: tuple[int, ...] = ()  # needed blocks that are not cached


def refusal(group: Group, cached: frozenset[int], length: int, limit: int) -> Refusal | None:
    """The reason `group` refuses `length`, or None when it accepts it."""
    if length > limit:
        return Refusal(
            length,
            _tag(max_hit_length),
            f"beyond {limit}: the request's last token is always computed",
        )
    if isinstance(group, CrossAttention):
        return None
    if isinstance(group, MambaState) and not state_serves_hits(group) and length > 0:
        return Refusal(length, _tag(state_serves_hits), "mode none keeps no state checkpoints")
    if length % group.block_size:
        return Refusal(
            length, _tag(group_accepts), f"not a multiple of the block size {group.block_size}"
        )
    missing = tuple(j for j in needed_blocks(group, length) if j not in cached)
    if not missing:
        return None
    if isinstance(group, MambaState):
        reason = f"needs the state checkpoint at token {length} (block {missing[0]}), not cached"
    else:
        first, last = missing[0] * group.block_size, (missing[-1] + 1) * group.block_size - 1
        reason = f"needs block(s) {format_indices(missing)} (tokens {first}-{last}), not cached"
    return Refusal(length, _tag(NEEDED_BY_KIND[type(group)]), reason, missing)


@dataclass(frozen=True)
class GroupReport:
    """One group on its own, and its part in the hybrid hit."""

    index: int  # position in the layout
    group: Group  # the group
    alone: int  # the longest hit this group alone could serve
    stop: Refusal  # why it does not accept the next length above `alone`
    blocks: tuple[int | None, ...]  # its block list at the hybrid hit


@dataclass(frozen=True)
class Explanation:
    """The hybrid hit with the reasons behind it."""

    view: CacheView  # what was asked
    hit: HybridHit  # the spec's answer
    limit: int  # HIT-LEN-1's bound
    alignment: int  # lcm of the cacheable groups' block sizes
    groups: tuple[GroupReport, ...]  # per group
    blockers: tuple[tuple[int, Refusal], ...]  # (group index, refusal) at the next aligned length
    dropped_by: str | None  # HIT-SPEC-2's tag when the speculative drop shortened the hit
    spec_checked: bool  # whether kvcert.spec's own answer was computed and agreed


def _fast_hit(layout: Layout, cached: tuple[frozenset[int], ...], num_tokens: int) -> int:
    """kvcert.reference's search over `cached` (block index j of group g is cached as j)."""
    config = config_from_json(layout_to_json(layout), 2)
    keys, served = block_index_cache(config, num_tokens, list(cached))
    length, _ = find_hit(config, num_tokens, keys, served)
    return length


def _undrafted(group: Group) -> Group:
    """The group as an ordinary one: a draft group's acceptance does not depend on the flag."""
    if isinstance(group, FullAttention | SlidingWindow | ChunkedLocal) and group.draft:
        return dataclasses.replace(group, draft=False)
    return group


def _alone(view: CacheView, index: int) -> int:
    """The longest hit group `index` alone could serve: one group, no speculative drop."""
    group = view.layout.groups[index]
    if isinstance(group, CrossAttention):
        return max_hit_length(view.num_tokens)
    return _fast_hit(Layout((_undrafted(group),)), (view.cached[index],), view.num_tokens)


def _plain(layout: Layout) -> Layout:
    """The layout without speculative decoding: HIT-HYB-1's hit before any drop."""
    groups = tuple(_undrafted(g) for g in layout.groups)
    return Layout(groups, speculative=None, max_model_len=layout.max_model_len)


def explain(view: CacheView, *, spec_check_tokens: int = SPEC_CHECK_TOKENS) -> Explanation:
    """Compute the hit and every reason `kvcert explain` prints."""
    layout = view.layout
    if layout.hit_unit is not None:
        raise InputError(
            f"kvcert explain gives per-group reasons under the block profile; this layout sets "
            f"hit_unit={layout.hit_unit} (HIT-UNIT-1..4), whose hit kvcert.spec.hybrid_hit "
            "answers without them: drop hit_unit to explain its whole-block hit"
        )
    if not any(not isinstance(g, CrossAttention) for g in layout.groups):
        hybrid_hit(view)  # the spec's refusal of a layout with nothing to cache
    length = _fast_hit(layout, view.cached, view.num_tokens)
    plain = _fast_hit(_plain(layout), view.cached, view.num_tokens)
    blocks = tuple(group_blocks(g, view.cached[i], length) for i, g in enumerate(layout.groups))
    hit = HybridHit(length=length, blocks=blocks, plain_length=plain)
    checked = view.num_tokens <= spec_check_tokens
    if checked and (spec := hybrid_hit(view)) != hit:
        raise ExplainDisagreement(f"reference search {hit} != spec {spec}")
    limit = max_hit_length(view.num_tokens)
    reports = []
    for index, group in enumerate(layout.groups):
        cached = view.cached[index]
        alone = _alone(view, index)
        step = 1 if isinstance(group, CrossAttention) else group.block_size
        stop = refusal(group, cached, alone + step, limit)
        if stop is None or (checked and not group_accepts(group, cached, alone)):
            raise ExplainDisagreement(f"group {index} alone: {alone} is not its longest hit")
        reports.append(GroupReport(index, group, alone, stop, hit.blocks[index]))
    alignment = hit_alignment(view.layout)
    after = hit.plain_length + alignment
    blockers = tuple(
        (r.index, why)
        for r in reports
        if (why := refusal(r.group, view.cached[r.index], after, limit)) is not None
    )
    dropped = view.layout.speculative is Speculative.DROP and hit.length < hit.plain_length
    return Explanation(
        view,
        hit,
        limit,
        alignment,
        tuple(reports),
        blockers,
        _tag(drop_draft_hit) if dropped else None,
        checked,
    )


def format_indices(indices: Sequence[int]) -> str:
    """1 2 3 7 -> '1-3, 7' (indices ascending)."""
    runs: list[list[int]] = []
    for j in indices:
        if runs and j == runs[-1][1] + 1:
            runs[-1][1] = j
        else:
            runs.append([j, j])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_block_list(blocks: Sequence[int | None]) -> str:
    """[None, None, 2, 3] -> '[null x2, 2-3]': the lookup result, run-length encoded."""
    parts: list[str] = []
    index = 0
    while index < len(blocks):
        end = index
        if blocks[index] is None:
            while end < len(blocks) and blocks[end] is None:
                end += 1
            parts.append("null" if end - index == 1 else f"null x{end - index}")
        else:
            while end < len(blocks) and blocks[end] is not None:
                end += 1
            parts.append(format_indices([b for b in blocks[index:end] if b is not None]))
        index = end
    return "[" + ", ".join(parts) + "]"


def describe_group(group: Group) -> str:
    """A short kind label: 'sliding_window W=128', 'mamba mode=align', ..."""
    match group:
        case FullAttention():
            label = "full"
        case SlidingWindow():
            label = f"sliding_window W={group.window}"
        case ChunkedLocal():
            label = f"chunked_local C={group.chunk}"
        case MambaState():
            label = f"mamba mode={group.mode.value}"
        case CrossAttention():
            label = "cross"
    draft = isinstance(group, FullAttention | SlidingWindow | ChunkedLocal) and group.draft
    return label + (" (draft)" if draft else "")


def _cell(states: set[str]) -> str:
    return states.pop() if len(states) == 1 else "+"


def diagram(explanation: Explanation, width: int = 64) -> list[str]:
    """One line per group, one cell per `scale` tokens, '|' at the hit boundary."""
    view = explanation.view
    cacheable = [g.block_size for g in view.layout.groups if not isinstance(g, CrossAttention)]
    scale = min(cacheable)
    if math.ceil(view.num_tokens / scale) > width:
        scale = math.ceil(view.num_tokens / width)
    cells = math.ceil(view.num_tokens / scale)
    marker = explanation.hit.length // scale
    lines = [
        f"scale: 1 cell = {scale} tokens   # used by the hit   o cached, unused   "
        ". not cached   + mixed   | hit boundary"
    ]
    name_width = max(len(r.group.name) for r in explanation.groups)
    for report in explanation.groups:
        group, cached = report.group, view.cached[report.index]
        row = []
        for c in range(cells):
            if isinstance(group, CrossAttention):
                row.append(" ")
                continue
            first = (c * scale) // group.block_size
            last = min((c + 1) * scale, view.num_tokens) - 1
            states = set()
            for j in range(first, last // group.block_size + 1):
                if j < len(report.blocks) and report.blocks[j] is not None:
                    states.add("#")
                else:
                    states.add("o" if j in cached else ".")
            row.append(_cell(states))
        row.insert(marker, "|")
        lines.append(f"{report.index} {report.group.name:<{name_width}}  {''.join(row)}")
    return lines


def render(explanation: Explanation, title: str = "", description: str = "") -> str:
    """The text `kvcert explain` prints."""
    view, hit = explanation.view, explanation.hit
    layout = view.layout
    spec = layout.speculative.value if layout.speculative else "off"
    out = [f"scenario: {title}"] if title else []
    if description:
        out.append(f"  {description}")
    out.append(
        f"layout: {len(layout.groups)} group(s), hit alignment {explanation.alignment} tokens, "
        f"speculative decoding: {spec}"
    )
    out.append(
        f"request: {view.num_tokens} tokens; a hit reuses at most {explanation.limit} (HIT-LEN-1)"
    )
    if not explanation.spec_checked:
        out.append(
            f"  (lengths from kvcert.reference's search; the cross-check against kvcert.spec's "
            f"definition runs up to {SPEC_CHECK_TOKENS:,} tokens and was skipped)"
        )
    out.append("")
    out.append(f"HYBRID HIT: {hit.length} tokens")
    if explanation.dropped_by:
        out.append(
            f"  every group accepts {hit.plain_length}; the speculative drop "
            f"({explanation.dropped_by}) steps down once to {hit.length}"
        )
    after = hit.plain_length + explanation.alignment
    if after > explanation.limit:
        out.append(
            f"  stops at {hit.plain_length}: the next aligned length {after} is beyond "
            f"{explanation.limit} (HIT-LEN-1)"
        )
    else:
        out.append(f"  stops at {hit.plain_length}: at {after} tokens")
        for index, why in explanation.blockers:
            out.append(
                f"    group {index} ({layout.groups[index].name}) refuses: "
                f"{why.reason} [{why.rule}]"
            )
    out.append("")
    out.append("per group (alone = the longest hit this group alone could serve):")
    for r in explanation.groups:
        out.append(
            f"  {r.index} {r.group.name}: {describe_group(r.group)}, block {r.group.block_size}"
        )
        out.append(
            f"      alone {r.alone}; stops at {r.stop.length}: {r.stop.reason} [{r.stop.rule}]"
        )
        out.append(f"      blocks at the hit: {format_block_list(r.blocks)}")
    out.append("")
    out.extend(diagram(explanation))
    return "\n".join(out) + "\n"


# --- the commands -------------------------------------------------------------------------


def run_explain(args: argparse.Namespace) -> int:
    """The `explain` command."""
    if (args.scenario is None) == (args.example is None):
        raise InputError("give either a SCENARIO.json path or --example NAME (not both)")
    if args.example is not None:
        scenario = load_example(args.example)
    else:
        scenario = load_scenario(Path(args.scenario))
    print(render(explain(scenario.view), scenario.name, scenario.description), end="")
    return 0


def run_examples(_: argparse.Namespace) -> int:
    """The `examples` command."""
    for name in example_names():
        print(f"{name:28} {load_example(name).description}")
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `kvcert explain` and `kvcert examples`."""
    parser = commands.add_parser(
        "explain",
        help="explain the hybrid hit of a scenario, group by group",
        description="Print the hybrid hit of a scenario (layout + what each group has cached "
        "+ request length), each group's longest hit alone and why it stops there, and a "
        "one-line-per-group block diagram.",
    )
    parser.add_argument("scenario", nargs="?", help="path to a scenario JSON file")
    parser.add_argument("--example", help="a bundled example (see `kvcert examples`)")
    parser.set_defaults(run=run_explain)
    commands.add_parser(
        "examples",
        help="list the bundled example scenarios",
        description="List the scenarios bundled with kvcert (seed reports and probe cases), one "
        "per line with its description; show one with `kvcert explain --example NAME`.",
    ).set_defaults(run=run_examples)
