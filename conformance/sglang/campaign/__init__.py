"""The soundness + completeness campaign through SGLang's scheduler steps (docs/campaign.md).

`workload` draws what arrives when (engine-free), `ledger` is the model runner that checks
every read and the oracle of the hit each admission was owed (engine-free), `loop` plays a
workload through SGLang's own request steps, and `command` runs seeds and reports.
"""
