"""Engine-faithful caches, one subpackage per system and one file per upstream file.

=================================  =======================  ==========================================  ==========================================================
class                              what it cares about      in → out                                    upstream file
=================================  =======================  ==========================================  ==========================================================
``vllm.KVCacheManager``            requests                 lookup (last-token rule), admit, free,      ``vllm/v1/core/kv_cache_manager.py``
                                                            preempt → blocks, stats, KV events
``vllm.BlockPool``                 physical blocks          ref counts, free queue = eviction order,    ``vllm/v1/core/block_pool.py``
                                                            hash map → blocks, KV events
``vllm.FreeKVCacheBlockQueue``     free blocks              O(1) intrusive list, head = next handed     ``vllm/v1/core/kv_cache_utils.py``
                                                            out
``vllm.Request``                   one request's cache      tokens / block keys → chained block hashes  ``vllm/v1/request.py``
                                   fields
``vllm.PrefixCacheStats``          admissions               queries, hits (preempted apart)             ``vllm/v1/metrics/stats.py``
``sglang.RadixCache``              token spans              match (splits, recency), insert, lock refs, ``python/sglang/srt/mem_cache/radix_cache.py``
                                                            evict → KV slots, KV events
``sglang.LRUStrategy`` …           eviction score           node → sortable score (lru, lfu, fifo …)    ``…/mem_cache/evict_policy.py``
``sglang.TokenToKVPoolAllocator``  KV slots                 alloc / free per token                      ``…/mem_cache/allocator.py``
``omlx.PagedCacheManager``         requests (vLLM's +)      fork, copy-on-write, shared prefix, ref     ``omlx/cache/paged_cache.py``
                                                            counts, cold blocks, SSD-only lookups
``omlx.PagedBlockPool``            physical blocks          vLLM's pool, growing up to ``max_blocks``   ``omlx/cache/paged_cache.py`` (``_grow_blocks``)
``omlx.PagedSSDCache``             block data on SSD        save / load / has by block hash, LRU        ``omlx/cache/paged_ssd_cache.py``
                                                            (a :class:`kvlab.tiers.Tier`)
:func:`replay_requests`            a trace, one request     per-request hits, rejections, evictions →   —
                                   at a time                :class:`kvlab.core.RunResult` (vLLM)
:func:`replay_omlx`                the same, through oMLX   … plus pool growth, SSD restores / state    —
``scenarios``                      teaching steps           design-doc example, radix growth, fork,     —
                                                            paged-SSD round trip
=================================  =======================  ==========================================  ==========================================================

The rules are docs/specs/engines.md §1 (V1–V15) and §2.1 (S1–S9). These models run one
operation at a time in Python, for stepping through and checking; the numba replay's
``"vllm"`` mode (:mod:`kvlab.sim.vllm_kernel`) gives the same hits at sweep speed.
Dependencies point one way: ``omlx`` builds on ``vllm``; ``vllm`` and ``sglang`` import
neither each other nor ``omlx``; the shared :mod:`.replay` and :mod:`.scenarios` import
the subpackages.
"""

from kvlab.engines.omlx import PagedBlockPool, PagedCacheManager, PagedSSDCache
from kvlab.engines.replay import (
    EngineReplayConfig,
    EngineResult,
    OmlxReplayConfig,
    full_block_keys,
    replay_omlx,
    replay_requests,
)
from kvlab.engines.sglang import EVICTION_STRATEGIES, MatchResult, RadixCache, RadixKey, get_eviction_strategy
from kvlab.engines.vllm import (
    FREE_ORDERS,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    PrefixCacheStats,
    Request,
)

__all__ = [
    "EVICTION_STRATEGIES",
    "FREE_ORDERS",
    "BlockPool",
    "EngineReplayConfig",
    "EngineResult",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "MatchResult",
    "OmlxReplayConfig",
    "PagedBlockPool",
    "PagedCacheManager",
    "PagedSSDCache",
    "PrefixCacheStats",
    "RadixCache",
    "RadixKey",
    "Request",
    "full_block_keys",
    "get_eviction_strategy",
    "replay_omlx",
    "replay_requests",
]
