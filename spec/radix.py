"""§13 The radix profile: the cache as a tree of page runs, as SGLang keeps it.

§6's pool keys every block and keeps cached blocks in a free queue. SGLang keeps a radix
tree instead: each node holds a run of whole pages, a request locks the path its table
starts with, and a node is evicted whole once no request locks it and no child hangs below
it. Under `eviction: radix` the allocator is that tree, for one full-attention group of page
size B; the operations and observations are §6's, misuse is refused alike (INPUT-1).

    RADIX-SCOPE-1  one full-attention group, nothing speculative, step-end visibility,
                   dense retention; no lookahead, no inner checkpoints, one token per decode
    RADIX-HIT-1    the hit: the longest run of whole pages of the prompt but its last token
                   that the tree holds
    RADIX-LRU-1    a lookup refreshes the path it matched, deepest last; an insert refreshes
                   what it walks, in walk order
    RADIX-SPLIT-1  a lookup or insert ending inside a node splits it there
    RADIX-PUB-1    a prefill chunk's whole pages join the tree when its step ends
    RADIX-PUB-2    pages a decode writes join the tree when the request finishes, never when
                   it is preempted
    RADIX-DEDUP-1  a page the tree holds already is freed, and the table takes the tree's
    RADIX-EVICT-1  before allocating: whole unlocked leaves, least recently used first, until
                   the allocation's target is free
    RADIX-ID-1     a page id names one allocation: no id is handed out twice
    RADIX-FREE-1   a release frees the request's pages outside the tree, unlocks its path
    RADIX-RESET-1  a reset empties the tree, refused while a request runs
    RADIX-INV-1    what every reachable state keeps

Why a profile and not a bug: every rule is a choice SGLang's code makes (0.5.23's);
an engine claiming `eviction.radix` is held to each exactly, as §6's engines are to theirs.
A page's id names its lifetime (RADIX-ID-1): which physical page a fresh allocation reuses
is SGLang's allocator's business, so tables are compared up to a renaming of lifetimes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvcert.spec.alloc import (
    Admit,
    Admitted,
    CacheReset,
    EndStep,
    Eviction,
    Extend,
    Extended,
    Finish,
    Observation,
    Op,
    PoolConfig,
    Preempt,
    Released,
    ResetCache,
    StepEnded,
    Visibility,
    Waiting,
    check_admission,
    check_extension,
)
from kvcert.spec.errors import InvalidOp, refuse
from kvcert.spec.hashing import BlockKey, Extra, block_keys, extras_within
from kvcert.spec.layout import FullAttention
from kvcert.spec.retention import Retention

ROOT = 0  # the tree's root: holds no page, never locked, never evicted
Stamp = tuple[int, int]  # last access: (tick, -depth below the deepest node a lookup stamped)
Content = tuple[tuple[int, ...], tuple[Extra, ...]]  # the tokens a page's KV covers, extras


@dataclass(frozen=True)
class Node:
    """A run of whole pages below `parent`: pages[i] holds the KV keyed keys[i]."""

    parent: int
    keys: tuple[BlockKey, ...]
    pages: tuple[int, ...]
    stamp: Stamp


@dataclass(frozen=True)
class Running:
    """A request the tree holds pages for."""

    tokens: tuple[int, ...]  # prompt plus the outputs appended so far
    extras: tuple[Extra, ...]
    prompt: int  # tokens it was admitted with
    computed: int  # tokens whose KV is written
    scheduled: int  # tokens being computed in the current step
    table: tuple[int, ...]  # its pages, in position order
    protected: int  # leading table entries the tree owns: the pages of its locked path
    lock: int  # the node its locked path ends at (ROOT: it locks nothing)
    decoding: bool = False  # it has appended a sampled token (RADIX-PUB-2)


@dataclass(frozen=True)
class State:
    """The whole radix allocator: tree, running requests, the clock and the id counters."""

    config: PoolConfig
    nodes: dict[int, Node] = field(default_factory=dict)  # every node but ROOT, by id
    requests: dict[str, Running] = field(default_factory=dict)
    written: dict[int, Content] = field(default_factory=dict)  # live pages' committed KV
    in_step: tuple[str, ...] = ()  # requests scheduled since the last end of step, in order
    clock: int = 0  # ticks handed out (RADIX-LRU-1)
    next_page: int = 1  # RADIX-ID-1: the id the next allocated page gets (0 is the null page)
    next_node: int = 1


def scope_problem(config: PoolConfig) -> str | None:
    """RADIX-SCOPE-1: The radix profile caches one full-attention group of page size B under
    step-end visibility and dense retention, with nothing speculative; its chunks reserve no
    lookahead and name no inner checkpoint, and a decode step appends one token.

        [full B=16]                          served
        [full B=16] + [sliding window W=8]   refused: SGLang's SWA tree is not specified
        [full B=16], speculative exact       refused: bigram keys are not specified

    pre: True
    post: __return__ is None or config.eviction is Eviction.RADIX
    """
    if config.eviction is not Eviction.RADIX:
        return None
    layout = config.layout
    groups = layout.groups
    if len(groups) != 1 or not isinstance(groups[0], FullAttention) or groups[0].draft:
        return (
            "the radix profile caches one full-attention group (SGLang's radix tree); "
            "other layouts have no radix profile yet: use a block-pool eviction profile"
        )
    if layout.speculative is not None or layout.hit_unit is not None:
        return "the radix profile defines no speculative profile and no hit unit; drop them"
    if config.visibility is not Visibility.STEP_END or config.retention is not Retention.DENSE:
        return (
            "the radix profile publishes pages as RADIX-PUB-1/2 say and keeps every page: "
            "leave visibility 'step-end' and retention 'dense'"
        )
    return None


def initial_state(config: PoolConfig) -> State:
    """An empty tree: every page but the null one free, nothing cached."""
    if config.eviction is not Eviction.RADIX:
        refuse(InvalidOp, "kvcert.spec.radix serves eviction 'radix'; use kvcert.spec.alloc")
    problem = scope_problem(config)
    if problem is not None:
        refuse(InvalidOp, problem)
    return State(config)


def step(state: State, op: Op) -> tuple[State, Observation]:
    """The next-state relation of the radix profile: one operation, one observation."""
    match op:
        case Admit():
            return _admit(state, op)
        case Extend():
            return _extend(state, op)
        case EndStep():
            return end_step(state)
        case Finish():
            return finish(state, op.rid)
        case Preempt():
            return release(state, op.rid)
        case ResetCache():
            return reset_cache(state)
    refuse(InvalidOp, f"unknown operation {op!r}")  # pragma: no cover - Op is closed


# --- the tree ------------------------------------------------------------------------------


def _page(state: State) -> int:
    return state.config.layout.groups[0].block_size


def page_keys(
    state: State, tokens: tuple[int, ...], extras: tuple[Extra, ...]
) -> tuple[BlockKey, ...]:
    """The keys of the whole pages of `tokens` (HASH-CHAIN-1: a key names its whole prefix,
    so equal keys mean equal tokens and extras before and in the page)."""
    return block_keys(tokens, _page(state), extras)


def children(nodes: dict[int, Node], parent: int) -> list[int]:
    return [n for n, node in nodes.items() if node.parent == parent]


def _child(nodes: dict[int, Node], parent: int, key: BlockKey) -> int | None:
    return next((n for n in children(nodes, parent) if nodes[n].keys[0] == key), None)


def path(nodes: dict[int, Node], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (empty for ROOT)."""
    out = []
    while node != ROOT:
        out.append(node)
        node = nodes[node].parent
    return out[::-1]


