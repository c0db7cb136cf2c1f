"""Request-level façade of a vLLM v1 KV cache: prefix lookup, slot allocation, free.

Models ``vllm/v1/core/kv_cache_manager.py :: KVCacheManager`` over one full-attention
KV-cache group (``UnitaryKVCacheCoordinator`` + ``FullAttentionManager``;
docs/specs/engines.md §1, rules V4–V8, V11, V14). kvlab folds in the one piece of
scheduler bookkeeping the rules depend on: a successful :meth:`KVCacheManager.allocate_slots`
advances ``request.num_computed_tokens`` and records prefix-cache stats at admission.

Unlike vLLM, the manager checks its callers (:mod:`kvlab.engines.vllm.checks`): prefix-hit
blocks must be the request's own cached blocks, and a request id belongs to one live
:class:`~kvlab.engines.vllm.request.Request` at a time (until it is freed or preempted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from kvlab.core.validate import check_flag
from kvlab.engines.vllm.block_pool import KV_CACHE_GROUP_ID, BlockPool
from kvlab.engines.vllm.checks import block_list, check_allocation, check_group_block_sizes, check_owner
from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
from kvlab.engines.vllm.request import Request
from kvlab.engines.vllm.stats import PrefixCacheStats
from kvlab.events.types import BlockStored, KVEvent
from kvlab.hashing.base import check_block_size

#: ``BlockStored.kv_cache_spec_kind`` of kvlab's one KV-cache group: vLLM 0.33's
#: ``KVCacheSpecKind.FULL_ATTENTION`` value (a full-attention group has no sliding window,
#: so ``kv_cache_spec_sliding_window`` stays ``None``).
KV_CACHE_SPEC_KIND = "full_attention"


class KVCacheManager:
    """Prefix lookup, slot allocation and freeing for requests over one :class:`BlockPool`.

    Models vLLM v1 ``KVCacheManager`` with a single KV-cache group. Lookups are pure
    (V6); :meth:`allocate_slots` is all-or-nothing (V7); a finished or preempted request
    frees its blocks in reverse (V4, V14); stats are recorded once per admission (V11).

    Args:
        pool: the block pool (its ``block_size`` and ``enable_caching`` must match).
        block_size: tokens per block.
        enable_caching: prefix caching on; a Python or numpy bool, compared by value.
        group_block_sizes: block sizes of the model's KV-cache groups, if known; only one
            distinct size (= ``block_size``) is accepted.

    Raises:
        ValueError: ``enable_caching`` not a bool, a mismatch with the pool, or several
            distinct group block sizes — vLLM's hybrid coordinator would align every
            hit to their LCM, so a short prompt could never hit (vLLM-Ascend issue
            #16270); kvlab models one group.

    Example:
        >>> manager = KVCacheManager(BlockPool(8, block_size=4), block_size=4)
        >>> req = Request.from_block_keys("a", 10, [11, 12])
        >>> [b.block_id for b in manager.allocate_slots(req, 10)]
        [1, 2, 3]
        >>> manager.free(req)
        >>> again = Request.from_block_keys("b", 10, [11, 12])
        >>> blocks, hit_tokens = manager.get_computed_blocks(again)
        >>> [b.block_id for b in blocks], hit_tokens
        ([1, 2], 8)
    """

    def __init__(self, pool: BlockPool, *, block_size: int, enable_caching: bool = True,
                 group_block_sizes: Iterable[int] | None = None) -> None:
        if not isinstance(pool, BlockPool):
            raise ValueError(f"pool must be a BlockPool, got {type(pool).__name__}")
        self.block_size = check_block_size(block_size)
        if self.block_size != pool.block_size:
            raise ValueError(f"block_size is {block_size} but the pool's block_size is {pool.block_size}")
        enable_caching = check_flag("enable_caching", enable_caching)
        if enable_caching != pool.enable_caching:
            raise ValueError(f"enable_caching is {enable_caching} but the pool's is {pool.enable_caching}")
        if group_block_sizes is not None:
            check_group_block_sizes(group_block_sizes, self.block_size)
        self.block_pool = pool
        self.enable_caching = enable_caching
        self.prefix_cache_stats = PrefixCacheStats()
        """Counters since the last :meth:`make_prefix_cache_stats`."""
        self._req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_block: dict[str, int] = {}
        self._owners: dict[str, Request] = {}
        """Request id → the Request object holding the blocks under that id."""

    def _check_request(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {type(request).__name__}")
        if request.block_size is not None and request.block_size != self.block_size:
            raise ValueError(f"request {request.request_id!r} was hashed with block_size {request.block_size} but "
                             f"the manager's block_size is {self.block_size}; build it with a hasher of block size "
                             f"{self.block_size}")
        full = request.num_tokens // self.block_size
        if len(request.block_hashes) != full:
            raise ValueError(f"request {request.request_id!r} has {len(request.block_hashes)} block keys but its "
                             f"{request.num_tokens} tokens make {full} full blocks of {self.block_size}; give one "
                             f"key per full block")

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request``: its blocks and its length in tokens.

        Models vLLM v1 ``KVCacheManager.get_computed_blocks`` (rule V6): walks the
        chained keys left to right, stopping at the first miss, over at most
        ``(num_tokens - 1) // block_size`` blocks — the last token is always recomputed,
        so a fully cached 32-token prompt with 16-token blocks hits 16 tokens. Pure:
        nothing is touched; empty when caching is off. The blocks are always valid hits
        for :meth:`allocate_slots`: a key repeated within the request (never the case
        for chained keys) ends the walk rather than list one block twice.

        Raises:
            ValueError: ``request`` does not fit this manager's block size.
        """
        self._check_request(request)
        if not self.enable_caching:
            return [], 0
        blocks: list[KVCacheBlock] = []
        seen: set[int] = set()
        for key in request.block_hashes[: (request.num_tokens - 1) // self.block_size]:
            block = self.block_pool.get_cached_block(key)
            if block is None or block.block_id in seen:
                break
            blocks.append(block)
            seen.add(block.block_id)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[KVCacheBlock] = ()) -> list[KVCacheBlock] | None:
        """Give ``request`` blocks for ``num_new_tokens`` more tokens, or do nothing.

        Models vLLM v1 ``KVCacheManager.allocate_slots`` (rules V7, V8)::

            tokens: | computed | new computed (hits) | new tokens | later steps |
                    |<- request.num_computed_tokens after the call ->|
            table:  [old blocks (the last one maybe copied) | hit blocks][new blocks]

        Capacity: new blocks + hit blocks with ``ref_cnt == 0`` (touching them takes
        them out of the free queue) must fit the pool's free blocks; otherwise ``None``
        and nothing is touched, allocated or recorded. On success, in order: touch the
        hits, take new blocks from the pool, cache the newly full blocks, advance
        ``request.num_computed_tokens``, and — at admission, i.e. when it was 0 — record
        prefix-cache stats (preempted requests counted apart, V11).

        Args:
            request: the request; its id must not be held by another live request.
            num_new_tokens: tokens to compute this step (an integer >= 1).
            num_new_computed_tokens: prefix-hit tokens (new requests only), a multiple of
                the block size.
            new_computed_blocks: the hit blocks from :meth:`get_computed_blocks`: hit
                ``i`` must be a block of this pool holding ``request.block_hashes[i]``.

        Returns:
            The newly allocated blocks, or ``None`` when they do not fit.

        Raises:
            ValueError: bad counts, hits for a running request or with caching off, hits
                not matching ``num_new_computed_tokens``, a hit that is not this pool's,
                is the null block, is listed twice or does not hold the request's key at
                its position, more tokens than the request has, a request whose computed
                tokens have no blocks (freed) or do not match its table, or a request id
                held by another live :class:`Request` object.
        """
        hits = block_list("new_computed_blocks", new_computed_blocks)
        total = self._check_allocation(request, num_new_tokens, num_new_computed_tokens, hits)
        rid = request.request_id
        table = self._req_to_blocks.get(rid, [])
        num_new = -(-total // self.block_size) - len(table) - len(hits)
        evictable = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new + evictable > self._num_allocatable_blocks():
            return None
        admitted = request.num_computed_tokens == 0
        self.block_pool.touch(hits)
        new_blocks = self.block_pool.get_new_blocks(num_new)
        table = self._req_to_blocks.setdefault(rid, [])
        if not table:
            self._num_cached_block[rid] = len(hits)
            self._owners[rid] = request
        table.extend(hits)
        table.extend(new_blocks)
        if self.enable_caching:
            self._cache_blocks(request, total)
        request.num_computed_tokens = total
        if admitted and self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_new_computed_tokens, request.num_preemptions > 0)
        return new_blocks

    def _check_allocation(self, request: Request, num_new_tokens: object, num_new_computed_tokens: object,
                          hits: list[KVCacheBlock]) -> int:
        """Every check of :meth:`allocate_slots`; the request's computed tokens after it."""
        self._check_request(request)
        check_owner(self._owners, request)
        return check_allocation(request, self._req_to_blocks.get(request.request_id, []), hits, num_new_tokens,
                                num_new_computed_tokens, block_size=self.block_size,
                                enable_caching=self.enable_caching, pool_blocks=self.block_pool.blocks)

    def _num_allocatable_blocks(self) -> int:
        """Blocks :meth:`allocate_slots` may take from the pool now: its free blocks."""
        return self.block_pool.get_num_free_blocks()

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the blocks full within the first ``num_tokens`` tokens (vLLM
        ``SingleTypeKVCacheManager.cache_blocks``; at scheduling time, V8)."""
        rid = request.request_id
        num_cached, num_full = self._num_cached_block[rid], num_tokens // self.block_size
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(self._req_to_blocks[rid], request.block_hashes, num_cached, num_full,
                                              request.token_ids,
                                              extra_keys=request.event_extra_keys(num_cached, num_full - num_cached),
                                              lora_id=request.lora_id, lora_name=request.lora_name,
                                              session_id=request.session_id)
            self._num_cached_block[rid] = num_full

    def free(self, request: Request) -> None:
        """Release a finished request's blocks, last block first (rule V4).

        Models vLLM v1 ``KVCacheManager.free`` / ``SingleTypeKVCacheManager.free``: the
        table goes to :meth:`BlockPool.free_blocks` reversed, so the tail of the chain
        is evicted first. A request holding no blocks is a no-op.

        Raises:
            ValueError: ``request`` is not a :class:`Request`, or its id is held by
                another live :class:`Request` object (nothing is freed then).
        """
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {type(request).__name__}")
        check_owner(self._owners, request)
        blocks = self._req_to_blocks.pop(request.request_id, [])
        self._num_cached_block.pop(request.request_id, None)
        self._owners.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def preempt(self, request: Request) -> None:
        """Preempt a running request in recompute mode (rule V14).

        Frees its blocks as :meth:`free` does, sets ``num_computed_tokens = 0`` and
        ``num_preemptions += 1``; on re-admission its stats go to the preempted counters.

        Raises:
            ValueError: ``request`` holds no blocks (it is not running), or its id is
                held by another live :class:`Request` object.
        """
        if isinstance(request, Request):
            check_owner(self._owners, request)
        if not isinstance(request, Request) or request.request_id not in self._req_to_blocks:
            raise ValueError(f"request {getattr(request, 'request_id', request)!r} holds no blocks; only a running "
                             f"request can be preempted")
        self.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as ids, empty when it holds none (vLLM ``get_block_ids``)."""
        return [b.block_id for b in self._req_to_blocks.get(request_id, [])]

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """The stats since the last call; counting restarts (vLLM take-and-reset)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache(self) -> bool:
        """Reset the pool's prefix cache (rule V12) and flag ``prefix_cache_stats.reset``.

        Returns:
            False (nothing changed) while any block is in use.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVEvent]:
        """The pool's queued KV events, drained (vLLM ``KVCacheManager.take_events``).

        As vLLM 0.33, every ``BlockStored`` of a known group is annotated with the group's
        spec: ``kv_cache_spec_kind`` :data:`KV_CACHE_SPEC_KIND` (the pool itself leaves it
        ``None``); other events pass unchanged.
        """
        return [dataclasses.replace(e, kv_cache_spec_kind=KV_CACHE_SPEC_KIND)
                if isinstance(e, BlockStored) and e.group_idx == KV_CACHE_GROUP_ID else e
                for e in self.block_pool.take_events()]

    def __repr__(self) -> str:
        return (f"KVCacheManager(block_size={self.block_size}, running={len(self._req_to_blocks)}, "
                f"caching={self.enable_caching}, pool={self.block_pool!r})")
