"""BlockPool: O(1) queue mechanics, duplicate keys, eviction forgets keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.reference.block_pool import BlockPool
from kvcert.reference.keyindex import served_items


def test_initial_queue_is_ascending_without_the_null_block():
    pool = BlockPool(5)
    assert list(pool.free_queue()) == [1, 2, 3, 4]
    assert pool.num_free == 4


def test_take_unlinks_from_the_middle_and_release_appends_in_order():
    pool = BlockPool(6)
    pool.take([3])
    assert list(pool.free_queue()) == [1, 2, 4, 5]
    assert pool.allocate(2) == [1, 2]
    assert pool.release([2, 3, 1]) == 3
    assert list(pool.free_queue()) == [4, 5, 2, 3, 1]


def test_shared_blocks_are_freed_only_by_their_last_holder():
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.take([block])
    assert pool.release([block]) == 0
    assert pool.release([block]) == 1


def test_duplicates_serve_the_earliest_and_survive_eviction_of_one_copy():
    pool = BlockPool(5)
    a, b = pool.allocate(2)
    pool.register(a, 0, b"k" * 32)
    pool.register(b, 0, b"k" * 32)
    assert pool.lookup(0, b"k" * 32) == a
    pool.release([a, b])
    assert pool.allocate(3)[-1] == a  # 3, 4, then a: a's key is forgotten
    assert pool.lookup(0, b"k" * 32) == b
    assert pool.key_of(a) is None
    assert pool.num_registered == 1


def test_reset_forgets_everything():
    pool = BlockPool(3, num_groups=2)
    (a,) = pool.allocate(1)
    pool.register(a, 1, b"x" * 32)
    pool.release([a])
    pool.reset()
    assert pool.lookup(1, b"x" * 32) is None
    assert pool.num_registered == 0


@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "take", "release"]), st.integers(0, 9)), max_size=60
    )
)
def test_queue_matches_a_list_model(ops):
    """The intrusive list behaves like a plain list with remove/append/pop-front."""
    pool = BlockPool(10)
    model = list(range(1, 10))
    held: list[int] = []
    for kind, value in ops:
        if kind == "alloc" and model:
            count = 1 + value % len(model)
            assert pool.allocate(count) == model[:count]
            held += model[:count]
            del model[:count]
        elif kind == "take" and model:
            block = model[value % len(model)]
            pool.take([block])
            model.remove(block)
            held.append(block)
        elif kind == "release" and held:
            block = held.pop(value % len(held))
            if block not in held:
                model.append(block)
            pool.release([block])
        assert list(pool.free_queue()) == model
        assert pool.num_free == len(model)


def _each_block_once(blocks: list[int]) -> bool:
    named = [b for b in blocks if b]
    return len(set(named)) == len(named)


@given(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=8).filter(_each_block_once))
def test_register_run_equals_one_register_per_block(blocks):
    """The batched commit path gives the same keys, copies and counts as the per-block one."""
    keys = [bytes([j]) * 32 for j in range(len(blocks))]
    keys = [k if j % 3 else b"\x00" * 32 for j, k in enumerate(keys)]  # some keys repeat
    one, batched = BlockPool(4), BlockPool(4)
    for pool in (one, batched):
        pool.allocate(3)
    for block, key in zip(blocks, keys, strict=True):
        if block:
            one.register(block, 0, key)
    assert batched.register_run(0, blocks, keys) == sum(1 for b in blocks if b)
    assert served_items(batched.served) == served_items(one.served)
    assert [batched.keys.holders(b) for b in range(4)] == [one.keys.holders(b) for b in range(4)]
    assert batched.num_registered == one.num_registered
    assert [batched.key_of(b) for b in range(4)] == [one.key_of(b) for b in range(4)]


def test_a_registered_block_refuses_another_key():
    """A block holds one key: re-keying it without forgetting the old key would leave that key
    served by content it no longer holds (a stale hit), so both paths refuse."""
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.register(block, 0, b"a" * 32)
    pool.register(block, 0, b"a" * 32)  # the same key again changes nothing
    with pytest.raises(ValueError, match="holds another key"):
        pool.register(block, 0, b"b" * 32)
    with pytest.raises(ValueError, match="holds another key"):
        pool.register_run(0, [block], [b"b" * 32])
    assert pool.lookup(0, b"a" * 32) == block
    assert pool.num_registered == 1


def test_register_run_refuses_a_liveness_tracking_pool():
    pool = BlockPool(4, track_liveness=True)
    with pytest.raises(ValueError, match="do not track liveness"):
        pool.register_run(0, [1], [b"k" * 32])