def path_pages(nodes: dict[int, Node], node: int) -> tuple[int, ...]:
    return tuple(p for n in path(nodes, node) for p in nodes[n].pages)


def locked(state: State) -> set[int]:
    """Every node on a running request's locked path."""
    return {n for r in state.requests.values() for n in path(state.nodes, r.lock)}


def live_pages(state: State) -> set[int]:
    """Pages the tree or a running request holds."""
    in_tree = {p for node in state.nodes.values() for p in node.pages}
    return in_tree | {p for r in state.requests.values() for p in r.table}


def free_pages(state: State) -> int:
    """Pages nothing holds (RADIX-ID-1: a page is live, or free under no id)."""
    return state.config.num_blocks - 1 - len(live_pages(state))


def evictable_pages(state: State) -> int:
    """Pages of unlocked nodes: eviction reaches every one of them, leaves first."""
    held = locked(state)
    return sum(len(node.pages) for n, node in state.nodes.items() if n not in held)


def _tick(state: State) -> tuple[State, Stamp]:
    return dataclasses.replace(state, clock=state.clock + 1), (state.clock + 1, 0)


def _restamp(state: State, node: int, stamp: Stamp) -> State:
    nodes = {**state.nodes, node: dataclasses.replace(state.nodes[node], stamp=stamp)}
    return dataclasses.replace(state, nodes=nodes)


