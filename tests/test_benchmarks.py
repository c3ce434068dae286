"""The benchmark command keeps working (a smoke run; no timing is asserted).

benchmarks/run.py refuses to report when the naive baseline or the spec disagrees with the
reference, so this also checks three implementations agree on its workloads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_runs_and_reports_ratios():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.endswith("x")]
    assert len(lines) == 13
    assert any(line.startswith("stream, radix tree") for line in lines)


def test_profile_names_where_the_reference_spends_its_time():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_reference.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "manager.py" in result.stdout
    assert "(extend)" in result.stdout
    assert "hashing.py" in result.stdout
