"""Engine-faithful caches: vLLM v1's block pool and KV cache manager, SGLang's radix cache.

==============================  =======================  =======================================================
layer                           what it cares about      in → out
==============================  =======================  =======================================================
:class:`KVCacheManager`         requests (vLLM)          lookup (last-token rule), admit, free, preempt; fork (oMLX)
:class:`BlockPool`              physical blocks (vLLM)   ref counts, free queue = eviction order, hash map
:class:`FreeKVCacheBlockQueue`  free blocks (vLLM)       O(1) intrusive list, head = next block handed out
:class:`RadixCache`             token spans (SGLang)     match (splits, recency), insert, lock refs, evict
``radix_policies``              eviction score (SGLang)  node → sortable score (lru, lfu, fifo, mru, …)
:func:`replay_requests`         a trace, one at a time   per-request hits through the vLLM manager
``scenarios``                   teaching steps           design-doc example, radix growth
==============================  =======================  =======================================================

The rules are docs/specs/engines.md §1 (V1–V15) and §2.1 (S1–S9). These models run one
operation at a time in Python, for stepping through and checking; the numba replay's
``"vllm"`` mode (:mod:`kvlab.sim.vllm_kernel`) gives the same hits at sweep speed.
"""

from kvlab.engines.replay import EngineRun, full_block_keys, replay_requests
from kvlab.engines.sglang import EVICTION_STRATEGIES, MatchResult, RadixCache, RadixKey, get_eviction_strategy
from kvlab.engines.vllm import FREE_ORDERS, BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, KVCacheManager, Request
from kvlab.engines.vllm.stats import PrefixCacheStats

__all__ = [
    "FREE_ORDERS",
    "EVICTION_STRATEGIES",
    "BlockPool",
    "EngineRun",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "MatchResult",
    "PrefixCacheStats",
    "RadixCache",
    "RadixKey",
    "Request",
    "full_block_keys",
    "get_eviction_strategy",
    "replay_requests",
]
