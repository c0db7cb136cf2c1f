"""LRU: evict the least recently used block.

The reference is an ``OrderedDict``; the kernel keeps an intrusive doubly linked list
over dense block ids with a sentinel at index ``num_keys``, the same O(1) structure as
vLLM v1's ``FreeKVCacheBlockQueue``, in one interleaved array (``links[2k]`` = prev,
``links[2k + 1]`` = next: one cache line per block; ``prev = -1`` marks a block not
resident; :mod:`kvlab.policies.structs`).

The replay loop is branch-free once the cache is full: a hit unlinks the block, a miss
unlinks the least recent block (the victim), and either way the block is pushed back as
the most recent; which of the two is unlinked is chosen arithmetically from the block's
``prev`` sign, and the list's head (the next victim) is kept in a register. On a random
mix of hits and misses a branch on hit/miss is mispredicted about half the time, which
cost more than the list operations themselves (``benchmarks/README.md``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import links_push_back, links_unlink
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
    """Kernel state: ``links`` (``int32[2 * (num_keys + 1)]``: ``links[2k]`` is block ``k``'s
    prev, ``-1`` when it is not resident, ``links[2k + 1]`` its next; entry ``num_keys`` is
    the sentinel, whose next is the least and prev the most recent block) and ``counters``
    (``int64[2]``: used, capacity)."""

    links: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LRUState:
    """Empty LRU state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    n = flat.num_keys
    links = np.full(2 * (n + 1), -1, dtype=np.int32)
    links[2 * n] = links[2 * n + 1] = n  # the empty list: the sentinel links to itself
    return LRUState(links, np.array([0, capacity_blocks], dtype=np.int64))


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.links[np.uint64(2 * block_id)] >= 0


@kernel_jit(inline="always")
def _step(links, sentinel, first, used, capacity, k, evicted, num_evicted):  # noqa: ANN001, ANN202, PLR0913
    """Look up and access block ``k`` in a cache with ``capacity >= 1``; returns the new
    ``first`` (the least recent block), ``used`` and ``num_evicted``, and whether ``k`` was
    resident. Without a branch on hit or miss once the cache is full."""
    miss = np.int64(links[np.uint64(2 * k)]) >> 63  # -1: not resident, 0: resident
    if used < capacity and miss != 0:  # room: insert (only until the cache first fills)
        links_push_back(links, sentinel, k)
        return np.int64(links[np.uint64(2 * sentinel + 1)]), used + 1, num_evicted, 0
    u = k ^ ((k ^ first) & miss)  # a hit unlinks k, a miss the least recent block
    was_first = -np.int64(links[np.uint64(2 * u)] == sentinel)
    q = links_unlink(links, u)
    links[np.uint64(2 * u)] = -1
    first ^= (first ^ q) & was_first  # u's successor is the least recent now
    evicted[num_evicted] = u  # kept only on a miss (the caller's room: one per block)
    links_push_back(links, sentinel, k)
    if first == sentinel:  # the list was emptied (capacity 1): k is the least recent
        first = k
    return first, used, num_evicted - miss, 1 + miss


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    links, counters = state.links, state.counters
    used, capacity = counters[0], counters[1]
    if capacity == 0:
        return 0
    sentinel = np.int64(links.shape[0] // 2 - 1)
    first = np.int64(links[np.uint64(2 * sentinel + 1)])
    num_evicted = 0
    for j in range(stop - start):
        k = np.int64(block_ids[np.uint64(stop - 1 - j if reverse else start + j)])
        first, used, num_evicted, _ = _step(links, sentinel, first, used, capacity, k, evicted, num_evicted)
    counters[0] = used
    return num_evicted


def replay_independent(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks,  # noqa: ANN001, PLR0913
                       used_blocks, evictions) -> None:  # noqa: ANN001 - numba hook
    # LRU's access does the lookup: one loop over the requests, the list's head in a register
    links, counters = state.links, state.counters
    used, capacity = counters[0], counters[1]
    sentinel = np.int64(links.shape[0] // 2 - 1)
    first = np.int64(links[np.uint64(2 * sentinel + 1)])
    for r in range(start, stop):
        a = offsets[r]
        b = offsets[r + 1]
        hits = 0
        num_evicted = 0
        if capacity > 0:
            for j in range(b - a):
                k = np.int64(block_ids[np.uint64(b - 1 - j if reverse else a + j)])
                first, used, num_evicted, hit = _step(links, sentinel, first, used, capacity, k, evicted,
                                                      num_evicted)
                hits += hit
        hit_blocks[r] = hits
        evictions[r] = num_evicted
        used_blocks[r] = used
    counters[0] = used


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook
    links = state.links
    links_unlink(links, block_id)
    links_push_back(links, links.shape[0] // 2 - 1, block_id)


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    state.counters[0] += 1
    links_push_back(state.links, state.links.shape[0] // 2 - 1, block_id)


def evict(state) -> int:  # noqa: ANN001 - numba hook
    if state.counters[0] == 0:
        return -1
    links = state.links
    victim = links[np.uint64(links.shape[0] - 1)]  # the sentinel's next
    links_unlink(links, victim)
    links[np.uint64(2 * victim)] = -1
    state.counters[0] -= 1
    return victim


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    links = state.links
    if links[np.uint64(2 * block_id)] < 0:
        return False
    links_unlink(links, block_id)
    links[np.uint64(2 * block_id)] = -1
    state.counters[0] -= 1
    return True


register_kernel(LRUState, contains=contains, access=access, replay_independent=replay_independent, touch=touch,
                insert=insert, evict=evict, remove=remove)

SPEC = PolicySpec(
    name="lru",
    summary="evict the least recently used block",
    models="vLLM v1 free-queue order (least recently freed first), LMCache LRU, SGLang 'lru'",
    reference=LRU,
    make_state=make_state,
)
