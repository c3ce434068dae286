"""The compiled hit search (reference/_keyindex_hit.c) answers as find_hit's Python scan and
as the spec, over the pool's compiled key index; it leaves every other case to the scan."""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvcert.reference import coordinator
from kvcert.reference.config import CacheConfig, DraftKeying, GroupConfig, Kind, MambaMode
from kvcert.reference.coordinator import BLOCK_IDS, find_hit
from kvcert.reference.keyindex import COMPILED
from kvcert.spec import NULL, FullAttention, Layout, MambaState, SlidingWindow, hybrid_hit
from kvcert.spec.view import CacheView, keyable_blocks
from tests.differential.test_coordinator import config_of
from tests.strategies import layouts, views

pytestmark = pytest.mark.skipif(
    COMPILED is None or coordinator._attention_hit is None,
    reason="the compiled key index is not built (or KVCERT_PURE_PYTHON=1)",
)


def digest(group: int, block: int) -> bytes:
    return hashlib.sha256(f"{group}:{block}".encode()).digest()


def indexed(cached, num_groups: int):
    """A compiled key index holding block 1 + 1000 g + j under group g's key of block j for
    every cached (g, j), and those ids."""
    index = COMPILED(1000 * num_groups + 1000, num_groups)
    ids = {}
    for g, blocks in enumerate(cached):
        for j in blocks:
            ids[(g, j)] = 1 + 1000 * g + j
            index.bind(ids[(g, j)], g, digest(g, j))
    return index, ids


def both(config, num_tokens, keys, served, **options):
    """find_hit's answer with the compiled search, then with the Python scan alone, and
    what the compiled search answered by itself (None: it left the case to the scan)."""
    plan, bound = config.search_plan, num_tokens - 1
    limit, ignore_state = options.get("limit"), options.get("ignore_state", False)
    bound = bound if limit is None else min(bound, limit)
    # find_hit's own test
    drops = config.speculative is DraftKeying.DROP and not ignore_state and limit is None
    alone = None
    if plan is not None and not drops:
        packed = options.get("packed", False)
        alone = coordinator._attention_hit(
            served, plan, keys, bound, config.alignment, packed, ignore_state
        )
    compiled = find_hit(config, num_tokens, keys, served, **options)
    saved, coordinator._attention_hit = coordinator._attention_hit, None
    try:
        scanned = find_hit(config, num_tokens, keys, served, **options)
    finally:
        coordinator._attention_hit = saved
    return compiled, scanned, alone


ANSWERED: Counter[str] = Counter()  # the draws the compiled search answered ("compiled") or not
BRANCHES: Counter[str] = Counter()  # the same for their branch points (`ignore_state`)


def attention_only(layout) -> bool:
    return not any(isinstance(g, MambaState) for g in layout.groups)


# half the draws without state groups (whose hits the first candidate decides more often)
LAYOUTS = st.one_of(layouts(reach=True), layouts(reach=True).filter(attention_only))


# a window whose first needed block at 40 tokens is 9 exactly (tokens 36..39 read): one
# block lower would hold the window's first token only with a window of 6
WINDOW_EDGE = CacheView(
    Layout((SlidingWindow(block_size=4, window=5), FullAttention(block_size=4))),
    41,
    (frozenset(range(10)), frozenset(range(10))),
)


