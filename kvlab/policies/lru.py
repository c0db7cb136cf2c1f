"""LRU: evict the least recently used block.

The reference is an ``OrderedDict``; the kernel keeps an intrusive doubly linked list
over dense block ids (arrays ``prev``/``next`` with a sentinel at index ``num_keys``),
the same O(1) structure as vLLM v1's ``FreeKVCacheBlockQueue``; the two link arrays are
interleaved (one cache line per block) and ``prev = -1`` marks a block not resident.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import list_pop_front, list_push_back, list_unlink
from kvlab.traces.flat import FlatTrace


class LRU:
    """Reference LRU cache over block ids (readable; the oracle for the kernel).

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.

    Raises:
        ValueError: negative or non-integer capacity.

    Example:
        >>> cache = LRU(capacity_blocks=2)
        >>> cache.access(1, 0), cache.access(2, 1), cache.access(1, 2)
        ([], [], [])
        >>> cache.access(3, 3)  # 2 is least recently used
        [2]
        >>> sorted(cache.resident())
        [1, 3]
    """

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._order: OrderedDict[int, None] = OrderedDict()  # first = least recent

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def resident(self) -> list[int]:
        """Resident block ids, least recently used first."""
        return list(self._order)

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Touch ``block_id`` (move to most recent) or insert it; return evicted ids."""
        if block_id in self._order:
            self._order.move_to_end(block_id)
            return []
        if self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._order) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._order[block_id] = None
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        Nothing else is kept about a block, so nothing else changes."""
        if block_id not in self._order:
            return False
        del self._order[block_id]
        return True

    def evict(self) -> int | None:
        """Evict the least recently used block (the victim of the next insertion into a
        full cache); ``None`` if nothing is resident."""
        return self._order.popitem(last=False)[0] if self._order else None


class LRUState(NamedTuple):
    """Kernel state: ``prev``/``next`` links (``int32[num_keys + 1]``, index ``num_keys`` is
    the sentinel: ``next[sentinel]`` = least recent, ``prev[sentinel]`` = most recent) and
    ``counters`` (``int64[2]``: used, capacity). ``prev`` and ``next`` are the even and odd
    halves of one interleaved array, so a block's two links share a cache line; ``prev[k]``
    is ``-1`` when block ``k`` is not resident (a resident block's ``prev`` is a block or
    the sentinel)."""

    prev: np.ndarray
    next: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LRUState:
    """Empty LRU state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    n = flat.num_keys
    links = np.full(2 * (n + 1), -1, dtype=np.int32)
    links[2 * n] = links[2 * n + 1] = n  # the empty list: the sentinel links to itself
    return LRUState(links[0::2], links[1::2], np.array([0, capacity_blocks], dtype=np.int64))


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.prev[block_id] >= 0


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    prev, nxt, counters = state.prev, state.next, state.counters
    sentinel = prev.shape[0] - 1
    capacity = counters[1]
    used = counters[0]
    num_evicted = 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        if prev[block_id] >= 0:  # resident: unlink, to be pushed back as most recent
            list_unlink(prev, nxt, block_id)
        elif capacity == 0:
            continue
        else:
            if used >= capacity:  # evict the least recent (the sentinel's next)
                victim = list_pop_front(prev, nxt, sentinel)
                prev[victim] = -1
                used -= 1
                evicted[num_evicted] = victim
                num_evicted += 1
            used += 1
        list_push_back(prev, nxt, sentinel, block_id)
    counters[0] = used
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook
    list_unlink(state.prev, state.next, block_id)
    list_push_back(state.prev, state.next, state.prev.shape[0] - 1, block_id)


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    state.counters[0] += 1
    list_push_back(state.prev, state.next, state.prev.shape[0] - 1, block_id)


def evict(state) -> int:  # noqa: ANN001 - numba hook
    if state.counters[0] == 0:
        return -1
    victim = list_pop_front(state.prev, state.next, state.prev.shape[0] - 1)
    state.prev[victim] = -1
    state.counters[0] -= 1
    return victim


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    if state.prev[block_id] < 0:
        return False
    list_unlink(state.prev, state.next, block_id)
    state.prev[block_id] = -1
    state.counters[0] -= 1
    return True


register_kernel(LRUState, contains=contains, access=access, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="lru",
    summary="evict the least recently used block",
    models="vLLM v1 free-queue order (least recently freed first), LMCache LRU, SGLang 'lru'",
    reference=LRU,
    make_state=make_state,
)
