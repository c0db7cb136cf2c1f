"""FIFO: evict the block inserted earliest; a hit does not change the order.

The reference keeps a ``dict`` (insertion ordered); the kernel a ring buffer of block ids
in insertion order. A replay (``access``) only ever removes the oldest block, so its ring —
the first ``capacity_blocks`` slots — has no holes and the cursor ``head`` is the oldest
block once the cache is full. A tier (the tier hooks) can also remove any block: its
entry stays in the ring as a *stale* entry, skipped when it reaches the head
(``stale[k]`` counts block ``k``'s stale entries; they are older than its live one, so
the oldest entry of ``k`` is stale while the count is positive); the ring is then
``2 * capacity_blocks`` slots, compacted when stale entries fill it (at most once per
``capacity_blocks`` removals).

libCacheSim's ``FIFO`` (libcachesim 0.3.5, ``libcachesim.FIFO``) inserts at the head and
evicts the tail, with no update on a hit: the same policy. Checked against libcachesim
0.3.5 (one block per request, or ``hit_semantics="independent"`` with
``touch_order="tail_most_recent"``) on small id streams, the Mooncake conversation trace
and a 10 M-reference chat trace: identical hits.

The Mooncake team's simulator (kvcache-ai/kvcache-blog) inserts a request's blocks head
first: it equals this FIFO with ``touch_order="tail_most_recent"``, not the default (docs/README.md).

References:
    libCacheSim ``cache/eviction/FIFO.c`` (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
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
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._order: dict[int, None] = {}  # insertion order: first = oldest

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def resident(self) -> list[int]:
        """Resident block ids, oldest (next victim) first."""
        return list(self._order)

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
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
    """Kernel state: ``ring`` (``int32[2 * capacity]``: the entries in insertion order from
    ``head``, stale ones included; a replay uses the first half), ``resident``
    (``bool[num_keys]``), ``stale`` (``int32[num_keys]``, stale entries per block) and
    ``counters`` (``int64[5]``: used, capacity, head, entries in the ring, stale entries).
    A state is driven by ``access`` or by the tier hooks, never both."""

    ring: np.ndarray
    resident: np.ndarray
    stale: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> FIFOState:
    """Empty FIFO state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    return FIFOState(np.zeros(2 * capacity_blocks, dtype=np.int32), np.zeros(flat.num_keys, dtype=np.bool_),
                     np.zeros(flat.num_keys, dtype=np.int32), np.array([0, capacity_blocks, 0, 0, 0], dtype=np.int64))


@kernel_jit(inline="always")
def _reverse(ring, lo, hi):  # noqa: ANN001, ANN202 - reverse ring[lo:hi] in place
    hi -= 1
    while lo < hi:
        ring[lo], ring[hi] = ring[hi], ring[lo]
        lo += 1
        hi -= 1


@kernel_jit
def _compact(ring, stale, head):  # noqa: ANN001, ANN202
    """Drop the stale entries of a ring full of entries, in place, keeping the order from
    slot 0 (rotated first so that the oldest entry is at slot 0); returns the entries kept."""
    size = ring.shape[0]
    _reverse(ring, 0, head)
    _reverse(ring, head, size)
    _reverse(ring, 0, size)
    n = 0
    for i in range(size):
        k = ring[i]
        if stale[k] > 0:
            stale[k] -= 1
        else:
            ring[n] = k
            n += 1
    return n


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.resident[block_id]


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    # a replay never removes: the entries are the resident blocks, in the ring's first half
    ring, resident, counters = state.ring, state.resident, state.counters
    used, capacity, head = counters[0], counters[1], counters[2]
    num_evicted = 0
    if capacity == 0:
        return 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        if resident[block_id]:
            continue
        if used == capacity:  # full: the head slot holds the oldest block; the new one takes it
            victim = ring[head]
            resident[victim] = False
            evicted[num_evicted] = victim
            num_evicted += 1
            ring[head] = block_id
            head = head + 1 if head + 1 < capacity else 0
        else:
            ring[used] = block_id
            used += 1
        resident[block_id] = True
    counters[0], counters[2], counters[3] = used, head, used
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001, ARG001 - numba hook: a hit changes nothing
    return None


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    ring, counters = state.ring, state.counters
    size = ring.shape[0]
    if counters[3] == size:  # full of entries, many stale
        counters[3], counters[2], counters[4] = _compact(ring, state.stale, counters[2]), 0, 0
    tail = counters[2] + counters[3]
    ring[tail - size if tail >= size else tail] = block_id
    counters[3] += 1
    state.resident[block_id] = True
    counters[0] += 1


def evict(state) -> int:  # noqa: ANN001 - numba hook
    ring, stale, counters = state.ring, state.stale, state.counters
    if counters[0] == 0:
        return -1
    head, filled, holes = counters[2], counters[3], counters[4]
    while True:  # the oldest entry, skipping stale ones
        victim = ring[head]
        head = head + 1 if head + 1 < ring.shape[0] else 0
        filled -= 1
        if holes == 0 or stale[victim] == 0:
            break
        stale[victim] -= 1
        holes -= 1
    counters[2], counters[3], counters[4] = head, filled, holes
    state.resident[victim] = False
    counters[0] -= 1
    return victim


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    if not state.resident[block_id]:
        return False
    state.resident[block_id] = False
    state.stale[block_id] += 1
    state.counters[4] += 1
    state.counters[0] -= 1
    return True


register_kernel(FIFOState, contains=contains, access=access, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="fifo",
    summary="evict the block inserted earliest (hits do not reorder)",
    models="FIFO; libCacheSim 'FIFO' (identical hits)",
    reference=FIFO,
    make_state=make_state,
)
