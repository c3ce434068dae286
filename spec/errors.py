"""The one error family of the specification.

Every input the spec refuses raises a subclass of `SpecError`. Messages say what is wrong and
how to fix it, so an engine developer can act on them without reading the spec's source.
`SpecError` subclasses `ValueError` because every refusal is about a bad value.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Base of every refusal raised by `kvcert.spec`."""


class InvalidLayout(SpecError):
    """A KV-cache layout (groups, block sizes, windows, speculative profile) is malformed."""


class AlignmentImpossible(InvalidLayout):
    """No positive hit can ever exist: the hit alignment exceeds what any request can reuse."""


class UncacheableLayout(InvalidLayout):
    """A prefix-cache lookup was asked of a layout in which no group can be cached."""


class InvalidRequest(SpecError):
    """A request or cache view is malformed (negative or empty lengths, blocks out of range)."""


class InvalidOp(SpecError):
    """An allocator operation misuses the protocol (unknown request, work in flight, ...)."""
