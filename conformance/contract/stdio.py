"""`kvcert-stdio/1`: the engine messages as newline-delimited JSON over stdin/stdout.

Runner to engine, one JSON object per line (logs go to stderr, never stdout):

    {"cmd": "start", "protocol": "kvcert-stdio/1"}
        <- {"protocol": "kvcert-stdio/1", "engine": {describe() object}}
    {"cmd": "run", "seq": 7, "case": {case input}}
        <- {"seq": 7, "result": {...}}  |  {"seq": 7, "errored": {"message": "..."}}
    {"cmd": "stop"}                                                     (no reply)

A message that breaks the protocol is answered {"seq": n or null, "protocol_error": {"message":
"..."}}. schema/stdio.schema.json states all of it as a JSON Schema (one `oneOf` branch per
message kind). A C++ or Rust engine implements these messages; `serve` turns any in-process
engine into such a process (`kvcert serve --engine NAME`), and `StdioEngine` is the runner's
side: it holds every exchange to its time limit (start-up included), restarts an engine that
died or hung, and gives up after a few consecutive failures instead of looping.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import IO, Any

import jsonschema

from kvcert.conformance.contract.codec import JSON
from kvcert.conformance.contract.protocol import Engine, EngineDead, EngineError

PROTOCOL = "kvcert-stdio/1"
SCHEMA = resources.files("kvcert.conformance.contract") / "schema" / "stdio.schema.json"
COMMANDS = ("start", "run", "stop")


@cache
def _schema() -> JSON:
    schema: JSON = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return schema


def schema_error(obj: object, definition: str) -> str | None:
    """Why `obj` is not a valid `definition` of the stdio schema (message, reply, run, ...),
    or None when it is."""
    schema = {"$ref": f"#/$defs/{definition}", "$defs": _schema()["$defs"]}
    errors = jsonschema.Draft202012Validator(schema).iter_errors(obj)
    error = jsonschema.exceptions.best_match(errors)
    if error is None:
        return None
    where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the message"
    return f"{where}: {error.message}"


def _seq_of(message: object) -> int | None:
    seq = message.get("seq") if isinstance(message, dict) else None
    valid = isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1
    return seq if valid else None


def protocol_error(seq: int | None, message: str) -> JSON:
    """The reply to a message that breaks kvcert-stdio/1."""
    return {"seq": seq, "protocol_error": {"message": message}}


def answer(engine: Engine, line: str) -> JSON | None:
    """The reply to one message line; None for `stop` (which has none)."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError as error:
        return protocol_error(None, f"not JSON ({error}); send one JSON object per line")
    if not isinstance(message, dict):
        return protocol_error(None, f"a message is a JSON object, got {type(message).__name__}")
    command = message.get("cmd")
    if command not in COMMANDS:
        return protocol_error(
            _seq_of(message),
            f'"cmd" must be one of {", ".join(COMMANDS)}, got {command!r}',
        )
    if (why := schema_error(message, command)) is not None:
        return protocol_error(_seq_of(message), f"bad {command} message: {why}")
    if command == "stop":
        return None
    if command == "start":
        return {"protocol": PROTOCOL, "engine": engine.describe()}
    seq = message["seq"]
    try:
        return {"seq": seq, "result": engine.run(message["case"])}
    except Exception as error:
        return {"seq": seq, "errored": {"message": f"{type(error).__name__}: {error}"}}


