"""The GPU check (scripts/gpu-check.sh, kvcert.kernels.certify) in its --quick mode under the
Triton interpreter, so the script a GPU run depends on cannot rot between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.kernels import certify

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_script_runs_quick_on_the_cpu(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        ["bash", "scripts/gpu-check.sh", "--quick", "--json", str(report)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(report.read_text())
    assert body["ok"]
    assert body["mode"] == "interpreter --quick"
    kernels = {check["kernel"] for check in body["checks"]}
    assert kernels == {"write_kv", "write_latent", "paged_decode", "copy_blocks", "slot_mapping"}
    assert all(check["equal"] for check in body["checks"])
    assert "ALL EQUAL" in done.stdout


def test_a_kernel_that_writes_a_wrong_byte_is_reported(monkeypatch):
    """The check's twin: a write kernel that flips one byte of the page must be caught."""
    from kvcert.kernels import ops

    real = ops.launch_write

    def off_by_one_byte(x, pages, slots, layout, part):
        real(x, pages, slots, layout, part)
        if part == "v":
            return
        first = int(slots[slots >= 0][0])
        block, token = divmod(first, layout.block_size)
        pages[block, layout.k_data + token] ^= 1

    monkeypatch.setattr(ops, "launch_write", off_by_one_byte)
    layout = certify.grid_layouts(quick=True)[0]
    assert "bytes differ" in certify.check_write(layout, 20, 1, "cpu")


def test_a_decode_that_reads_past_the_window_is_reported(monkeypatch):
    from kvcert.kernels import ops

    real = ops.launch_decode

    def no_window(*args, **kwargs):
        return real(*args, **{**kwargs, "window": 0})

    monkeypatch.setattr(ops, "launch_decode", no_window)
    layout = certify.grid_layouts(quick=True)[0]
    why = certify.check_decode(layout, [50, 40], 9, 2, seed=3, device="cpu")
    assert why.startswith("non-finite output") or "max error" in why


@pytest.mark.parametrize("quick", [True, False])
def test_the_families_cover_what_the_issue_names(quick):
    layouts = certify.grid_layouts(quick)
    if quick:
        assert layouts
        return
    assert {x.dtype for x in layouts} == set(certify.ATTENTION_DTYPES)
    assert {x.block_size for x in layouts} == set(certify.BLOCKS)
    assert {x.head_k for x in layouts} == set(certify.HEAD_SIZES)
    assert any(x.page_size > x.data_bytes for x in layouts)  # padded pages
    planned = certify.planned_layouts()
    assert any(x.page_size > x.data_bytes for x in planned)  # the planner pads some pages
