"""The reference allocator's error family: misuse is an exception, lack of space is not.

Running out of blocks is a normal outcome (`Waiting`); these errors mean the caller broke the
protocol or the configuration, and each message says what to do instead.
"""

from __future__ import annotations


class KVCacheError(Exception):
    """Base of every error raised by `kvcert.reference`."""


class ConfigError(KVCacheError, ValueError):
    """The cache configuration is malformed."""


class UnknownRequestError(KVCacheError, KeyError):
    """The request id is not running (never admitted, finished, or preempted)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class RequestStateError(KVCacheError):
    """The operation does not fit the request's state (admitted twice, chunk in flight...)."""


class MaxLengthError(RequestStateError):
    """The request would grow past `max_model_len`."""
