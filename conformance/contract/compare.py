"""The normative comparison of an engine's answers with a vector's expectations.

Which physical block an allocator hands out is implementation-defined; that the same block is
handed out again (sharing, reuse) is not. Block tables are therefore compared up to a
renaming: a bijection between the vector's ids and the engine's, fixed for a whole trace,
with the null block (0) mapped to itself. Everything else must be equal.

An engine under the radix profile (§13, RADIX-ID-1) is compared up to a renaming of
lifetimes instead: the vector never names a page twice, and an engine id may stand for a new
vector id once the id it stood for appears in no later observation (its page was freed or
evicted, and nothing can tell which free page the engine reuses).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvcert.conformance.contract.codec import to_runs


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
                if not self.bind(want, got):
                    return False
        return True

    def bind(self, want: int, got: int) -> bool:
        """Whether vector id `want` may be engine id `got`, recording it."""
        if self.forward.setdefault(want, got) != got:
            return False
        return self.backward.setdefault(got, want) == want


def compare_hit(expect: dict[str, Any], answer: object) -> str | None:
    """None when the engine's hit answer matches, else what differs."""
    if refusal := _refusal(expect, answer):
        return None if refusal == "ok" else refusal
    if not isinstance(answer, dict) or "hit" not in answer or "blocks" not in answer:
        return f"malformed answer {answer!r}: expected {{'hit': int, 'blocks': [[...], ...]}}"
    if answer["hit"] != expect["hit"]:
        return f"hit {answer['hit']} != expected {expect['hit']}"
    try:
        runs = [to_runs(list(blocks)) for blocks in answer["blocks"]]
    except TypeError:
        return f"malformed block lists {answer['blocks']!r}"
    if runs != expect["block_runs"]:
        return f"block lists (as runs) {runs} != expected {expect['block_runs']}"
    return None


LATER_HITS = "; hits differ later too:"  # what compare_alloc appends after a first difference


class LifetimeRenaming(Renaming):
    """A renaming of page lifetimes (RADIX-ID-1): `last[v]` is the last observation that
    names vector id v; an engine id is rebound to a new vector id once the one it stood for
    is past its last observation."""

    def __init__(self, last: dict[int, int]) -> None:
        super().__init__()
        self.last = last
        self.now = 0

    def bind(self, want: int, got: int) -> bool:
        if self.forward.setdefault(want, got) != got:
            return False
        held = self.backward.get(got, want)
        if held != want and (held == 0 or self.last.get(held, 0) >= self.now):
            return False
        self.backward[got] = want
        return True


class LiveRenaming(Renaming):
    """The lifetime renaming online, for a machine that steps the spec beside the engine:
    an engine id may stand for a new vector id once the page the old one named is no longer
    live in the spec's state after the step being compared (`live`, set before each
    comparison). A trace's future is unknown there, but the spec never names a page twice
    (RADIX-ID-1), so a page no longer live is never mentioned again."""

    def __init__(self) -> None:
        super().__init__()
        self.live: set[int] = set()

    def bind(self, want: int, got: int) -> bool:
        if self.forward.setdefault(want, got) != got:
            return False
        held = self.backward.get(got, want)
        if held != want and (held == 0 or held in self.live):
            return False
        self.backward[got] = want
        return True


def _last_mentions(observations: Sequence[Any]) -> dict[int, int]:
    last: dict[int, int] = {}
    for index, observation in enumerate(observations):
        body: Any = next(iter(observation.values()), {}) if isinstance(observation, dict) else {}
        for table in body.get("tables", []) if isinstance(body, dict) else []:
            for block in table:
                last[block] = index
    return last


def compare_alloc(expect: dict[str, Any], answer: object, *, lifetimes: bool = False) -> str | None:
    """None when every observation matches (tables up to one renaming, of lifetimes when
    `lifetimes`), else the first diff, followed, when it is not itself a hit, by every later
    admission whose hit differs: a difference in registrations or tables never hides a hit
    the engine did not serve."""
    if refusal := _refusal(expect, answer):
        return None if refusal == "ok" else refusal
    if not isinstance(answer, dict) or not isinstance(answer.get("observations"), list):
        return f"malformed answer {answer!r}: expected {{'observations': [...]}}"
    wanted, got = expect["observations"], answer["observations"]
    if len(got) != len(wanted):
        return f"{len(got)} observations != expected {len(wanted)}"
    renaming = LifetimeRenaming(_last_mentions(wanted)) if lifetimes else Renaming()
    for step, (want, have) in enumerate(zip(wanted, got, strict=True)):
        if isinstance(renaming, LifetimeRenaming):
            renaming.now = step
        difference = compare_observation(renaming, want, have)
        if difference is not None:
            later = [
                f"step {k} ({_hit(h)} != expected {_hit(w)})"
                for k, (w, h) in enumerate(zip(wanted, got, strict=True))
                if k >= step and _hit(w) is not None and _hit(h) != _hit(w)
                and not (k == step and "'hit'" in difference)
            ]  # fmt: skip
            return f"step {step}: {difference}" + (
                f"{LATER_HITS} {', '.join(later)}" if later else ""
            )
    return None


