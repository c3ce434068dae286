"""The published text the claim tests check: the README and docs/, one file per topic."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def doc(name: str) -> str:
    """One file's text: "README" or a docs/ topic ("kernels", "campaign", ...)."""
    path = README if name == "README" else DOCS / f"{name}.md"
    return path.read_text(encoding="utf-8")


def words(name: str) -> str:
    """The file's text with its line breaks and runs of spaces as single spaces: a claim
    wrapped across lines reads as one."""
    return " ".join(doc(name).split())
