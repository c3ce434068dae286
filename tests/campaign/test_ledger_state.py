"""The ledger's Mamba/GDN state groups without vLLM: a scripted scheduler serves state blocks
the ledger must accept (a checkpoint written at a block boundary) or flag (a block whose
state is a position inside it, or another prefix's), with vLLM's runner moving each request's
running state between blocks as `preprocess_mamba` does."""

from __future__ import annotations

from types import SimpleNamespace

from kvcert.conformance.vllm.campaign.ledger import Group, Ledger
from tests.campaign.fakes import FakeScheduler

BLOCK = 4


def _ledger() -> Ledger:
    """A hybrid of a state group (tables' first) and a full-attention group (second)."""
    return Ledger([Group(BLOCK, "mamba"), Group(BLOCK, "full")])


def test_a_checkpoint_at_a_block_boundary_is_a_sound_hit():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5, 6, 7, 8], [10, 11], [20, 21])
    # aligned split: the first pass ends at the block boundary, so block 10 keeps state@3
    assert ledger.forward(s, s.step({"a": 4}, new=("a",)), 0)[1] is None
    assert ledger.forward(s, s.step({"a": 4}), 1)[1] is None
    # b hits a's first block in both groups and starts from its checkpoint
    s.add("b", [1, 2, 3, 4, 9, 9], [10, 12], [20, 22], hit=4)
    assert ledger.forward(s, s.step({"b": 2}, new=("b",)), 2)[1] is None


def test_a_block_holding_a_state_from_inside_it_is_an_unsound_hit():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5, 6, 7, 8], [10, 11], [20, 21])
    # unaligned split: the first pass ends at position 1, so block 10 holds state@1, and the
    # second pass carries it to block 11 and writes state@7 there
    ledger.forward(s, s.step({"a": 2}, new=("a",)), 0)
    assert ledger.forward(s, s.step({"a": 6}), 1)[1] is None
    s.add("b", [1, 2, 3, 4, 9, 9], [10, 12], [20, 22], hit=4)
    _, violation = ledger.forward(s, s.step({"b": 2}, new=("b",)), 2)
    assert violation is not None
    assert violation.role == "state"
    assert "group 0 (mamba, block 12)" in violation.text
    assert "state after position 3 of this prefix but holds the state after position 1" in (
        violation.text
    )


def test_a_checkpoint_of_another_prefix_is_an_unsound_hit():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5], [10, 11], [20, 21])
    ledger.forward(s, s.step({"a": 4}, new=("a",)), 0)
    # b's first block differs in token 3 but is served a's blocks (state groups are checked
    # first, so the state read is the one reported)
    s.add("b", [1, 2, 3, 7, 5], [10, 12], [20, 22], hit=4)
    _, violation = ledger.forward(s, s.step({"b": 1}, new=("b",)), 1)
    assert violation is not None
    assert "group 0 (mamba, block 12)" in violation.text
    assert "holds the state of another token prefix" in violation.text


def test_the_running_state_follows_the_request_across_blocks():
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", list(range(1, 12)), [10, 11, 12], [20, 21, 22])
    for step, count in enumerate((3, 3, 3, 2)):  # passes ending inside blocks 0, 1, 2, 2
        new = ("a",) if step == 0 else ()
        assert ledger.forward(s, s.step({"a": count}, new=new), step)[1] is None
    assert ledger.state_index["a"] == 2


def test_state_copies_read_before_any_write():
    """In one step, a's copy reads block 11 and b's copy writes block 11 (freed by a's manager
    and handed to b): on the device all copies read first, so a still gets its state."""
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", list(range(1, 10)), [10, 11], [20, 21, 22])
    ledger.forward(s, s.step({"a": 4}, new=("a",)), 0)
    ledger.forward(s, s.step({"a": 2}), 1)  # state@5 in block 11
    s.add("b", [1, 2, 3, 4, 8, 8], [10, 11], [20, 23], hit=4)
    s.tables["a"] = ([0, 11, 13], [20, 21, 22])
    assert ledger.forward(s, s.step({"b": 2, "a": 3}, new=("b",)), 2)[1] is None


