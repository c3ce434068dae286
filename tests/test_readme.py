"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_reference_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README shows a Python example"
    namespace = {"prompt_token_ids": list(range(300)), "sampled_token": 7}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert "Stats(" in capsys.readouterr().out
