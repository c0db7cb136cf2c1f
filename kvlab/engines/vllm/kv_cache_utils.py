"""The per-block record and the free-block queue of a vLLM v1 block pool.

Models ``vllm/v1/core/kv_cache_utils.py :: KVCacheBlock, FreeKVCacheBlockQueue``
(docs/specs/engines.md §1.1). The free queue is an *intrusive* doubly linked list: the
links live on the block records, so taking a block out of the middle (a prefix hit on a
free block, rule V5) is O(1) and allocates nothing. Two sentinel records (ids -1 and -2)
remove every empty-list edge case::

    fake head <-> b7 <-> b8 <-> b4 <-> ... <-> b1 <-> fake tail
                  ^ next to be handed out (= next eviction victim)

Unlike vLLM, every insertion checks an ``in_free_queue`` flag: a double append would
silently corrupt the list and its count (hard point #11, engines.md §7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvlab.core.validate import check_count


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one physical KV-cache block (blocks compare by identity).

    Models vLLM v1 ``KVCacheBlock``. Mutate it only through a
    :class:`~kvlab.engines.vllm.block_pool.BlockPool` (or a :class:`FreeKVCacheBlockQueue` for the
    links); the fields are plain so tests and notebooks can read them.

    Example:
        >>> block = KVCacheBlock(block_id=3)
        >>> block
        KVCacheBlock(block_id=3, ref_cnt=0, block_hash=None, is_null=False, in_free_queue=False)
    """

    block_id: int
    """Fixed physical id; index into the pool's block list."""
    ref_cnt: int = 0
    """Number of request block tables holding the block; 0 means it sits in the free queue."""
    block_hash: int | None = None
    """u64 block key of the full block's content when cached; ``None`` otherwise."""
    is_null: bool = False
    """True only for the pool's placeholder block 0 (rule V1)."""
    in_free_queue: bool = field(default=False, init=False)
    """Whether the block is linked into a free queue (kvlab's guard, hard point #11)."""
    _prev: KVCacheBlock | None = field(default=None, init=False, repr=False)
    _next: KVCacheBlock | None = field(default=None, init=False, repr=False)


class FreeKVCacheBlockQueue:
    """Every block with ``ref_cnt == 0``, in eviction order (head = next to hand out).

    Models vLLM v1 ``FreeKVCacheBlockQueue``: O(1) :meth:`popleft`, :meth:`remove`,
    :meth:`append`; O(n) :meth:`popleft_n`, :meth:`append_n`, :meth:`prepend_n`. The
    pool's free order (rule V4) is nothing but which end freed blocks are put at.

    Args:
        blocks: the initial free blocks, linked head to tail in the given order.

    Raises:
        RuntimeError: from the mutators when a block would be inserted twice, the null
            block would be inserted, or a block not in the queue would be removed —
            each "indicates a bug" in the caller and names the block id.

    Example:
        >>> blocks = [KVCacheBlock(i) for i in range(4)]
        >>> queue = FreeKVCacheBlockQueue(blocks)
        >>> queue.popleft().block_id, [b.block_id for b in queue.popleft_n(2)]
        (0, [1, 2])
        >>> queue.prepend_n([blocks[1], blocks[2]]); queue.append(blocks[0])
        >>> [b.block_id for b in queue.get_all_free_blocks()], queue.num_free_blocks
        ([1, 2, 3, 0], 4)
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = 0
        """Number of blocks in the queue (kept, not counted)."""
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-2)
        self._head._next = self._tail
        self._tail._prev = self._head
        self.append_n(list(blocks))

    def popleft(self) -> KVCacheBlock:
        """Take the head block out of the queue.

        Raises:
            ValueError: the queue is empty.
        """
        if self.num_free_blocks == 0:
            raise ValueError("no free blocks available")
        block = self._head._next
        assert block is not None
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first ``n`` blocks (head first) out of the queue.

        Raises:
            ValueError: ``n`` is not an integer >= 0 or exceeds :attr:`num_free_blocks`.
        """
        n = check_count("n", n)
        if n > self.num_free_blocks:
            raise ValueError(f"n={n} exceeds the {self.num_free_blocks} free blocks")
        return [self.popleft() for _ in range(n)]

    def peek(self) -> KVCacheBlock | None:
        """The head block, which :meth:`popleft` would take, left in place; ``None`` when
        the queue is empty (kvlab's, O(1))."""
        block = self._head._next
        return None if block is self._tail else block

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from anywhere in the queue (a hit on a free block, V5).

        Raises:
            RuntimeError: ``block`` is not in the queue.
        """
        if not block.in_free_queue:
            raise RuntimeError(f"block {block.block_id} is not in the free queue; removing it indicates a bug")
        prev, nxt = block._prev, block._next
        assert prev is not None and nxt is not None, f"block {block.block_id} is flagged free but unlinked"
        prev._next, nxt._prev = nxt, prev
        block._prev = block._next = None
        block.in_free_queue = False
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the tail (evicted last).

        Raises:
            RuntimeError: ``block`` is already queued or is the null block.
        """
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the tail, keeping their order (the last one ends at the tail).

        Raises:
            RuntimeError: a block is already queued, listed twice or is the null block;
                nothing is linked then.
        """
        self._check_insertable(blocks)
        self._link_after(self._tail._prev, blocks)  # type: ignore[arg-type]

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order (``blocks[0]`` becomes the head).

        Models vLLM's ``prepend_n`` (added with PR #42656).

        Raises:
            RuntimeError: a block is already queued, listed twice or is the null block;
                nothing is linked then.
        """
        self._check_insertable(blocks)
        self._link_after(self._head, blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The queued blocks, head to tail (O(n); for tests, dumps and snapshots)."""
        out = []
        block = self._head._next
        while block is not self._tail:
            assert block is not None
            out.append(block)
            block = block._next
        return out

    def _link_after(self, prev: KVCacheBlock, blocks: Sequence[KVCacheBlock]) -> None:
        nxt = prev._next
        assert nxt is not None
        for block in blocks:
            prev._next, block._prev = block, prev
            block.in_free_queue = True
            prev = block
        prev._next, nxt._prev = nxt, prev
        self.num_free_blocks += len(blocks)

    @staticmethod
    def _check_insertable(blocks: Sequence[KVCacheBlock]) -> None:
        seen: set[int] = set()
        for block in blocks:
            if block.is_null:
                raise RuntimeError(f"block {block.block_id} is the null block, which never enters the free queue "
                                   f"(rule V1); inserting it indicates a bug")
            if block.in_free_queue or id(block) in seen:
                raise RuntimeError(f"block {block.block_id} is already in the free queue; inserting it again would "
                                   f"corrupt the list (hard point #11) and indicates a bug")
            seen.add(id(block))

    def __repr__(self) -> str:
        ids = " ".join(str(b.block_id) for b in self.get_all_free_blocks())
        return f"FreeKVCacheBlockQueue(num_free_blocks={self.num_free_blocks}, head->tail: {ids})"
