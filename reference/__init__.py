"""kvcert.reference: the production-grade allocator engines import.

    config       CacheConfig, GroupConfig and the profiles (eviction, draft keying, hashing)
    manager      KVCacheManager: admit, extend, end_step, finish, preempt, lookup, stats
    coordinator  the hybrid hit search          groups       per-kind position arithmetic
    block_pool   reference counts, keys, liveness            eviction     one free queue per
    hashing      collision-resistant block digests                        eviction profile
    planner      page planning (block sizes, one page size)  scheduling   prefill chunking
    rules        which function implements each rule of kvcert.spec

It never imports kvcert.spec: the differential tests compare the two, and a shared import
would make them tautologies (tests/test_packaging.py checks the import graph).
"""
