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