def split(state: State, node: int, at: int) -> tuple[State, int]:
    """RADIX-SPLIT-1: A lookup or insert that ends `at` pages into a node splits it there: a
    new node takes the first `at` pages and the old one, now its child, keeps the rest; the
    new node is stamped, then the old one, so the part past the split is the fresher.

        node 7 = pages [4 5 6 7], lookup matches 2 of them:
        node 9 = [4 5] (stamp t), node 7 = [6 7] below it (stamp t+1); locks on 7 still
        cover 9, which is on 7's path

    pre: 0 < at < len(state.nodes[node].pages)
    post: __return__[0].nodes[node].parent == __return__[1]
    """
    old = state.nodes[node]
    new = state.next_node
    state = dataclasses.replace(state, next_node=new + 1)
    state, first = _tick(state)
    state, second = _tick(state)
    prefix = Node(old.parent, old.keys[:at], old.pages[:at], first)
    suffix = Node(new, old.keys[at:], old.pages[at:], second)
    return dataclasses.replace(state, nodes={**state.nodes, new: prefix, node: suffix}), new


def _common(keys: tuple[BlockKey, ...], offset: int, node: Node) -> int:
    """How many of the node's pages the keys from `offset` on match."""
    n = 0
    while n < len(node.keys) and offset + n < len(keys) and keys[offset + n] == node.keys[n]:
        n += 1
    return n


def lookup(state: State, keys: tuple[BlockKey, ...]) -> tuple[State, int]:
    """RADIX-HIT-1: The hit is the longest run of the keys of the whole pages of the prompt
    but its last token that the tree holds down one path.

    The lookup splits the node it ends inside (RADIX-SPLIT-1) and stamps the path
    (RADIX-LRU-1). Returns the state and the node the match ends at (ROOT: no hit); its
    path's pages are the hit.

        B=4, prompt of 13 tokens: keys of pages 0..2 (token 12 is left to compute)
        tree: root - A [p0 p1] - B [p2 p3 p4]      matches p0 p1 p2: B split after p2
        hit 12 tokens, pages p0 p1 p2

    pre: True
    post: __return__[1] == 0 or __return__[1] in __return__[0].nodes
    """
    node, matched, visited = ROOT, 0, []
    while matched < len(keys):
        child = _child(state.nodes, node, keys[matched])
        if child is None:
            break
        common = _common(keys, matched, state.nodes[child])
        matched += common
        if common < len(state.nodes[child].keys):
            state, child = split(state, child, common)
            visited.append(child)
            node = child
            break
        visited.append(child)
        node = child
    return stamp_lookup(state, visited), node


def stamp_lookup(state: State, visited: list[int]) -> State:
    """RADIX-LRU-1: A lookup stamps the nodes it matched with one tick, the deepest newest
    (each level above one step older); an insert stamps each node it enters with a tick of
    its own, in walk order, and the leaf it adds last; nothing else refreshes a node.

        lookup through A - B' at tick 9:   B' (9, 0), A (9, -1)
        insert entering A then B', adding C:   A 10, B' 11, C 12

    pre: True
    post: __return__.clock == state.clock + 1
    """
    state, (tick, _) = _tick(state)
    for depth, n in enumerate(reversed(visited)):
        state = _restamp(state, n, (tick, -depth))
    return state


