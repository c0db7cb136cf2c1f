"""oMLX's paged KV cache (jundot/omlx), built on kvlab's vLLM v1 engine.

==============================  ===========================================================
kvlab module                    upstream file
==============================  ===========================================================
:mod:`.paged_cache`             ``omlx/cache/paged_cache.py`` (``PagedCacheManager``; its pool)
:mod:`.paged_ssd_cache`         ``omlx/cache/paged_ssd_cache.py`` (``PagedSSDCacheManager``)
:mod:`.stats`                   ``omlx/cache/stats.py`` (``PagedCacheStats``)
==============================  ===========================================================
"""

from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.omlx.stats import PagedCacheStats

__all__ = ["PagedBlockPool", "PagedCacheManager", "PagedCacheStats", "PagedSSDCache"]