def serve(engine: Engine, stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> int:
    """Answer runner messages until `stop` or end of input."""
    for line in stdin:
        if not line.strip():
            continue
        reply = answer(engine, line)
        if reply is None:
            return 0
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()
    return 0


class StdioEngine:
    """An engine in another process, spoken to over kvcert-stdio/1.

    Every exchange, the start-up handshake included, must complete within `timeout` seconds.
    A process that exits, hangs or answers outside the protocol is killed, the failure is
    reported against the case at hand, and the next case starts a fresh process. After
    `max_failed_starts` consecutive failed start-ups, or `max_failed_cases` consecutive cases
    that killed the process, the engine is declared dead (`EngineDead`): the runner reports
    every remaining case as an engine error and finishes.
    """

    enforces_timeout = True  # the runner need not wrap run() in its own timer

    def __init__(
        self,
        command: str,
        timeout: float = 30.0,
        max_failed_starts: int = 3,
        max_failed_cases: int = 5,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        """`on_retry(message)` is told each failed start-up that will be retried, so a person
        waiting through `max_failed_starts` time limits sees why."""
        if not command.strip():
            raise EngineError(
                "--cmd is empty: give the command that starts your engine, "
                "e.g. --cmd './my-engine --kvcert'"
            )
        try:
            self.command = shlex.split(command)
        except ValueError as error:
            raise EngineError(f"cannot split --cmd {command!r} into words: {error}") from error
        if not timeout > 0:
            raise EngineError(f"the timeout must be a positive number of seconds, got {timeout}")
        self.timeout = timeout
        self.max_failed_starts = max_failed_starts
        self.max_failed_cases = max_failed_cases
        self.on_retry = on_retry
        self.label = f"engine {command!r}"
        self.dead: str | None = None
        self._seq = 0
        self._info: JSON | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = bytearray()
        self._failed_starts = 0
        self._failed_cases = 0
        # The engine's log, for error messages; closed by close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._spawn()  # a command that cannot run at all is bad input, refused at once

    # -- process ------------------------------------------------------------------------------

    def _spawn(self) -> None:
        try:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
            )
        except OSError as error:
            raise EngineError(f"cannot start {self.label}: {error}") from error
        if self._process.stdin is not None:
            os.set_blocking(self._process.stdin.fileno(), False)
        self._buffer.clear()

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()

    def _exit_status(self) -> str:
        process = self._process
        if process is None:
            return ""
        try:
            code = process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ""
        return f" (exit status {code})"

    def _log_tail(self) -> str:
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 600))
        tail = self._stderr.read().decode("utf-8", errors="replace").strip()
        return f"; its stderr ends: {tail[-500:]!r}" if tail else ""

    # -- one exchange ---------------------------------------------------------------------------

    def _write(self, data: bytes, deadline: float, what: str) -> None:
        process = self._process
        if process is None or process.stdin is None:
            raise EngineError(f"{self.label} is not running")
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{self.label} did not read the {what} message within {self.timeout:g} s"
                )
            _, writable, _ = select.select([], [process.stdin], [], remaining)
            if not writable:
                continue
            try:
                view = view[os.write(process.stdin.fileno(), view) :]
            except (BrokenPipeError, ConnectionResetError) as error:
                raise EngineError(
                    f"{self.label} exited{self._exit_status()} before reading the {what} "
                    f"message{self._log_tail()}"
                ) from error

    def _read_line(self, deadline: float, what: str) -> str:
        process = self._process
        if process is None or process.stdout is None:
            raise EngineError(f"{self.label} is not running")
        fd = process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{self.label}: no answer to the {what} message within {self.timeout:g} s"
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EngineError(
                    f"{self.label} exited{self._exit_status()} before answering the {what} "
                    f"message{self._log_tail()}"
                )
            self._buffer += chunk
        end = self._buffer.index(b"\n")
        line = bytes(self._buffer[:end]).decode("utf-8", errors="replace")
        del self._buffer[: end + 1]
        return line

    def _exchange(self, message: JSON, what: str, expected: str) -> Any:
        """Send one message and read its reply, both within the time limit; the reply must be
        a valid `expected` of the stdio schema."""
        deadline = time.monotonic() + self.timeout
        self._write((json.dumps(message) + "\n").encode(), deadline, what)
        line = self._read_line(deadline, what)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = None
        if reply is None or schema_error(reply, expected) is not None:
            why = "not JSON" if reply is None else schema_error(reply, expected)
            raise EngineError(
                f"{self.label} answered the {what} message with a line outside {PROTOCOL} "
                f"({why}): {line[:300]!r}"
            )
        return reply

    # -- life cycle ---------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Run the start-up handshake, spawning the process if needed; EngineDead after
        `max_failed_starts` consecutive failed start-ups."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        while self._info is None or self._process is None:
            try:
                if self._process is None:
                    self._spawn()
                started = self._exchange({"cmd": "start", "protocol": PROTOCOL}, "start", "started")
            except (EngineError, TimeoutError) as error:
                self._kill()
                self._failed_starts += 1
                if self._failed_starts >= self.max_failed_starts:
                    self.dead = (
                        f"{self.label} failed to start {self._failed_starts} times in a row; "
                        f"the last time: {error}"
                    )
                    raise EngineDead(self.dead) from error
                if self.on_retry is not None:
                    self.on_retry(
                        f"{self.label} failed to start (attempt {self._failed_starts} of "
                        f"{self.max_failed_starts}): {error}; starting it again"
                    )
                continue
            self._failed_starts = 0
            if self._info is None:
                self._info = started["engine"]
                self.label = f"engine {self._info['name']!r} ({' '.join(self.command)})"

    def describe(self) -> JSON:
        self._ensure_started()
        if self._info is None:  # pragma: no cover - _ensure_started sets it or raises
            raise EngineDead(f"{self.label} never described itself")
        return self._info

    def run(self, case: JSON) -> JSON:
        self._ensure_started()
        self._seq += 1
        seq = self._seq
        what = f"run (seq {seq})"
        try:
            reply = self._exchange({"cmd": "run", "seq": seq, "case": case}, what, "reply")
            if reply.get("seq") != seq or "engine" in reply:
                raise EngineError(f"{self.label} answered the {what} message with {reply!r}")
        except (EngineError, TimeoutError) as error:
            self._kill()  # the stream may be out of step: the next case starts afresh
            self._failed_cases += 1
            if self._failed_cases >= self.max_failed_cases:
                self.dead = (
                    f"{self.label} failed {self._failed_cases} cases in a row (exited, hung "
                    f"or answered outside the protocol); the last time: {error}"
                )
            raise
        self._failed_cases = 0
        if "errored" in reply:
            raise EngineError(f"{self.label} failed: {reply['errored']['message']}")
        if "protocol_error" in reply:
            raise EngineError(
                f"{self.label} says the run message broke {PROTOCOL}: "
                f"{reply['protocol_error']['message']}"
            )
        result: JSON = reply["result"]
        return result

    def close(self) -> None:
        """Ask the engine to stop; kill it if it does not within 5 s."""
        process = self._process
        if process is not None and self._info is not None:
            try:
                self._write(b'{"cmd": "stop"}\n', time.monotonic() + 5, "stop")
                process.wait(timeout=5)
            except (EngineError, TimeoutError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._stderr.close()
