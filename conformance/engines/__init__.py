"""Engines kvcert can certify, and how it finds them.

spec_engine       kvcert.spec itself: the vectors' oracle
reference_engine  kvcert.reference (entry point `reference`, the main job's engine)
template          a documented adapter to copy for your own engine
(real engines, run in their own venvs, live in their own rooms: kvcert.conformance.vllm,
kvcert.conformance.sglang)
mutants           deliberately broken engines that show the checks have teeth
loader            `kvcert.engines` entry points and `module:factory`
"""
