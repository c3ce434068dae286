"""A scripted stand-in for vLLM's scheduler, for testing the campaign's ledger without vLLM:
requests and per-group block tables as a scheduler holds them after `schedule()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass
class FakeRequest:
    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    num_prompt_tokens: int | None = None
    max_tokens: int | None = None  # None: no limit


@dataclass
class FakeScheduler:
    tables: dict[str, tuple[list[int], ...]] = field(default_factory=dict)  # per group
    requests: dict[str, FakeRequest] = field(default_factory=dict)
    sent: dict[str, list[int]] = field(default_factory=dict)  # table lengths the runner holds

    def __post_init__(self) -> None:
        self.kv_cache_manager = SimpleNamespace(get_block_ids=lambda rid: self.tables[rid])

    def add(self, rid: str, tokens: list[int], *tables: list[int], hit: int = 0) -> None:
        """A request with `hit` tokens already computed and one block table per group."""
        self.requests[rid] = FakeRequest(rid, tokens, hit)
        self.tables[rid] = tables

    def step(
        self,
        counts: dict[str, int],
        new: tuple[str, ...] = (),
        drafts: dict[str, tuple[int, ...]] | None = None,
    ) -> SimpleNamespace:
        """One step scheduling `counts[rid]` tokens of each request (advancing its count as
        the scheduler does), the `new` ones sent whole, with their scheduled drafts."""
        hits = {rid: self.requests[rid].num_computed_tokens for rid in new}
        for rid, count in counts.items():
            self.requests[rid].num_computed_tokens += count
        cached = [rid for rid in counts if rid not in new]
        for rid in new:
            self.sent[rid] = [0] * len(self.tables[rid])
        appended = [self._appended(rid) for rid in cached]
        return SimpleNamespace(
            num_scheduled_tokens=dict(counts),
            scheduled_new_reqs=[
                SimpleNamespace(
                    req_id=rid, block_ids=self._appended(rid), num_computed_tokens=hits[rid]
                )
                for rid in new
            ],
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=cached,
                resumed_req_ids=set(),
                new_block_ids=appended,
                num_computed_tokens=[self.requests[r].num_computed_tokens for r in cached],
            ),
            scheduled_spec_decode_tokens={r: list(d) for r, d in (drafts or {}).items() if d},
        )

    def _appended(self, rid: str) -> tuple[list[int], ...]:
        """The blocks the runner's tables gain this step (vLLM appends new block ids)."""
        held = self.sent.setdefault(rid, [0] * len(self.tables[rid]))
        tails = tuple(list(t[n:]) for t, n in zip(self.tables[rid], held, strict=True))
        self.sent[rid] = [len(t) for t in self.tables[rid]]
        return tails

    def schedule(self, rid: str, count: int, drafts: tuple[int, ...] = (), new: bool = False):
        """One step scheduling one request."""
        return self.step({rid: count}, (rid,) if new else (), {rid: drafts})
