"""End-to-end checks through vLLM's own objects, each runnable with `python -m` in a vLLM
venv and run by CI: `integration` (what the drop-in keys, announces and refuses), `seed001`
(the DeepSeek-V4 report end to end), `preempt_in_flight` (the wrong-output bug, and its
absence with kvcert's scheduler), `plan` (kvcert's planner model against vLLM's planner)."""
