"""`kvcert fuzz` through vLLM's scheduler: `build` wires a workload's scheduler, `ledger` is
the model runner that checks every read, `loop` plays EngineCore's steps; `fix` and
`mutants` are the preempt-in-flight fix and the broken twins the campaign must catch;
`check` and `results` judge and publish the reports (docs/campaign.md)."""
