"""§5 block keys: injectivity, isolation by extra keys, draft look-ahead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcert.spec import (
    Extra,
    ExtraKind,
    FullAttention,
    InvalidRequest,
    Layout,
    Speculative,
    block_keys,
    matched_blocks,
)
from kvcert.spec.hashing import ROOT, block_extras, draft_lookahead, key_lookahead

TOKENS = st.lists(st.integers(0, 3), max_size=40)  # a tiny vocabulary: prefixes really repeat


@given(TOKENS, TOKENS, st.sampled_from([1, 2, 3, 4, 8]))
def test_a_key_match_certifies_the_whole_prefix(writer, reader, block_size):
    """HASH-CHAIN-1/HASH-MATCH-1: a matched block j means identical tokens [0, (j+1)B)."""
    matched = matched_blocks(
        block_keys(reader, block_size), frozenset(block_keys(writer, block_size))
    )
    for j in matched:
        end = (j + 1) * block_size
        assert reader[:end] == writer[:end]
    # and conversely every block of the common prefix matches
    common = 0
    while common < min(len(reader), len(writer)) and reader[common] == writer[common]:
        common += 1
    assert matched == frozenset(range(common // block_size))


def test_only_full_blocks_get_keys():
    """HASH-CHAIN-1's diagram: 9 tokens, B=4 -> 2 keys, the second extending the first."""
    keys = block_keys([7, 8, 9, 1, 2, 3, 4, 5, 6], 4)
    assert keys == (
        (ROOT, ((7, 8, 9, 1), ())),
        (ROOT, ((7, 8, 9, 1), ()), ((2, 3, 4, 5), ())),
    )


def test_different_cache_salts_never_share_a_block():
    """HASH-EXTRA-1: the salt sits in block 0, so it changes every key of the request."""
    prompt = list(range(32))
    a = block_keys(prompt, 8, [Extra(ExtraKind.CACHE_SALT, "tenant-a")])
    b = block_keys(prompt, 8, [Extra(ExtraKind.CACHE_SALT, "tenant-b")])
    assert matched_blocks(b, frozenset(a)) == frozenset()
    assert matched_blocks(a, frozenset(a)) == frozenset(range(4))


def test_lora_name_and_cache_salt_with_equal_text_do_not_collide():
    """HASH-EXTRA-1 (vLLM #44701): a LoRA named "x" and a salt "x" give different keys."""
    prompt = list(range(16))
    lora = block_keys(prompt, 8, [Extra(ExtraKind.LORA, "x")])
    salt = block_keys(prompt, 8, [Extra(ExtraKind.CACHE_SALT, "x")])
    assert set(lora).isdisjoint(salt)


@given(
    st.lists(
        st.tuples(st.sampled_from(list(ExtraKind)), st.sampled_from(["x", "y"])),
        min_size=1,
        max_size=3,
    ),
    st.lists(
        st.tuples(st.sampled_from(list(ExtraKind)), st.sampled_from(["x", "y"])),
        min_size=1,
        max_size=3,
    ),
)
def test_extra_keys_are_equal_only_for_equal_tagged_sources(left, right):
    """HASH-EXTRA-1: block 0's extras are equal iff the (kind, value, span) multisets are."""

    def extras(pairs):
        return [
            Extra(kind, value)
            if kind in {ExtraKind.CACHE_SALT, ExtraKind.LORA, ExtraKind.ENCODER_INPUT}
            else Extra(kind, value, 0, 4)
            for kind, value in pairs
        ]

    same = sorted(left) == sorted(right)
    assert (block_extras(extras(left), 0, 8) == block_extras(extras(right), 0, 8)) == same


def test_positioned_extras_carry_their_offset_into_every_block_they_overlap():
    """HASH-EXTRA-1's diagram: an image at [10, 30) enters blocks 0 and 1 with its offsets."""
    extras = [Extra(ExtraKind.CACHE_SALT, "t1"), Extra(ExtraKind.MULTIMODAL, "img", 10, 30)]
    assert block_extras(extras, 0, 16) == (("cache_salt", "t1"), ("multimodal", "img", 10, 30))
    assert block_extras(extras, 16, 32) == (("multimodal", "img", -6, 14),)
    assert block_extras(extras, 32, 48) == ()


def test_same_image_at_another_position_gives_another_key():
    """A multimodal item moved by one token changes the key (vLLM 0.19 added the offset)."""
    prompt = list(range(16))
    at_2 = block_keys(prompt, 16, [Extra(ExtraKind.MULTIMODAL, "img", 2, 6)])
    at_3 = block_keys(prompt, 16, [Extra(ExtraKind.MULTIMODAL, "img", 3, 7)])
    assert at_2 != at_3


def test_draft_keys_cover_the_next_token_under_exact_only():
    """HASH-DRAFT-1: look-ahead 1 for draft groups under exact, 0 otherwise."""
    assert draft_lookahead(True, True) == 1
    assert draft_lookahead(True, False) == draft_lookahead(False, True) == 0
    keys = block_keys([7, 8, 9, 1, 2, 3, 4, 5, 6], 4, (), lookahead=1)
    assert keys[0] == (ROOT, ((7, 8, 9, 1, 2), ()))
    assert len(keys) == 2  # block 1's next token (6) exists; a block 2 would need token 12
    assert len(block_keys([7, 8, 9, 1, 2, 3, 4, 5], 4, (), lookahead=1)) == 1


def test_draft_keys_cover_the_draft_reach():
    """HASH-DRAFT-1 for a drafter of k MTP modules: the key spans the k tokens after a block."""
    assert draft_lookahead(True, True, 3) == 3
    assert draft_lookahead(True, False, 3) == draft_lookahead(False, True, 3) == 0
    keys = block_keys([7, 8, 9, 1, 2, 3, 4, 5, 6], 4, (), lookahead=3)
    assert keys == ((ROOT, ((7, 8, 9, 1, 2, 3, 4), ())),)  # block 1 would need token 10
    layout = Layout((FullAttention(4), FullAttention(4, draft=True)), Speculative.EXACT, None, 3)
    assert [key_lookahead(layout, g) for g in layout.groups] == [0, 3]
    dropped = Layout((FullAttention(4), FullAttention(4, draft=True)), Speculative.DROP, None, 3)
    assert [key_lookahead(dropped, g) for g in dropped.groups] == [0, 0]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "Lora", "value": "x"}, "ExtraKind"),
        ({"kind": "salt", "value": "x"}, "extra kind must be one of cache_salt"),
        ({"kind": ExtraKind.LORA, "value": 3}, "must be a string"),
        ({"kind": ExtraKind.CACHE_SALT, "value": "x", "end": 4}, "whole request"),
        ({"kind": ExtraKind.MULTIMODAL, "value": "img"}, "token span"),
        ({"kind": ExtraKind.PROMPT_EMBEDS, "value": "e", "start": 5, "end": 5}, "token span"),
    ],
)
def test_malformed_extras_are_refused(kwargs, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        Extra(**kwargs)
