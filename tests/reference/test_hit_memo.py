"""The remembered search (HitQueries._uncapped, answered by `_remembered`): a lookup and the
admission of the same Prompt right after it search once, and no answer outlives a change of
the served maps."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvcert.conformance.contract.codec import layout_to_json
from kvcert.conformance.engines.reference_engine import config_from_json
from kvcert.reference import block_pool, coordinator
from kvcert.reference.config import CacheConfig, GroupConfig, Kind
from kvcert.reference.errors import KVCacheError
from kvcert.reference.keyindex import PyKeyIndex
from kvcert.reference.manager import KVCacheManager, Scheduled
from kvcert.reference.requests import Prompt
from tests.strategies import layouts
from tests.tiers import tiered

FULL = GroupConfig(Kind.FULL, 16)
WINDOW = GroupConfig(Kind.SLIDING_WINDOW, 16, window=32)
SHARED = list(range(1, 81))  # every prompt starts with some of these tokens
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ("lookup", "admit", "serve", "other", "extend", "end_step", "finish", "reset")
        ),
        st.integers(0, 1),  # which prompt, or which running request
        st.integers(1, 48),  # a budget
    ),
    min_size=4,
    max_size=60,
)
PROMPTS = st.lists(
    st.tuples(st.integers(1, 40), st.lists(st.integers(500, 503), max_size=8)),
    min_size=2,
    max_size=2,
)


def fresh(
    m: KVCacheManager, prompt: Prompt, max_hit: int | None = None
) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """The search over the cache as it is now, nothing remembered; at most `max_hit` tokens
    as `lookup` caps it (the largest length below the cap every group accepts)."""
    keys = m._keying.keys(prompt.chains)
    search = functools.partial(coordinator.find_hit, m.config, len(prompt), keys, m.pool.served)
    hit, tables = search()
    if max_hit is not None and hit > max_hit:
        hit, tables = search(limit=max_hit)
    return hit, tuple(tuple(t) for t in tables)


def play(m: KVCacheManager, prompts: list[Prompt], ops: list[tuple[str, int, int]]) -> None:
    """Plays `ops`: lookups, admissions and whole requests (`serve`) of the two prompts
    between chunks, step ends, finishes, other prompts' allocations (evictions: the pool
    is small) and resets, each between two lookups of its prompt. An operation the
    manager refuses (KVCacheError) changes nothing and is passed over."""
    running: list[str] = []
    for n, (op, which, size) in enumerate(ops):
        prompt = prompts[which]
        m.lookup(prompt)  # remembered before the operation, asked again after it
        with contextlib.suppress(KVCacheError):
            step(m, prompt, running, op, f"r{n}", which, size)
        assert m.hit_length(prompt) == fresh(m, prompt)[0]  # the remembered search's, uncopied
        capped_now = fresh(m, prompt, size)  # the remembered search's hit may exceed the cap
        assert m.hit_length(prompt, max_hit=size) == capped_now[0]
        assert m.lookup(prompt, max_hit=size) == capped_now
        assert m.lookup(prompt) == fresh(m, prompt)


def step(
    m: KVCacheManager, prompt: Prompt, running: list[str], op: str, rid: str, which: int, size: int
) -> None:
    if op == "lookup":
        assert m.lookup(prompt) == fresh(m, prompt)
    elif op == "admit":
        want = fresh(m, prompt)[0]
        result = m.admit(rid, prompt, size)
        if isinstance(result, Scheduled):
            assert result.hit == want, (result.hit, want)
            running.append(rid)
    elif op == "serve" and not running:  # a whole request: its blocks join the cache
        if isinstance(m.admit(rid, prompt, len(prompt)), Scheduled):
            m.end_step()
            m.finish(rid)
    elif op == "other":  # another tenant's prompt takes as many free blocks as it can
        for tokens in (m.pool.num_free * 64 >> k for k in range(16)):
            if tokens and isinstance(m.admit(rid, [1000 + size] * tokens, tokens), Scheduled):
                running.append(rid)
                break
    elif op == "extend" and running:
        progress = m.progress_of(running[which % len(running)])
        if progress is not None and not progress.scheduled:
            whole = progress.computed == progress.known
            m.extend(running[which % len(running)], 1 if whole else size, [size] * whole)
    elif op == "end_step":
        m.end_step()
    elif op == "finish" and running:
        m.finish(running[which % len(running)])
        running.pop(which % len(running))
    elif op == "reset" and not running:
        m.reset_prefix_cache()


@pytest.fixture
def checked_memo(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every answer of the remembered search is checked against `fresh` as it is given;
    yields how many were given (a vacuity count)."""
    remembered = [0]
    recall = KVCacheManager._remembered

    def checked(self: KVCacheManager, prompt: Prompt, spend: bool, *, copied: bool) -> Any:
        answer = recall(self, prompt, spend, copied=copied)
        if answer is not None:
            remembered[0] += 1
            hit, answered = answer
            if copied:
                assert (hit, tuple(map(tuple, answered))) == fresh(self, prompt)
            else:  # hit_length's: the length alone
                assert hit == fresh(self, prompt)[0]
        return answer

    monkeypatch.setattr(KVCacheManager, "_remembered", checked)
    return remembered


