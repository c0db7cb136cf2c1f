"""SIEVE: a FIFO queue with a visited bit and a hand that sifts from old to new.

New blocks go to the head (newest end) with the visited bit clear; a hit sets the bit
and moves nothing. To evict, the hand starts where it last stopped (at the tail, the
oldest block, on the first eviction or after it passed the head), clears the bit of
every visited block it passes while moving towards the head (wrapping to the tail),
and evicts the first unvisited block; it then rests on the block newer than the victim
(or, if the victim was the newest, nowhere: the next sweep starts at the tail).

The kernel keeps an intrusive doubly linked list over dense block ids (arrays
``newer``/``older`` with a sentinel at index ``num_keys``: ``newer[sentinel]`` is the tail
(oldest), ``older[sentinel]`` the head (newest)) and the hand as a block id (the
sentinel meaning "start at the tail").

This follows libCacheSim's ``Sieve`` (``Sieve_evict``) step for step, including where
the hand rests after evicting the newest block. Checked against libcachesim 0.3.5 (one
block per request, or ``hit_semantics="independent"`` with ``touch_order=
"tail_most_recent"``) on small id streams, the Mooncake conversation trace and a
10 M-reference chat trace: identical hits.

References:
    Zhang, Yang, Yue, Vigfusson, Rashmi, "SIEVE is Simpler than LRU: an Efficient
    Turn-Key Eviction Algorithm for Web Caches", NSDI 2024; libCacheSim
    ``cache/eviction/Sieve.c`` (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import list_push_back, list_unlink, make_lists
from kvlab.traces.flat import FlatTrace


class Sieve:
    """Reference SIEVE cache over block ids (readable; the oracle for the kernel).

    Models SIEVE (Zhang et al., NSDI'24) as libCacheSim's ``Sieve`` implements it.

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.

    Raises:
        ValueError: negative or non-integer capacity.

    References:
        Zhang et al., NSDI 2024; libCacheSim ``Sieve.c``.

    Example:
        >>> cache = Sieve(capacity_blocks=3)
        >>> [cache.access(k, i) for i, k in enumerate([1, 2, 3, 1])]
        [[], [], [], []]
        >>> cache.access(4, 4)  # the hand clears 1 (visited) and evicts 2
        [2]
        >>> cache.access(5, 5)  # the hand rests on 3: unvisited, evicted
        [3]
        >>> cache.resident()
        [1, 4, 5]
    """

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._queue: list[int] = []  # oldest (tail) first, newest (head) last
        self._visited: dict[int, bool] = {}
        self._hand: int | None = None  # index into _queue; None = start at the tail

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._visited

    def __len__(self) -> int:
        return len(self._queue)

    def resident(self) -> list[int]:
        """Resident block ids, oldest (tail) first."""
        return list(self._queue)

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Mark ``block_id`` visited, or insert it at the head; return evicted ids."""
        if block_id in self._visited:
            self._visited[block_id] = True
            return []
        if self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._queue) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._queue.append(block_id)
        self._visited[block_id] = False
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        The others keep their order and visited bits. If the hand rests on the removed
        block it moves to the block newer than it (the next one it would examine), or,
        if that was the newest, nowhere (the next sweep starts at the tail) — where it
        rests after evicting that block, and what libCacheSim's ``Sieve_remove_obj``
        does (``pointer = obj->queue.prev``, its ``prev`` pointing towards the head)."""
        if block_id not in self._visited:
            return False
        i = self._queue.index(block_id)
        del self._queue[i]
        del self._visited[block_id]
        if self._hand is not None:
            if i < self._hand:
                self._hand -= 1  # the same block, one place lower in the list
            if self._hand >= len(self._queue):
                self._hand = None
        return True

    def evict(self) -> int | None:
        """Run the hand to the first unvisited block and evict it (the victim of the
        next insertion into a full cache), clearing visited bits on the way; ``None`` if
        nothing is resident."""
        if not self._queue:
            return None
        i = 0 if self._hand is None else self._hand
        while self._visited[self._queue[i]]:
            self._visited[self._queue[i]] = False
            i = (i + 1) % len(self._queue)
        victim = self._queue.pop(i)
        del self._visited[victim]
        self._hand = i if i < len(self._queue) else None  # the block newer than the victim
        return victim


class SieveState(NamedTuple):
    """Kernel state: ``newer``/``older`` links (``int32[num_keys + 1]``, sentinel at
    ``num_keys``), ``visited`` and ``resident`` (``bool[num_keys]``), ``counters``
    (``int64[3]``: used, capacity, hand — a block id, or the sentinel for "the tail")."""

    newer: np.ndarray
    older: np.ndarray
    visited: np.ndarray
    resident: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> SieveState:
    """Empty SIEVE state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    n = flat.num_keys
    older, newer = make_lists(n, 1)
    return SieveState(newer, older, np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_),
                      np.array([0, capacity_blocks, n], dtype=np.int64))


@kernel_jit(inline="always")
def _sift(newer, older, visited, hand):  # noqa: ANN001, ANN202
    """Run the hand from where it rests (the sentinel: the tail) towards the head, wrapping
    to the tail, clearing visited bits, to the first unvisited block; unlink it and return
    ``(victim, hand)``, the hand resting on the block newer than the victim."""
    sentinel = visited.shape[0]
    victim = newer[sentinel] if hand == sentinel else hand
    while visited[victim]:
        visited[victim] = False
        victim = newer[victim]
        if victim == sentinel:
            victim = newer[sentinel]
    hand = newer[victim]
    list_unlink(older, newer, victim)
    return victim, hand


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.resident[block_id]


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    newer, older, visited, resident, counters = state.newer, state.older, state.visited, state.resident, \
        state.counters
    sentinel = resident.shape[0]
    used, capacity, hand = counters[0], counters[1], counters[2]
    num_evicted = 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        if resident[block_id]:
            visited[block_id] = True
            continue
        if capacity == 0:
            continue
        if used >= capacity:
            victim, hand = _sift(newer, older, visited, hand)
            resident[victim] = False
            used -= 1
            evicted[num_evicted] = victim
            num_evicted += 1
        list_push_back(older, newer, sentinel, block_id)  # as the newest
        visited[block_id] = False
        resident[block_id] = True
        used += 1
    counters[0] = used
    counters[2] = hand
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook
    state.visited[block_id] = True


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    list_push_back(state.older, state.newer, state.resident.shape[0], block_id)
    state.visited[block_id] = False
    state.resident[block_id] = True
    state.counters[0] += 1


def evict(state) -> int:  # noqa: ANN001 - numba hook
    counters = state.counters
    if counters[0] == 0:
        return -1
    victim, counters[2] = _sift(state.newer, state.older, state.visited, counters[2])
    state.resident[victim] = False
    counters[0] -= 1
    return victim


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook: a hand resting on it moves to the newer block
    if not state.resident[block_id]:
        return False
    if state.counters[2] == block_id:
        state.counters[2] = state.newer[block_id]
    list_unlink(state.older, state.newer, block_id)
    state.resident[block_id] = False
    state.counters[0] -= 1
    return True


register_kernel(SieveState, contains=contains, access=access, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="sieve",
    summary="FIFO with a visited bit; a hand sifts old to new and evicts the first unvisited block",
    models="SIEVE (Zhang et al., NSDI'24); libCacheSim 'Sieve' (identical hits)",
    reference=Sieve,
    make_state=make_state,
)
