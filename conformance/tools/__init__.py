"""Operator tools built on the spec and the reference.

explain       why a lookup hits what it hits (`kvcert explain`), with scenario.py's files
              and the bundled examples/
plan          a model's page plan (`kvcert plan`), model_plan.py its shared options,
              catalog.py + models/ the bundled model files, hf_config.py config.json
simulate/     hit rates of eviction and placement policies on traces (`kvcert simulate`)
discover      which packages an engine's KV-cache import chain needs (the engine locks)
"""
