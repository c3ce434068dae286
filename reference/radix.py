"""The radix profile's allocator (spec §13): the cache as a tree of page runs, as SGLang keeps
it, with the same calls as KVCacheManager (admit, extend, end_step, finish, preempt,
reset_prefix_cache, block_tables).

Where the spec rebuilds frozen states and scans every node, this tree is mutable and pays
per call only for what the call touches: a node keeps its children by first key, and
counts the running requests whose locked path passes through it (SGLang's lock_ref), so
the pages eviction can reach are a running total; eviction pops a heap of leaf stamps, each
entry checked when popped (a node restamped, split, locked or given a child since leaves a
stale entry behind, skipped then). Page ids are physical and reused: the spec names a page
by its lifetime (RADIX-ID-1), and conformance compares tables up to that renaming.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Sequence

from kvcert.reference import inputs
from kvcert.reference.config import CacheConfig, Eviction, Kind, Retention, Visibility
from kvcert.reference.errors import (
    ConfigError,
    MaxLengthError,
    RequestStateError,
    UnknownRequestError,
)
from kvcert.reference.hashing import Chain, ExtraKey, hasher
from kvcert.reference.requests import Scheduled, Waiting

__all__ = ["RadixCacheManager"]

Stamp = tuple[int, int]  # (tick, -depth below the deepest node a lookup stamped)


class _Node:
    """A run of whole pages: pages[i] holds the KV keyed keys[i]."""

    __slots__ = ("alive", "children", "keys", "locks", "pages", "parent", "stamp")

    def __init__(self, parent: _Node | None, keys: list[bytes], pages: list[int]) -> None:
        self.parent = self if parent is None else parent  # the root is its own parent
        self.children: dict[bytes, _Node] = {}  # by the child's first key
        self.keys = keys
        self.pages = pages
        self.stamp: Stamp = (0, 0)
        self.locks = 0  # running requests whose locked path passes through this node
        self.alive = True


class _Running:
    """A request the tree holds pages for."""

    __slots__ = (
        "chain", "computed", "decoding", "lock", "protected", "scheduled", "table", "tokens",
    )  # fmt: skip

    def __init__(self, tokens: array[int], chain: Chain, hit: int, lock: _Node) -> None:
        self.tokens = tokens  # prompt plus the outputs appended so far
        self.chain = chain  # its page keys, digested as far as its tokens go
        self.computed = hit  # tokens whose KV is written
        self.scheduled = 0  # tokens its chunk in flight computes
        self.table: list[int] = []  # its pages, in position order
        self.protected = 0  # leading table entries the tree owns: its locked path's pages
        self.lock = lock  # the node its locked path ends at (the root: nothing locked)
        self.decoding = False  # it has appended a sampled token (RADIX-PUB-2)


class RadixCacheManager:
    """SGLang's radix tree as an allocator: one full-attention group of page size B."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.page = _check_scope(config)
        self._new = hasher(config.hash_algorithm)
        self._root = _Node(None, [], [])
        self._clock = 0
        self._free = list(range(config.num_blocks - 1, 0, -1))  # pops hand out 1, 2, ...
        self._reachable = 0  # pages of unlocked nodes: what eviction can reach
        self._leaves: list[tuple[Stamp, int, _Node]] = []  # heap of leaf stamps, lazily valid
        self._nodes = 0  # nodes in the tree, the root aside
        self._order = itertools.count()
        self._requests: dict[str, _Running] = {}
        self._in_step: dict[str, None] = {}  # scheduled since the last end of step, in order

    # --- the calls ------------------------------------------------------------------------

    def admit(
        self,
        rid: str,
        tokens: Sequence[int],
        budget: int,
        extras: Sequence[ExtraKey] = (),
        lookahead: int = 0,
        *,
        checkpoint: int = 0,
    ) -> Scheduled | Waiting:
        """Look a new request up and allocate for its first chunk. Implements RADIX-HIT-1:
        the hit is the longest run of the prompt's whole pages, but its last token, that the
        tree holds down one path; the lookup splits and stamps whether or not the request
        then fits (SGLang looks a request up before it is admitted)."""
        inputs.request_id(rid)
        prompt = inputs.token_ids(tokens, "a prompt's tokens")
        keys_of = inputs.extra_keys(extras)
        if rid in self._requests:
            raise RequestStateError(
                f"request {rid!r} is already running; extend it, or finish/preempt it first"
            )
        if not prompt:
            raise RequestStateError("a request needs at least one token")
        inputs.budget_and_lookahead(budget, lookahead)
        self._no_lookahead_or_checkpoint(lookahead, checkpoint)
        limit = self.config.max_model_len
        if limit is not None and len(prompt) > limit:
            raise MaxLengthError(f"{len(prompt)} tokens exceed max_model_len={limit}")
        if any(e.end is not None and e.end > len(prompt) for e in keys_of):
            raise RequestStateError(
                "a positioned extra (multimodal item, prompt embeddings) lies beyond the "
                "prompt; its span must be within the tokens"
            )
        chain = Chain(self.page, 0, keys_of, self._new)
        chain.extend(prompt)
        node, hit_pages = self._lookup(chain.digests[: (len(prompt) - 1) // self.page])
        request = _Running(prompt, chain, len(hit_pages) * self.page, node)
        request.table = hit_pages
        request.protected = len(hit_pages)
        scheduled = min(budget, len(prompt) - request.computed)
        self._lock(node)
        fresh = self._grow(request, scheduled, decode=False)
        if isinstance(fresh, Waiting):
            self._unlock(node)
            return fresh
        self._requests[rid] = request
        self._in_step[rid] = None
        return Scheduled(request.computed, scheduled, (fresh,), (tuple(request.table),))

    def extend(
        self,
        rid: str,
        budget: int,
        appended: Sequence[int] = (),
        lookahead: int = 0,
        *,
        checkpoint: int = 0,
    ) -> Scheduled | Waiting:
        """Schedule a running request's next chunk, or its decode step of one appended token;
        on Waiting nothing changes, the appended token included."""
        request = self._running(rid)
        more = inputs.token_ids(appended, "appended tokens")
        if request.scheduled:
            raise RequestStateError(f"request {rid!r} has a chunk in flight; end_step first")
        inputs.budget_and_lookahead(budget, lookahead)
        self._no_lookahead_or_checkpoint(lookahead, checkpoint)
        if len(more) > 1:
            raise RequestStateError(
                "the radix profile decodes one token per step (RADIX-SCOPE-1); append one token"
            )
        if more and request.computed != len(request.tokens):
            raise RequestStateError(
                f"request {rid!r} still has prompt tokens to compute; append only after them"
            )
        known = len(request.tokens) + len(more)
        limit = self.config.max_model_len
        if limit is not None and known > limit:
            raise MaxLengthError(f"{known} tokens exceed max_model_len={limit}; finish it")
        if request.computed >= known:
            raise RequestStateError(
                f"request {rid!r} has no token left to compute; append the sampled token"
            )
        scheduled = min(budget, known - request.computed)
        fresh = self._grow(request, scheduled, decode=bool(more))
        if isinstance(fresh, Waiting):
            return fresh
        request.tokens.extend(more)
        request.decoding = request.decoding or bool(more)
        self._in_step[rid] = None
        return Scheduled(0, scheduled, (fresh,))

    def end_step(self) -> int:
        """Implements RADIX-PUB-1: every request scheduled since the last end of step commits
        its chunk, and each one still computing its prompt publishes its whole pages, in the
        order they were scheduled; a decode step publishes nothing (RADIX-PUB-2). Returns
        the pages that joined the tree."""
        registered = 0
        for rid in self._in_step:
            request = self._requests.get(rid)
            if request is None:  # released mid-step
                continue
            request.computed += request.scheduled
            request.scheduled = 0
            if not request.decoding:
                registered += self._publish(request)
        self._in_step.clear()
        return registered

    def finish(self, rid: str) -> int:
        """Implements RADIX-PUB-2: a finished request publishes every whole page it computed,
        then is released (RADIX-FREE-1); returns the pages its table held that no other
        running request holds."""
        request = self._running(rid)
        held = list(request.table)
        self._publish(request)
        return self._release(rid, held)

    def preempt(self, rid: str) -> int:
        """Release a request without publishing what it decoded (RADIX-PUB-2, RADIX-FREE-1)."""
        request = self._running(rid)
        return self._release(rid, list(request.table))

    def reset_prefix_cache(self) -> bool:
        """Implements RADIX-RESET-1: empty the tree, refused (False) while a request runs."""
        if self._requests:
            return False
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            node.alive = False
            self._free.extend(node.pages)
            stack.extend(node.children.values())
        self._root.children.clear()
        self._reachable = self._nodes = 0
        self._leaves.clear()
        return True

    def block_tables(self, rid: str) -> tuple[tuple[int, ...], ...]:
        """The request's one table (one full-attention group)."""
        return (tuple(self._running(rid).table),)

    @property
    def free_blocks(self) -> int:
        """Pages nothing holds."""
        return len(self._free)

    @property
    def cached_blocks(self) -> int:
        """Pages the tree holds."""
        stack, count = list(self._root.children.values()), 0
        while stack:
            node = stack.pop()
            count += len(node.pages)
            stack.extend(node.children.values())
        return count

    # --- the tree ---------------------------------------------------------------------------

    def _tick(self) -> Stamp:
        self._clock += 1
        return (self._clock, 0)

    def _restamp(self, node: _Node, stamp: Stamp) -> None:
        node.stamp = stamp
        if not node.children and not node.locks:
            self._push(node)

    def _push(self, node: _Node) -> None:
        """Offer an unlocked leaf to eviction; the heap is rebuilt from its current entries
        when stale ones outnumber the nodes, so it stays within a constant of the tree."""
        heapq.heappush(self._leaves, (node.stamp, next(self._order), node))
        if len(self._leaves) > 4 * self._nodes + 64:
            self._leaves = [entry for entry in self._leaves if _current(entry)]
            heapq.heapify(self._leaves)

    def _split(self, node: _Node, at: int) -> _Node:
        """Implements RADIX-SPLIT-1: a new node takes the first `at` pages of `node` and
        becomes its parent; the new node is stamped, then `node`, so the part past the split
        is the fresher. Locks through `node` pass through the new one too."""
        parent = node.parent
        prefix = _Node(parent, node.keys[:at], node.pages[:at])
        prefix.stamp = self._tick()
        prefix.locks = node.locks
        self._nodes += 1
        parent.children[prefix.keys[0]] = prefix
        del node.keys[:at], node.pages[:at]
        node.parent = prefix
        prefix.children[node.keys[0]] = node
        self._restamp(node, self._tick())
        return prefix

    def _lookup(self, keys: list[bytes]) -> tuple[_Node, list[int]]:
        """Implements RADIX-LRU-1 for a lookup: the node the match ends at (the root: no hit)
        and its path's pages; the nodes it matched are stamped with one tick, the deepest
        newest (each level above one step older)."""
        node, matched = self._root, 0
        visited: list[_Node] = []
        pages: list[int] = []
        while matched < len(keys):
            child = node.children.get(keys[matched])
            if child is None:
                break
            common = _common(keys, matched, child.keys)
            matched += common
            partial = common < len(child.keys)
            if partial:
                child = self._split(child, common)
            visited.append(child)
            pages += child.pages
            node = child
            if partial:
                break
        tick, _ = self._tick()
        for depth, entered in enumerate(reversed(visited)):
            self._restamp(entered, (tick, -depth))
        return node, pages

    def _insert(
        self, keys: list[bytes], pages: list[int], protected: int
    ) -> tuple[_Node, list[int], int]:
        """Implements RADIX-DEDUP-1 and RADIX-LRU-1 for an insert: walk the tree along the
        keys, stamping each node entered with a tick of its own (splitting one the keys end
        inside); each of the request's own pages (past `protected`) the walk finds held
        already is freed; the rest hang below as a new leaf, stamped last. Returns the node
        the insert ends at, the tree's pages for every key and how many it added."""
        node, done = self._root, 0
        tree_pages: list[int] = []
        while done < len(keys):
            child = node.children.get(keys[done])
            if child is None:
                break
            self._restamp(child, self._tick())
            common = _common(keys, done, child.keys)
            if common < len(child.keys):
                child = self._split(child, common)
            self._free += pages[max(done, protected) : done + common]
            tree_pages += child.pages
            node, done = child, done + common
        if done == len(keys):
            return node, tree_pages, 0
        leaf = _Node(node, keys[done:], pages[done:])
        node.children[keys[done]] = leaf
        self._nodes += 1
        self._reachable += len(leaf.pages)
        self._restamp(leaf, self._tick())
        return leaf, tree_pages + leaf.pages, len(leaf.pages)

    def _lock(self, node: _Node) -> None:
        while node is not self._root:
            if not node.locks:
                self._reachable -= len(node.pages)
            node.locks += 1
            node = node.parent

    def _unlock(self, node: _Node) -> None:
        while node is not self._root:
            node.locks -= 1
            if not node.locks:
                self._reachable += len(node.pages)
                if not node.children:
                    self._push(node)
            node = node.parent

    def _evict(self, target: int) -> None:
        """Implements RADIX-EVICT-1: while fewer than `target` tokens' pages are free, evict
        the unlocked leaf with the oldest stamp, whole; a parent left childless and unlocked
        is a leaf like any other."""
        leaves = self._leaves
        while len(self._free) * self.page < target and leaves:
            stamp, _, node = heapq.heappop(leaves)
            if not node.alive or node.stamp != stamp or node.children or node.locks:
                continue  # a stale entry: the node changed since it was pushed
            node.alive = False
            self._nodes -= 1
            self._free += node.pages
            self._reachable -= len(node.pages)
            parent = node.parent
            del parent.children[node.keys[0]]
            if parent is not self._root and not parent.children and not parent.locks:
                self._push(parent)
                leaves = self._leaves  # a push may rebuild the heap

    # --- requests ---------------------------------------------------------------------------

    def _running(self, rid: str) -> _Running:
        request = self._requests.get(rid) if isinstance(rid, str) else None
        if request is None:
            raise UnknownRequestError(f"unknown request {rid!r}; it is not running")
        return request

    @staticmethod
    def _no_lookahead_or_checkpoint(lookahead: int, checkpoint: int) -> None:
        inputs.counts(checkpoint=checkpoint)
        if lookahead:
            raise RequestStateError("the radix profile reserves no lookahead (RADIX-SCOPE-1)")
        if checkpoint:
            raise RequestStateError("the radix profile names no inner checkpoint (RADIX-SCOPE-1)")

    def _grow(
        self, request: _Running, scheduled: int, *, decode: bool
    ) -> tuple[int, ...] | Waiting:
        """Allocate the pages a chunk of `scheduled` tokens needs, evicting first
        (RADIX-EVICT-1), or Waiting when free and reachable pages are too few (the
        request's own lock held). The eviction's target is the chunk plus a page (B > 1),
        or a page for a decode step, whether or not a page is needed: SGLang over-asks by a
        page per request."""
        page = self.page
        needed = -(-(request.computed + scheduled) // page) - len(request.table)
        available = len(self._free) + self._reachable
        if needed > available:
            return Waiting(needed, available)
        self._evict(page if decode else scheduled + (page if page > 1 else 0))
        fresh = tuple(self._free.pop() for _ in range(needed))
        request.table += fresh
        request.scheduled = scheduled
        return fresh

    def _publish(self, request: _Running) -> int:
        """Insert the request's computed whole pages (RADIX-DEDUP-1): its table takes the
        tree's pages and its lock moves to the node the insert ended at; returns the pages
        added to the tree."""
        count = request.computed // self.page
        request.chain.extend(request.tokens)
        keys = request.chain.digests[:count]
        node, tree_pages, added = self._insert(keys, request.table[:count], request.protected)
        self._lock(node)
        self._unlock(request.lock)
        request.lock = node
        request.table[:count] = tree_pages
        request.protected = count
        return added

    def _release(self, rid: str, held: list[int]) -> int:
        """Implements RADIX-FREE-1: the request's pages outside the tree are freed and its
        path unlocked; returns the pages of `held` (its table before a finish published)
        that no other running request holds."""
        request = self._requests.pop(rid)
        shared: set[int] = set()
        node = request.lock
        while node is not self._root:
            if node.locks > 1:  # another running request's locked path passes here
                shared.update(node.pages)
            node = node.parent
        self._free += request.table[request.protected :]
        self._unlock(request.lock)
        return len(set(held) - shared)


def _common(keys: list[bytes], offset: int, run: list[bytes]) -> int:
    """How many of a node's keys `run` the keys from `offset` on match."""
    n, most = 0, min(len(run), len(keys) - offset)
    while n < most and keys[offset + n] == run[n]:
        n += 1
    return n


def _current(entry: tuple[Stamp, int, _Node]) -> bool:
    stamp, _, node = entry
    return node.alive and node.stamp == stamp and not node.children and not node.locks


def _check_scope(config: CacheConfig) -> int:
    """Implements RADIX-SCOPE-1: one full-attention group of page size B (returned), step-end
    visibility, dense retention, nothing speculative and no hit unit, under eviction radix."""
    if not isinstance(config, CacheConfig):
        raise ConfigError(f"a RadixCacheManager is built from a CacheConfig, got {config!r}")
    if config.eviction is not Eviction.RADIX:
        raise ConfigError(
            f"eviction {config.eviction.value!r} is a block-pool profile: build a "
            "KVCacheManager, or set eviction='radix' for this tree"
        )
    groups = config.groups
    if len(groups) != 1 or groups[0].kind is not Kind.FULL or groups[0].draft:
        raise ConfigError(
            "the radix profile caches one full-attention group (SGLang's radix tree); other "
            "layouts have no radix profile yet: use a block-pool eviction profile"
        )
    if config.speculative is not None or config.hit_unit is not None:
        raise ConfigError(
            "the radix profile defines no speculative profile and no hit unit; drop them"
        )
    if config.visibility is not Visibility.STEP_END or config.retention is not Retention.DENSE:
        raise ConfigError(
            "the radix profile publishes pages as RADIX-PUB-1/2 say and keeps every page: "
            "leave visibility 'step-end' and retention 'dense'"
        )
    return groups[0].block_size
