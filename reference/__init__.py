"""kvcert.reference: the production-grade allocator engines import.

It must not import kvcert.spec at run time: the differential tests compare the two, and a
shared import would make them tautologies (tests/test_packaging.py checks the import graph).
The allocator arrives with the allocator issue; this package holds its place in the layout.
"""
