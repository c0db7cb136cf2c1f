"""oMLX's paged SSD store: block data by block hash, bounded, least recently used out first.

Models ``jundot/omlx : omlx/cache/paged_ssd_cache.py :: PagedSSDCacheManager`` and its
index (``PagedSSDCacheIndex``: an ``OrderedDict`` LRU over block hashes bounded by
``max_size_bytes``) at block granularity, as a :class:`kvlab.tiers.Tier` named ``"SSD"``
with the ``"lru"`` policy. In oMLX's paged-SSD-only mode every block's KV data lives here;
the block pool keeps metadata only (:mod:`kvlab.engines.omlx.paged_cache`)::

    save_block(h)   stored: touched (most recent); else inserted, evicting the LRU block
    load_block(h)   stored: touched, one block read; else a miss
    has_block(h)    membership only, nothing touched (upstream's index lookup)

Capacity is in blocks: every kvlab block has the same bytes, so ``capacity_blocks`` ×
bytes per block is upstream's ``max_size_bytes``. Not modelled: serialisation, the
in-memory hot cache, the background write queue, disk-pressure limits.
"""

from __future__ import annotations

from kvlab.core.validate import check_positive
from kvlab.engines.vllm.block_pool import check_block_key
from kvlab.tiers.tier import Tier


class PagedSSDCache:
    """A paged SSD store of block data, LRU-bounded: oMLX ``PagedSSDCacheManager``.

    Args:
        capacity_blocks: blocks the store holds (an integer >= 1), or ``None``: unbounded.

    Attributes:
        tier: the :class:`~kvlab.tiers.Tier` ``"SSD"`` holding the block hashes; its
            ``counters`` count saves (``written_blocks``), LRU evictions
            (``evicted_blocks``) and loads (``read_blocks``).

    Raises:
        ValueError: a bad capacity (names it).

    Example:
        >>> ssd = PagedSSDCache(capacity_blocks=2)
        >>> ssd.save_block(0xA), ssd.save_block(0xB), ssd.load_block(0xA)
        ([], [], True)
        >>> ssd.save_block(0xC)  # 0xB is the least recently used
        [11]
        >>> ssd.has_block(0xB), ssd.has_block(0xA), len(ssd)
        (False, True, 2)
    """

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self.tier = Tier("SSD", check_positive("capacity_blocks", capacity_blocks, optional=True), "lru")
        self._clock = 0

    @property
    def capacity_blocks(self) -> int | None:
        """Blocks the store holds at most (``None``: unbounded)."""
        return self.tier.capacity_blocks

    def __len__(self) -> int:
        return len(self.tier)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.tier

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def has_block(self, block_hash: int) -> bool:
        """Whether the store holds ``block_hash``'s data; touches nothing.

        Models oMLX ``PagedSSDCacheManager.has_block``.

        Raises:
            ValueError: ``block_hash`` is not a u64 key.
        """
        return check_block_key("block_hash", block_hash) in self.tier

    def save_block(self, block_hash: int) -> list[int]:
        """Store ``block_hash``'s data; return the hashes evicted to make room.

        Models oMLX ``PagedSSDCacheManager.save_block``: a stored block is only touched
        (most recently used, nothing written); a new one is inserted after the least
        recently used block is evicted from a full store.

        Raises:
            ValueError: ``block_hash`` is not a u64 key.
        """
        key = check_block_key("block_hash", block_hash)
        if key in self.tier:
            self.tier.touch(key, self._tick())
            return []
        return self.tier.insert(key, self._tick())

    def load_block(self, block_hash: int) -> bool:
        """Read ``block_hash``'s data: ``True`` (and the block becomes the most recently
        used) when stored, ``False`` on a miss.

        Models oMLX ``PagedSSDCacheManager.load_block`` (``None`` on a miss upstream).

        Raises:
            ValueError: ``block_hash`` is not a u64 key.
        """
        key = check_block_key("block_hash", block_hash)
        self.tier.counters.queried_blocks += 1
        if key not in self.tier:
            return False
        self.tier.touch(key, self._tick())
        self.tier.counters.hit_blocks += 1
        self.tier.counters.read_blocks += 1
        return True

    def __repr__(self) -> str:
        return f"PagedSSDCache(capacity_blocks={self.capacity_blocks}, blocks={len(self)})"
