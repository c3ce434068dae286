"""The conformance vectors (kvcert-vector/3; /1 and /2 files still read): hit/, alloc/, page/ and
manifest.json are data, generated from kvcert.spec by
`python -m kvcert.conformance.vectors.generate`."""
