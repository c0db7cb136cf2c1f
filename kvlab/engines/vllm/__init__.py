"""vLLM v1's KV cache, one kvlab file per upstream file (docs/specs/engines.md §1).

==============================  ===========================================================
kvlab module                    upstream file
==============================  ===========================================================
:mod:`.kv_cache_utils`          ``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, ``FreeKVCacheBlockQueue``)
:mod:`.block_pool`              ``vllm/v1/core/block_pool.py`` (``BlockPool``)
:mod:`.kv_cache_manager`        ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``)
:mod:`.request`                 ``vllm/v1/request.py`` (``Request``, its cache fields)
:mod:`.stats`                   ``vllm/v1/metrics/stats.py`` (``PrefixCacheStats``)
:mod:`.checks`                  none: the caller checks vLLM leaves to its scheduler
==============================  ===========================================================
"""

from kvlab.engines.vllm.block_pool import FREE_ORDERS, MEDIUM_GPU, BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvlab.engines.vllm.request import Request
from kvlab.engines.vllm.stats import PrefixCacheStats

__all__ = ["FREE_ORDERS", "MEDIUM_GPU", "BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock", "KVCacheManager",
           "PrefixCacheStats", "Request"]
