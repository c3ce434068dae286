"""eagle-bigram-cap, end to end: a prompt served, finished and sent again under EAGLE.

A request with a 5-token prompt and one output token finishes through SGLang's own
`release_kv_cache` (the tree keeps what it can key; `request_steps`), then the same prompt
arrives again and the scheduler's prefill step (`Req.init_next_round_input`) matches it;
page size 2. Without
EAGLE the re-send hits 4 tokens, all but the last (HIT-LEN-1). Under EAGLE the tree keys
each position by its token and the next; positions 0-3 are cached and keyed (the first
request's tokens 0-4 cover their bigrams), and the re-send holds token 4 too, so 4 is still
owed; SGLang caps the raw key at n - 1 = 4 tokens, 3 bigrams, and serves one page: 2.

    .engines/sglang-0.5.23/bin/python -m kvcert.conformance.sglang.checks.bigram_cap

Exit 1 when the loss reproduces (the finding stands), 0 when the re-send under EAGLE hits
what it hits without, 2 when the check cannot run.
"""

from __future__ import annotations

import sys
from array import array

from kvcert.conformance.sglang import unified
from kvcert.conformance.sglang.request_steps import request_steps

PAGE = 2
PROMPT = (11, 12, 13, 14, 15)
OUTPUT = (16,)


def resend_hit(eagle: bool) -> int:
    """The re-send's hit after one request with PROMPT and OUTPUT finished."""
    shape = unified.Shape(page=PAGE, exclusive_window=None, state_grid=None, eagle=eagle)
    tree, requests = unified.build(shape, 64, 0)
    first = unified.new_request("first", array("q", PROMPT), len(OUTPUT))
    requests.alloc([first])
    first.init_next_round_input(tree)
    first.output_ids = unified.as_request_holds(array("q", OUTPUT))
    total = len(PROMPT) + len(OUTPUT)
    slots = tree.token_to_kv_pool_allocator.alloc(total)
    kv = getattr(first, "kv", first)  # the request's KV record (on the request before 0.5.19)
    requests.write((kv.req_pool_idx, slice(0, total)), slots)
    kv.kv_committed_len = total
    kv.kv_allocated_len = total
    first.lock = None
    request_steps().release(first, tree, insert=True)  # finished: the tree keeps its KV
    again = unified.new_request("again", array("q", PROMPT), len(OUTPUT))
    requests.alloc([again])
    again.init_next_round_input(tree)
    return unified.matched_length(again)


def main() -> int:
    try:
        plain, eagle = resend_hit(eagle=False), resend_hit(eagle=True)
    except Exception as error:  # a crash is "cannot run", never a verdict
        print(f"CANNOT RUN: {type(error).__name__}: {error}")
        return 2
    owed = (len(PROMPT) - 1) // PAGE * PAGE
    print(f"re-send of a {len(PROMPT)}-token prompt, page {PAGE}: hit {plain} without EAGLE, "
          f"{eagle} under EAGLE; owed {owed} in both")  # fmt: skip
    if eagle < plain:
        print(f"REPRODUCED eagle-bigram-cap: {plain - eagle} cached tokens recomputed")
        return 1
    print("not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
