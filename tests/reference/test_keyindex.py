"""The compiled key index equals its pure-Python definition, operation by operation.

A Hypothesis state machine drives `_keyindex.KeyIndex` (C) and `PyKeyIndex` side by side with
the same calls, valid and invalid, and compares every answer, every error type and the whole
state (per block its key, group and its key's holders in order, per group its map) after
each step. Keys come from a small pool so that copies, slot collisions, table growth and
backward-shift deletion all happen; the pool-level machines (tests/differential) run the
allocator on both too.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from array import array
from functools import partial

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcert.reference import keyindex, native
from kvcert.reference.coordinator import BLOCK_IDS, _cached_prefix, _probed_prefix
from kvcert.reference.keyindex import KEY_SIZE, PyKeyIndex, served_items
from kvcert.reference.lookup import Layered
from tests.tiers import tiered

compiled = pytest.importorskip("kvcert.reference._keyindex")
KEYS = [bytes([k]) * KEY_SIZE for k in range(40)]
ODD_KEYS = [b"", b"short", bytes(KEY_SIZE + 1), "a str", 7, bytearray(KEY_SIZE)]


def outcome(call):
    try:
        return ("ok", call())
    except (ValueError, TypeError, IndexError, KeyError) as error:
        return ("error", type(error))


class CompiledAgainstDefinition(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 64), num_groups=st.integers(1, 3))
    def create(self, num_blocks: int, num_groups: int) -> None:
        self.num_blocks, self.num_groups = num_blocks, num_groups
        self.c = compiled.KeyIndex(num_blocks, num_groups)
        self.py = PyKeyIndex(num_blocks, num_groups)

    def both(self, name: str, *args):
        c = outcome(lambda: getattr(self.c, name)(*args))
        py = outcome(lambda: getattr(self.py, name)(*args))
        assert c == py, (name, args)
        return c

    blocks = st.integers(-1, 65)
    groups = st.integers(-1, 3)
    keys = st.sampled_from(KEYS[:3]) | st.sampled_from(KEYS) | st.sampled_from(ODD_KEYS)

    @rule(block=blocks, group=groups, key=keys)
    def bind(self, block, group, key):
        self.both("bind", block, group, key)

    @rule(group=groups, blocks=st.lists(blocks, max_size=8), keys=st.lists(keys, max_size=8))
    def bind_run(self, group, blocks, keys):
        self.both("bind_run", group, blocks, keys[: len(blocks)] if keys else keys)

    @rule(group=groups, data=st.data())
    def bind_run_of_equal_length(self, group, data):
        blocks = data.draw(st.lists(st.integers(0, 63), max_size=10))
        keys = data.draw(
            st.lists(st.sampled_from(KEYS), min_size=len(blocks), max_size=len(blocks))
        )
        self.both("bind_run", group, blocks, keys)

    @rule(group=st.integers(0, 2), first=st.integers(0, 39), data=st.data())
    def fill(self, group, first, data):
        """Many distinct keys at once, so tables grow and probe runs wrap around."""
        blocks = data.draw(st.permutations(range(1, self.num_blocks)))[:30]
        keys = [KEYS[(first + k) % len(KEYS)] for k in range(len(blocks))]
        self.both("bind_run", group % self.num_groups, blocks, keys)

    @rule(group=st.integers(0, 2), key=st.sampled_from(KEYS[:3]), data=st.data())
    def copies(self, group, key, data):
        """Several blocks take one key: its holders queue up behind the served one."""
        if self.num_blocks < 3:
            return
        pool = st.integers(1, self.num_blocks - 1)
        blocks = data.draw(st.lists(pool, min_size=2, max_size=5, unique=True))
        self.both("bind_run", group % self.num_groups, blocks, [key] * len(blocks))

    @rule(data=st.data())
    def a_holder_leaves(self, data):
        """Any bound block goes: the served holder, a middle copy or the last one."""
        bound = [b for b in range(self.num_blocks) if self.py.key_of(b) is not None]
        if bound:
            self.both("unbind", data.draw(st.sampled_from(bound)))

    @rule(block=blocks)
    def unbind(self, block):
        self.both("unbind", block)

    @rule(blocks=st.lists(blocks, max_size=10))
    def forget_run(self, blocks):
        c_counts = [[5] * self.num_groups, [2] * self.num_groups]
        py_counts = [[5] * self.num_groups, [2] * self.num_groups]
        c = outcome(lambda: self.c.forget_run(blocks, *c_counts))
        py = outcome(lambda: self.py.forget_run(blocks, *py_counts))
        assert c == py
        assert c_counts == py_counts

    @rule(block=blocks)
    def ask_about_a_block(self, block):
        for name in ("is_served", "key_of", "group_of", "holders"):
            self.both(name, block)

    @rule(group=st.integers(0, 2), key=keys)
    def look_up(self, group, key):
        if group >= self.num_groups:
            return
        c, py = self.c.served[group], self.py.served[group]
        asks = (
            lambda m: m.get(key),
            lambda m: m.get(key, -3),
            lambda m: key in m,
            lambda m: m[key],
        )
        for ask in asks:
            assert outcome(partial(ask, c)) == outcome(partial(ask, py))

    @rule(
        group=st.integers(0, 2),
        keys=st.lists(st.sampled_from([*KEYS, b"", b"short"]), max_size=12),
        cap=st.integers(-1, 14),
    )
    def cached_prefix(self, group, keys, cap):
        """The compiled prefix scan equals the coordinator's generic one over dicts (keys are
        bytes there: the generic scan probes ahead in runs, so an unhashable key after the
        first miss would raise only in it)."""
        if group >= self.num_groups:
            return
        c = outcome(lambda: self.c.served[group].prefix(keys, cap))
        py = outcome(lambda: _cached_prefix(self.py.served[group], keys, cap))
        assert c == py
        ids = self.c.served[group].prefix_ids  # the same blocks packed, int32 each
        assert outcome(lambda: array(BLOCK_IDS, ids(keys, cap)).tolist()) == py

    @rule()
    def clear(self):
        self.both("clear")

    @invariant()
    def same_state(self):
        if not hasattr(self, "c"):
            return
        for block in range(self.num_blocks):
            assert self.c.holders(block) == self.py.holders(block)
            assert self.c.key_of(block) == self.py.key_of(block)
            assert self.c.group_of(block) == self.py.group_of(block)
            assert self.c.is_served(block) == self.py.is_served(block)
        assert served_items(self.c.served) == served_items(self.py.served)
        assert [len(m) for m in self.c.served] == [len(m) for m in self.py.served]
        assert [sorted(m) for m in self.c.served] == [sorted(m) for m in self.py.served]
        # `changes` stands still only while the served maps do (a lookup's memo relies on it)
        now = [(index.changes, served_items(index.served)) for index in (self.c, self.py)]
        for (count, maps), (count_before, maps_before) in zip(
            now, getattr(self, "before", now), strict=True
        ):
            assert count >= count_before
            assert count != count_before or maps == maps_before
        self.before = now


CompiledAgainstDefinition.TestCase.settings = settings(
    max_examples=tiered(150, 3000), stateful_step_count=60, deadline=None
)
TestCompiledAgainstDefinition = CompiledAgainstDefinition.TestCase


def test_many_keys_survive_growth_and_deletion():
    """Thousands of keys in one table (it grows from 8 slots to 32,768; 524,288 in the long
    tier), then every other one removed (backward shifts across wrapped runs): the survivors
    are all still found."""
    size = tiered(12_000, 300_000)
    c, py = compiled.KeyIndex(size, 1), PyKeyIndex(size, 1)
    keys = [i.to_bytes(KEY_SIZE, "little") for i in range(size)]
    for index in (c, py):
        assert index.bind_run(0, list(range(1, size)), keys[1:]) == size - 1
        gone = list(range(1, size, 2))
        assert index.forget_run(gone, [0], [0]) == len(gone)
    assert served_items(c.served) == served_items(py.served)
    assert all(c.served[0].get(keys[b]) == b for b in range(2, size, 2))
    assert not any(keys[b] in c.served[0] for b in range(1, size, 2))


def keys_homed_at(slots: tuple[int, ...], capacity: int = 8) -> list[bytes]:
    """Distinct digests whose home slot in a table of `capacity` is each of `slots` (the
    compiled table places a key at hash(key) mod capacity)."""
    found: list[bytes] = []
    candidate = 0
    for slot in slots:
        while True:
            candidate += 1
            key = candidate.to_bytes(KEY_SIZE, "little")
            if hash(key) % capacity == slot:
                found.append(key)
                break
    return found


def test_deletion_keeps_every_other_key_reachable():
    """Five keys in an 8-slot table (the most it holds before growing), homed around the
    table's end in every combination so their probe runs wrap; removing any one leaves the
    others found: the backward shift moves an entry only when its home is not between the
    hole and it."""
    for homes in itertools.product((6, 7, 0, 1), repeat=5):
        keys = keys_homed_at(homes)
        for gone in range(1, len(keys) + 1):
            index = compiled.KeyIndex(len(keys) + 1, 1)
            for block, key in enumerate(keys, start=1):
                index.bind(block, 0, key)
            index.unbind(gone)
            found = [index.served[0].get(key) for key in keys]
            assert found == [None if b == gone else b for b in range(1, len(keys) + 1)], homes


@pytest.mark.parametrize("gone", [1, 2, 3, 4])
def test_a_holder_leaving_keeps_the_others_in_order(gone):
    """Four holders of one key: whichever goes (the served one, a middle one, the last),
    the rest keep their order and the first of them serves the key."""
    for index in (compiled.KeyIndex(5, 1), PyKeyIndex(5, 1)):
        assert index.bind_run(0, [1, 2, 3, 4], [KEYS[1]] * 4) == 4
        assert index.holders(3) == [1, 2, 3, 4]
        assert index.unbind(gone) == (2 if gone == 1 else 0)
        rest = [b for b in (1, 2, 3, 4) if b != gone]
        assert index.holders(rest[0]) == rest
        assert index.served[0][KEYS[1]] == rest[0]


def test_the_extension_is_built_and_chosen():
    """The install builds the extension (gcc and Python's headers are on every machine kvcert
    supports), and the pool uses it unless KVCERT_PURE_PYTHON=1 asks for the fallback."""
    if native.PURE_PYTHON:  # this process was asked for the fallback
        assert keyindex.KeyIndex is PyKeyIndex
    else:
        assert keyindex.COMPILED is compiled.KeyIndex
        assert keyindex.KeyIndex is compiled.KeyIndex
    chosen = subprocess.run(
        [sys.executable, "-c", "from kvcert.reference import keyindex; print(keyindex.KeyIndex)"],
        env={"KVCERT_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "PyKeyIndex" in chosen.stdout


def test_the_pool_runs_on_either_index(monkeypatch):
    """BlockPool takes whichever KeyIndex the module chose (tests/differential runs it on the
    fallback too, by monkeypatching this name)."""
    from kvcert.reference import block_pool

    monkeypatch.setattr(block_pool, "KeyIndex", PyKeyIndex)
    pool = block_pool.BlockPool(4)
    (block,) = pool.allocate(1)
    pool.register(block, 0, KEYS[1])
    assert isinstance(pool.keys, PyKeyIndex)
    assert pool.lookup(0, KEYS[1]) == block


LONG_KEYS = [i.to_bytes(4, "little") * (KEY_SIZE // 4) for i in range(1, 301)]


@settings(max_examples=tiered(100, 1000))
@given(
    bound=st.integers(0, 300),
    order=st.permutations(range(300)),
    gaps=st.lists(st.integers(0, 299), max_size=3),
    cap=st.integers(-1, 310),
    odd=st.sampled_from([None, b"short", "a str"]),
)
def test_a_long_prefix_scan_equals_the_definition(bound, order, gaps, cap, odd):
    """Past one batch of fetched-ahead keys: prefixes of up to 300 keys, misses anywhere
    (an unbound key, a key of another length, not bytes), blocks bound in any order."""
    c, py = compiled.KeyIndex(302, 1), PyKeyIndex(302, 1)
    for block, k in enumerate(order[:bound], start=1):
        for index in (c, py):
            index.bind(block, 0, LONG_KEYS[k])
    keys = list(LONG_KEYS)
    for at in gaps:
        keys[at] = odd if odd is not None else bytes(KEY_SIZE)
    assert c.served[0].prefix(keys, cap) == _cached_prefix(py.served[0], keys, cap)
    packed = array(BLOCK_IDS, c.served[0].prefix_ids(keys, cap))
    assert packed.tolist() == _cached_prefix(py.served[0], keys, cap)


@settings(max_examples=tiered(100, 1000))
@given(
    bound=st.integers(0, 120),
    order=st.permutations(range(120)),
    added=st.dictionaries(st.integers(0, 119), st.integers(1, 200), max_size=12),
    gaps=st.lists(st.integers(0, 119), max_size=2),
    cap=st.integers(-1, 125),
)
# the index's run ends where the steps in flight go on (keys 10 and 11): random draws meet
# this about once in 30, so it is asked every time
@example(bound=10, order=list(range(120)), added={10: 150, 11: 151, 13: 152}, gaps=[], cap=125)
def test_a_layered_prefix_scan_equals_the_generic_scan(bound, order, added, gaps, cap):
    """Layered.prefix (the index's run, then key by key through both maps) reads what the
    generic scan reads through Layered.get, over the compiled index and the definition:
    keys the steps in flight add anywhere (past the index's run, inside it, on keys it
    holds: the index wins), misses anywhere."""
    c, py = compiled.KeyIndex(122, 1), PyKeyIndex(122, 1)
    for block, k in enumerate(order[:bound], start=1):
        for index in (c, py):
            index.bind(block, 0, LONG_KEYS[k])
    pending = {LONG_KEYS[k]: block for k, block in added.items()}
    keys = list(LONG_KEYS[:120])
    for at in gaps:
        keys[at] = bytes(KEY_SIZE)
    expected = _probed_prefix(Layered(py.served[0], pending), keys, cap)
    assert Layered(c.served[0], pending).prefix(keys, cap) == expected
    assert Layered(py.served[0], pending).prefix(keys, cap) == expected
    assert _cached_prefix(Layered(c.served[0], pending), keys, cap) == expected


@pytest.mark.parametrize("num_groups", [254, 255, 300, 65534])
def test_group_numbers_survive_either_width(num_groups):
    """Up to 254 groups a block's group takes one byte, past that two; the highest group and
    the ones at the width's edge read back as the definition's."""
    c, py = compiled.KeyIndex(12, num_groups), PyKeyIndex(12, num_groups)
    groups = sorted({0, 253, num_groups - 2, num_groups - 1} & set(range(num_groups)))
    for block, group in enumerate(groups * 2, start=1):
        for index in (c, py):
            index.bind(block, group, KEYS[block % 3])
    for index in (c, py):
        index.unbind(2)
    for block in range(12):
        assert c.group_of(block) == py.group_of(block)
        assert c.holders(block) == py.holders(block)
    assert served_items(c.served) == served_items(py.served)
    with pytest.raises(IndexError):
        c.bind(11, num_groups, KEYS[0])
