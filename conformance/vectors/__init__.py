"""The conformance vectors (kvcert-vector/6; /1 to /5 files still read): hit/, alloc/, page/ and
manifest.json are data, generated from kvcert.spec by
`python -m kvcert.conformance.vectors.generate`."""
