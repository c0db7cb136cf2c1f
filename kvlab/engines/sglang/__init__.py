"""SGLang's radix prefix cache (``python/sglang/srt/mem_cache/``), one kvlab file per upstream file.

==============================  ===========================================================
kvlab module                    upstream file
==============================  ===========================================================
:mod:`.radix_cache`             ``radix_cache.py`` (``RadixCache``, ``MatchResult``): the walks
                                and the request-level calls
:mod:`.tree_core`               ``radix_cache.py``'s tree bookkeeping (clock, nodes, splits,
                                locks, counters), split off as upstream splits
                                ``unified_cache/unified_tree_core.py`` (T-LRU depths from there)
:mod:`.tree_node`               ``radix_cache.py`` (``RadixKey``, ``TreeNode``), apart so that
                                every module below can import them without a circle
:mod:`.evict_policy`            ``evict_policy.py`` (``LRUStrategy`` … ``TLRUStrategy``) and
                                ``utils.py :: get_eviction_strategy``
:mod:`.allocator`               ``allocator.py`` (``TokenToKVPoolAllocator``)
:mod:`.events`                  ``events.py`` (``KVCacheEventRecorder``, ``KvEventLoraNames``)
:mod:`.checks`                  none: the caller checks SGLang leaves to its scheduler
==============================  ===========================================================

Modelled on SGLang 0.5.23. Imports point one way: ``tree_node`` ← ``evict_policy``,
``events``, ``allocator`` ← ``checks`` ← ``tree_core`` ← ``radix_cache``.
"""

from kvlab.engines.sglang.allocator import TokenToKVPoolAllocator
from kvlab.engines.sglang.evict_policy import EVICTION_STRATEGIES, EvictionStrategy, get_eviction_strategy
from kvlab.engines.sglang.radix_cache import MatchResult, RadixCache
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode

__all__ = ["EVICTION_STRATEGIES", "EvictionStrategy", "MatchResult", "RadixCache", "RadixKey",
           "TokenToKVPoolAllocator", "TreeNode", "get_eviction_strategy"]
