"""Obligations for §3-§4 hits: acceptance, the reference's hybrid search, the speculative drop.

A group is symbolic: kind (full, sliding window, state), block size in SIZES, window, and one
Bool per block (cached or not). Lengths are concrete (0..LMAX), so every `//` and `%` is by a
constant and each block size is a branch: no product of two unknowns reaches the solver.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

import z3  # type: ignore[import-untyped]

from kvcert.conformance.checks.proofs.core import (
    AGREES,
    COUNTEREXAMPLE,
    PROVED,
    Obligation,
    evaluate,
)
from kvcert.spec import (
    CacheView,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
)
from kvcert.spec.acceptance import group_accepts
from kvcert.spec.hybrid import hybrid_hit
from kvcert.spec.view import keyable_blocks as keyable

SIZES = (1, 2, 4)
CHUNKS = (2, 3, 4, 8)
FULL, SW, STATE, CHUNKED, STATE_NONE, CROSS = 0, 1, 2, 3, 4, 5
KINDS = (FULL, SW, STATE, CHUNKED, STATE_NONE, CROSS)


@dataclass(frozen=True)
class Bounds:
    groups: int  # groups in the layout
    lmax: int  # longest hit considered (tokens); also blocks per group at block size 1


PR = Bounds(groups=3, lmax=8)
LONG = Bounds(groups=4, lmax=32)  # 8 blocks per group at block size 4


@dataclass(frozen=True)
class SymGroup:
    kind: Any
    size: Any
    window: Any
    chunk: Any
    cached: tuple[Any, ...]


def _group(index: int, bounds: Bounds) -> tuple[SymGroup, list[Any]]:
    kind, size, window, chunk = z3.Ints(f"kind{index} size{index} window{index} chunk{index}")
    cached = tuple(z3.Bools(" ".join(f"c{index}_{j}" for j in range(bounds.lmax))))
    domain = [
        z3.Or([kind == k for k in KINDS]),
        z3.Or([size == s for s in SIZES]),
        window >= 1,
        window <= 2 * bounds.lmax,
        z3.Or([chunk == c for c in CHUNKS]),
    ]
    return SymGroup(kind, size, window, chunk, cached), domain


def _layout(bounds: Bounds) -> tuple[list[SymGroup], Any, list[Any]]:
    groups, domain = [], []
    for index in range(bounds.groups):
        group, constraints = _group(index, bounds)
        groups.append(group)
        domain += constraints
    num_tokens = z3.Int("num_tokens")
    domain += [num_tokens >= 1, num_tokens <= bounds.lmax + 1]
    return groups, num_tokens, domain


def _needed_sw_tokens(group: SymGroup, length: int, size: int, j: int) -> Any:
    """HIT-SW-1 at token level: block j holds a token of [max(0, L - W + 1), L)."""
    return (j + 1) * size - 1 >= length - group.window + 1


def _needed_sw_reference(group: SymGroup, length: int, size: int, j: int, minus_one: bool) -> Any:
    """kvcert.reference.groups.first_needed: j >= max(0, L - (W - 1)) // B."""
    reach = length - (group.window - 1) if minus_one else length - group.window
    return j >= z3.If(reach > 0, reach, 0) / size


