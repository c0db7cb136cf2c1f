"""Request-level façade of a vLLM v1 KV cache: prefix lookup, slot allocation, free, fork.

Models ``vllm/v1/core/kv_cache_manager.py :: KVCacheManager`` over one full-attention
KV-cache group (``UnitaryKVCacheCoordinator`` + ``FullAttentionManager``;
docs/specs/engines.md §1, rules V4–V8, V11, V14). kvlab folds in the one piece of
scheduler bookkeeping the rules depend on: a successful :meth:`KVCacheManager.allocate_slots`
advances ``request.num_computed_tokens`` and records prefix-cache stats at admission.

Fork with copy-on-write is not vLLM's — vLLM v1 does not fork (its partial blocks are
never shared). It comes from the oMLX design (jundot/omlx ``omlx/cache/paged_cache.py``)
and lives in :mod:`kvlab.engines.omlx.paged_cache`; the elastic pool
(:class:`~kvlab.engines.vllm.block_pool.BlockPool` ``max_blocks``) comes from the same design.

Unlike vLLM, the manager checks its callers (:mod:`kvlab.engines.vllm.checks`): prefix-hit
blocks must be the request's own cached blocks, and a request id belongs to one live
:class:`Request` object at a time (until it is freed or preempted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
from kvlab.engines.vllm.checks import (
    block_list,
    check_allocation,
    check_flag,
    check_group_block_sizes,
    check_owner,
    check_positive,
)
from kvlab.engines.omlx.paged_cache import ForkMixin
from kvlab.engines.vllm.block_pool import BlockPool, check_block_key
from kvlab.engines.vllm.stats import PrefixCacheStats
from kvlab.events.types import KVEvent
from kvlab.hashing.base import BlockHasher, RequestExtras, as_token_array, check_block_size, check_count


def _full_block_keys(hasher: BlockHasher, token_ids: list[int], extras: RequestExtras | None) -> list[int]:
    """The hasher's u64 keys of the full blocks (vLLM hashes no partial tail)."""
    keys = hasher.block_keys(token_ids, extras)
    return [int(k) for k in keys[: len(token_ids) // hasher.block_size]]


@dataclass(eq=False)
class Request:
    """What the KV cache manager needs to know about one request.

    Models the cache-related part of vLLM v1 ``Request``: its length, the chained
    block hashes of its full blocks (precomputed as tokens arrive, V8), how many tokens
    are computed, how often it was preempted. Build it with :meth:`from_tokens` (a
    :mod:`kvlab.hashing` profile hashes the tokens) or :meth:`from_block_keys` (trace
    replay: keys given directly).

    Example:
        >>> from kvlab.hashing import sim
        >>> req = Request.from_tokens("r0", range(10), sim(block_size=4))
        >>> req.num_tokens, len(req.block_hashes), req.block_size
        (10, 2, 4)
        >>> Request.from_block_keys("r1", 9, [7, 8])
        Request(request_id='r1', num_tokens=9, block_hashes=[7, 8], block_size=None, token_ids=None,
                num_computed_tokens=0, num_preemptions=0)
    """

    request_id: str
    """Unique id; the manager keys block tables by it (one live object per id)."""
    num_tokens: int
    """Tokens so far (prompt plus appended output), >= 1."""
    block_hashes: list[int]
    """u64 keys of the full blocks, chained (equal key ⇒ equal whole prefix)."""
    block_size: int | None = None
    """Block size the keys were computed for (the hasher's); ``None`` when given directly."""
    token_ids: list[int] | None = None
    """The tokens, when known (they go into ``BlockStored`` events)."""
    num_computed_tokens: int = 0
    """Tokens whose KV is in the request's blocks (hits included)."""
    num_preemptions: int = 0
    """Times the request was preempted (rule V14)."""
    hasher: BlockHasher | None = field(default=None, repr=False)
    """The profile that hashes appended tokens (:meth:`from_tokens` requests)."""
    extras: RequestExtras | None = field(default=None, repr=False)
    """LoRA / multimodal / salt inputs passed to ``hasher``."""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        check_positive(self.num_tokens, "num_tokens")
        self.block_hashes = [check_block_key(h, f"block_hashes[{i}]") for i, h in enumerate(self.block_hashes)]
        if self.block_size is not None and len(self.block_hashes) != self.num_tokens // self.block_size:
            raise ValueError(f"block_hashes has {len(self.block_hashes)} keys but {self.num_tokens} tokens make "
                             f"{self.num_tokens // self.block_size} full blocks of {self.block_size}")
        if self.token_ids is not None and len(self.token_ids) != self.num_tokens:
            raise ValueError(f"token_ids has {len(self.token_ids)} tokens but num_tokens is {self.num_tokens}")
        if check_count(self.num_computed_tokens, "num_computed_tokens") > self.num_tokens:
            raise ValueError(f"num_computed_tokens must be <= num_tokens ({self.num_tokens}), "
                             f"got {self.num_computed_tokens}")
        check_count(self.num_preemptions, "num_preemptions")

    @classmethod
    def from_tokens(cls, request_id: str, token_ids: Sequence[int] | np.ndarray, hasher: BlockHasher,
                    extras: RequestExtras | None = None) -> Request:
        """A request whose full blocks are keyed by ``hasher.block_keys(token_ids, extras)``.

        The manager using it must have ``block_size == hasher.block_size``.

        Raises:
            ValueError: ``hasher`` is not a :class:`~kvlab.hashing.BlockHasher`; no
                tokens; invalid tokens or extras (from the hasher).
        """
        if not isinstance(hasher, BlockHasher):
            raise ValueError(f"hasher must be a kvlab.hashing BlockHasher, got {type(hasher).__name__}")
        tokens = [int(t) for t in as_token_array(token_ids)]
        return cls(request_id, len(tokens), _full_block_keys(hasher, tokens, extras), hasher.block_size, tokens,
                   hasher=hasher, extras=extras)

    @classmethod
    def from_block_keys(cls, request_id: str, num_tokens: int, block_keys: Iterable[int]) -> Request:
        """A request given its length and the u64 keys of its full blocks (trace replay).

        Pass one key per full block (``num_tokens // block_size`` keys; drop a trace's
        partial-tail key); the manager checks the count against its block size at use.
        No tokens are known, so the ``BlockStored`` events its blocks cause carry
        ``token_ids=()`` (the keys, parent key and block size only).

        Raises:
            ValueError: a bad id, length or key.
        """
        return cls(request_id, num_tokens, list(block_keys))

    def append_tokens(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Append output tokens (a :meth:`from_tokens` request); newly full blocks get keys.

        Raises:
            ValueError: the request was built from block keys, or no / invalid tokens.
        """
        if self.hasher is None or self.token_ids is None:
            raise ValueError(f"request {self.request_id!r} has no hasher (built from block keys); "
                             f"use append_block_keys")
        new = [int(t) for t in as_token_array(token_ids)]
        if not new:
            raise ValueError("token_ids must not be empty")
        tokens = self.token_ids + new
        if len(tokens) // self.hasher.block_size > len(self.block_hashes):
            self.block_hashes = _full_block_keys(self.hasher, tokens, self.extras)
        self.token_ids, self.num_tokens = tokens, len(tokens)

    def append_block_keys(self, num_new_tokens: int, block_keys: Iterable[int] = ()) -> None:
        """Append ``num_new_tokens`` tokens and the keys of the blocks they complete
        (a :meth:`from_block_keys` request).

        Raises:
            ValueError: the request has tokens (use :meth:`append_tokens`),
                ``num_new_tokens`` not an integer >= 1, or a bad key.
        """
        if self.token_ids is not None:
            raise ValueError(f"request {self.request_id!r} has token ids; use append_tokens")
        check_positive(num_new_tokens, "num_new_tokens")
        keys = [check_block_key(k, f"block_keys[{i}]") for i, k in enumerate(block_keys)]
        self.num_tokens += num_new_tokens
        self.block_hashes.extend(keys)


class KVCacheManager(ForkMixin):
    """Prefix lookup, slot allocation and freeing for requests over one :class:`BlockPool`.

    Models vLLM v1 ``KVCacheManager`` with a single KV-cache group. Lookups are pure
    (V6); :meth:`allocate_slots` is all-or-nothing (V7); a finished or preempted request
    frees its blocks in reverse (V4, V14); stats are recorded once per admission (V11);
    :meth:`~kvlab.engines.omlx.paged_cache.ForkMixin.fork` shares a running request's blocks with
    copy-on-write (from oMLX; vLLM v1 does not fork).

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
        enable_caching = check_flag(enable_caching, "enable_caching")
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
        them out of the free queue) + 1 for a copy-on-write must fit
        :meth:`BlockPool.get_num_available_blocks`; otherwise ``None`` and nothing is
        touched, allocated or recorded. On success, in order: touch the hits, take new
        blocks from the pool (a copy first), cache the newly full blocks, advance
        ``request.num_computed_tokens``, and — at admission, i.e. when it was 0 — record
        prefix-cache stats (preempted requests counted apart, V11).

        Copy-on-write (:mod:`kvlab.engines.omlx.paged_cache`): if the last block is partially
        filled and shared (after a fork), the first new block becomes its private copy.

        Args:
            request: the request; its id must not be held by another live request.
            num_new_tokens: tokens to compute this step (an integer >= 1).
            num_new_computed_tokens: prefix-hit tokens (new requests only), a multiple of
                the block size.
            new_computed_blocks: the hit blocks from :meth:`get_computed_blocks`: hit
                ``i`` must be a block of this pool holding ``request.block_hashes[i]``.

        Returns:
            The newly allocated blocks (a copy-on-write copy first), or ``None`` when they
            do not fit.

        Raises:
            ValueError: bad counts, hits for a running request or with caching off, hits
                not matching ``num_new_computed_tokens``, a hit that is not this pool's,
                is the null block, is listed twice or does not hold the request's key at
                its position, more tokens than the request has, a request whose computed
                tokens have no blocks (freed) or do not match its table, or a request id
                held by another live :class:`Request` object.
        """
        hits = block_list(new_computed_blocks, "new_computed_blocks")
        total = check_allocation(self, request, num_new_tokens, num_new_computed_tokens, hits)
        rid, size = request.request_id, self.block_size
        table = self._req_to_blocks.get(rid, [])
        num_new = -(-total // size) - len(table) - len(hits)
        copy = int(self._needs_copy(request))
        evictable = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new + copy + evictable > self.block_pool.get_num_available_blocks():
            return None
        admitted = request.num_computed_tokens == 0
        self.block_pool.touch(hits)
        new_blocks = self.block_pool.get_new_blocks(num_new + copy)
        table = self._req_to_blocks.setdefault(rid, [])
        if not table:
            self._num_cached_block[rid] = len(hits)
            self._owners[rid] = request
        table.extend(hits)
        if copy:
            self._copy_last_block(rid, new_blocks[0])
        table.extend(new_blocks[copy:])
        if self.enable_caching:
            self._cache_blocks(request, total)
        request.num_computed_tokens = total
        if admitted and self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_new_computed_tokens, request.num_preemptions > 0)
        return new_blocks

    def _cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the blocks full within the first ``num_tokens`` tokens (vLLM
        ``SingleTypeKVCacheManager.cache_blocks``; at scheduling time, V8)."""
        rid = request.request_id
        num_cached, num_full = self._num_cached_block[rid], num_tokens // self.block_size
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(self._req_to_blocks[rid], request.block_hashes, num_cached, num_full,
                                              request.token_ids)
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
        """The pool's queued KV events, drained (vLLM ``KVCacheManager.take_events``)."""
        return self.block_pool.take_events()

    def __repr__(self) -> str:
        return (f"KVCacheManager(block_size={self.block_size}, running={len(self._req_to_blocks)}, "
                f"caching={self.enable_caching}, pool={self.block_pool!r})")
