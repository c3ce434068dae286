"""The block pool's key map: per block the key it holds, per group the block a key serves.

Two implementations of one contract. `PyKeyIndex` below is the definition, in dicts and a
list; `kvcert.reference._keyindex.KeyIndex` is the same contract compiled (reference/
_keyindex.c): each digest stored once in a flat array indexed by block id and each group's
map an open-addressing table of int32 block ids, about 42 B per cached block where the dicts
cost about 140 (the memory row of benchmarks/vs_vllm.py). tests/reference/test_keyindex.py
holds the two equal operation by operation, and the differential machine runs the pool on
both. `KeyIndex` is the compiled one when it was built, else the fallback (see
kvcert.reference.native; KVCERT_PURE_PYTHON=1 chooses the fallback).

Keys are 32-byte digests (`KEY_SIZE`); block 0 is the null block and never holds a key.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Protocol, TypeVar

from kvcert.reference.native import native

KEY_SIZE = 32
K = TypeVar("K", bound=Hashable)


class ServedMap(Protocol[K]):
    """What a hit search reads of one group's key -> block map: a dict, or the compiled
    index's read-only view."""

    def get(self, key: K, default: int, /) -> int: ...

    def __getitem__(self, key: K, /) -> int: ...

    def __contains__(self, key: object, /) -> bool: ...

    def __len__(self) -> int: ...

    def items(self) -> Iterable[tuple[K, int]]: ...


class KeyMap(Protocol):
    """What the pool needs of a key index (both implementations satisfy it)."""

    def __init__(self, num_blocks: int, num_groups: int) -> None: ...

    @property
    def served(self) -> Sequence[ServedMap[bytes]]: ...

    def bind(self, block: int, group: int, key: bytes) -> int: ...

    def bind_run(
        self, group: int, blocks: Sequence[int], keys: Sequence[bytes]
    ) -> tuple[int, list[int]]: ...

    def unbind(self, block: int) -> bool: ...

    def forget_run(self, blocks: Sequence[int], evictions: list[int]) -> int: ...

    def serve(self, block: int) -> None: ...

    def is_served(self, block: int) -> bool: ...

    def key_of(self, block: int) -> bytes | None: ...

    def group_of(self, block: int) -> int | None: ...

    def clear(self) -> None: ...


class PyKeyIndex:
    """The definition: `served[g]` maps a key to the block lookups of it get in group g (its
    earliest holder, chosen by the pool); a block holds at most one key."""

    __slots__ = ("_group", "_key", "num_blocks", "served")

    def __init__(self, num_blocks: int, num_groups: int) -> None:
        if not 1 <= num_blocks <= 2**31 - 1:
            raise ValueError(f"num_blocks must be in 1..{2**31 - 1}, got {num_blocks}")
        if not 1 <= num_groups < 0xFFFF:
            raise ValueError(f"num_groups must be in 1..{0xFFFF - 1}, got {num_groups}")
        self.num_blocks = num_blocks
        self._key: list[bytes | None] = [None] * num_blocks
        self._group: list[int | None] = [None] * num_blocks
        self.served: list[dict[bytes, int]] = [{} for _ in range(num_groups)]

    def _block(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} is outside the pool (0..{self.num_blocks - 1})")
        return block

    def _bindable(self, block: int) -> int:
        if self._block(block) == 0:
            raise ValueError("block 0 is the null block: it never holds a key")
        return block

    def _group_index(self, group: int) -> int:
        if not 0 <= group < len(self.served):
            raise IndexError(f"group {group} is outside 0..{len(self.served) - 1}")
        return group

    def bind(self, block: int, group: int, key: bytes) -> int:
        """Give `block` the key: -1 when it held exactly that (nothing changes), 0 when it now
        serves the key, else the earlier holder, which keeps serving it."""
        self._bindable(block)
        self._group_index(group)
        if not isinstance(key, bytes) or len(key) != KEY_SIZE:
            length = len(key) if isinstance(key, bytes) else -1
            raise TypeError(
                f"a block key is a {KEY_SIZE}-byte digest (bytes), got "
                f"{type(key).__name__} of length {length}"
            )
        if self._key[block] is not None:
            if self._key[block] == key and self._group[block] == group:
                return -1
            raise ValueError(f"block {block} holds another key: unbind it first")
        self._key[block], self._group[block] = key, group
        holder = self.served[group].setdefault(key, block)
        return 0 if holder == block else holder

    def bind_run(
        self, group: int, blocks: Sequence[int], keys: Sequence[bytes]
    ) -> tuple[int, list[int]]:
        """`bind` per (block, key), NULL blocks skipped: (how many were bound anew, the
        positions in `blocks` of those that became copies of an earlier holder, in order)."""
        self._group_index(group)
        if len(blocks) != len(keys):
            raise ValueError(f"bind_run: {len(blocks)} blocks but {len(keys)} keys")
        for block in blocks:
            self._block(block)
        fresh, copies = 0, []
        for position, (block, key) in enumerate(zip(blocks, keys, strict=True)):
            if block:
                result = self.bind(block, group, key)
                fresh += result >= 0
                if result > 0:
                    copies.append(position)
        return fresh, copies

    def unbind(self, block: int) -> bool:
        """Drop the block's key (and the key's entry when the block served it); whether it
        held one."""
        key, group = self._key[self._block(block)], self._group[block]
        if key is None or group is None:
            return False
        if self.served[group].get(key) == block:
            del self.served[group][key]
        self._key[block] = self._group[block] = None
        return True

    def forget_run(self, blocks: Sequence[int], evictions: list[int]) -> int:
        """`unbind` each block, counting the ones that held a key in `evictions[group]`."""
        if len(evictions) != len(self.served):
            raise TypeError("forget_run(blocks, evictions): one count per group")
        for block in blocks:
            self._block(block)
        forgotten = 0
        for block in blocks:
            group = self._group[block]
            if group is not None:
                evictions[group] += 1
                self.unbind(block)
                forgotten += 1
        return forgotten

    def serve(self, block: int) -> None:
        """The bound block becomes the one its key's lookups get."""
        key, group = self._key[self._bindable(block)], self._group[block]
        if key is None or group is None:
            raise ValueError(f"block {block} holds no key: bind it first")
        self.served[group][key] = block

    def is_served(self, block: int) -> bool:
        key, group = self._key[self._block(block)], self._group[block]
        return key is not None and group is not None and self.served[group].get(key) == block

    def key_of(self, block: int) -> bytes | None:
        return self._key[self._block(block)]

    def group_of(self, block: int) -> int | None:
        return self._group[self._block(block)]

    def clear(self) -> None:
        for served in self.served:
            served.clear()
        self._key = [None] * self.num_blocks
        self._group = [None] * self.num_blocks


def _compiled() -> type[KeyMap] | None:
    module = native("_keyindex")
    return None if module is None else module.KeyIndex


COMPILED: type[KeyMap] | None = _compiled()
KeyIndex: type[KeyMap] = COMPILED or PyKeyIndex


def served_items(served: Iterable[ServedMap[bytes]]) -> list[dict[bytes, int]]:
    """Per group, key -> block as plain dicts (to compare the two implementations)."""
    return [dict(m.items()) for m in served]