@given(views(LAYOUTS, max_tokens=80))
@example(WINDOW_EDGE)
def test_compiled_search_equals_the_scan_and_the_spec(view):
    """Every drawn view, each group keyed only where its keys exist (HASH-DRAFT-1), with
    and without packing and a limit: equal answers; and the spec's hit where unlimited."""
    groups = len(view.cached)
    config = config_of(view.layout, 2)
    index, ids = indexed(view.cached, groups)
    keys = [
        [digest(g, j) for j in range(keyable_blocks(view.layout, g, view.num_tokens))]
        for g in range(groups)
    ]
    served = index.served
    compiled, scanned, alone = both(config, view.num_tokens, keys, served)
    assert compiled == scanned
    ANSWERED["declined" if alone is None else "compiled"] += 1
    if alone is not None:
        assert (alone[0], alone[1]) == compiled
    expected = hybrid_hit(view)
    assert compiled[0] == expected.length
    tables = [[0 if j is NULL else ids[g, j] for j in run] for g, run in enumerate(expected.blocks)]
    assert compiled[1] == tables
    packed, packed_scan, _ = both(config, view.num_tokens, keys, served, packed=True)
    assert packed[0] == packed_scan[0] == compiled[0]
    assert all(isinstance(t, array) and t.typecode == BLOCK_IDS for t in packed[1])
    assert [t.tolist() for t in packed[1]] == [t.tolist() for t in packed_scan[1]]
    for limit in (0, compiled[0] - 1, view.num_tokens // 2):
        if limit >= 0:
            capped, capped_scan, _ = both(config, view.num_tokens, keys, served, limit=limit)
            assert capped == capped_scan
    branch, branch_scan, alone = both(config, view.num_tokens, keys, served, ignore_state=True)
    assert branch == branch_scan  # BRANCH-1: state groups constrain nothing
    BRANCHES["declined" if alone is None else "compiled"] += 1
    if alone is not None:
        assert (alone[0], alone[1]) == branch


def test_the_draws_reach_both_paths():
    """Not vacuous: the draws above met the compiled search answering, and declining, each
    in at least a tenth of them, and a twentieth of their branch points (under the dev
    profile's random draws, six runs answered 38-61 hits and 73-86 branch points of 101
    compiled: the branch point declines less, state groups constraining nothing there)."""
    if not any(ANSWERED.values()):
        test_compiled_search_equals_the_scan_and_the_spec()
    for counts, least in ((ANSWERED, 10), (BRANCHES, 20)):
        draws = counts.total()
        assert counts["compiled"] >= draws / least, counts
        assert counts["declined"] >= draws / least, counts


WINDOWED = CacheConfig(
    groups=(
        GroupConfig(Kind.SLIDING_WINDOW, 4, window=6),
        GroupConfig(Kind.FULL, 4),
        GroupConfig(Kind.CHUNKED_LOCAL, 2, chunk=8),
        GroupConfig(Kind.CROSS, 4),
    ),
    num_blocks=8192,
)


def test_a_shared_prefix_is_answered_compiled():
    """A 41-token prompt whose first 40 tokens are cached in every group: hit 40, each
    table as the definition lays it (null where the window or the chunk reads nothing)."""
    cached = (set(range(10)), set(range(10)), set(range(20)), set())
    index, ids = indexed(cached, 4)
    keys = [[digest(g, j) for j in range(41 // size)] for g, size in enumerate((4, 4, 2, 4))]
    compiled, scanned, alone = both(WINDOWED, 41, keys, index.served)
    assert alone is not None
    assert compiled == scanned
    hit, tables = compiled
    assert hit == 40
    assert tables[0] == [0] * 8 + [ids[(0, 8)], ids[(0, 9)]]  # tokens 35..39 read
    assert tables[1] == [ids[(1, j)] for j in range(10)]
    assert tables[2] == [0] * 20  # the chunk starting at token 40 reads nothing cached
    assert tables[3] == []


def test_a_failed_first_candidate_is_left_to_the_scan():
    """The window's run at the full prefix misses a block: the compiled search declines,
    and the scan finds the lower hit (where the window holds its run)."""
    cached = (set(range(10)) - {8}, set(range(10)), set(range(20)), set())
    index, _ = indexed(cached, 4)
    keys = [[digest(g, j) for j in range(41 // size)] for g, size in enumerate((4, 4, 2, 4))]
    compiled, scanned, alone = both(WINDOWED, 41, keys, index.served)
    assert alone is None
    assert compiled == scanned
    assert compiled[0] == 32  # the run 6..7 is whole at 32 tokens


def test_keys_that_are_no_digests_are_left_to_the_scan():
    """A key of another type is served by no block; an unhashable one is the scan's error."""
    index, _ = indexed((set(range(10)), set(range(10)), set(range(20)), set()), 4)
    keys = [[digest(g, j) for j in range(41 // size)] for g, size in enumerate((4, 4, 2, 4))]
    keys[1][3] = "not a digest"
    compiled, scanned, alone = both(WINDOWED, 41, keys, index.served)
    assert alone is None
    assert compiled == scanned
    assert compiled[0] == 12
    keys[1][3] = []
    with pytest.raises(TypeError):
        find_hit(WINDOWED, 41, keys, index.served)


def test_malformed_calls_are_refused_or_declined():
    """The compiled entry checks what it is given: a wrong count of arguments is a TypeError;
    a plan, served maps or keys of another shape are the scan's (None)."""
    index, _ = indexed((set(), set(), set(), set()), 4)
    served, plan = index.served, WINDOWED.search_plan
    keys = [[], [], [], []]
    with pytest.raises(TypeError, match="takes 7 arguments"):
        coordinator._attention_hit(served, plan, keys)
    assert coordinator._attention_hit(served, plan, keys, 10, 4, False, False) is not None
    assert coordinator._attention_hit(served, plan, keys, -1, 4, False, False) is None
    assert coordinator._attention_hit(served, plan[:3], keys, 10, 4, False, False) is None
    assert coordinator._attention_hit([{}] * 4, plan, keys, 10, 4, False, False) is None
    unknown = ((9, 4, 0),) * 4
    assert coordinator._attention_hit(served, unknown, keys, 10, 4, False, False) is None
    odd_keys = [iter(()), [], [], []]
    assert coordinator._attention_hit(served, plan, odd_keys, 10, 4, False, False) is None


def test_a_table_past_the_keys_given_is_all_nulls():
    """A chunked group whose hit starts a chunk reads no cached block (HIT-CHUNK-1), even with
    fewer keys than the hit has blocks: its table is all nulls, packed or not, grown past the
    keys (the compiled search sizes its tables by the keys)."""
    config = CacheConfig(groups=(GroupConfig(Kind.CHUNKED_LOCAL, 2, chunk=8),), num_blocks=64)
    index, _ = indexed((set(),), 1)
    for packed in (False, True):
        compiled, scanned, alone = both(config, 17, [[]], index.served, packed=packed)
        assert alone is not None
        assert compiled[0] == scanned[0] == 16
        assert [list(t) for t in compiled[1]] == [list(t) for t in scanned[1]] == [[0] * 8]


HYBRID = CacheConfig(
    groups=(GroupConfig(Kind.MAMBA, 8, mode=MambaMode.ALIGN), GroupConfig(Kind.FULL, 8)),
    num_blocks=8192,
)


def test_a_state_hybrid_is_answered_compiled():
    """A 41-token prompt of a state hybrid whose attention prefix is 40 tokens: with the state
    checkpoint at 40 cached, hit 40, the state table null but for block 4 (HIT-MAMBA-1);
    without it the search declines, the scan finds 24 (the checkpoint there), and the branch
    point stays 40, answered compiled, the state table holding what is cached of its run."""
    index, ids = indexed(({2, 4}, set(range(5))), 2)
    keys = [[digest(g, j) for j in range(5)] for g in range(2)]
    compiled, scanned, alone = both(HYBRID, 41, keys, index.served)
    assert alone is not None
    assert compiled == scanned == (40, [[0, 0, 0, 0, ids[(0, 4)]], [ids[(1, j)] for j in range(5)]])
    index, ids = indexed(({2}, set(range(5))), 2)
    compiled, scanned, alone = both(HYBRID, 41, keys, index.served)
    assert alone is None
    assert compiled == scanned
    assert compiled[0] == 24
    branch, branch_scan, alone = both(HYBRID, 41, keys, index.served, ignore_state=True)
    assert alone is not None
    assert branch == branch_scan == (40, [[0] * 5, [ids[(1, j)] for j in range(5)]])


def test_a_state_group_keeping_no_checkpoint_is_the_scans():
    """Mode none: every hit is 0 (HIT-MAMBA-2); the plan is None, the scan answers."""
    config = CacheConfig(
        groups=(GroupConfig(Kind.MAMBA, 8, mode=MambaMode.NONE), GroupConfig(Kind.FULL, 8)),
        num_blocks=64,
    )
    assert config.search_plan is None
    index, _ = indexed(({4}, set(range(5))), 2)
    keys = [[digest(g, j) for j in range(5)] for g in range(2)]
    assert find_hit(config, 41, keys, index.served)[0] == 0
