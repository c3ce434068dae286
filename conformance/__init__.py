"""kvcert.conformance: what engines run to certify themselves, and the `kvcert` command."""
