"""kvcert.conformance: what engines run to certify themselves, and the `kvcert` command.

cli          argument parsing and dispatch       arguments   typed argument parsers
contract/    the engine protocol, the JSON codec, the schemas (what an engine author reads)
vectors/     the vectors and their generator     certify/    the runner and the report
engines/     the spec, reference and template engines, the loader, seeded bugs
checks/      `kvcert check`: Z3, CrossHair, the shipped Hypothesis state machine
tools/       operator tools: explain, plan, simulate
campaign/    `kvcert fuzz`, engine-neutral: workloads and the command
vllm/        everything that drives vLLM (run in a vLLM venv)
sglang/      SGLang's adapter (run in an SGLang venv)
"""
