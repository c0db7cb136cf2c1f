"""Counters of oMLX's paged cache manager, kept apart from its state.

Models the event counters of ``jundot/omlx : omlx/cache/stats.py :: PagedCacheStats``
(``cow_copies``; upstream's single ``evictions`` counter is split here by cause). Block
counts (allocated, free, shared) are read from the pool instead of being kept twice:
:meth:`PagedCacheManager.get_ref_count_distribution
<kvlab.engines.omlx.paged_cache.PagedCacheManager.get_ref_count_distribution>`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PagedCacheStats:
    """Event counts of one :class:`~kvlab.engines.omlx.paged_cache.PagedCacheManager`.

    Example:
        >>> stats = PagedCacheStats()
        >>> stats.cow_copies += 1
        >>> stats.to_dict()
        {'cow_copies': 1, 'restored_blocks': 0, 'cold_marks': 0, 'permanent_evictions': 0}
    """

    cow_copies: int = 0
    """Shared partially filled blocks copied before a write (``_cow_copy_block``)."""
    restored_blocks: int = 0
    """Blocks a lookup registered from the paged SSD store (their data was on it, their
    metadata no longer in the pool)."""
    cold_marks: int = 0
    """Successful :meth:`mark_block_cold` calls (upstream counts them as evictions)."""
    permanent_evictions: int = 0
    """Successful :meth:`evict_block_permanently` calls."""

    def to_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return asdict(self)
