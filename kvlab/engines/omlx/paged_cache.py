"""oMLX's paged KV cache: block tables, fork with copy-on-write, an elastic pool, SSD-only mode.

Models ``jundot/omlx : omlx/cache/paged_cache.py :: PagedCacheManager``, which follows
vLLM's block pool and adds, in kvlab as extensions of the vLLM v1 classes
(:class:`PagedBlockPool` of :class:`~kvlab.engines.vllm.block_pool.BlockPool`,
:class:`PagedCacheManager` of :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`):

=======================  ====================================  ==============================
oMLX feature             kvlab                                 upstream
=======================  ====================================  ==============================
elastic pool             ``PagedBlockPool(max_blocks=)``       ``_grow_blocks``
fork                     :meth:`PagedCacheManager.fork`        ``fork_block_table``
copy-on-write            ``allocate_slots`` copies             ``_cow_copy_block``
shared prefix            ``find_shared_prefix``                same
ref-count statistics     ``get_ref_count_distribution``        same (and ``_summary``)
paged-SSD-only mode      ``PagedCacheManager(ssd=)``           ``set_paged_ssd_cache_manager``
cold blocks              ``mark_block_cold`` …                 same names
=======================  ====================================  ==============================

Only a partially filled last block is ever written, so only it is copied on write::

    parent "p" (6 tokens, B=4): [1: full, hashed][2: 2 tokens]
    fork -> child "c":          [1][2]               refs 2, 2
    c appends 1 token:          block 2 is partial and shared -> c gets a copy, say 3:
                                c [1][3], p [1][2]   refs 2, 1, 1
    p appends 3 tokens:         block 2 is private again -> written in place, full, cached

**Paged-SSD-only mode**: the pool holds metadata; every block's data lives on a
:class:`~kvlab.engines.omlx.paged_ssd_cache.PagedSSDCache` with its own capacity and LRU.
Newly cached blocks are saved to it, head first; hits are loaded from it (both move the
block to the LRU's recent end). A lookup hits a block only while the SSD holds its data;
a block whose metadata left the pool (lazy or permanent eviction) but whose data is still
on the SSD is registered again by the lookup, in a block taken from the free queue —
never one the same lookup already matched (the walk ends there instead).

Kept from vLLM on purpose (the manager extends vLLM's), where upstream oMLX differs: a
finished request frees its blocks in reverse into the free queue with their hashes
(upstream's scheduler calls ``release_for_eviction``: ref 0, hash kept, out of the queue,
evicted later by last access, a request's head first); the pool grows by the shortfall
only once the free queue, cached blocks included, cannot cover an allocation (upstream
grows by shortfall + 128 before it evicts released blocks); lookups keep the last-token
rule (upstream matches every full block). So with forking unused, no SSD and the pool
created at ``max_blocks``, the hits are exactly vLLM's (tests/test_engines_omlx.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from kvlab.core.validate import check_count, check_int
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.omlx.stats import PagedCacheStats
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.checks import block_list, check_owner
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
from kvlab.engines.vllm.request import Request
from kvlab.hashing.base import check_block_size


class PagedBlockPool(BlockPool):
    """vLLM's block pool that grows on demand up to ``max_blocks``: oMLX's elastic pool.

    Models oMLX ``PagedCacheManager._grow_blocks``: :meth:`get_new_blocks` asked for more
    blocks than are free creates the shortfall as new blocks with fresh ids
    (``num_blocks``, ``num_blocks + 1`` …) instead of failing, up to ``max_blocks`` blocks
    in all; it never shrinks. Cached free blocks are still evicted before it grows.
    :meth:`get_usage` is relative to the current size.

    Args:
        num_blocks: blocks at start-up (upstream ``initial_blocks``), null block included.
        max_blocks: the ceiling (an integer in ``[num_blocks, 2**31)``), or ``None``: a
            fixed pool. Other arguments: :class:`~kvlab.engines.vllm.block_pool.BlockPool`.

    Raises:
        ValueError: an invalid argument, naming it and its value.

    Example:
        >>> pool = PagedBlockPool(3, max_blocks=6, block_size=4)
        >>> [b.block_id for b in pool.get_new_blocks(4)], pool.num_blocks, pool.get_num_available_blocks()
        ([1, 2, 3, 4], 5, 1)
    """

    def __init__(self, num_blocks: int, *, max_blocks: int | None = None, enable_caching: bool = True,
                 free_order: str = "current", block_size: int = 16, enable_kv_cache_events: bool = False) -> None:
        super().__init__(num_blocks, enable_caching=enable_caching, free_order=free_order, block_size=block_size,
                         enable_kv_cache_events=enable_kv_cache_events)
        top = self.num_blocks if max_blocks is None else check_block_size(max_blocks, "max_blocks")
        if top < self.num_blocks:
            raise ValueError(f"max_blocks must be None or >= num_blocks ({self.num_blocks}), got {max_blocks!r}")
        self.max_blocks = top

    def get_num_available_blocks(self) -> int:
        """Blocks :meth:`get_new_blocks` can hand out: free ones plus the room to grow."""
        return self.get_num_free_blocks() + self.max_blocks - self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """vLLM's ``get_new_blocks`` after growing the pool by the shortfall (oMLX
        ``get_new_blocks`` / ``_grow_blocks``).

        Raises:
            ValueError: ``num_blocks`` is not an integer >= 0 or exceeds
                :meth:`get_num_available_blocks`.
        """
        num_blocks = check_count("num_blocks", num_blocks)
        if num_blocks > self.get_num_available_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool: {self.get_num_free_blocks()} free"
                             f" and room to grow by {self.max_blocks - self.num_blocks} (max_blocks={self.max_blocks})")
        shortfall = num_blocks - self.get_num_free_blocks()
        if shortfall > 0:
            grown = [KVCacheBlock(i) for i in range(self.num_blocks, self.num_blocks + shortfall)]
            self.blocks.extend(grown)
            self.free_block_queue.append_n(grown)
        return super().get_new_blocks(num_blocks)


class PagedCacheManager(KVCacheManager):
    """vLLM's KV cache manager with oMLX's fork, copy-on-write, cold blocks and SSD-only mode.

    Models oMLX ``PagedCacheManager`` (module table). Everything else — lookups with the
    last-token rule, all-or-nothing allocation, reverse free, stats, caller checks — is
    :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`'s.

    Args:
        pool: a :class:`PagedBlockPool` (its ``block_size`` and ``enable_caching`` match).
        block_size, enable_caching, group_block_sizes: as ``KVCacheManager``.
        ssd: the paged SSD store of paged-SSD-only mode, or ``None`` (needs caching on:
            the SSD keys data by block hash).

    Attributes:
        ssd: the :class:`~kvlab.engines.omlx.paged_ssd_cache.PagedSSDCache`, or ``None``.
        stats: the :class:`~kvlab.engines.omlx.stats.PagedCacheStats` counters.

    Raises:
        ValueError: a bad argument (names it).

    Example:
        >>> manager = PagedCacheManager(PagedBlockPool(6, block_size=4), block_size=4)
        >>> parent = Request.from_block_keys("p", 6, [0xA])
        >>> _ = manager.allocate_slots(parent, 6)
        >>> child = manager.fork(parent, "c")
        >>> child.append_block_keys(1)
        >>> [b.block_id for b in manager.allocate_slots(child, 1)]  # a private copy of block 2
        [3]
        >>> manager.get_block_ids("p"), manager.get_block_ids("c"), manager.get_ref_count_summary()
        ([1, 2], [1, 3], 'rc1=2,rc2=1')
    """

    block_pool: PagedBlockPool

    def __init__(self, pool: PagedBlockPool, *, block_size: int, enable_caching: bool = True,
                 group_block_sizes: Iterable[int] | None = None, ssd: PagedSSDCache | None = None) -> None:
        if not isinstance(pool, PagedBlockPool):
            raise ValueError(f"pool must be a PagedBlockPool, got {type(pool).__name__}")
        super().__init__(pool, block_size=block_size, enable_caching=enable_caching,
                         group_block_sizes=group_block_sizes)
        if ssd is not None and not isinstance(ssd, PagedSSDCache):
            raise ValueError(f"ssd must be a PagedSSDCache or None, got {type(ssd).__name__}")
        if ssd is not None and not self.enable_caching:
            raise ValueError("ssd needs enable_caching=True: the paged SSD store keys block data by block hash")
        self.ssd = ssd
        self.stats = PagedCacheStats()
        self._to_save: list[int] = []

    # ----- lookups and allocation -------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """vLLM's lookup; in paged-SSD-only mode a block hits only while the SSD holds its
        data, and a block on the SSD but not in the pool is registered again (module
        docstring). Not pure then: registered blocks stay cached.

        Raises:
            ValueError: ``request`` does not fit this manager's block size.
        """
        if self.ssd is None:
            return super().get_computed_blocks(request)
        self._check_request(request)
        blocks: list[KVCacheBlock] = []
        seen: set[int] = set()
        for key in request.block_hashes[: (request.num_tokens - 1) // self.block_size]:
            if not self.ssd.has_block(key):
                break
            block = self.block_pool.get_cached_block(key)
            if block is None:
                block = self._register_from_ssd(key, seen)
            if block is None or block.block_id in seen:
                break
            blocks.append(block)
            seen.add(block.block_id)
        return blocks, len(blocks) * self.block_size

    def _register_from_ssd(self, key: int, matched: set[int]) -> KVCacheBlock | None:
        """A free block holding ``key`` again (its data is on the SSD), or ``None`` when the
        pool has no block to give but one this lookup matched (oMLX's lazy restore)."""
        pool = self.block_pool
        head = pool.free_block_queue.peek()
        if (head is None and pool.get_num_available_blocks() == 0) or (head is not None and head.block_id in matched):
            return None
        block = pool.get_new_blocks(1)[0]
        pool.cache_full_blocks([block], [key], 0, 1)
        pool.free_blocks([block])
        self.stats.restored_blocks += 1
        return block

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[KVCacheBlock] = ()) -> list[KVCacheBlock] | None:
        """vLLM's ``allocate_slots``, plus copy-on-write and the SSD's loads and saves.

        Copy-on-write (oMLX ``_cow_copy_block``): when the request's last block is
        partially filled and shared (after a fork), the first new block becomes its
        private copy; the copy counts toward the capacity check and the shared block
        loses one reference. In paged-SSD-only mode the hits are loaded from the SSD,
        then the newly cached blocks saved to it, head first.

        Returns:
            The newly allocated blocks (a copy first), or ``None`` when they do not fit.

        Raises:
            ValueError: every caller mistake vLLM's ``allocate_slots`` lists.
        """
        hits = block_list("new_computed_blocks", new_computed_blocks)
        if isinstance(request, Request) and self._needs_copy(request):
            new_blocks = self._allocate_with_copy(request, num_new_tokens, num_new_computed_tokens, hits)
        else:
            new_blocks = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, hits)
        to_save, self._to_save = self._to_save, []
        if new_blocks is not None and self.ssd is not None:
            for block in hits:
                self.ssd.load_block(block.block_hash)
            for key in to_save:
                self.ssd.save_block(key)
        return new_blocks

    def _allocate_with_copy(self, request: Request, num_new_tokens: object, num_new_computed_tokens: object,
                            hits: list[KVCacheBlock]) -> list[KVCacheBlock] | None:
        total = self._check_allocation(request, num_new_tokens, num_new_computed_tokens, hits)
        table = self._req_to_blocks[request.request_id]
        num_new = -(-total // self.block_size) - len(table)
        if num_new + 1 > self._num_allocatable_blocks():
            return None
        new_blocks = self.block_pool.get_new_blocks(num_new + 1)
        shared, table[-1] = table[-1], new_blocks[0]
        self.block_pool.free_blocks([shared])
        table.extend(new_blocks[1:])
        self.stats.cow_copies += 1
        if self.enable_caching:
            self._cache_blocks(request, total)
        request.num_computed_tokens = total
        return new_blocks

    def _needs_copy(self, request: Request) -> bool:
        """Whether the request's next write needs a private copy of its last block: the
        block is partially filled and shared."""
        table = self._req_to_blocks.get(request.request_id)
        return bool(table) and request.num_computed_tokens % self.block_size != 0 and table[-1].ref_cnt > 1

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        before = self._num_cached_block[request.request_id]
        super()._cache_blocks(request, num_tokens)
        if self.ssd is not None:
            self._to_save.extend(request.block_hashes[before:self._num_cached_block[request.request_id]])

    def _num_allocatable_blocks(self) -> int:
        return self.block_pool.get_num_available_blocks()

    # ----- fork and shared prefixes -----------------------------------------------

    def fork(self, request: Request, new_request_id: str) -> Request:
        """A child of a running request sharing all its blocks by reference count.

        Models oMLX ``PagedCacheManager.fork_block_table``: the child's table is a copy
        of the parent's, every block gets one more ref, and the child starts with the
        parent's tokens, keys and ``num_computed_tokens`` (``num_preemptions`` 0).
        Whichever of the two first appends into the shared, partially filled last block
        gets a private copy.

        Raises:
            ValueError: ``request`` does not fit the manager, holds no blocks or has an
                id held by another live :class:`Request`, or ``new_request_id`` is
                invalid or already holds blocks.
        """
        self._check_request(request)
        check_owner(self._owners, request)
        table = self._req_to_blocks.get(request.request_id)
        if not table:
            raise ValueError(f"request {request.request_id!r} holds no blocks; only a running request can be forked")
        if new_request_id in self._req_to_blocks:
            raise ValueError(f"new_request_id {new_request_id!r} already holds blocks")
        child = replace(request, request_id=new_request_id, block_hashes=list(request.block_hashes),
                        token_ids=None if request.token_ids is None else list(request.token_ids), num_preemptions=0)
        self.block_pool.touch(table)
        self._req_to_blocks[new_request_id] = list(table)
        self._num_cached_block[new_request_id] = self._num_cached_block[request.request_id]
        self._owners[new_request_id] = child
        return child

    def find_shared_prefix(self, request: Request) -> tuple[list[int], list[int], int]:
        """The cached prefix of ``request``: its block ids, their hashes, and the number
        of tokens left to compute. Models oMLX ``find_shared_prefix`` (which returns the
        remaining tokens themselves); the lookup is :meth:`get_computed_blocks`.

        Raises:
            ValueError: ``request`` does not fit this manager's block size.
        """
        blocks, num_tokens = self.get_computed_blocks(request)
        return [b.block_id for b in blocks], [b.block_hash for b in blocks], request.num_tokens - num_tokens

    # ----- ref counts and cold blocks ---------------------------------------------

    def get_ref_count_distribution(self) -> dict[int, int]:
        """Ref count → number of blocks, over the blocks in use or cached (ascending).

        Models oMLX ``get_ref_count_distribution`` over its ``allocated_blocks``; the
        null block is left out (upstream counts it at ref 1).
        """
        counts = Counter(b.ref_cnt for b in self.block_pool.blocks
                         if not b.is_null and (b.ref_cnt or b.block_hash is not None))
        return dict(sorted(counts.items()))

    def get_ref_count_summary(self) -> str:
        """``"rc0=5(ssd=3),rc1=100"``: :meth:`get_ref_count_distribution` with, for ref 0,
        how many of those blocks have their data on the SSD store; ``"rc=none"`` when empty.
        Models oMLX ``get_ref_count_summary``."""
        on_ssd = 0 if self.ssd is None else sum(1 for b in self.get_cold_blocks() if b.ref_cnt == 0)
        parts = [f"rc{ref_cnt}={count}" + (f"(ssd={on_ssd})" if ref_cnt == 0 else "")
                 for ref_cnt, count in self.get_ref_count_distribution().items()]
        return ",".join(parts) or "rc=none"

    def _block(self, block_id: object) -> KVCacheBlock | None:
        block_id = check_int("block_id", block_id, low=0)
        return self.block_pool.blocks[block_id] if block_id < self.block_pool.num_blocks else None

    def _free_block(self, block_id: object) -> KVCacheBlock | None:
        """The block ``block_id`` if it exists, is free (ref count 0) and is not the null block."""
        block = self._block(block_id)
        return None if block is None or block.ref_cnt > 0 or block.is_null else block

    def mark_block_cold(self, block_id: int) -> bool:
        """Record that a free block's data is cold (on the SSD). Models oMLX
        ``mark_block_cold``: in paged-SSD-only mode a bookkeeping step only — the block
        stays in lookups, its metadata kept.

        Returns:
            ``False`` for an unknown id, a block in use, or the null block.

        Raises:
            ValueError: ``block_id`` is not an integer >= 0.
        """
        block = self._free_block(block_id)
        if block is None:
            return False
        self.stats.cold_marks += 1
        return True

    def evict_block_permanently(self, block_id: int) -> bool:
        """Remove a free block from lookups: its hash and map entry go (a ``BlockRemoved``
        event when events are on), its data stays on the SSD store. Models oMLX
        ``evict_block_permanently``; kvlab leaves the block where it is in the free queue.

        Returns:
            ``False`` for an unknown id, a block in use, or the null block.

        Raises:
            ValueError: ``block_id`` is not an integer >= 0.
        """
        block = self._free_block(block_id)
        if block is None:
            return False
        self.block_pool.evict_blocks([block.block_id])
        self.stats.permanent_evictions += 1
        return True

    def restore_block(self, block_id: int) -> bool:
        """Read a block's data back from the SSD store (it becomes the SSD's most recently
        used). Models oMLX ``restore_block``, which only touches the block.

        Returns:
            ``False`` for an unknown id or, with an SSD store, a cached block whose data the
            store no longer holds; ``True`` otherwise.

        Raises:
            ValueError: ``block_id`` is not an integer >= 0.
        """
        block = self._block(block_id)
        if block is None:
            return False
        if self.ssd is not None and block.block_hash is not None:
            return self.ssd.load_block(block.block_hash)
        return True

    def get_cold_blocks(self) -> list[KVCacheBlock]:
        """Blocks whose data is on the SSD: every non-null cached block (upstream, where
        paged-SSD-only mode keeps all data there), and with a store, only those whose data
        it still holds. Models oMLX ``get_cold_blocks``."""
        return [b for b in self.block_pool.blocks if b.block_hash is not None and not b.is_null
                and (self.ssd is None or self.ssd.has_block(b.block_hash))]

    def __repr__(self) -> str:
        return (f"PagedCacheManager(block_size={self.block_size}, running={len(self._req_to_blocks)}, "
                f"ssd={self.ssd!r}, pool={self.block_pool!r})")
