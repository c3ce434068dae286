"""kvcert's allocator inside vLLM 0.33.0: a drop-in KVCacheManager and the Scheduler using it.

Needs vLLM installed (importing this package without it raises ImportError). Never imports
kvcert.spec. Configuration: `Settings` or the environment (KVCERT_EVICTION, KVCERT_HASH,
KVCERT_SPECULATIVE; see kvcert.reference.vllm.settings).
"""

from kvcert.reference.vllm.layout import UnsupportedConfigError
from kvcert.reference.vllm.manager import IntegrationError, KVCacheManager
from kvcert.reference.vllm.scheduler import Scheduler
from kvcert.reference.vllm.settings import Settings

__all__ = ["IntegrationError", "KVCacheManager", "Scheduler", "Settings", "UnsupportedConfigError"]
