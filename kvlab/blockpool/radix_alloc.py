"""A simulated token-slot allocator for the radix cache, so de-duplication can be seen.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/allocator.py ::
TokenToKVPoolAllocator`` (token granularity): slots ``1 .. size`` (slot 0 is SGLang's
padding slot and is never handed out); ``alloc`` takes slots from the head of the free
list and ``free`` appends them at its tail, so freed slots are reused last::

    free list:  head → 4 5 6 … size → (freed slots appended here)

SGLang's paged allocator (whole pages for ``page_size > 1``) is not modelled: the radix
cache frees per token (an unaligned tail, de-duplicated tokens), which this shows exactly.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from kvlab.hashing.base import check_block_size, check_count


class TokenSlotAllocator:
    """A pool of ``size`` KV slots, one per token.

    Models SGLang ``TokenToKVPoolAllocator.alloc/free/available_size``. "Does not fit"
    is a return value (``alloc`` returns ``None``), as in SGLang.

    Args:
        size: number of usable slots (``1 <= size < 2**31``); they are numbered
            ``1 .. size``.

    Raises:
        ValueError: ``size`` not an integer in that range.

    Example:
        >>> pool = TokenSlotAllocator(4)
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
        return f"TokenSlotAllocator(size={self.size}, available={len(self._free)})"

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
        if check_count(need_size, "need_size") > len(self._free):
            return None
        slots = np.array([self._free.popleft() for _ in range(need_size)], dtype=np.int64)
        self._is_free[slots] = False
        return slots

    def is_allocated(self, indices: np.ndarray) -> bool:
        """Whether every index is an allocated slot of this pool (``int64[n]`` input)."""
        in_range = bool(np.all((indices >= 1) & (indices <= self.size)))
        return in_range and not bool(np.any(self._is_free[indices]))

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


def check_slots(name: str, slots: object, allocator: TokenSlotAllocator | None) -> np.ndarray:
    """``slots`` as ``int64[n]``, checked: non-negative integers and, with a pool,
    distinct slots currently allocated from it.

    Raises:
        ValueError: naming ``name`` and the value.

    Example:
        >>> check_slots("value", [3, 4], None).tolist()
        [3, 4]
    """
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise ValueError(f"{name} must be a 1-D sequence of non-negative integer slots, got {slots!r}")
    arr = arr.astype(np.int64)
    if allocator is not None and (len(np.unique(arr)) != len(arr) or not allocator.is_allocated(arr)):
        raise ValueError(f"{name} must hold distinct slots allocated from this cache's pool, got {arr.tolist()}")
    return arr