VISIBILITY = st.sampled_from(("step-end", "same-pass"))


def manager_and_prompts(
    layout: Any, visibility: str, blocks: int, parts: list[tuple[int, list[int]]]
) -> tuple[KVCacheManager, list[Prompt]]:
    """A small pool (evictions come soon) and two prompts sharing a prefix."""
    config = config_from_json(layout_to_json(layout), blocks, {"visibility": visibility})
    m = KVCacheManager(config)
    return m, [m.prompt(SHARED[:length] + own) for length, own in parts]


CHECK = settings(
    max_examples=tiered(300, 3000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("index", ["compiled or default", "pure Python"])
def test_a_remembered_search_is_the_search_now(checked_memo, monkeypatch, index):
    """Every answer of the search, remembered or not, equals the search over the cache as
    it is then, after admissions, chunks, step ends, finishes, evictions and resets; an
    admission's hit is the search's right before it. At least one remembered answer per
    example on average (vacuity). On the default key index and on the pure-Python one."""
    if index == "pure Python":
        monkeypatch.setattr(block_pool, "KeyIndex", PyKeyIndex)
    explore(CHECK)
    assert checked_memo[0] >= tiered(300, 3000), checked_memo


def cached_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[KVCacheManager, list[int | None]]:
    """A manager holding SHARED[:80] cached, and the searches it makes from now on (each
    one's `limit`)."""
    m = KVCacheManager(CacheConfig((FULL, WINDOW), 64))
    m.admit("a", m.prompt(SHARED[:80]), 80)
    m.end_step()
    m.finish("a")
    calls: list[int | None] = []
    search = coordinator.find_hit

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("limit"))
        return search(*args, **kwargs)

    monkeypatch.setattr(KVCacheManager, "search", staticmethod(counted))
    return m, calls


def test_a_lookup_then_its_admission_search_once(monkeypatch):
    """The pattern the memo is for: lookup, then admit the same Prompt; the admission takes
    the remembered search (one search call), and leaves nothing remembered."""
    m, calls = cached_and_counted(monkeypatch)
    again = m.prompt([*SHARED[:80], 600, 601])
    hit, _ = m.lookup(again)
    result = m.admit("b", again, 16)
    assert isinstance(result, Scheduled)
    assert result.hit == hit == 80
    assert calls == [None]
    assert m._last_search is None


class _EvictionBlindIndex(PyKeyIndex):
    """A broken twin: a key index whose change count misses evictions (forget_run)."""

    __slots__ = ()

    def forget_run(self, blocks: Any, evictions: list[int], shadowed: list[int]) -> int:
        before = self.changes
        forgotten = super().forget_run(blocks, evictions, shadowed)
        self.changes = before
        return forgotten


def test_a_memo_blind_to_evictions_is_caught(monkeypatch, checked_memo):
    """The property above has teeth: with a key index that does not count evictions, the
    memo serves blocks that were evicted and reused since, and the check says so."""
    monkeypatch.setattr(block_pool, "KeyIndex", _EvictionBlindIndex)
    search = settings(CHECK, max_examples=1000, derandomize=True, phases=[Phase.generate])
    with pytest.raises(AssertionError):
        explore(search)


def explore(chosen: settings) -> None:
    """Plays drawn layouts, visibilities, prompts and operations."""

    @chosen
    @given(
        layout=layouts(),
        visibility=VISIBILITY,
        blocks=st.integers(8, 24),
        parts=PROMPTS,
        ops=OPS,
    )
    def played(layout: Any, visibility: str, blocks: int, parts: Any, ops: Any) -> None:
        m, prompts = manager_and_prompts(layout, visibility, blocks, parts)
        play(m, prompts, ops)

    played()


def test_a_lookup_of_plain_tokens_leaves_the_remembered_search_of_a_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup given token ids makes its own Prompt, which nobody can pass again: its
    search is not remembered (its tables are not copied for nothing), and the search an
    engine's Prompt left stays for that Prompt's admission."""
    m, calls = cached_and_counted(monkeypatch)
    mine = m.prompt([*SHARED[:80], 600])
    hit, _ = m.lookup(mine)
    remembered = m._last_search
    plain = [*SHARED[:48], 700]
    assert m.lookup(plain) == fresh(m, m.prompt(plain))
    assert m._last_search is remembered  # the plain lookup remembered nothing
    result = m.admit("b", mine, 16)
    assert isinstance(result, Scheduled)
    assert result.hit == hit == 80
    assert calls == [None, None]  # mine's search, the plain one's: the admission took mine's
    assert m._last_search is None
