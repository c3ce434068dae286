"""kvcert.reference: the production-grade allocator engines import.

    config       CacheConfig, GroupConfig and the profiles (eviction, draft keying, hashing)
    manager      KVCacheManager, the request API: admit, extend, reserve, end_step, finish,
                 preempt, lookup, stats; each operation delegates to
    inputs       argument checks             requests     the records returned and kept
    lookup       keys per group              tables       positions a step writes and frees
    commit       registration and events     coordinator  the hybrid hit search
    groups       per-kind position arithmetic
    block_pool   reference counts, keys, liveness (keyindex, refcounts: C with a Python twin)
    decode_lane  which managers take decode steps in C (their Python path is the twin)
    eviction     one free queue per profile  hashing      collision-resistant block digests
    planner      page planning               scheduling   prefill chunking and placement
    rules        which function implements each rule of kvcert.spec
    vllm/        the drop-in for vLLM 0.33.0 (needs vLLM)

It never imports kvcert.spec: the differential tests compare the two, and a shared import
would make them tautologies (tests/test_architecture.py checks the import rules).
"""