def insert(
    state: State, keys: tuple[BlockKey, ...], pages: tuple[int, ...], protected: int
) -> tuple[State, int, tuple[int, ...]]:
    """RADIX-DEDUP-1: Inserting a request's pages frees each one the tree holds already
    under its key (unless it is one of the request's first `protected`, which are the tree's
    own), and the request's table takes the tree's page in its place.

    The insert walks the tree along the keys, stamping each node it enters (RADIX-LRU-1;
    a node it ends inside is split, RADIX-SPLIT-1); the pages past the walk hang below it
    as a new leaf. Returns the state, the node the insert ends at and the pages the
    request's table takes: the tree's, for every key.

        tree: root - A [p0 p1];  request b computed its own q0 q1 q2 (protected 0)
        insert keys 0..2: enter A (stamp), q0 q1 freed (A holds them), new leaf C [q2]
        b's table becomes p0 p1 q2, its lock moves to C

    pre: len(pages) == len(keys) and 0 <= protected <= len(keys)
    post: len(__return__[2]) == len(keys)
    """
    node, done = ROOT, 0
    freed: set[int] = set()
    while done < len(keys):
        child = _child(state.nodes, node, keys[done])
        if child is None:
            break
        state, stamp = _tick(state)
        state = _restamp(state, child, stamp)
        common = _common(keys, done, state.nodes[child])
        if common < len(state.nodes[child].keys):
            state, child = split(state, child, common)
        freed |= {pages[j] for j in range(max(done, protected), done + common)}
        node, done = child, done + common
    if done < len(keys):
        state, stamp = _tick(state)
        leaf = state.next_node
        nodes = {**state.nodes, leaf: Node(node, keys[done:], pages[done:], stamp)}
        state = dataclasses.replace(state, nodes=nodes, next_node=leaf + 1)
        node = leaf
    written = {p: c for p, c in state.written.items() if p not in freed}
    state = dataclasses.replace(state, written=written)
    return state, node, path_pages(state.nodes, node)


def evict(state: State, target: int) -> State:
    """RADIX-EVICT-1: Before an allocation the tree evicts, while fewer than `target` tokens'
    pages are free, the unlocked leaf with the oldest stamp, whole, a parent left childless
    and unlocked being a leaf like any other.

    The target is the chunk's tokens plus one page (B > 1), or one page for a decode step,
    whether or not a page is needed: SGLang's allocation over-asks by a page per request.
    A leaf holds every page one insert added (or what a split left of them).

        B=4, 1 page free, prefill of 6 tokens -> target 6 + 4 = 10 tokens = 3 pages
        leaves: C [p5 p6] stamp 3, D [p7] stamp 9      evict C (2 pages, 3 free): done

    pre: target >= 0
    post: free_pages(__return__) >= free_pages(state)
    """
    size = _page(state)
    while free_pages(state) * size < target:
        held = locked(state)
        parents = {node.parent for node in state.nodes.values()}
        leaves = [n for n in state.nodes if n not in held and n not in parents]
        if not leaves:
            break
        victim = min(leaves, key=lambda n: (state.nodes[n].stamp, n))
        gone = set(state.nodes[victim].pages)
        nodes = {n: node for n, node in state.nodes.items() if n != victim}
        written = {p: c for p, c in state.written.items() if p not in gone}
        state = dataclasses.replace(state, nodes=nodes, written=written)
    return state


def allocate(state: State, count: int) -> tuple[State, tuple[int, ...]]:
    """RADIX-ID-1: A page handed out gets the next unused id, so an id names one page's
    lifetime from its allocation to its free or eviction, and is never reused.

        pages 1..5 handed out, 3 freed:    the next allocation gets 6, never 3

    pre: 0 <= count <= free_pages(state)
    post: len(__return__[1]) == count
    """
    first = state.next_page
    return dataclasses.replace(state, next_page=first + count), tuple(range(first, first + count))