def accepts_at(
    group: SymGroup, length: int, reference: bool = False, minus_one: bool = True
) -> Any:
    """HIT-GROUP-1 for one symbolic group at a concrete length."""
    branches = [z3.And(group.kind == CROSS)]  # HIT-CROSS-1: any length, aligned or not
    for size in SIZES:
        if length % size:
            continue
        blocks = length // size
        full = z3.And([group.cached[j] for j in range(blocks)])
        chunked = z3.Or(
            [
                z3.And(
                    group.chunk == c,
                    z3.And([group.cached[j] for j in range(length // c * c // size, blocks)]),
                )
                for c in CHUNKS
            ]
        )
        if reference:
            sw_needed = [
                _needed_sw_reference(group, length, size, j, minus_one) for j in range(blocks)
            ]
        else:
            sw_needed = [_needed_sw_tokens(group, length, size, j) for j in range(blocks)]
        sw = z3.And([z3.Implies(n, group.cached[j]) for j, n in enumerate(sw_needed)])
        state = z3.BoolVal(True) if blocks == 0 else group.cached[blocks - 1]
        rules = {FULL: full, SW: sw, STATE: state, CHUNKED: chunked, STATE_NONE: length == 0}
        kind_rule = z3.Or([z3.And(group.kind == k, rule) for k, rule in rules.items()])
        branches.append(z3.And(group.size == size, kind_rule))
    return z3.Or(branches)


def _largest(lengths: range, condition: Any) -> Any:
    """max{L in lengths : condition(L)} as an If-chain (0 when none)."""
    result: Any = z3.IntVal(0)
    for length in lengths:
        result = z3.If(condition(length), length, result)
    return result


def spec_hit(groups: list[SymGroup], num_tokens: Any, bounds: Bounds) -> Any:
    """HIT-LEN-1 + HIT-HYB-1: the largest length <= num_tokens - 1 every group accepts."""
    return _largest(
        range(bounds.lmax + 1),
        lambda n: z3.And(n <= num_tokens - 1, *[accepts_at(g, n) for g in groups]),
    )


def spec_drop(groups: list[SymGroup], num_tokens: Any, bounds: Bounds, hit: Any) -> Any:
    """HIT-SPEC-2: the next lower element of the common set, or 0."""
    lower = _largest(
        range(bounds.lmax + 1),
        lambda n: z3.And(n < hit, n <= num_tokens - 1, *[accepts_at(g, n) for g in groups]),
    )
    return z3.If(hit > 0, lower, 0)


def _alignment(groups: list[SymGroup]) -> Any:
    result: Any = z3.IntVal(1)
    for g in groups:  # lcm of powers of two is the max; cross groups align nothing
        result = z3.If(z3.And(g.kind != CROSS, g.size > result), g.size, result)
    return result


def reference_search(
    groups: list[SymGroup], num_tokens: Any, bounds: Bounds, checked: int | None = None
) -> tuple[Any, Any]:
    """kvcert.reference.coordinator.find_hit: full-prefix cap, then a downward scan over
    multiples of the alignment checking only the other groups. `checked` limits how many
    non-full groups are checked (the 2-group shortcut checks one)."""
    bound: Any = num_tokens - 1
    for g in groups:
        prefix = _largest(range(bounds.lmax + 1), lambda n, g=g: accepts_at(g, n))
        bound = z3.If(z3.And(g.kind == FULL, prefix < bound), prefix, bound)
        bound = z3.If(g.kind == STATE_NONE, 0, bound)
    alignment = _alignment(groups)

    def others_accept(n: int) -> Any:
        conditions = []
        earlier_others: Any = z3.IntVal(0)
        for g in groups:
            other = z3.And(g.kind != FULL, g.kind != STATE_NONE, g.kind != CROSS)
            counted = z3.BoolVal(True) if checked is None else earlier_others < checked
            conditions.append(z3.Implies(z3.And(other, counted), accepts_at(g, n, reference=True)))
            earlier_others = earlier_others + z3.If(other, 1, 0)
        aligned = z3.Or([z3.And(alignment == a, n % a == 0) for a in SIZES])
        return z3.And(n <= bound, aligned, *conditions)

    first = _largest(range(bounds.lmax + 1), others_accept)
    second = _largest(range(bounds.lmax + 1), lambda n: z3.And(n < first, others_accept(n)))
    return first, z3.If(first > 0, second, 0)


def hybrid_search(bounds: Bounds) -> Any:
    def build() -> tuple[list[Any], Any]:
        groups, num_tokens, domain = _layout(bounds)
        hit = spec_hit(groups, num_tokens, bounds)
        first, second = reference_search(groups, num_tokens, bounds)
        return domain, z3.And(first == hit, second == spec_drop(groups, num_tokens, bounds, hit))

    return build


def two_group_shortcut_twin() -> tuple[list[Any], Any]:
    """vLLM #33524's shortcut (one other group checked) on a 3-group layout."""
    groups, num_tokens, domain = _layout(PR)
    first, _ = reference_search(groups, num_tokens, PR, checked=1)
    return domain, first == spec_hit(groups, num_tokens, PR)


def drop_once() -> tuple[list[Any], Any]:
    """HIT-SPEC-2 never drops twice and never spirals: the result is common, lower than the
    hit, and no common length lies strictly between them."""
    groups, num_tokens, domain = _layout(PR)
    hit = spec_hit(groups, num_tokens, PR)
    drop = spec_drop(groups, num_tokens, PR, hit)

    def common(n: int) -> Any:
        return z3.And(n <= num_tokens - 1, *[accepts_at(g, n) for g in groups])

    between = z3.And(
        [z3.Implies(z3.And(drop < n, n < hit), z3.Not(common(n))) for n in range(PR.lmax + 1)]
    )
    in_set = z3.Or([z3.And(drop == n, common(n)) for n in range(PR.lmax + 1)])
    return domain, z3.And(in_set, between, z3.Implies(hit > 0, drop < hit))


def per_group_drop_twin() -> tuple[list[Any], Any]:
    """vLLM #32802: the draft group's one-block drop re-applied on every pass of the loop."""
    groups, num_tokens, domain = _layout(PR)
    hit = spec_hit(groups, num_tokens, PR)
    draft = groups[0]
    current: Any = hit
    for _ in range(3):
        limit = current - draft.size
        current = _largest(
            range(PR.lmax + 1),
            lambda n, limit=limit: z3.And(
                n <= limit, n <= num_tokens - 1, *[accepts_at(g, n) for g in groups]
            ),
        )
    return domain, current == spec_drop(groups, num_tokens, PR, hit)


def drop_covers_reach(beyond: int = 0) -> Any:
    """HIT-SPEC-2 with a drafter reading r tokens ahead (HASH-DRAFT-1's draft_reach): where
    the drop serves a positive length d below the plain hit h, the r tokens the draft KV at
    d - 1 reads lie inside the matched prefix (d + r <= h), for every r up to the hit
    alignment, which Layout allows under drop. `beyond` > 0: a reach past the alignment."""

    def build() -> tuple[list[Any], Any]:
        groups, num_tokens, domain = _layout(PR)
        reach = z3.Int("reach")
        alignment = _alignment(groups)
        domain += [reach >= 1, reach <= alignment + beyond]
        if beyond:
            domain.append(reach > alignment)
        hit = spec_hit(groups, num_tokens, PR)
        drop = spec_drop(groups, num_tokens, PR, hit)
        return domain, z3.Implies(drop > 0, drop + reach <= hit)

    return build


def registration_unit(factor: int = 1) -> Any:
    """Registering each block of a group once it is full, and registering it only in whole
    units of U tokens (a block once the U-aligned unit holding it is computed; vLLM 0.33
    across block sizes and, since spec 0.12.0, ALLOC-COMMIT-1 for attention groups, with U
    the hit alignment) serve every request sharing the writer's `computed` tokens the same
    hybrid hit: a hit
    length is a multiple of the alignment, so a hit at or below the writer's last whole unit
    needs no block of the partial unit after it, and a longer one needs a block past
    `computed`, cached under neither rule. Groups' blocks are registered as mode all and
    attention do (every full block). `factor` 2: units of twice the alignment, which lose the
    last aligned length (the twin)."""

    def build() -> tuple[list[Any], Any]:
        groups, num_tokens, domain = _layout(PR)
        computed = z3.Int("computed")
        domain += [computed >= 0, computed <= PR.lmax]
        unit = _alignment(groups) * factor
        whole = (computed / unit) * unit  # the tokens of the writer's whole units
        by_unit = []
        for g in groups:
            domain += [g.cached[j] == ((j + 1) * g.size <= computed) for j in range(PR.lmax)]
            cached = tuple((j + 1) * g.size <= whole for j in range(PR.lmax))
            by_unit.append(SymGroup(g.kind, g.size, g.window, g.chunk, cached))
        return domain, spec_hit(groups, num_tokens, PR) == spec_hit(by_unit, num_tokens, PR)

    return build


def _needed_at(group: SymGroup, length: int, j: int) -> Any:
    """Whether a hit of the concrete `length` needs block j of a bounded group (HIT-SW-1,
    HIT-CHUNK-1, HIT-MAMBA-1; False for a length the group's blocks do not divide)."""
    branches = []
    for size in SIZES:
        if length % size or j >= length // size:
            continue
        chunk_first = z3.Or(
            [z3.And(group.chunk == c, j >= length // c * c // size) for c in CHUNKS]
        )
        kinds = {
            SW: _needed_sw_tokens(group, length, size, j),
            CHUNKED: chunk_first,
            STATE: z3.BoolVal(j == length // size - 1),
        }
        rule = z3.Or([z3.And(group.kind == k, r) for k, r in kinds.items()])
        branches.append(z3.And(group.size == size, rule))
    return z3.Or(branches) if branches else z3.BoolVal(False)


def retention_owed(drop: bool = False, extension: bool = True, step_below: bool = True) -> Any:
    """RET-SPARSE-1/-2's promise: a writer computes a p-token prompt and finishes; a request
    sharing all p tokens (the re-send, n = p, or an extension, n > p) gets the same hit (under
    `drop`, the same HIT-SPEC-2 hit) whether the writer's bounded groups (sliding window,
    chunked, state in mode all) registered every full block (dense) or only the blocks a hit
    at a retained length needs (sparse: floor_A(p - 1), floor_A(p), and under drop the step
    below each). Twins: without the extension length (`extension=False`) or without the
    step below under drop (`step_below=False`)."""

    def build() -> tuple[list[Any], Any]:
        groups, num_tokens, domain = _layout(PR)
        prompt = z3.Int("prompt")
        domain += [prompt >= 1, prompt <= num_tokens]
        alignment = _alignment(groups)
        ends = [(prompt - 1) / alignment * alignment]
        if extension:
            ends.append(prompt / alignment * alignment)
        if drop and step_below:
            ends += [end - alignment for end in ends]

        def retained(length: int) -> Any:
            return z3.And(length > 0, z3.Or([length == end for end in ends]))

        sparse = []
        for g in groups:
            domain += [g.cached[j] == ((j + 1) * g.size <= prompt) for j in range(PR.lmax)]
            bounded = z3.Or(g.kind == SW, g.kind == CHUNKED, g.kind == STATE)
            kept = [
                z3.Or([z3.And(retained(n), _needed_at(g, n, j)) for n in range(PR.lmax + 1)])
                for j in range(PR.lmax)
            ]
            cached = tuple(
                z3.And(g.cached[j], z3.Or(z3.Not(bounded), kept[j])) for j in range(PR.lmax)
            )
            sparse.append(SymGroup(g.kind, g.size, g.window, g.chunk, cached))
        dense_hit = spec_hit(groups, num_tokens, PR)
        sparse_hit = spec_hit(sparse, num_tokens, PR)
        if drop:
            dense_hit = spec_drop(groups, num_tokens, PR, dense_hit)
            sparse_hit = spec_drop(sparse, num_tokens, PR, sparse_hit)
        return domain, dense_hit == sparse_hit

    return build


def dense_reads(factor: int = 1) -> Any:
    """RET-DENSE-1's claim: a writer's bounded groups registering only the blocks some hit at
    a multiple of the alignment reads give every reader the hit they give registering every
    full block. The reader shares `shared` tokens of the writer's prompt (the cached blocks
    are those within them). Twin (`factor=2`): only blocks a multiple of twice the alignment
    reads."""

    def build() -> tuple[list[Any], Any]:
        groups, num_tokens, domain = _layout(PR)
        shared = z3.Int("shared")
        domain += [shared >= 0, shared <= num_tokens]
        step = factor * _alignment(groups)
        masked = []
        for g in groups:
            domain += [g.cached[j] == ((j + 1) * g.size <= shared) for j in range(PR.lmax)]
            bounded = z3.Or(g.kind == SW, g.kind == CHUNKED, g.kind == STATE)
            read = [
                z3.Or([z3.And(n % step == 0, _needed_at(g, n, j)) for n in range(1, PR.lmax + 1)])
                for j in range(PR.lmax)
            ]
            cached = tuple(
                z3.And(g.cached[j], z3.Or(z3.Not(bounded), read[j])) for j in range(PR.lmax)
            )
            masked.append(SymGroup(g.kind, g.size, g.window, g.chunk, cached))
        return domain, spec_hit(groups, num_tokens, PR) == spec_hit(masked, num_tokens, PR)

    return build


def downward_closed(kind: int) -> Any:
    """Accepting L implies accepting every shorter length aligned to the block size."""

    def build() -> tuple[list[Any], Any]:
        group, domain = _group(0, PR)
        lengths = range(PR.lmax + 1)
        claim = z3.And(
            [
                z3.Implies(z3.And(accepts_at(group, n), _aligned(group, m)), accepts_at(group, m))
                for n, m in itertools.product(lengths, lengths)
                if m <= n
            ]
        )
        return [*domain, group.kind == kind], claim

    return build


def _first_needed_reference(group: SymGroup, length: int, size: int) -> Any:
    """kvcert.reference.groups.first_needed for the kinds the search visits."""
    reach = length - (group.window - 1)
    chunked = z3.Sum([z3.If(group.chunk == c, length // c * c // size, 0) for c in CHUNKS])
    return z3.If(
        group.kind == SW,
        z3.If(reach > 0, reach, 0) / size,
        z3.If(group.kind == CHUNKED, chunked, z3.If(group.kind == STATE, length // size - 1, 0)),
    )


def skip_missing(slack: int = 0) -> Any:
    """A block m missing from the run a candidate L needs refuses every aligned L' with
    m * B < L' <= L (the search's jump); `slack` > 0 jumps that many blocks further."""

    def build() -> tuple[list[Any], Any]:
        group, domain = _group(0, PR)
        claims = []
        for size in SIZES:
            for length in range(0, PR.lmax + 1, size):
                for m in range(length // size):
                    for shorter in range(0, length, size):
                        if shorter <= (m - slack) * size:
                            continue
                        missing = z3.And(
                            group.size == size,
                            _first_needed_reference(group, length, size) <= m,
                            z3.Not(group.cached[m]),
                        )
                        claims.append(z3.Implies(missing, z3.Not(accepts_at(group, shorter))))
        kinds = z3.Or([group.kind == k for k in (FULL, SW, STATE, CHUNKED)])
        return [*domain, kinds], z3.And(claims)

    return build


def _aligned(group: SymGroup, length: int) -> Any:
    return z3.Or([group.size == s for s in SIZES if length % s == 0])


def sliding_window_search(minus_one: bool = True) -> Any:
    def build() -> tuple[list[Any], Any]:
        group, domain = _group(0, PR)
        claim = z3.And(
            [
                accepts_at(group, n) == accepts_at(group, n, reference=True, minus_one=minus_one)
                for n in range(PR.lmax + 1)
            ]
        )
        return [*domain, group.kind == SW], claim

    return build


# --- drift: the encodings against kvcert.spec ------------------------------------------------


def _concrete_group(kind: int, size: int, window: int, chunk: int) -> Any:
    if kind == FULL:
        return FullAttention(size)
    if kind == SW:
        return SlidingWindow(size, window)
    if kind == STATE:
        return MambaState(size)
    if kind == CHUNKED:
        return ChunkedLocal(size, chunk)
    if kind == STATE_NONE:
        return MambaState(size, MambaMode.NONE)
    return CrossAttention(size)


def drift() -> None:
    rng = random.Random(7)
    groups, num_tokens, _ = _layout(PR)
    hit = spec_hit(groups, num_tokens, PR)
    first, _second = reference_search(groups, num_tokens, PR)
    for _ in range(120):
        kinds = [rng.choice(KINDS) for _ in groups]
        if all(k == CROSS for k in kinds):
            kinds[0] = FULL  # a cross-only layout is refused for lookups
        sizes = [rng.choice(SIZES) for _ in groups]
        windows = [rng.randint(1, 2 * PR.lmax) for _ in groups]
        chunks = [rng.choice(CHUNKS) for _ in groups]
        tokens = rng.randint(1, PR.lmax + 1)
        layout = Layout(tuple(map(_concrete_group, kinds, sizes, windows, chunks)))
        bits = [[rng.random() < 0.8 and k not in (STATE_NONE, CROSS) for _ in range(PR.lmax)]
                for k in kinds]  # fmt: skip
        cached = tuple(
            frozenset(j for j in range(min(PR.lmax, keyable(layout, g, tokens))) if bits[g][j])
            for g in range(len(groups))
        )
        view = CacheView(layout, tokens, cached)
        values: dict[str, int | bool] = {"num_tokens": tokens}
        for g in range(len(groups)):
            values |= {f"kind{g}": kinds[g], f"size{g}": sizes[g], f"window{g}": windows[g]}
            values |= {f"chunk{g}": chunks[g]}
            values |= {f"c{g}_{j}": j in cached[g] for j in range(PR.lmax)}
        expected = hybrid_hit(view).length
        for length in range(PR.lmax + 1):
            for g, group in enumerate(groups):
                if length <= tokens - 1:
                    got = evaluate(accepts_at(group, length), **values)
                    want = group_accepts(layout.groups[g], cached[g], length)
                    assert got == want, f"HIT-GROUP-1 encoding {got} != spec {want}"
        assert evaluate(hit, **values) == expected, "HIT-HYB-1 encoding != spec"
        assert evaluate(first, **values) == expected, "reference search encoding != spec"


OBLIGATIONS = (
    Obligation("THM-FULL-DOWN", ("HIT-FULL-1", "HIT-GROUP-1"), "blocks 1, 2, 4; lengths <= 8",
               PROVED, "pr", downward_closed(FULL),
               about="a full group accepting L accepts every aligned L' <= L"),
    Obligation("TWIN-SW-DOWN", ("HIT-SW-1",), "as THM-FULL-DOWN", COUNTEREXAMPLE, "pr",
               downward_closed(SW), twin_of="THM-FULL-DOWN",
               about="a sliding window is not downward closed (no cap from it)"),
    Obligation("THM-SW-SEARCH", ("HIT-SW-1",), "blocks 1, 2, 4; windows 1..16; lengths <= 8",
               PROVED, "pr", sliding_window_search(),
               about="the reference's first-needed block formula equals the token rule"),
    Obligation("TWIN-SW-NO-MINUS-ONE", ("HIT-SW-1",), "as THM-SW-SEARCH", COUNTEREXAMPLE, "pr",
               sliding_window_search(minus_one=False), twin_of="THM-SW-SEARCH",
               about="a window without the -1 needs one block too many"),
    Obligation("THM-SKIP-MISSING", ("HIT-GROUP-1", "HIT-HYB-1"),
               "full, window, chunked, state; blocks 1/2/4; lengths <= 8", PROVED, "pr",
               skip_missing(),
               about="a missing block m refuses every candidate down to m * B (the jump)"),
    Obligation("TWIN-SKIP-TOO-FAR", ("HIT-GROUP-1",), "as THM-SKIP-MISSING", COUNTEREXAMPLE,
               "pr", skip_missing(slack=1), twin_of="THM-SKIP-MISSING",
               about="jumping one block further skips an accepted candidate"),
    Obligation("THM-HYB-SEARCH", ("HIT-HYB-1", "HIT-LEN-1", "HIT-SPEC-2"),
               "3 groups of any of the 6 kinds, blocks 1/2/4, lengths <= 8", PROVED, "pr",
               hybrid_search(PR), rlimit=200_000_000,
               about="reference hit and drop equal the spec's maximum and next lower element"),
    Obligation("THM-HYB-SEARCH-LONG", ("HIT-HYB-1", "HIT-LEN-1", "HIT-SPEC-2"),
               "4 groups of any of the 6 kinds, blocks 1/2/4, lengths <= 32", PROVED, "long",
               hybrid_search(LONG), rlimit=2_000_000_000, timeout_s=1800,
               about="as THM-HYB-SEARCH, deeper"),
    Obligation("TWIN-HYB-TWO-GROUP", ("HIT-HYB-1",), "as THM-HYB-SEARCH", COUNTEREXAMPLE, "pr",
               two_group_shortcut_twin, twin_of="THM-HYB-SEARCH", rlimit=200_000_000,
               about="vLLM #33524's 2-group shortcut on a 3-group layout"),
    Obligation("THM-SPEC-DROP-ONCE", ("HIT-SPEC-2",), "as THM-HYB-SEARCH", PROVED, "pr",
               drop_once, rlimit=200_000_000,
               about="the drop lands on the next common length: never twice, never a spiral"),
    Obligation("TWIN-SPEC-PER-GROUP-DROP", ("HIT-SPEC-2",), "as THM-HYB-SEARCH", COUNTEREXAMPLE,
               "pr", per_group_drop_twin, twin_of="THM-SPEC-DROP-ONCE", rlimit=200_000_000,
               about="vLLM #32802: the drop inside the fixed-point loop spirals"),
    Obligation("THM-SPEC-DROP-REACH", ("HIT-SPEC-2", "HASH-DRAFT-1"),
               "as THM-HYB-SEARCH; draft reach 1 .. the hit alignment", PROVED, "pr",
               drop_covers_reach(), rlimit=200_000_000,
               about="a drop hit leaves the draft_reach tokens its last draft KV reads matched"),
    Obligation("TWIN-SPEC-DROP-PAST-ALIGNMENT", ("HIT-SPEC-2",), "as THM-SPEC-DROP-REACH",
               COUNTEREXAMPLE, "pr", drop_covers_reach(beyond=1),
               twin_of="THM-SPEC-DROP-REACH", rlimit=200_000_000,
               about="a reach past the alignment (refused by Layout) is not covered"),
    Obligation("THM-REG-UNIT", ("ALLOC-COMMIT-1", "HIT-HYB-1", "HIT-GROUP-1"),
               "as THM-HYB-SEARCH; one writer, computed 0..8 tokens", PROVED, "pr",
               registration_unit(), rlimit=200_000_000,
               about="registering in whole hit-alignment units changes no hit"),
    Obligation("TWIN-REG-UNIT-DOUBLE", ("ALLOC-COMMIT-1",), "as THM-REG-UNIT", COUNTEREXAMPLE,
               "pr", registration_unit(factor=2), twin_of="THM-REG-UNIT", rlimit=200_000_000,
               about="units of twice the alignment lose the writer's last aligned length"),
    Obligation("THM-DENSE-READS", ("RET-DENSE-1", "RET-SPARSE-2", "HIT-HYB-1"),
               "as THM-HYB-SEARCH; a reader sharing 0..9 tokens with one writer, mode-all state",
               PROVED, "pr", dense_reads(), rlimit=200_000_000,
               about="registering only blocks an aligned hit reads changes no hit"),
    Obligation("TWIN-DENSE-READS-DOUBLE", ("RET-DENSE-1",), "as THM-DENSE-READS",
               COUNTEREXAMPLE, "pr", dense_reads(factor=2), twin_of="THM-DENSE-READS",
               rlimit=200_000_000,
               about="keeping only blocks twice the alignment reads loses a hit"),
    Obligation("THM-RET-OWED", ("RET-SPARSE-1", "RET-SPARSE-2", "HIT-HYB-1"),
               "as THM-HYB-SEARCH; one writer of 1..9 tokens, mode-all state", PROVED, "pr",
               retention_owed(), rlimit=200_000_000,
               about="sparse retention serves the re-send and extensions their dense hit"),
    Obligation("THM-RET-OWED-DROP", ("RET-SPARSE-1", "RET-SPARSE-2", "HIT-SPEC-2"),
               "as THM-RET-OWED", PROVED, "pr", retention_owed(drop=True), rlimit=200_000_000,
               about="and so does the drop, with the step below each retained length"),
    Obligation("TWIN-RET-NO-EXTENSION", ("RET-SPARSE-1",), "as THM-RET-OWED", COUNTEREXAMPLE,
               "pr", retention_owed(extension=False), twin_of="THM-RET-OWED",
               rlimit=200_000_000,
               about="keeping only the re-send's length loses an aligned prompt's extension"),
    Obligation("TWIN-RET-NO-STEP-BELOW", ("RET-SPARSE-1",), "as THM-RET-OWED", COUNTEREXAMPLE,
               "pr", retention_owed(drop=True, step_below=False),
               twin_of="THM-RET-OWED-DROP", rlimit=200_000_000,
               about="under drop, the retained lengths alone leave no step below to serve"),
    Obligation("DRIFT-HIT", ("HIT-GROUP-1", "HIT-HYB-1"), "120 random concrete views", AGREES,
               "pr", drift, about="the hit encodings equal kvcert.spec.hybrid"),
)  # fmt: skip
