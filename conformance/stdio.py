"""`kvcert-stdio/1`: the same engine messages as newline-delimited JSON over stdin/stdout.

Runner to engine, one JSON object per line (logs go to stderr, never stdout):

    {"cmd": "start", "protocol": "kvcert-stdio/1"}
        <- {"protocol": "kvcert-stdio/1", "engine": {describe() object}}
    {"cmd": "run", "seq": 7, "case": {case input}}
        <- {"seq": 7, "result": {...}}  |  {"seq": 7, "errored": {"message": "..."}}
    {"cmd": "stop"}

A C++ or Rust engine implements these three messages; `serve` turns any in-process engine
into such a process (`kvcert serve --engine NAME`), and `StdioEngine` is the runner's side.
"""

from __future__ import annotations

import json
import selectors
import shlex
import subprocess
import sys
from typing import IO, Any

from kvcert.conformance.codec import JSON
from kvcert.conformance.engines import Engine, EngineError

PROTOCOL = "kvcert-stdio/1"


def serve(engine: Engine, stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> int:
    """Answer runner messages until `stop` or end of input."""
    for line in stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
            command = message.get("cmd")
        except (json.JSONDecodeError, AttributeError) as error:
            reply: JSON = {"errored": {"message": f"unreadable message: {error}"}}
            command = None
        if command == "stop":
            return 0
        if command == "start":
            reply = {"protocol": PROTOCOL, "engine": engine.describe()}
        elif command == "run":
            try:
                reply = {"seq": message.get("seq"), "result": engine.run(message["case"])}
            except Exception as error:
                reply = {
                    "seq": message.get("seq"),
                    "errored": {"message": f"{type(error).__name__}: {error}"},
                }
        elif command is not None:
            reply = {"errored": {"message": f"unknown command {command!r}"}}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()
    return 0


class StdioEngine:
    """An engine in another process, spoken to over kvcert-stdio/1."""

    def __init__(self, command: str, timeout: float = 30.0) -> None:
        self.command = shlex.split(command)
        self.timeout = timeout
        self._seq = 0
        self._process: subprocess.Popen[str] | None = None
        self._info: JSON = {}
        self._start()

    def _start(self) -> None:
        try:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
            )
        except OSError as error:
            raise EngineError(f"cannot start {self.command}: {error}") from error
        reply = self._exchange({"cmd": "start", "protocol": PROTOCOL})
        if reply.get("protocol") != PROTOCOL or not isinstance(reply.get("engine"), dict):
            raise EngineError(f"engine did not start with {PROTOCOL}: {reply!r}")
        self._info = reply["engine"]

    def _exchange(self, message: JSON) -> Any:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise EngineError("engine process is not running")
        try:
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()
        except BrokenPipeError as error:
            self._restart()
            raise EngineError("engine process exited") from error
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(self.timeout)
        selector.close()
        if not ready:
            self._restart()
            raise TimeoutError(f"no answer within {self.timeout:g} s")
        line = process.stdout.readline()
        if not line:
            self._restart()
            raise EngineError("engine process exited")
        return json.loads(line)

    def _restart(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        self._process = None
        self._start()

    def describe(self) -> JSON:
        return self._info

    def run(self, case: JSON) -> JSON:
        self._seq += 1
        reply = self._exchange({"cmd": "run", "seq": self._seq, "case": case})
        if reply.get("seq") != self._seq:
            raise EngineError(f"reply {reply!r} does not answer request {self._seq}")
        if "errored" in reply:
            raise EngineError(reply["errored"].get("message", "engine error"))
        result: JSON = reply["result"]
        return result

    def close(self) -> None:
        if self._process is not None and self._process.stdin is not None:
            try:
                self._process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                self._process.stdin.flush()
                self._process.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._process.kill()
            self._process = None
