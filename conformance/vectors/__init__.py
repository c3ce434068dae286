"""The conformance vectors (kvcert-vector/1): hit/, alloc/, page/ and manifest.json are data,
generated from kvcert.spec by `python -m kvcert.conformance.vectors.generate`."""