def test_a_request_sent_whole_again_starts_from_its_hit_not_its_old_state_block():
    """Resumed after a preemption, the runner's tables are replaced by the ones sent."""
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", [1, 2, 3, 4, 5, 6, 7, 8], [10, 11], [20, 21])
    ledger.forward(s, s.step({"a": 4}, new=("a",)), 0)
    ledger.forward(s, s.step({"a": 2}), 1)
    # preempted and resumed with a 4-token hit: the runner starts over from block 0's state
    s.requests["a"].num_computed_tokens = 4
    s.tables["a"] = ([10, 14], [20, 24])
    output = s.step({"a": 4})
    output.scheduled_cached_reqs = SimpleNamespace(
        req_ids=["a"], resumed_req_ids={"a"}, new_block_ids=[([10, 14], [20, 24])]
    )
    assert ledger.forward(s, output, 2)[1] is None


def test_a_block_the_runners_table_does_not_name_there_is_a_violation():
    """The runner appends the blocks each output hands a running request: a manager that
    leaves out a skipped position's null block shifts the running state's block into the
    wrong column of the runner's table."""
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", list(range(1, 14)), [0, 11], [20, 21])
    assert ledger.forward(s, s.step({"a": 8}, new=("a",)), 0)[1] is None
    s.tables["a"] = ([0, 0, 0, 13], [20, 21, 22, 23])
    output = s.step({"a": 5})
    output.scheduled_cached_reqs.new_block_ids = [([13], [22, 23])]  # no null for column 2
    _, violation = ledger.forward(s, output, 1)
    assert violation is not None
    assert violation.role == "target"
    assert "group 0 (mamba) names block 13 at position 3" in violation.text
    assert "holds nothing there" in violation.text


def test_a_stale_id_where_the_manager_released_a_position_is_no_violation():
    """Released positions hold the null block in the manager's table and whatever block the
    runner was given before in its own: the runner never reads them."""
    s, ledger = FakeScheduler(), _ledger()
    s.add("a", list(range(1, 14)), [0, 11], [20, 21])
    assert ledger.forward(s, s.step({"a": 8}, new=("a",)), 0)[1] is None
    s.tables["a"] = ([0, 11, 0, 13], [20, 21, 22, 23])
    assert ledger.forward(s, s.step({"a": 5}), 1)[1] is None
    s.tables["a"] = ([0, 0, 0, 13], [20, 21, 22, 23])  # 11 released; the runner still has it
    s.requests["a"].all_token_ids.append(9)
    assert ledger.forward(s, s.step({"a": 1}), 2)[1] is None


