"""LRU: evict the least recently used block.

The reference is an ``OrderedDict``; the kernel keeps an intrusive doubly linked list
over dense block ids (arrays ``prev``/``next`` with a sentinel at index ``n_keys``),
the same O(1) structure as vLLM v1's ``FreeKVCacheBlockQueue``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
from numba import njit

from kvlab.policies.base import PolicySpec, register_kernel
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
        if capacity_blocks is not None and (isinstance(capacity_blocks, bool)
                                            or not isinstance(capacity_blocks, (int, np.integer))
                                            or capacity_blocks < 0):
            raise ValueError(f"capacity_blocks must be an integer >= 0 or None, got {capacity_blocks!r}")
        self.capacity_blocks = None if capacity_blocks is None else int(capacity_blocks)
        self._order: OrderedDict[int, None] = OrderedDict()  # first = least recent

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def resident(self) -> list[int]:
        """Resident block ids, least recently used first."""
        return list(self._order)

    def access(self, block_id: int, ref_index: int) -> list[int]:
        """Touch ``block_id`` (move to most recent) or insert it; return evicted ids."""
        if block_id in self._order:
            self._order.move_to_end(block_id)
            return []
        if self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._order) >= self.capacity_blocks:
            evicted.append(self._order.popitem(last=False)[0])
        self._order[block_id] = None
        return evicted


class LRUState(NamedTuple):
    """Kernel state: ``prev``/``next`` links (``int32[n_keys + 1]``, index ``n_keys`` is
    the sentinel: ``next[sentinel]`` = least recent, ``prev[sentinel]`` = most recent),
    ``resident`` (``bool[n_keys]``) and ``counters`` (``int64[2]``: used, capacity)."""

    prev: np.ndarray
    next: np.ndarray
    resident: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LRUState:
    """Empty LRU state for ``flat.n_keys`` block ids and the given capacity (blocks)."""
    n = flat.n_keys
    prev = np.full(n + 1, n, dtype=np.int32)
    nxt = np.full(n + 1, n, dtype=np.int32)
    return LRUState(prev, nxt, np.zeros(n, dtype=np.bool_), np.array([0, capacity_blocks], dtype=np.int64))


@njit(inline="always")
def _unlink(state: LRUState, block_id: int) -> None:
    p = state.prev[block_id]
    n = state.next[block_id]
    state.next[p] = n
    state.prev[n] = p


@njit(inline="always")
def _push_most_recent(state: LRUState, block_id: int) -> None:
    sentinel = state.resident.shape[0]
    last = state.prev[sentinel]
    state.next[last] = block_id
    state.prev[block_id] = last
    state.next[block_id] = sentinel
    state.prev[sentinel] = block_id


def contains(state, block_id):  # noqa: ANN001 - numba hook
    return state.resident[block_id]


def access(state, block_id, ref_index):  # noqa: ANN001 - numba hook
    if state.resident[block_id]:
        _unlink(state, block_id)
        _push_most_recent(state, block_id)
        return 0
    if state.counters[1] == 0:
        return 0
    evicted = 0
    if state.counters[0] >= state.counters[1]:
        victim = state.next[state.resident.shape[0]]
        _unlink(state, victim)
        state.resident[victim] = False
        state.counters[0] -= 1
        evicted = 1
    _push_most_recent(state, block_id)
    state.resident[block_id] = True
    state.counters[0] += 1
    return evicted


def used(state):  # noqa: ANN001 - numba hook
    return state.counters[0]


register_kernel(LRUState, contains=contains, access=access, used=used)

SPEC = PolicySpec(
    name="lru",
    summary="evict the least recently used block",
    models="vLLM v1 free-queue order (least recently freed first), LMCache LRU, SGLang 'lru'",
    reference=LRU,
    make_state=make_state,
)
