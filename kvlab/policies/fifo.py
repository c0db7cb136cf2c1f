"""FIFO: evict the block inserted earliest; a hit does not change the order.

The reference keeps a ``dict`` (insertion ordered); the kernel a ring buffer of
``capacity_blocks`` slots whose cursor points at the oldest block once the cache is full
(insertions fill the slots in order, and only the oldest is ever removed, so the ring
never has holes).

libCacheSim's ``FIFO`` (libcachesim 0.3.5, ``libcachesim.FIFO``) inserts at the head and
evicts the tail, with no update on a hit: the same policy. Checked against libcachesim
0.3.5 (one block per request, or ``hit_semantics="independent"`` with
``touch_order="tail_most_recent"``) on small id streams, the Mooncake conversation trace
and a 10 M-reference chat trace: identical hits.

References:
    libCacheSim ``cache/eviction/FIFO.c`` (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvlab.policies.base import PolicySpec, check_capacity, register_kernel
from kvlab.traces.flat import FlatTrace


class FIFO:
    """Reference FIFO cache over block ids (readable; the oracle for the kernel).

    Models first-in-first-out eviction: the victim is the resident block inserted
    earliest, whatever its hits since. Same as libCacheSim's ``FIFO``.

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.

    Raises:
        ValueError: negative or non-integer capacity.

    References:
        libCacheSim ``FIFO.c``.

    Example:
        >>> cache = FIFO(capacity_blocks=2)
        >>> cache.access(1, 0), cache.access(2, 1), cache.access(1, 2)
        ([], [], [])
        >>> cache.access(3, 3)  # 1 was inserted first; its hit does not save it
        [1]
        >>> cache.resident()
        [2, 3]
    """

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = check_capacity(capacity_blocks)
        self._order: dict[int, None] = {}  # insertion order: first = oldest

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def resident(self) -> list[int]:
        """Resident block ids, oldest (next victim) first."""
        return list(self._order)

    def access(self, block_id: int, ref_index: int) -> list[int]:
        """Insert ``block_id`` if missing (a hit changes nothing); return evicted ids."""
        if block_id in self._order or self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._order) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._order[block_id] = None
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        The others keep their insertion order."""
        if block_id not in self._order:
            return False
        del self._order[block_id]
        return True

    def evict(self) -> int | None:
        """Evict the oldest inserted block (the victim of the next insertion into a full
        cache); ``None`` if nothing is resident."""
        if not self._order:
            return None
        victim = next(iter(self._order))
        del self._order[victim]
        return victim


class FIFOState(NamedTuple):
    """Kernel state: ``ring`` (``int32[capacity]``, resident ids in insertion order
    from the cursor), ``resident`` (``bool[n_keys]``) and ``counters`` (``int64[3]``:
    used, capacity, cursor — the next slot to fill, which is the oldest block once full)."""

    ring: np.ndarray
    resident: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> FIFOState:
    """Empty FIFO state for ``flat.n_keys`` block ids and the given capacity (blocks)."""
    return FIFOState(np.zeros(capacity_blocks, dtype=np.int32), np.zeros(flat.n_keys, dtype=np.bool_),
                     np.array([0, capacity_blocks, 0], dtype=np.int64))


def contains(state, block_id):  # noqa: ANN001 - numba hook
    return state.resident[block_id]


def access(state, block_ids, start, stop, reverse, evicted):  # noqa: ANN001 - numba hook
    ring, resident, counters = state.ring, state.resident, state.counters
    used, capacity, cursor = counters[0], counters[1], counters[2]
    n_evicted = 0
    if capacity == 0:
        return 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        if resident[block_id]:
            continue
        if used == capacity:  # full: the cursor slot holds the oldest block
            victim = ring[cursor]
            resident[victim] = False
            evicted[n_evicted] = victim
            n_evicted += 1
        else:
            used += 1
        ring[cursor] = block_id
        resident[block_id] = True
        cursor += 1
        if cursor == capacity:
            cursor = 0
    counters[0] = used
    counters[2] = cursor
    return n_evicted


register_kernel(FIFOState, contains=contains, access=access)

SPEC = PolicySpec(
    name="fifo",
    summary="evict the block inserted earliest (hits do not reorder)",
    models="FIFO; libCacheSim 'FIFO' (identical hits)",
    reference=FIFO,
    make_state=make_state,
)
