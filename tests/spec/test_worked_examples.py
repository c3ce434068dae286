"""Worked examples from the seed reports, each with its reasoning.

Where the tokens matter, caches are built the way an engine builds them: a writer request's
block keys (HASH-CHAIN-1, HASH-DRAFT-1) go into each group's cache, and the reader's cached
blocks are the keys it matches (HASH-MATCH-1). Expected numbers are derived in the docstrings
from the rules, or taken from what the reports observed; none is read off the code under test.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from kvcert.spec import (
    CacheView,
    FullAttention,
    Layout,
    MambaMode,
    MambaState,
    SlidingWindow,
    Speculative,
    block_keys,
    hybrid_hit,
    matched_blocks,
)
from kvcert.spec.hashing import draft_lookahead
from kvcert.spec.layout import Group, is_draft
from tests.spec.test_hybrid import per_group_drop_in_loop

Keep = Callable[[int], bool]  # which block indices of a writer the group keeps


def keys_for(layout: Layout, group: Group, tokens: Sequence[int]):
    lookahead = draft_lookahead(is_draft(group), layout.speculative is Speculative.EXACT)
    return block_keys(tokens, group.block_size, (), lookahead)


def view_after(
    layout: Layout,
    writers: Sequence[tuple[Sequence[int], Sequence[Keep | None]]],
    reader: Sequence[int],
) -> CacheView:
    """The reader's view after each writer cached the blocks its groups keep."""
    cached = []
    for index, group in enumerate(layout.groups):
        stored = frozenset(
            key
            for tokens, keeps in writers
            for j, key in enumerate(keys_for(layout, group, tokens))
            if keeps[index] is None or keeps[index](j)
        )
        cached.append(matched_blocks(keys_for(layout, group, reader), stored))
    return CacheView(layout, len(reader), tuple(cached))


def tokens(seed: int, count: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(50_000) for _ in range(count)]


PROMPT_A = tokens(1, 1000)


def test_gpt_oss_with_eagle():
    """GPT-OSS (full + SWA 128, B=16) with EAGLE merged into the full group, A re-sent.

    1000 tokens: the limit is 999, so the plain hit is 62 blocks = 992. Under `drop` the hit
    steps down once to 976, the answer vLLM 0.20+ gives; vLLM <= 0.15 spiralled to 0 (the
    broken twin reproduces that). Under `exact` the draft keys cover each block's next token,
    which the re-sent prompt repeats, so nothing drops: 992.
    """
    for profile, expected in [(Speculative.DROP, 976), (Speculative.EXACT, 992)]:
        layout = Layout((FullAttention(16, draft=True), SlidingWindow(16, 128)), profile)
        view = view_after(layout, [(PROMPT_A, [None, None])], PROMPT_A)
        assert hybrid_hit(view).length == expected
    assert (
        per_group_drop_in_loop(
            view_after(
                Layout((FullAttention(16, draft=True), SlidingWindow(16, 128)), Speculative.DROP),
                [(PROMPT_A, [None, None])],
                PROMPT_A,
            )
        )
        == 0
    )


def test_exact_draft_keys_refuse_a_block_whose_next_token_differs():
    """HASH-DRAFT-1: A = P + x..., B = P + y...: the draft's last block of P was computed from
    x, so under `exact` B cannot reuse it, while the target groups can.

    P is 64 tokens (4 blocks of 16). The target group matches blocks 0-3; the draft group's
    block 3 key includes token 64 (x vs y), so it matches blocks 0-2 only: hit 48.
    """
    shared = tokens(2, 64)
    writer, reader = [*shared, 1, *tokens(3, 20)], [*shared, 2, *tokens(4, 20)]
    layout = Layout((FullAttention(16), FullAttention(16, draft=True)), Speculative.EXACT)
    view = view_after(layout, [(writer, [None, None])], reader)
    assert view.cached == (frozenset(range(4)), frozenset(range(3)))
    assert hybrid_hit(view).length == 48


