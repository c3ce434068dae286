"""The block pool's key map: per block the key it holds, per group the block a key serves.

Two implementations of one contract. `PyKeyIndex` below is the definition, in dicts and a
list; `kvcert.reference._keyindex.KeyIndex` is the same contract compiled (reference/
_keyindex.c): each digest stored once in a flat array indexed by block id, and each group's
map an open-addressing table of int32 block ids whose capacity stops at 3/2 of the pool's
blocks, a key's later holders (copies) entries behind the served one in its probe run:
40 B per cached block at most (tracemalloc) where the dicts cost about 150.
tests/reference/test_keyindex.py holds the two equal operation by operation, and the
differential machine runs the pool on both. `KeyIndex` is the compiled one when it was
built, else the fallback (see kvcert.reference.native; KVCERT_PURE_PYTHON=1 chooses the
fallback).

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

    @property
    def changes(self) -> int:
        """Counts the calls that could change a served map: while it stands still, so do
        they (a lookup's answer may be reused: kvcert.reference.hit_queries)."""
        ...

    def bind(self, block: int, group: int, key: bytes) -> int: ...

    def bind_run(self, group: int, blocks: Sequence[int], keys: Sequence[bytes]) -> int: ...

    def unbind(self, block: int) -> int: ...

    def forget_run(
        self, blocks: Sequence[int], evictions: list[int], shadowed: list[int]
    ) -> int: ...

    def holders(self, block: int) -> list[int]: ...

    def is_served(self, block: int) -> bool: ...

    def key_of(self, block: int) -> bytes | None: ...

    def group_of(self, block: int) -> int | None: ...

    def clear(self) -> None: ...


class PyKeyIndex:
    """The definition. A block holds at most one key; a key's holders in a group are kept in
    registration order and `served[g]` maps the key to the first of them (ALLOC-LOOKUP-1's
    earliest holder), so when it goes the next one serves the key."""

    __slots__ = ("_group", "_key", "_later", "changes", "num_blocks", "served")

    def __init__(self, num_blocks: int, num_groups: int) -> None:
        if not 1 <= num_blocks <= 2**31 - 1:
            raise ValueError(f"num_blocks must be in 1..{2**31 - 1}, got {num_blocks}")
        if not 1 <= num_groups < 0xFFFF:
            raise ValueError(f"num_groups must be in 1..{0xFFFF - 1}, got {num_groups}")
        self.num_blocks = num_blocks
        self._key: list[bytes | None] = [None] * num_blocks
        self._group: list[int | None] = [None] * num_blocks
        self.served: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self._later: dict[tuple[int, bytes], list[int]] = {}  # a key's other holders, in order
        self.changes = 0  # calls that could change a served map: equal counts, equal maps

    def _block(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} is outside the pool (0..{self.num_blocks - 1})")
        return block

    def _group_index(self, group: int) -> int:
        if not 0 <= group < len(self.served):
            raise IndexError(f"group {group} is outside 0..{len(self.served) - 1}")
        return group

    def bind(self, block: int, group: int, key: bytes) -> int:
        """Give `block` the key: -1 when it held exactly that (nothing changes), 0 when it now
        serves the key, else the holder serving it (the block joins its holders last)."""
        self.changes += 1
        if self._block(block) == 0:
            raise ValueError("block 0 is the null block: it never holds a key")
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
        if holder == block:
            return 0
        self._later.setdefault((group, key), []).append(block)
        return holder

    def bind_run(self, group: int, blocks: Sequence[int], keys: Sequence[bytes]) -> int:
        """`bind` per (block, key), block 0 skipped; how many were bound anew."""
        self.changes += 1
        self._group_index(group)
        if len(blocks) != len(keys):
            raise ValueError(f"bind_run: {len(blocks)} blocks but {len(keys)} keys")
        for block in blocks:
            self._block(block)
        return sum(
            self.bind(block, group, key) >= 0
            for block, key in zip(blocks, keys, strict=True)
            if block
        )

    def unbind(self, block: int) -> int:
        """Drop the block's key: -1 when it held none; else the holder that now serves the
        key in its place (0: none did, the block was not serving it or was its last holder)."""
        self.changes += 1
        key, group = self._key[self._block(block)], self._group[block]
        if key is None or group is None:
            return -1
        self._key[block] = self._group[block] = None
        later = self._later.get((group, key), [])
        successor = 0
        if self.served[group][key] != block:
            later.remove(block)
        elif later:
            successor = self.served[group][key] = later.pop(0)
        else:
            del self.served[group][key]
        if not later:
            self._later.pop((group, key), None)
        return successor

    def forget_run(self, blocks: Sequence[int], evictions: list[int], shadowed: list[int]) -> int:
        """`unbind` each block; per group, count those that held a key in `evictions` and
        those of them that were not serving it in `shadowed`. Returns how many held one."""
        self.changes += 1
        if len(evictions) != len(self.served) or len(shadowed) != len(self.served):
            raise TypeError("forget_run(blocks, evictions, shadowed): one count per group")
        for block in blocks:
            self._block(block)
        forgotten = 0
        for block in blocks:
            group = self._group[block]
            if group is not None:
                evictions[group] += 1
                shadowed[group] += not self.is_served(block)
                self.unbind(block)
                forgotten += 1
        return forgotten

    def holders(self, block: int) -> list[int]:
        """The holders of the block's key in its group, the serving one first."""
        key, group = self._key[self._block(block)], self._group[block]
        if key is None or group is None:
            return []
        return [self.served[group][key], *self._later.get((group, key), [])]

    def is_served(self, block: int) -> bool:
        key, group = self._key[self._block(block)], self._group[block]
        return key is not None and group is not None and self.served[group].get(key) == block

    def key_of(self, block: int) -> bytes | None:
        return self._key[self._block(block)]

    def group_of(self, block: int) -> int | None:
        return self._group[self._block(block)]

    def clear(self) -> None:
        self.changes += 1
        for served in self.served:
            served.clear()
        self._later.clear()
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
