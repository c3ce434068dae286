"""Request traces for `kvcert simulate`: generators for the workloads behind the seeds, and a
JSONL format for real logs.

One JSON object per line, requests in arrival order:

    {"id": "a", "prompt": [17, 4, ...], "output": [9, 12, ...], "cache_salt": "tenant-1"}

`prompt` is the token ids sent, `output` the tokens the model generated (decoded one per
step; may be empty), `cache_salt` optional. Token ids are integers >= 0.

Generators draw token ids from a seeded random.Random, so a trace is reproducible from its
arguments; distinct texts share no token sequence except where the workload says so.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvcert.conformance.contract.codec import MAX_TOKENS, InputError

VOCABULARY = 200_000  # token ids are drawn from [1, VOCABULARY)


class TraceError(InputError):
    """A trace file or generator argument is malformed."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    rid: str
    prompt: tuple[int, ...]
    output: tuple[int, ...] = ()
    cache_salt: str | None = None


def _text(rng: random.Random, length: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, VOCABULARY) for _ in range(length))


def _positive(value: int, what: str) -> None:
    if value < 1:
        raise TraceError(f"{what} must be >= 1, got {value}")


def resend(length: int = 8192, output: int = 0, seed: int = 1) -> list[TraceRequest]:
    """Seed 001: prompt A, A again, an unrelated B of the same length, then A a third time."""
    _positive(length, "prompt length")
    rng = random.Random(seed)
    a, b = _text(rng, length), _text(rng, length)
    out = [_text(rng, output) for _ in range(4)]
    return [
        TraceRequest("A", a, out[0]),
        TraceRequest("A-again", a, out[1]),
        TraceRequest("B", b, out[2]),
        TraceRequest("A-third", a, out[3]),
    ]


def shared_prefix(
    users: int = 16, system: int = 4096, question: int = 512, output: int = 64, seed: int = 2
) -> list[TraceRequest]:
    """One system prompt shared by many users, each with its own question."""
    _positive(users, "users")
    _positive(system, "system prompt length")
    rng = random.Random(seed)
    prefix = _text(rng, system)
    return [
        TraceRequest(f"user{u}", prefix + _text(rng, question), _text(rng, output))
        for u in range(users)
    ]


def agentic(
    sessions: int = 4,
    *,
    turns: int = 6,
    system: int = 2048,
    tool_output: int = 3000,
    output: int = 200,
    seed: int = 3,
) -> list[TraceRequest]:
    """Multi-turn agent sessions, interleaved round robin: every turn re-sends the session's
    whole context (previous prompt, the model's output, a long tool result)."""
    _positive(sessions, "sessions")
    _positive(turns, "turns")
    rng = random.Random(seed)
    prefix = _text(rng, system)
    contexts = [prefix + _text(rng, 256) for _ in range(sessions)]
    requests = []
    for turn in range(turns):
        for s in range(sessions):
            generated = _text(rng, output)
            requests.append(TraceRequest(f"s{s}-t{turn}", contexts[s], generated))
            contexts[s] = contexts[s] + generated + _text(rng, tool_output)
    return requests


GENERATORS = {"resend": resend, "shared-prefix": shared_prefix, "agentic": agentic}


def _tokens(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise TraceError(f"{where} must be a list of token ids (integers >= 0)")
    return tuple(value)


def parse_request(obj: object, where: str) -> TraceRequest:
    """One JSONL line as a request, with the field that is wrong named."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    unknown = set(obj) - {"id", "prompt", "output", "cache_salt"}
    if unknown:
        raise TraceError(f"{where}: unknown fields {sorted(unknown)}")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        raise TraceError(f"{where}: 'id' must be a non-empty string")
    prompt = _tokens(obj.get("prompt"), f"{where}: 'prompt'")
    if not prompt:
        raise TraceError(f"{where}: 'prompt' needs at least one token")
    salt = obj.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise TraceError(f"{where}: 'cache_salt' must be a string")
    output = _tokens(obj.get("output", []), f"{where}: 'output'")
    if len(prompt) + len(output) > MAX_TOKENS:
        raise TraceError(f"{where}: a request holds at most {MAX_TOKENS:,} tokens (2^20)")
    return TraceRequest(rid, prompt, output, salt)


def read_jsonl(path: Path) -> list[TraceRequest]:
    """A trace file; blank lines are skipped, anything else malformed is refused."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise TraceError(f"cannot read trace {path}: {error}") from error
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}:{number}: not JSON ({error.msg})") from error
        requests.append(parse_request(obj, f"{path}:{number}"))
    if not requests:
        raise TraceError(f"{path} holds no requests")
    return requests


def to_jsonl(requests: Iterable[TraceRequest]) -> str:
    """The JSONL text of a trace (what `kvcert simulate --save-trace` writes)."""
    lines = []
    for r in requests:
        obj: dict[str, object] = {"id": r.rid, "prompt": list(r.prompt), "output": list(r.output)}
        if r.cache_salt is not None:
            obj["cache_salt"] = r.cache_salt
        lines.append(json.dumps(obj, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def describe(requests: Sequence[TraceRequest]) -> str:
    """One line: how many requests and tokens."""
    prompt = sum(len(r.prompt) for r in requests)
    output = sum(len(r.output) for r in requests)
    return f"{len(requests)} requests, {prompt:,} prompt tokens, {output:,} output tokens"