def test_gemma4_with_dflash_draft():
    """Gemma4 full (B=16) + sliding (B=32, W=1024) + DFlash draft full (B=64): vLLM #40624.

    Three groups, the shape the two-group early exit missed: vLLM 0.16-0.19.1 spiralled to 0.
    The alignment is lcm(16, 32, 64) = 64; 1000 tokens give a plain hit of 15*64 = 960. The
    draft group's large block coarsens the alignment: without it the hit would be 992.
    `drop` steps down once to 896; `exact` keeps 960.
    """
    groups = (FullAttention(16), SlidingWindow(32, 1024), FullAttention(64, draft=True))
    for profile, expected in [(Speculative.DROP, 896), (Speculative.EXACT, 960)]:
        layout = Layout(groups, profile)
        view = view_after(layout, [(PROMPT_A, [None] * 3)], PROMPT_A)
        assert hybrid_hit(view).length == expected
    target_only = Layout(groups[:2])
    assert hybrid_hit(view_after(target_only, [(PROMPT_A, [None] * 2)], PROMPT_A)).length == 992


DSV4 = Layout(
    (
        FullAttention(256, name="mla_full"),
        SlidingWindow(64, 128, name="swa_mla_64"),
        SlidingWindow(4, 128, name="swa_mla_4"),
        SlidingWindow(8, 128, name="swa_mla_8"),
    )
)
DSV4_PROMPT = 373_943  # tokens of A in the report's reproduction


def test_deepseek_v4_flash_warm_resend_matches_the_report():
    """DeepSeek-V4-Flash A.2: everything cached. The report observed 373,760 hit tokens.

    The limit is 373,942; the alignment lcm(256, 64, 4, 8) = 256; floor(373942/256)*256 =
    373,760, the observed figure. The sliding groups need only their last 127 tokens.
    """
    count = [DSV4_PROMPT // g.block_size for g in DSV4.groups]
    view = CacheView(DSV4, DSV4_PROMPT, tuple(frozenset(range(c)) for c in count))
    hit = hybrid_hit(view)
    assert hit.length == 373_760
    assert [sum(b is not None for b in blocks) for blocks in hit.blocks] == [1460, 2, 32, 16]


def test_deepseek_v4_flash_resend_after_b_is_zero_because_block_zero_is_gone():
    """DeepSeek-V4-Flash A.3: after B, group 0 lost A's blocks, the sliding tails survived.

    Full attention needs block 0 for any positive hit (HIT-FULL-1), so the hybrid hit is 0
    whatever the sliding groups hold: the report's 0% with a mostly free pool. The sliding
    groups alone could serve nearly the whole prompt, which is what makes the loss avoidable.
    """
    tails = [
        frozenset(),
        frozenset({5840, 5841}),
        frozenset(range(93453, 93485)),
        frozenset(range(46726, 46742)),
    ]
    view = CacheView(DSV4, DSV4_PROMPT, tuple(tails))
    assert hybrid_hit(view).length == 0


def test_qwen35_gdn_align_vs_all():
    """Qwen3.5 (GDN + full attention), vLLM #36493: B shares its first 800 tokens with A.

    align (block 544): A was prefilled in one step of 4000 tokens, ending on no block
    boundary, and the aligned split put its one checkpoint at floor(4000/544)*544 = 3808, in
    A's unique tokens. B matches full block 0 (tokens 0-543) but no checkpoint: hit 0.
    all (block 64): A checkpointed every boundary; B matches blocks 0-11 (768 tokens) in both
    groups, and the checkpoint at 768 lets it resume there: hit 768.
    """
    prefix = tokens(5, 800)
    a, b = [*prefix, *tokens(6, 3200)], [*prefix, *tokens(7, 3200)]
    align = Layout((FullAttention(544), MambaState(544, MambaMode.ALIGN)))
    checkpoint_block = 3808 // 544 - 1
    view = view_after(align, [(a, [None, lambda j: j == checkpoint_block])], b)
    assert view.cached == (frozenset({0}), frozenset())
    assert hybrid_hit(view).length == 0

    every = Layout((FullAttention(64), MambaState(64, MambaMode.ALL)))
    view = view_after(every, [(a, [None, None])], b)
    assert hybrid_hit(view).length == 768


def test_block_aligned_prompt_with_eagle():
    """One full group with EAGLE, a 48-token prompt (3 blocks of 16) re-sent: hit 16.

    HIT-LEN-1 removes block 2 (the last token is computed), HIT-SPEC-2 steps down once more:
    what vLLM's test_eagle_enabled_removes_last_block asserts. Under `exact`, 32.
    """
    prompt = tokens(8, 48)
    for profile, expected in [(Speculative.DROP, 16), (Speculative.EXACT, 32)]:
        layout = Layout((FullAttention(16, draft=True),), profile)
        assert hybrid_hit(view_after(layout, [(prompt, [None])], prompt)).length == expected
