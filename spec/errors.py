"""The one error family of the specification.

Every input the spec refuses raises a subclass of `SpecError`. Messages say what is wrong and
how to fix it, so an engine developer can act on them without reading the spec's source.
`SpecError` subclasses `ValueError` because every refusal is about a bad value.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NoReturn, TypeVar

E = TypeVar("E", bound=StrEnum)


class SpecError(ValueError):
    """Base of every refusal raised by `kvcert.spec`."""


class InvalidLayout(SpecError):
    """A KV-cache layout (groups, block sizes, windows, speculative profile) is malformed."""


class AlignmentImpossible(InvalidLayout):
    """No positive hit can ever exist: the hit alignment exceeds what any request can reuse."""


class UncacheableLayout(InvalidLayout):
    """A prefix-cache lookup was asked of a layout in which no group can be cached."""


class InvalidPlan(SpecError):
    """A page-planning input (layers, dtype, kernel limits, memory) is malformed."""


class NoPageLayout(InvalidPlan):
    """No page layout satisfies the inputs: the message names the constraint that rules it out."""


class InvalidRequest(SpecError):
    """A request or cache view is malformed (negative or empty lengths, blocks out of range)."""


class InvalidOp(SpecError):
    """An allocator operation misuses the protocol (unknown request, work in flight, ...)."""


def refuse(error: type[SpecError], message: str) -> NoReturn:
    """INPUT-1: Invalid input is refused with a typed error that says what is wrong and how to
    fix it, and nothing is computed from it.

        FullAttention(block_size=0)     -> InvalidLayout("... block_size must be >= 1, got 0")
        Admit("a", tokens=(), ...)      -> InvalidOp("a request needs at least one token")

    pre: issubclass(error, SpecError) and bool(message)
    post: False
    raises: SpecError
    """
    raise error(message)


def as_choice(choices: type[E], value: object, what: str, error: type[SpecError]) -> E:
    """An enum-typed input is the member itself or its exact value string (JSON and command
    lines speak strings); anything else is refused by INPUT-1, naming the choices, because a
    value compared by identity and silently unequal would pick another rule."""
    if not isinstance(value, choices):  # type guard: Python callers only (JSON is parsed first)
        for member in choices:
            if isinstance(value, str) and member.value == value:
                return member
        names = ", ".join(m.value for m in choices)
        refuse(error, f"{what} must be one of {names} (a {choices.__name__} or its value), "
               f"got {value!r}")  # fmt: skip
    return value
