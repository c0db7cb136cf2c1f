"""SGLang's token-to-KV-slot allocator, simulated, so the radix cache's de-duplication can be seen.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/allocator.py ::
TokenToKVPoolAllocator`` (token granularity): slots ``1 .. size`` (slot 0 is SGLang's
padding slot and is never handed out); ``alloc`` takes slots from the head of the free
list and ``free`` appends them at its tail, so freed slots are reused last::

    free list:  head → 4 5 6 … size → (freed slots appended here)

SGLang's paged allocator (whole pages for ``page_size > 1``) is not modelled: the radix
cache frees per token (an unaligned tail, de-duplicated tokens), which this shows exactly.
The tree's record of the slots it holds (a check SGLang does not make) is
:class:`~kvlab.engines.sglang.checks.TreeSlots`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from kvlab.core.validate import check_count
from kvlab.hashing.base import check_block_size


class TokenToKVPoolAllocator:
    """A pool of ``size`` KV slots, one per token.

    Models SGLang ``TokenToKVPoolAllocator.alloc/free/available_size``. "Does not fit"
    is a return value (``alloc`` returns ``None``), as in SGLang.

    Args:
        size: number of usable slots (``1 <= size < 2**31``); they are numbered
            ``1 .. size``.

    Raises:
        ValueError: ``size`` not an integer in that range.

    Example:
        >>> pool = TokenToKVPoolAllocator(4)
        >>> pool.alloc(3).tolist(), pool.available_size()
        ([1, 2, 3], 1)
        >>> pool.free([2]); pool.alloc(2).tolist()
        [4, 2]
        >>> pool.alloc(1) is None
        True
    """

    def __init__(self, size: int) -> None:
        self.size = check_block_size(size, "size")
        self._free = deque(range(1, self.size + 1))
        self._is_free = np.ones(self.size + 1, dtype=bool)
        self._is_free[0] = False

    def __repr__(self) -> str:
        return f"TokenToKVPoolAllocator(size={self.size}, available={len(self._free)})"

    def available_size(self) -> int:
        """Free slots."""
        return len(self._free)

    def free_slots(self) -> np.ndarray:
        """``int64[available_size()]`` the free slots in reuse order (head first)."""
        return np.fromiter(self._free, dtype=np.int64, count=len(self._free))

    def alloc(self, need_size: int) -> np.ndarray | None:
        """Take ``need_size`` slots from the head of the free list.

        Returns:
            ``int64[need_size]`` slot indices, or ``None`` when fewer are free.

        Raises:
            ValueError: ``need_size`` not an integer >= 0.
        """
        if check_count("need_size", need_size) > len(self._free):
            return None
        slots = np.array([self._free.popleft() for _ in range(need_size)], dtype=np.int64)
        self._is_free[slots] = False
        return slots

    def allocated_mask(self, indices: np.ndarray) -> np.ndarray:
        """``bool[n]``: which indices (``int64[n]``) are allocated slots of this pool."""
        mask = (indices >= 1) & (indices <= self.size)
        mask[mask] = ~self._is_free[indices[mask]]
        return mask

    def is_allocated(self, indices: np.ndarray) -> bool:
        """Whether every index is an allocated slot of this pool (``int64[n]`` input)."""
        return bool(self.allocated_mask(indices).all())

    def free(self, indices: np.ndarray | list[int]) -> None:
        """Return slots to the tail of the free list, in the given order.

        Raises:
            ValueError: a non-integer index, an index out of ``[1, size]``, already free
                (a double free), or repeated; nothing is freed then.
        """
        slots = np.asarray(indices).reshape(-1)
        if slots.size and slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integer slot indices, got dtype {slots.dtype}")
        slots = slots.astype(np.int64)
        if len(np.unique(slots)) != len(slots) or not self.is_allocated(slots):
            raise ValueError(f"indices must be distinct allocated slots in [1, {self.size}] (a slot freed twice "
                             f"is a double free), got {slots.tolist()}")
        self._is_free[slots] = True
        self._free.extend(slots.tolist())