def _saving_ledger() -> Ledger:
    """The state group's kernel saves the state at the last block boundary inside a pass
    into column cdiv(end, 4) - 2 (vLLM's rule for blocks of 4, without EAGLE or lookahead)."""

    def saved(start: int, end: int) -> tuple[int, int]:
        position = (end - 1) // BLOCK * BLOCK
        column = -(-end // BLOCK) - 2
        return (
            (position, column)
            if column > (start - 1) // BLOCK and position > start
            else (
                0,
                -1,
            )
        )

    return Ledger([Group(BLOCK, "mamba", checkpoint_alignment=1), Group(BLOCK, "full")],
                  checkpoints=saved)  # fmt: skip


def test_a_checkpoint_saved_inside_a_pass_is_a_sound_hit():
    """One pass over 10 tokens saves state@7 in column 1 (block 11) in passing: a request
    sharing the first 8 tokens resumes from it."""
    s, ledger = FakeScheduler(), _saving_ledger()
    s.add("a", list(range(1, 11)), [0, 11, 12], [20, 21, 22])
    assert ledger.forward(s, s.step({"a": 10}, new=("a",)), 0)[1] is None
    s.add("b", [*range(1, 9), 5, 5], [0, 11, 13], [20, 21, 23], hit=8)
    assert ledger.forward(s, s.step({"b": 2}, new=("b",)), 1)[1] is None


def test_a_checkpoint_no_pass_saved_is_an_unsound_hit():
    """The same pass with column 1 null (the runner skips it), and the broken twin of the
    test above, a backend that saves no checkpoint: either way the block a manager serves
    for the first 8 tokens holds no state."""
    for ledger, table in ((_saving_ledger(), [0, 0, 12]), (_ledger(), [0, 11, 12])):
        s = FakeScheduler()
        s.add("a", list(range(1, 11)), table, [20, 21, 22])
        ledger.forward(s, s.step({"a": 10}, new=("a",)), 0)
        s.add("b", [*range(1, 9), 5, 5], [0, 11, 13], [20, 21, 23], hit=8)
        _, violation = ledger.forward(s, s.step({"b": 2}, new=("b",)), 1)
        assert violation is not None
        assert "holds no state any forward pass wrote" in violation.text


def _drafting_pass(rid: str, start: int, known: list[int], drafts: list[int], table: list[int]):
    from kvcert.conformance.vllm.campaign.ledger import _Pass

    return _Pass(rid, 0, start, 1 + len(drafts), known, drafts, (table,))


def test_drafts_states_follow_the_running_state_and_the_accepted_one_is_read():
    """vLLM's align-mode runner with drafts (S=2, B=4): a pass verifying drafts 6 and 7 after
    token 5 writes the states after positions 4, 5 and 6 into blocks 1, 2 and 3; one draft
    accepted, the next pass runs in block 2 and starts from the state after position 5 there
    (the accepted one), not from block 1's."""
    from kvcert.conformance.vllm.campaign.ledger import identities

    ledger = Ledger([Group(BLOCK, "mamba", speculative_blocks=2)])
    table = [10, 11, 12, 13, 14]
    first = _drafting_pass("a", 4, [1, 2, 3, 4, 5], [6, 7], table)
    ledger._carry_states([first])
    ledger._write(first, "t", identities([1, 2, 3, 4, 5, 6, 7], 7), 0)
    ran = identities([1, 2, 3, 4, 5, 6, 7], 7)
    assert [ledger.slots.get((0, "s", b, 0)) for b in (11, 12, 13)] == ran[4:7]
    ledger._settle_state(first, 2)  # draft 6 and the bonus token: reaches no boundary
    assert ledger.state_copies == 0
    second = _drafting_pass("a", 6, [1, 2, 3, 4, 5, 6, 9], [8, 8], table)
    ledger._carry_states([second])
    assert ledger.state_read["a"] == 2
    assert ledger._check_reads(second) is None


def test_the_state_at_a_boundary_accepted_drafts_cross_is_copied_to_its_block():
    """postprocess_mamba (S=2, B=4): a pass verifying drafts 8 and 9 after token 7 runs in
    block 2; with draft 8 accepted the tokens reach 8, so the state after position 7 (block
    3, the first draft's) is copied into block 1, the boundary's, where a hit of 8 reads it."""
    from kvcert.conformance.vllm.campaign.ledger import identities

    ledger = Ledger([Group(BLOCK, "mamba", speculative_blocks=2)])
    tokens = [1, 2, 3, 4, 5, 6, 7]
    one = _drafting_pass("a", 6, tokens, [8, 9], [10, 11, 12, 13, 14])
    ledger._carry_states([one])
    ledger._write(one, "t", identities([*tokens, 8, 9], 9), 0)
    ledger._settle_state(one, 2)
    assert ledger.state_copies == 1  # counted in the campaign's report
    assert ledger.slots[(0, "s", 11, 0)] == identities([*tokens, 8], 8)[7]
    assert ledger.state_accepted["a"] == 2  # the copy went to another block: read in place
    hit = _drafting_pass("b", 8, [*tokens, 8, 5], [], [0, 11, 20])
    ledger._carry_states([hit])
    assert ledger._check_reads(hit) is None
