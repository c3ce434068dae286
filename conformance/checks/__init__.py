"""Checks of kvcert's own spec and reference (`kvcert check`).

check      the command: every part with an expected and an actual verdict
proofs/    Z3 obligations with broken twins and drift checks
symbolic   CrossHair contracts, spec-vs-reference diffbehavior, golden controls
stateful   the Hypothesis state machine, also shipped for any engine to run
"""
