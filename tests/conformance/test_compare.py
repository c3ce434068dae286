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


def test_online_lifetimes_free_an_id_once_the_spec_no_longer_holds_its_page():
    """The machine's form of RADIX-ID-1 (LiveRenaming): an engine id may name a new page
    once the page it named is not live in the spec's state after the step compared."""
    from kvcert.conformance.contract.compare import LiveRenaming

    renaming = LiveRenaming()
    renaming.live = {1}
    assert renaming.match([[0, 1]], [[0, 7]])
    renaming.live = {1, 2}
    assert not renaming.match([[2]], [[7]])  # page 1 still live: 7 cannot be page 2 too
    renaming.live = {2}
    assert renaming.match([[2]], [[7]])  # page 1 gone: 7 is page 2 now
    assert not renaming.match([[1]], [[7]])  # and page 1 can never come back as 7
    assert not renaming.match([[3]], [[0]])  # the null page stays the null page


def test_a_radix_claim_leaves_block_pool_traces_compared_by_one_renaming(tmp_path):
    """Only the radix profile's traces are compared as lifetimes: kvcert.reference claims
    eviction.radix beside lru, and is still held to one renaming on an lru trace."""
    import json
    from importlib import resources

    from kvcert.conformance.certify.runner import run_vectors
    from kvcert.conformance.certify.vector_files import user_manifest
    from kvcert.conformance.engines.reference_engine import ReferenceEngine

    shipped = resources.files("kvcert.conformance.vectors") / "alloc" / "radix.json"
    header = {k: v for k, v in json.loads(shipped.read_text(encoding="utf-8")).items()
              if k != "cases"}  # fmt: skip
    admit = {"op": "admit", "rid": "a", "tokens": [1, 2], "budget": 2}
    ops = [admit, {"op": "finish", "rid": "a"}, {**admit, "rid": "b"}]
    layout = {"groups": [{"kind": "full", "block_size": 1}]}
    case = {
        "id": "alloc.test.lifetimes",
        "rules": ["RADIX-ID-1"],
        "requires": ["kind.full"],
        "input": {"suite": "alloc", "layout": layout, "num_blocks": 8, "ops": ops},
        "expect": {"observations": [admitted(1), {"released": {"blocks": 1}}, admitted(2)]},
    }

    class Reusing(ReferenceEngine):  # the lifetime-renamed answer to that expectation
        def run(self, case):
            return {"observations": [admitted(7), {"released": {"blocks": 1}}, admitted(7)]}

    def status(eviction: str | None) -> list[str]:
        if eviction is not None:
            case["input"]["eviction"] = eviction
        (tmp_path / "alloc.json").write_text(json.dumps({**header, "cases": [case]}))
        (tmp_path / "manifest.json").write_text(json.dumps(user_manifest(tmp_path)))
        return [r.status for r in run_vectors(Reusing(), root=tmp_path).results]

    assert "eviction.radix" in Reusing().describe()["profiles"]
    assert status(None) == ["failed"]  # lru: one renaming for the whole trace
    assert status("radix") == ["passed"]  # radix: page 1's lifetime ended at the release
