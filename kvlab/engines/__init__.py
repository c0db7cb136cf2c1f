"""Engine-faithful caches, one subpackage per system and one file per upstream file.

=================================  ====================  ========================================  =====================
class                              cares about           in → out                                  upstream file
=================================  ====================  ========================================  =====================
``vllm.KVCacheManager``            requests              lookup (last-token rule), admit, free,    ``kv_cache_manager``
                                                         preempt → blocks, stats, KV events
``vllm.BlockPool``                 physical blocks       ref counts, free queue (= eviction        ``block_pool``
                                                         order), hash map → blocks, KV events
``vllm.FreeKVCacheBlockQueue``     free blocks           O(1) intrusive list; head = next out      ``kv_cache_utils``
``vllm.Request``                   a request's blocks    tokens or keys → chained block hashes     ``request``
``vllm.PrefixCacheStats``          admissions            queries, hits (preempted apart)           ``metrics/stats``
``sglang.RadixCache``              token spans           match (splits), insert, lock, evict →     ``radix_cache``
                                                         KV slots, KV events
``sglang.LRUStrategy`` …           eviction order        tree node → sortable score                ``evict_policy``
``sglang.TokenToKVPoolAllocator``  KV slots              alloc / free per token                    ``allocator``
``omlx.PagedCacheManager``         requests (+ vLLM's)   fork, copy-on-write, shared prefix, ref   ``paged_cache``
                                                         counts, cold blocks, SSD-only lookups
``omlx.PagedBlockPool``            physical blocks       vLLM's pool growing to ``max_blocks``     ``paged_cache``
``omlx.PagedSSDCache``             block data on SSD     save / load / has by hash, LRU (a         ``paged_ssd_cache``
                                                         :class:`kvlab.tiers.Tier`)
:func:`replay_requests`            a trace, in order     per-request hits, rejections, evictions   —
                                                         → :class:`kvlab.core.RunResult` (vLLM)
:func:`replay_omlx`                the same, on oMLX     … plus pool growth, SSD restores, SSD     —
``scenarios``                      teaching steps        design doc, radix growth, fork, SSD trip  —
=================================  ====================  ========================================  =====================

Upstream files are under ``vllm/v1/core/`` (``vllm/v1/request.py``,
``vllm/v1/metrics/stats.py``), ``python/sglang/srt/mem_cache/`` and ``omlx/cache/``; each
subpackage's docstring maps its modules.

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
