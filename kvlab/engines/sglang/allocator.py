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


class TreeSlots:
    """Which slots of a pool the radix tree holds, so that no slot sits in two nodes.

    SGLang keeps no such record (its callers are trusted); kvlab keeps one bool per slot
    so that a caller's mistake is refused at ``insert`` instead of surfacing later as a
    double free half-way through an eviction. Invariant: a held slot is allocated.

    Args:
        allocator: the pool whose slots are tracked.

    Example:
        >>> pool = TokenSlotAllocator(4)
        >>> held = TreeSlots(pool)
        >>> held.adopt(pool.alloc(2)); held.owned().tolist()
        [1, 2]
        >>> held.check_new("value", np.array([2, 3]))
        Traceback (most recent call last):
        ValueError: value holds slots [2] that the tree already holds for other tokens; ...
        >>> held.release(np.array([2, 1]), "evict"); pool.free_slots().tolist()
        [3, 4, 2, 1]
    """

    def __init__(self, allocator: TokenSlotAllocator) -> None:
        self.allocator = allocator
        self._held = np.zeros(allocator.size + 1, dtype=bool)

    def owned(self) -> np.ndarray:
        """``int64[n]`` the slots the tree holds, ascending."""
        return np.flatnonzero(self._held).astype(np.int64)

    def check_new(self, name: str, slots: np.ndarray) -> None:
        """Refuse slots for tokens new to the tree that it already holds elsewhere
        (``slots`` are checked allocated and in range already, see :func:`check_slots`).

        Raises:
            ValueError: naming ``name`` and the slots already held.
        """
        taken = slots[self._held[slots]]
        if len(taken):
            raise ValueError(f"{name} holds slots {taken.tolist()} that the tree already holds for other tokens; "
                             f"the part of a key new to the tree needs slots of the caller's own (allocated "
                             f"and not cached)")

    def adopt(self, slots: np.ndarray) -> None:
        """Record ``slots`` (checked by :meth:`check_new`) as held by the tree."""
        self._held[slots] = True

    def release(self, slots: np.ndarray, operation: str) -> None:
        """Free tree slots to the pool, checking all of them before freeing any.

        Raises:
            RuntimeError: a slot repeated, not held by the tree or not allocated (the
                tree is corrupt; ``operation`` names the caller); nothing is freed then.
        """
        allocated = self.allocator.is_allocated(slots)
        if not allocated or len(np.unique(slots)) != len(slots) or not self._held[slots].all():
            raise RuntimeError(f"{operation} would free slots {slots.tolist()} that are repeated or not held by "
                               f"the tree; a slot in two nodes or freed behind the tree's back indicates a bug")
        self._held[slots] = False
        self.allocator.free(slots)


def check_slots(name: str, slots: object, allocator: TokenSlotAllocator | None) -> np.ndarray:
    """``slots`` as ``int64[n]``, checked: non-negative integers and, with a pool,
    distinct slots currently allocated from it.

    Raises:
        ValueError: naming ``name``, the value and the offending slots.

    Example:
        >>> check_slots("value", [3, 4], None).tolist()
        [3, 4]
    """
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise ValueError(f"{name} must be a 1-D sequence of non-negative integer slots, got {slots!r}")
    arr = arr.astype(np.int64)
    if allocator is not None:
        unique, counts = np.unique(arr, return_counts=True)
        repeated = unique[counts > 1].tolist()
        missing = unique[~allocator.allocated_mask(unique)].tolist()
        if repeated or missing:
            raise ValueError(f"{name} must hold distinct slots allocated from this cache's pool, got {arr.tolist()} "
                             f"(repeated {repeated}, not allocated {missing})")
    return arr


def check_insert_value(token_ids: tuple[int, ...], value: object, allocator: TokenSlotAllocator | None) -> np.ndarray:
    """An insert's ``value`` as ``int64[len(token_ids)]``: the checked slots, or the token
    ids themselves when ``value`` is ``None`` (allowed only without a pool; the ids fit
    int64, see :func:`~kvlab.engines.sglang.tree_node.as_radix_key`).

    Raises:
        ValueError: ``value`` missing with a pool, of another length, or bad slots
            (see :func:`check_slots`).
    """
    if value is None:
        if allocator is not None:
            raise ValueError("value is required when the cache has a KV pool (kv_pool_size is set); "
                             "allocate slots with cache.allocator.alloc(n)")
        return np.asarray(token_ids, dtype=np.int64)
    arr = check_slots("value", value, allocator)
    if len(arr) != len(token_ids):
        raise ValueError(f"value must hold one slot per token of key ({len(token_ids)}), got {len(arr)}")
    return arr