def _pages_for(tokens: int, size: int) -> int:
    return -(-tokens // size)


# --- operations -----------------------------------------------------------------------------


def _require(condition: bool, message: str) -> None:
    if not condition:
        refuse(InvalidOp, message)


def _admit(state: State, op: Admit) -> tuple[State, Observation]:
    check_admission(state.config.layout, state.requests, op)
    _require(op.lookahead == 0, "the radix profile reserves no lookahead (RADIX-SCOPE-1)")
    _require(op.checkpoint == 0, "the radix profile names no inner checkpoint (RADIX-SCOPE-1)")
    size = _page(state)
    keys = page_keys(state, op.tokens[:-1], op.extras)
    state, node = lookup(state, keys)
    hit_pages = path_pages(state.nodes, node)
    hit = len(hit_pages) * size
    scheduled = min(op.budget, len(op.tokens) - hit)
    request = Running(
        op.tokens, op.extras, len(op.tokens), hit, scheduled, hit_pages, len(hit_pages), node
    )
    return _grow(state, op.rid, request, decode=False, admitting=True)


def _extend(state: State, op: Extend) -> tuple[State, Observation]:
    tokens = check_extension(state.config.layout, op, state.requests.get(op.rid))
    request = state.requests[op.rid]
    _require(op.lookahead == 0, "the radix profile reserves no lookahead (RADIX-SCOPE-1)")
    _require(op.checkpoint == 0, "the radix profile names no inner checkpoint (RADIX-SCOPE-1)")
    _require(
        len(op.appended) <= 1,
        "the radix profile decodes one token per step (RADIX-SCOPE-1); append one token",
    )
    scheduled = min(op.budget, len(tokens) - request.computed)
    grown = dataclasses.replace(
        request,
        tokens=tokens,
        scheduled=scheduled,
        decoding=request.decoding or bool(op.appended),
    )
    return _grow(state, op.rid, grown, decode=bool(op.appended))


def _grow(
    state: State, rid: str, request: Running, *, decode: bool, admitting: bool = False
) -> tuple[State, Observation]:
    """Allocate the pages `request`'s chunk needs, evicting by RADIX-EVICT-1, or answer
    Waiting and leave `state` as it is (an admission's lookup has stamped and split it
    already: SGLang looks a request up whether or not it is then admitted)."""
    size = _page(state)
    needed = _pages_for(request.computed + request.scheduled, size) - len(request.table)
    holding = dataclasses.replace(state, requests={**state.requests, rid: request})
    available = free_pages(holding) + evictable_pages(holding)
    if needed > available:
        return state, Waiting(needed, available)
    target = size if decode else request.scheduled + (size if size > 1 else 0)
    holding, fresh = allocate(evict(holding, target), needed)
    grown = dataclasses.replace(request, table=request.table + fresh)
    in_step = holding.in_step + ((rid,) if rid not in holding.in_step else ())
    holding = dataclasses.replace(
        holding, requests={**holding.requests, rid: grown}, in_step=in_step
    )
    if admitting:
        return holding, Admitted(request.computed, request.scheduled, (grown.table,))
    return holding, Extended(request.scheduled, (grown.table,))


def publish(state: State, rid: str, upto: int) -> tuple[State, int]:
    """Publish the request's first `upto` tokens' whole pages by inserting them
    (RADIX-DEDUP-1): its table takes the tree's pages, its lock moves to the node the
    insert ended at, and the tree owns its table up to there; returns the pages added.

        B=4, a computed 10 tokens: pages [a0 a1 a2], a2 half written
        insert keys 0..1 -> leaf [a0 a1]; a2 stays a's own; a locks the leaf, protected 2

    pre: rid in state.requests and upto <= state.requests[rid].computed
    post: __return__[1] >= 0
    """
    request = state.requests[rid]
    keys = page_keys(state, request.tokens[:upto], request.extras)
    before = sum(len(node.pages) for node in state.nodes.values())
    state, node, tree_pages = insert(state, keys, request.table[: len(keys)], request.protected)
    added = sum(len(node.pages) for node in state.nodes.values()) - before
    table = tree_pages + request.table[len(keys) :]
    published = dataclasses.replace(request, table=table, protected=len(keys), lock=node)
    return dataclasses.replace(state, requests={**state.requests, rid: published}), added


def end_step(state: State) -> tuple[State, Observation]:
    """RADIX-PUB-1: When a step ends, every request scheduled in it commits its chunk, and
    each one still computing its prompt then publishes its whole pages (RADIX-DEDUP-1), in
    the order the requests were scheduled; a decode step publishes nothing (RADIX-PUB-2).

        B=4: a prefills 10 tokens -> at the end of the step pages 0..1 join the tree
        a decodes token 10 -> nothing joins until a finishes

    pre: True
    post: all(r.scheduled == 0 for r in __return__[0].requests.values())
    """
    size = _page(state)
    registered = 0
    for rid in state.in_step:
        request = state.requests.get(rid)
        if request is None:  # released mid-step
            continue
        computed = request.computed + request.scheduled
        written = dict(state.written)
        for j in range(computed // size):
            covered = request.tokens[: (j + 1) * size]
            written.setdefault(
                request.table[j], (covered, extras_within(request.extras, (j + 1) * size))
            )
        request = dataclasses.replace(request, computed=computed, scheduled=0)
        state = dataclasses.replace(
            state, requests={**state.requests, rid: request}, written=written
        )
        if not request.decoding:
            state, added = publish(state, rid, computed)
            registered += added
    return dataclasses.replace(state, in_step=()), StepEnded(registered)


def finish(state: State, rid: str) -> tuple[State, Observation]:
    """RADIX-PUB-2: The pages a decode writes join the tree only when the request finishes,
    which publishes every whole page it computed before releasing it (RADIX-FREE-1); a
    preempted request is released without publishing them, so its output is lost.

        B=4, prompt 8 tokens in the tree [p0 p1], decoded 5 more: own pages d2 d3
        finish:  insert 12 tokens -> leaf [d2] below [p0 p1]; d3 (1 token) freed
        preempt: d2 d3 freed; [p0 p1] stays cached, unlocked

    (The output's pages form a node apart from the prompt's, which its last prefill step
    published; SGLang inserts the prompt again at a finish to split them, which changes
    nothing here.)

    pre: True
    post: rid not in __return__[0].requests
    """
    _require(rid in state.requests, f"unknown request {rid!r}; it is not running")
    before = state.requests[rid]
    state, _ = publish(state, rid, before.computed)
    return release(state, rid, before.table)


def release(
    state: State, rid: str, held: tuple[int, ...] | None = None
) -> tuple[State, Observation]:
    """RADIX-FREE-1: A released request's pages outside the tree are freed and its path is
    unlocked; the observation counts the pages its table held (`held`, before a finish
    published) that no other running request holds.

        a [p0 p1 a2 a3] (tree owns p0 p1, b also holds them): a2 a3 freed, p0 p1 stay
        locked by b; released 2

    pre: True
    post: rid not in __return__[0].requests
    """
    _require(rid in state.requests, f"unknown request {rid!r}; it is not running")
    table = state.requests[rid].table if held is None else held
    others = {p for r, other in state.requests.items() if r != rid for p in other.table}
    requests = {r: other for r, other in state.requests.items() if r != rid}
    state = dataclasses.replace(state, requests=requests)
    alive = live_pages(state)
    written = {p: c for p, c in state.written.items() if p in alive}
    return dataclasses.replace(state, written=written), Released(len(set(table) - others))


def reset_cache(state: State) -> tuple[State, Observation]:
    """RADIX-RESET-1: Resetting empties the tree, and is refused while a request runs.

        8 pages, tree [p1 p2] + [p4 p5], no request running:  every node dropped, 8 free
        request a holds [p1 p2 p3]:                            refused, nothing changes

    pre: True
    post: __return__[1].done == (not state.requests)
    """
    if state.requests:
        return state, CacheReset(False)
    return dataclasses.replace(state, nodes={}, written={}), CacheReset(True)


# --- invariants ------------------------------------------------------------------------------


def violated(state: State) -> list[str]:
    """RADIX-INV-1: In every reachable state each tree page holds the KV its key names, each
    running request's committed pages hold its own tokens' KV, its table starts with its
    locked path, and no more pages are live than the pool has.

        a's table [p0 p1 q2], protected 2, lock on [p0 p1]: p0 holds tokens 0..3 of a

    pre: True
    post: isinstance(__return__, list)
    """
    size = _page(state)
    broken = []
    for n, node in state.nodes.items():
        depth = len(path_pages(state.nodes, node.parent))
        for i, (key, page) in enumerate(zip(node.keys, node.pages, strict=True)):
            content = state.written.get(page)
            if content is None:
                broken.append(f"RADIX-INV-1: tree page {page} of node {n} holds nothing written")
                continue
            keys = block_keys(content[0], size, content[1])
            if len(keys) != depth + i + 1 or keys[-1] != key:
                broken.append(f"RADIX-INV-1: tree page {page} holds other KV than its key names")
    for rid, request in state.requests.items():
        if request.table[: request.protected] != path_pages(state.nodes, request.lock):
            broken.append(f"RADIX-INV-1: {rid}'s table does not start with its locked path")
        for j in range(request.computed // size):
            want = request.tokens[: (j + 1) * size]
            got = state.written.get(request.table[j])
            if got is None or got[0] != want:
                broken.append(f"RADIX-INV-1: {rid}'s page {j} holds other tokens' KV")
    if len(live_pages(state)) > state.config.num_blocks - 1:
        broken.append("RADIX-INV-1: more pages live than the pool has")
    return broken
