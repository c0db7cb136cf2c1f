"""Fork and copy-on-write for :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager` (oMLX design).

Not vLLM: vLLM v1 does not fork (its partial blocks are never cached, so they are never
shared, and nothing is ever copied). This module models the oMLX design instead, jundot/omlx
``omlx/cache/paged_cache.py :: PagedCacheManager.fork_block_table`` (a child shares every
block of its parent by reference count) and ``_cow_copy_block`` (a shared block is copied
before it is written) — as the elastic pool of :class:`~kvlab.engines.vllm.block_pool.BlockPool`
models oMLX's ``_grow_blocks``. Only a partially filled last block is ever written, so only
it is copied::

    parent "p" (6 tokens, B=4): [1: full, hashed][2: 2 tokens]
    fork -> child "c":          [1][2]            refs 2, 2
    c appends 1 token:          block 2 is partial and shared -> c gets a copy, say 3:
                                c [1][3], p [1][2]   refs 2, 1, 1
    p appends 3 tokens:         block 2 is private again -> written in place, full, cached

The copy is the first block of the allocation that needs it (the head of the free queue),
counts toward the capacity check and replaces the shared block in the writer's table; the
shared block loses one reference.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvlab.engines.vllm.checks import check_owner

if TYPE_CHECKING:
    from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
    from kvlab.engines.vllm.kv_cache_manager import Request
    from kvlab.engines.vllm.block_pool import BlockPool


class ForkMixin:
    """The fork / copy-on-write part of :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`,
    from oMLX (vLLM v1 does not fork).

    A mixin over the manager's block tables; not used on its own.

    Example:
        >>> from kvlab.engines.vllm.kv_cache_manager import KVCacheManager, Request
        >>> from kvlab.engines.vllm.block_pool import BlockPool
        >>> manager = KVCacheManager(BlockPool(6, block_size=4), block_size=4)
        >>> parent = Request.from_block_keys("p", 6, [0xA])
        >>> _ = manager.allocate_slots(parent, 6)
        >>> child = manager.fork(parent, "c")
        >>> child.append_block_keys(1)
        >>> [b.block_id for b in manager.allocate_slots(child, 1)]  # a private copy of block 2
        [3]
        >>> manager.get_block_ids("p"), manager.get_block_ids("c")
        ([1, 2], [1, 3])
    """

    block_pool: BlockPool
    block_size: int
    _req_to_blocks: dict[str, list[KVCacheBlock]]
    _num_cached_block: dict[str, int]
    _owners: dict[str, Request]

    def fork(self, request: Request, new_request_id: str) -> Request:
        """A child of a running request sharing all its blocks by reference count.

        Models oMLX ``PagedCacheManager.fork_block_table``: the child's table is a copy
        of the parent's, every block gets one more ref, and the child starts with the
        parent's tokens, keys and ``num_computed_tokens`` (``num_preemptions`` 0).
        Whichever of the two first appends into the shared, partially filled last block
        gets a private copy.

        Raises:
            ValueError: ``request`` does not fit the manager, holds no blocks or has an
                id held by another live :class:`~kvlab.engines.vllm.kv_cache_manager.Request` object,
                or ``new_request_id`` is invalid or already holds blocks.
        """
        self._check_request(request)  # type: ignore[attr-defined]
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

    def _needs_copy(self, request: Request) -> bool:
        """Whether writing the request's next token needs a private copy of its last block:
        the block is partially filled and shared."""
        table = self._req_to_blocks.get(request.request_id)
        return bool(table) and request.num_computed_tokens % self.block_size != 0 and table[-1].ref_cnt > 1

    def _copy_last_block(self, request_id: str, copy: KVCacheBlock) -> None:
        """Point the table's last slot at ``copy``; the shared block loses a reference
        (oMLX ``_cow_copy_block``)."""
        table = self._req_to_blocks[request_id]
        shared, table[-1] = table[-1], copy
        self.block_pool.free_blocks([shared])
