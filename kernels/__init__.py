"""kvcert.kernels: Triton kernels on the KV data path, certified against the spec's page layout.

The kernels arrive with the kernels issue; this package holds their place in the layout.
"""
