"""Argument types the `kvcert` commands share: each refuses a bad value before any work runs,
with argparse's usage line and exit status 2."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

STDOUT = "-"


def output_path_or_stdout(text: str) -> Path:
    """`output_path`, or "-" for standard output."""
    return Path(STDOUT) if text == STDOUT else output_path(text)


def output_path(text: str) -> Path:
    """A file a report will be written to, checked now: a run of minutes must not end unable
    to write its report."""
    if text == STDOUT:
        raise argparse.ArgumentTypeError("this option writes a file; '-' (stdout) is not one")
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file to write")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def positive_number(text: str, what: str = "number") -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive {what}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A time limit in seconds, > 0 and finite."""
    return positive_number(text, "number of seconds")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value
