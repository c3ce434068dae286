"""kvcert-stdio/1: the schema both directions follow, `kvcert serve`'s answers to malformed
messages, and how the runner survives engines that die, hang or print garbage."""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from kvcert.conformance.certify.runner import run_vectors
from kvcert.conformance.certify.vector_files import iter_cases
from kvcert.conformance.cli import main
from kvcert.conformance.contract.protocol import EngineDead, EngineError
from kvcert.conformance.contract.stdio import PROTOCOL, StdioEngine, answer, schema_error, serve
from kvcert.conformance.engines.reference_engine import ReferenceEngine

PY = shlex.quote(sys.executable)


def hit_case_count() -> int:
    return sum(1 for _, c, _ in iter_cases() if c is not None and c["input"]["suite"] == "hit")


def total_cases() -> int:
    return sum(1 for _ in iter_cases())


@pytest.mark.slow
def test_both_directions_of_a_whole_certification_follow_the_schema(tmp_path, capsys):
    transcript = tmp_path / "transcript.txt"
    engine = f"{PY} -m tests.conformance.recording_stdio_engine {shlex.quote(str(transcript))}"
    assert main(["certify", "--quiet", "--cmd", engine]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary == f"{total_cases()} passed, 0 failed, 0 skipped"
    lines = transcript.read_text(encoding="utf-8").splitlines()
    messages = [json.loads(x[2:]) for x in lines if x.startswith("> ")]
    replies = [json.loads(x[2:]) for x in lines if x.startswith("< ")]
    assert [m["cmd"] for m in messages[:2]] == ["start", "run"]
    assert messages[-1] == {"cmd": "stop"}
    assert len(replies) == len(messages) - 1 == total_cases() + 1
    assert [schema_error(m, "message") for m in messages] == [None] * len(messages)
    assert [schema_error(r, "reply") for r in replies] == [None] * len(replies)


@pytest.mark.parametrize(
    ("line", "seq", "fragment"),
    [
        ('{"seq": 3}', 3, '"cmd" must be one of start, run, stop, got None'),
        ('{"cmd": "jump"}', None, "got 'jump'"),
        ("not json", None, "not JSON"),
        ("[1, 2]", None, "a message is a JSON object, got list"),
        ('{"cmd": "run", "seq": 4}', 4, "'case' is a required property"),
        ('{"cmd": "run", "seq": 0, "case": {"suite": "hit"}}', None, "['seq']"),
        ('{"cmd": "run", "seq": 5, "case": {"suite": "disk"}}', 5, "['case']['suite']"),
        ('{"cmd": "start", "protocol": "kvcert-stdio/0"}', None, "['protocol']"),
        ('{"cmd": "stop", "now": true}', None, "'now' was unexpected"),
    ],
)
def test_a_malformed_message_gets_a_protocol_error_naming_the_fault(line, seq, fragment):
    reply = answer(ReferenceEngine(), line)
    assert reply is not None
    assert schema_error(reply, "protocol_error") is None
    assert reply["seq"] == seq
    assert fragment in reply["protocol_error"]["message"]


def test_serve_never_resends_a_stale_reply():
    """The first message lacks "cmd" (once an UnboundLocalError); the third is malformed
    after a good one (once answered with the previous reply)."""
    case = next(c for _, c, _ in iter_cases() if c is not None and c["input"]["suite"] == "hit")
    lines = [
        '{"seq": 1}',
        json.dumps({"cmd": "start", "protocol": PROTOCOL}),
        '{"cmd": "run"}',
        json.dumps({"cmd": "run", "seq": 2, "case": case["input"]}),
        '{"no": "cmd"}',
        '{"cmd": "stop"}',
        json.dumps({"cmd": "start", "protocol": PROTOCOL}),  # after stop: never answered
    ]
    out = io.StringIO()
    assert serve(ReferenceEngine(), io.StringIO("\n".join(lines) + "\n"), out) == 0
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [sorted(r) for r in replies] == [
        ["protocol_error", "seq"],
        ["engine", "protocol"],
        ["protocol_error", "seq"],
        ["result", "seq"],
        ["protocol_error", "seq"],
    ]
    assert replies[3]["seq"] == 2
    assert replies[3]["result"]["hit"] == case["expect"]["hit"]


def counting(launches: Path, then: str) -> str:
    """An engine command that notes each launch in `launches`, then runs `then`."""
    code = f"open({str(launches)!r}, 'a').write('x'); {then}"
    return f"{PY} -c {shlex.quote(code)}"


def test_an_engine_that_exits_at_once_ends_with_the_summary_line(tmp_path, capsys):
    """Once ~330 recursive restarts and a RecursionError; now three tries, then every case
    is reported as an engine error."""
    launches = tmp_path / "launches"
    code = main(["certify", "--quiet", "--cmd", counting(launches, "import sys; sys.exit(3)")])
    assert code == 1
    assert launches.read_text() == "xxx"
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"0 passed, {total_cases()} failed, 0 skipped"
    assert "failed to start 3 times in a row" in out
    assert "exit status 3" in out


def test_the_timeout_holds_from_the_first_message_on(tmp_path, capsys):
    """Three start-ups that never answer, 1 s each, then nothing waits on the engine: a
    timeout that did not hold would leave the test on the engine's 600 s sleep, past pytest's
    own limit."""
    launches = tmp_path / "launches"
    sleeper = counting(launches, "import time; time.sleep(600)")
    code = main(["certify", "--quiet", "--timeout", "1", "--cmd", sleeper])
    assert code == 1
    # at most three: a launch the timeout ends before Python starts writes nothing
    assert len(launches.read_text() if launches.exists() else "") <= 3
    out = capsys.readouterr().out
    assert "no answer to the start message within 1 s" in out
    assert "failed to start 3 times in a row" in out
    assert out.splitlines()[-1] == f"0 passed, {total_cases()} failed, 0 skipped"


def test_an_engine_that_dies_on_every_case_is_given_up_after_five(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import json, sys\n"
        "line = sys.stdin.readline()\n"
        "print(json.dumps({'protocol': 'kvcert-stdio/1', 'engine': "
        "{'name': 'dies', 'features': ['kind.full'], 'profiles': []}}), flush=True)\n"
        "sys.stdin.readline()\n"
        "sys.exit(7)\n",
        encoding="utf-8",
    )
    engine = StdioEngine(f"{PY} {shlex.quote(str(script))}", timeout=5)
    try:
        report = run_vectors(engine, suites=("hit",))
    finally:
        engine.close()
    errored = [r for r in report.results if r.status == "errored"]
    assert len(errored) == sum(1 for r in report.results if r.status != "skipped") > 3
    assert "exit status 7" in errored[0].detail
    assert not any(r.detail.startswith("engine unavailable:") for r in errored[:5])
    assert all(r.detail.startswith("engine unavailable:") for r in errored[5:])
    assert engine.dead is not None
    with pytest.raises(EngineDead):
        engine.run({"suite": "hit"})


def test_garbage_names_the_engine_and_the_line_and_the_report_names_the_case(tmp_path, capsys):
    script = tmp_path / "garbage.py"
    script.write_text(
        "import json, sys\n"
        "sys.stdin.readline()\n"
        "print(json.dumps({'protocol': 'kvcert-stdio/1', 'engine': "
        "{'name': 'noisy', 'features': ['kind.full'], 'profiles': []}}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    print('Loading weights... 42%', flush=True)\n",
        encoding="utf-8",
    )
    assert main(["certify", "--cmd", f"{PY} {shlex.quote(str(script))}", "--timeout", "5"]) == 1
    out = capsys.readouterr().out
    first = next(x for x in out.splitlines() if x.startswith("ERRORED "))
    assert re.match(r"ERRORED (hit|alloc|page)\.[a-z0-9.-]+: ", first)  # the case
    assert "engine 'noisy'" in first  # the engine
    assert "'Loading weights... 42%'" in first  # the line it sent


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--cmd", ""], "--cmd is empty"),
        (["--cmd", "   "], "--cmd is empty"),
        (["--cmd", "'unbalanced"], "cannot split --cmd"),
        (["--cmd", "/no/such/engine --kvcert"], "cannot start engine"),
        (["--engine", "tests.conformance.test_stdio:raising_factory"], "raised RuntimeError"),
        (["--engine", "tests.conformance.test_stdio:NOT_CALLABLE"], "not a factory"),
    ],
)
def test_bad_engine_arguments_are_typed_errors(argv, fragment, capsys):
    assert main(["certify", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcert: error:")
    assert fragment in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--engine", "reference", "--cmd", "x"], "not allowed with argument"),
        (["--timeout", "0"], "must be a positive number of seconds"),
        (["--timeout", "-1"], "must be a positive number of seconds"),
        (["--timeout", "nan"], "must be a positive number of seconds"),
        (["--timeout", "soon"], "expected a number of seconds"),
    ],
)
def test_contradictory_or_impossible_options_exit_2(argv, fragment, capsys):
    assert main(["certify", *argv]) == 2
    assert fragment in capsys.readouterr().err


def raising_factory():
    raise RuntimeError("no GPU here")


NOT_CALLABLE = 42


def test_the_engine_constructor_refuses_a_zero_timeout():
    with pytest.raises(EngineError, match="positive number of seconds"):
        StdioEngine(f"{PY} -c pass", timeout=0)
