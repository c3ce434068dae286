"""How alloc differences are read: whether any admission's hit differs."""

from __future__ import annotations

from kvcert.conformance.contract.compare import hits_match

REGISTERED = (
    "step 1: {'step_ended': {'registered': 4}} != expected {'step_ended': {'registered': 7}}"
)
HIT = (
    "step 3: {'admitted': {'hit': 8, 'scheduled': 4}} != "
    "expected {'admitted': {'hit': 4, 'scheduled': 8}}"
)


def test_hits_match_reads_whether_any_admission_hit_differs():
    assert hits_match(None)
    assert hits_match(REGISTERED)
    assert not hits_match(REGISTERED + "; hits differ later too: step 3 (0 != expected 8)")
    assert not hits_match(HIT)
    assert hits_match(HIT.replace("'hit': 8", "'hit': 4"))  # the same hit, another chunk
    assert not hits_match("step 3: {'waiting': {'needed': 4}} != expected {'admitted': {'hit': 4}}")
    assert hits_match("step 2: tables [[0, 3]] are not a consistent renaming of [[0, 6]]")


def admitted(*table: int) -> dict[str, object]:
    return {"admitted": {"hit": 0, "scheduled": 1, "tables": [list(table)]}}


def test_page_lifetimes_let_a_freed_page_come_back_under_a_new_id():
    """RADIX-ID-1: the vector names a page lifetime once; the engine may hand the page out
    again once the lifetime it held is over, never while it is still to be seen."""
    from kvcert.conformance.contract.compare import compare_alloc

    released = {"released": {"blocks": 1}}
    want = {"observations": [admitted(1), released, admitted(2)]}
    reused = {"observations": [admitted(7), released, admitted(7)]}
    assert compare_alloc(want, reused, lifetimes=True) is None
    assert compare_alloc(want, reused) is not None  # one renaming for the whole trace
    # page 1 is seen again after b's admission: the engine gave b a page still in use
    still = {"observations": [admitted(1), admitted(2), admitted(1, 3)]}
    shared = {"observations": [admitted(7), admitted(7), admitted(7, 8)]}
    assert "renaming" in str(compare_alloc(still, shared, lifetimes=True))
    # a lifetime keeps its page: vector id 1 is the engine's 7 whenever it is seen
    moved = {"observations": [admitted(7), admitted(8), admitted(9, 8)]}
    assert "renaming" in str(compare_alloc(still, moved, lifetimes=True))
    null = {"observations": [admitted(0), released, admitted(2)]}
    assert compare_alloc(want, null, lifetimes=True) is not None
