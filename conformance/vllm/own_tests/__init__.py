"""vLLM's own tests/v1/core with kvcert's manager: `swap` is the pytest plugin that swaps it
in (scripts/vllm-own-tests.sh runs them), `report` compares the two runs."""