def _hit(observation: object) -> int | None:
    """The hit an admission observation reports (None for any other observation)."""
    if isinstance(observation, dict) and isinstance(observation.get("admitted"), dict):
        hit = observation["admitted"].get("hit")
        return hit if isinstance(hit, int) else None
    return None


def compare_observation(renaming: Renaming, want: dict[str, Any], have: object) -> str | None:
    """One observation of a trace; `renaming` carries over between the trace's steps."""
    if set(want) == {"refused"}:  # a refusal may say why: {"refused": true, "reason": "..."}
        refused = isinstance(have, dict) and have.get("refused") is True
        return None if refused else f"{have!r} != expected a refusal"
    if not isinstance(have, dict) or set(have) != set(want):
        return f"{have!r} != expected {want!r}"
    (kind,) = want
    fields, actual = dict(want[kind]), have[kind]
    if not isinstance(actual, dict) or set(actual) - {"copies"} != set(fields) - {"copies"}:
        return f"{have!r} != expected {want!r}"
    tables = fields.pop("tables", None)
    copies = fields.pop("copies", [])  # absent: none (format /6, `unit U`)
    if any(actual[k] != v for k, v in fields.items()):
        return f"{have!r} != expected {want!r}"
    if tables is not None and not _renames(renaming, tables, actual["tables"]):
        return f"tables {actual['tables']} are not a consistent renaming of {tables}"
    return _compare_copies(renaming, copies, actual.get("copies", []))


def _compare_copies(renaming: Renaming, want: list[Any], have: object) -> str | None:
    """Copies (group, source, target) match in order, their blocks under the trace's renaming."""
    if not isinstance(have, list) or len(have) != len(want):
        return f"copies {have!r} != expected {want!r}"
    for (group, source, target), got in zip(want, have, strict=True):
        if not isinstance(got, list) or len(got) != 3 or got[0] != group:
            return f"copies {have!r} != expected {want!r}"
        if not _renames(renaming, [[source, target]], [got[1:]]):
            return f"copies {have!r} are not a consistent renaming of {want!r}"
    return None


PLAN_FIELDS = ("page_size", "num_blocks", "token_capacity", "hit_alignment")
GROUP_FIELDS = ("kind", "layers", "block_size", "page_bytes", "draft")


def compare_page(expect: dict[str, Any], answer: object) -> str | None:
    """None when the plan matches; groups compare as a set (their order is the engine's)."""
    if refusal := _refusal(expect, answer):
        return None if refusal == "ok" else refusal
    if not isinstance(answer, dict) or not isinstance(answer.get("groups"), list):
        return f"malformed answer {answer!r}: expected a plan with groups"
    for field in PLAN_FIELDS:
        if answer.get(field) != expect[field]:
            return f"{field} {answer.get(field)!r} != expected {expect[field]}"

    def canonical(groups: list[Any]) -> list[tuple[Any, ...]]:
        rows = [tuple(json_key(g.get(f)) for f in GROUP_FIELDS) for g in groups]
        return sorted(rows, key=repr)

    got, want = canonical(answer["groups"]), canonical(expect["groups"])
    if got != want:
        return f"groups {answer['groups']} != expected {expect['groups']} (in any order)"
    return None


def json_key(value: Any) -> Any:
    """Lists become tuples so groups can be sorted and compared."""
    return tuple(value) if isinstance(value, list) else value


def _renames(renaming: Renaming, expected: Any, actual: Any) -> bool:
    try:
        return renaming.match(expected, actual)
    except TypeError:
        return False


REFUSED_VALID = "the engine refused valid input"


def _refusal(expect: dict[str, Any], answer: object) -> str | None:
    """ "ok" for an expected refusal given, a message for a refusal mismatch, else None. A
    refusal may say why ({"refused": true, "reason": "..."}); the message carries it."""
    refused = isinstance(answer, dict) and answer.get("refused") is True
    if expect.get("refused"):
        return "ok" if refused else f"expected the engine to refuse this input, got {answer!r}"
    if not refused:
        return None
    reason = answer.get("reason") if isinstance(answer, dict) else None
    return f"{REFUSED_VALID}: {reason}" if isinstance(reason, str) and reason else REFUSED_VALID


def hits_match(detail: str | None) -> bool:
    """Whether an alloc difference leaves every admission's hit as expected: it is not itself
    a hit or an admission answered otherwise, and lists no later hit (compare_alloc)."""
    if detail is None:
        return True
    first, later, _ = detail.partition(LATER_HITS)
    if later or not first.startswith("step "):
        return False
    if "are not a consistent renaming" in first:  # tables are compared once hits are equal
        return True
    hits = re.findall(r"\{'admitted': \{'hit': (\d+)", first)
    answered = re.search(r": \{'(\w+)'.* != expected \{'(\w+)'", first)
    if answered is None or answered.group(1) != answered.group(2):
        return False
    return answered.group(1) != "admitted" or len(set(hits)) == 1
