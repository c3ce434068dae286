"""The kernels' error type: bad arguments are refused before any kernel runs."""

from __future__ import annotations


class KernelInputError(ValueError):
    """A kernel argument is malformed or out of range; the message says what to fix."""
