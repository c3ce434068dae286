"""Scheduler-level soundness campaigns: random workloads through an engine's real scheduler,
with the model runner replaced by a ledger of what each forward pass wrote where."""
