"""Everything that drives vLLM, in one room; each module runs inside a vLLM release's venv
(`scripts/engine-venv.sh vllm VERSION`) and imports vLLM only through `runtime.vllm()`.

    runtime          vLLM imported once; its planner, VllmConfig and scheduler wired as
                     EngineCore wires them; weightless model files (no downloads)
    adapter          the conformance engine `vllm` (vLLM's KVCacheManager, hand mode)
    planned          its planned modes (`vllm-planned*`: layers through vLLM's planner)
    layers           kvcert's layers as vLLM's per-layer KV-cache specs
    planner_model    kvcert's model of vLLM's page planner (no vLLM needed; `kvcert plan`)
    campaign/        `kvcert fuzz`: build, ledger, loop, the fix, broken twins, checks
    checks/          end-to-end checks CI runs: integration, seed 001, preempt-in-flight,
                     the planner model against vLLM's planner
    own_tests/       vLLM's own tests with kvcert's manager swapped in (report, swap plugin)
    expected, trace_causes, coverage
                     the results of engines/ (expected failures with their causes, which
                     flag a difference follows, which of vLLM's branches the vectors reach)

The results they write live in engines/ (data only); `checkout()` finds it.
"""

from __future__ import annotations

from pathlib import Path


def checkout() -> Path:
    """The kvcert checkout whose engines/ these tools read and write: the one this package
    is installed from (editable, as scripts/engine-venv.sh installs it), else the working
    directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "engines").is_dir() else Path.cwd()
