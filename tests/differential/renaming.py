"""Compare block tables up to a consistent renaming of physical block ids.

Which physical block an allocator hands out is implementation-defined; that the same block is
handed out again (sharing, reuse) is not. A renaming is a bijection between the two
allocators' ids, fixed for a whole trace, with the null block mapped to itself.
"""

from __future__ import annotations

from collections.abc import Sequence


class Renaming:
    """A bijection built incrementally; `match` fails on the first inconsistency."""

    def __init__(self) -> None:
        self.forward: dict[int, int] = {0: 0}
        self.backward: dict[int, int] = {0: 0}

    def match(self, expected: Sequence[Sequence[int]], actual: Sequence[Sequence[int]]) -> bool:
        if len(expected) != len(actual):
            return False
        for want_table, got_table in zip(expected, actual, strict=True):
            if len(want_table) != len(got_table):
                return False
            for want, got in zip(want_table, got_table, strict=True):
                if self.forward.setdefault(want, got) != got:
                    return False
                if self.backward.setdefault(got, want) != want:
                    return False
        return True
