"""S3-FIFO: a small FIFO filtering one-hit wonders, a main FIFO with 2-bit reinsertion, and
a ghost FIFO of ids recently evicted from the small queue — as libCacheSim's ``S3FIFO``.

Rules (libCacheSim ``S3FIFO.c``, step for step):

* a resident block has a counter: 0 on insertion, +1 per hit, capped at 3 (2 bits);
* a missing block goes to the main queue if its id is in the ghost (the id leaves it),
  else to the small queue — except that until the first eviction a block arriving when
  the small queue is full goes to main (libCacheSim's current ``S3FIFO.c``; the original
  ``S3FIFOv0.c`` and the paper always use the small queue);
* when full, evict from main if it holds more than its share or small is empty, else from
  small. Small: its oldest block moves to main (counter reset to 0) if its counter is
  ≥ ``move_to_main_threshold``, and the next is tried; else it is evicted and its id
  appended to the ghost (dropping the oldest ghost id when full); if small empties, evict
  from main. Main: its oldest block, if its counter is > 0, is decremented and reinserted
  at the tail, and the next is tried; else it is evicted.

Parameters (defaults = libCacheSim's, libcachesim 0.3.5): ``small_size_ratio = 0.1``
(small queue ``int(capacity * ratio)`` blocks, main the rest), ``ghost_size_ratio = 0.9``
(ghost ``int(capacity * ratio)`` ids; the paper sizes it like main — equal when the
capacity is a multiple of 10), ``move_to_main_threshold = 2`` (the paper's ``freq > 1``:
two hits in small earn a place in main).

Against libcachesim 0.3.5 (one block per request, ``hit_semantics="independent"``,
forward order): identical hits on every id stream tried, with default and other
parameters, whenever the small queue has ≥ 2 blocks (capacity ≥ 20 at the defaults), and
on the Mooncake conversation trace and a 10 M-reference chat trace. Below that libCacheSim degenerates — a 0-block small
queue is refused, and into a 1-block one it admits nothing (it rejects blocks as large as
the small queue), so it caches nothing. kvlab gives the small queue at least 1 block.

The kernel links the three queues through one pair of ``prev``/``next`` arrays over dense
block ids (a block is in at most one queue: a ghost id leaves the ghost when accessed).

References:
    Yang, Zhang, Qiu, Yue, Vinayak, "FIFO queues are all you need for cache eviction",
    SOSP 2023; libCacheSim ``cache/eviction/S3FIFO.c`` (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count, check_int, check_real
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import list_pop_front, list_push_back, list_unlink, make_lists
from kvlab.traces.flat import FlatTrace

SMALL, MAIN, GHOST = 1, 2, 3  # queue codes in the kernel's ``where``; 0 = nowhere


def queue_sizes(capacity_blocks: int, small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9,
                move_to_main_threshold: int = 2) -> tuple[int, int, int]:
    """``(small, main, ghost)`` queue sizes in blocks for a capacity, as libCacheSim sizes
    them (``int(capacity * ratio)``), except that the small queue gets at least 1 block.

    Raises:
        ValueError: a ratio outside ``(0, 1)`` / ``[0, 10]``, or a threshold not in 1..3 (names it).

    Example:
        >>> queue_sizes(100), queue_sizes(25), queue_sizes(5)
        ((10, 90, 90), (2, 23, 22), (1, 4, 4))
    """
    ratio = small_size_ratio
    try:
        small_size_ratio = check_real("small_size_ratio", ratio, low=0.0, high=1.0, low_open=True)
    except ValueError:
        small_size_ratio = 1.0
    if small_size_ratio == 1.0:  # an open interval: main gets something
        raise ValueError(f"small_size_ratio must be a finite number in (0.0, 1.0), got {ratio!r}")
    ghost_size_ratio = check_real("ghost_size_ratio", ghost_size_ratio, low=0.0, high=10.0)
    check_int("move_to_main_threshold", move_to_main_threshold, low=1, high=3)
    small = max(int(capacity_blocks * small_size_ratio), 1) if capacity_blocks > 0 else 0
    return small, capacity_blocks - small, int(capacity_blocks * ghost_size_ratio)


class S3FIFO:
    """Reference S3-FIFO cache over block ids (readable; the oracle for the kernel).

    Models S3-FIFO (Yang et al., SOSP'23) as libCacheSim's ``S3FIFO`` implements it
    (the module docstring gives the rules and the differences).

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.
        small_size_ratio, ghost_size_ratio, move_to_main_threshold: see
            :func:`queue_sizes` and the module docstring.

    Raises:
        ValueError: negative or non-integer capacity, or a bad parameter.

    References:
        Yang et al., SOSP 2023; libCacheSim ``S3FIFO.c``.

    Example:
        >>> cache = S3FIFO(capacity_blocks=3)  # small 1, main 2, ghost 2
        >>> [cache.access(k, i) for i, k in enumerate([1, 2, 3, 4, 2])]
        [[], [], [], [1], []]
        >>> cache.queues()  # 2 and 3 went to main (small was full before any eviction)
        {'small': [4], 'main': [2, 3], 'ghost': [1]}
        >>> cache.access(1, 5)  # a ghost hit: 4 (small, never hit) makes room, 1 goes to main
        [4]
        >>> cache.access(5, 6)  # main is over its share: 2 (hit once) is reinserted, 3 evicted
        [3]
        >>> cache.queues()
        {'small': [5], 'main': [1, 2], 'ghost': [4]}
    """

    def __init__(self, capacity_blocks: int | None, *, small_size_ratio: float = 0.1,
                 ghost_size_ratio: float = 0.9, move_to_main_threshold: int = 2) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        sizes = queue_sizes(self.capacity_blocks or 0, small_size_ratio, ghost_size_ratio, move_to_main_threshold)
        self._small_size, self._main_size, self._ghost_size = sizes
        self._threshold = move_to_main_threshold
        self._small: OrderedDict[int, int] = OrderedDict()  # block -> counter, oldest first
        self._main: OrderedDict[int, int] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._has_evicted = False

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._small or block_id in self._main

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def queues(self) -> dict[str, list[int]]:
        """Block ids of the small, main and ghost queues, oldest first."""
        return {"small": list(self._small), "main": list(self._main), "ghost": list(self._ghost)}

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Count a hit on ``block_id`` or insert it; return evicted ids (at most one)."""
        for queue in (self._small, self._main):
            if block_id in queue:
                queue[block_id] = min(queue[block_id] + 1, 3)
                return []
        if self.capacity_blocks == 0:
            return []
        ghost_hit = block_id in self._ghost
        if ghost_hit:
            del self._ghost[block_id]
        evicted = []
        bounded = self.capacity_blocks is not None
        if bounded and len(self) >= self.capacity_blocks:
            evicted.append(self._evict())
        if ghost_hit or (bounded and not self._has_evicted and len(self._small) >= self._small_size):
            self._main[block_id] = 0
        else:
            self._small[block_id] = 0
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction) from whichever queue holds it;
        ``False`` if it was not resident. Its counter is forgotten and its id does *not*
        enter the ghost queue (it was not evicted); the other queues and the "anything
        evicted yet" flag are unchanged."""
        for queue in (self._small, self._main):
            if block_id in queue:
                del queue[block_id]
                return True
        return False

    def evict(self) -> int | None:
        """Evict one block exactly as the insertion of a block not in the ghost would
        (:meth:`access` on a full cache): the same steps, including moving small-queue
        blocks with counter ≥ the threshold to main, reinserting main blocks with counter
        > 0 (decremented), appending a small-queue victim to the ghost, and setting the
        "anything evicted yet" flag. ``None`` if nothing is resident."""
        return self._evict() if len(self) else None

    def _evict(self) -> int:
        self._has_evicted = True
        if self._small and len(self._main) <= self._main_size:  # from small, until one is evicted
            while self._small:
                victim, counter = self._small.popitem(last=False)
                if counter >= self._threshold:
                    self._main[victim] = 0
                    continue
                if len(self._ghost) >= self._ghost_size > 0:
                    self._ghost.popitem(last=False)
                if self._ghost_size:
                    self._ghost[victim] = None
                return victim
        while True:
            victim, counter = self._main.popitem(last=False)
            if counter == 0:
                return victim
            self._main[victim] = counter - 1


class S3FIFOState(NamedTuple):
    """Kernel state: ``prev``/``next`` links (``int32[num_keys + 3]``; sentinels ``num_keys``,
    ``num_keys + 1``, ``num_keys + 2`` head the small, main and ghost queues, ``next[sentinel]``
    the oldest), ``where`` (``int8[num_keys]``: 0 nowhere, 1 small, 2 main, 3 ghost),
    ``freq`` (``int8[num_keys]``, 0..3) and ``counters`` (``int64[9]``: blocks in small,
    main, ghost; capacity; small, main, ghost sizes; move-to-main threshold; whether
    anything was evicted yet)."""

    prev: np.ndarray
    next: np.ndarray
    where: np.ndarray
    freq: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int, *, small_size_ratio: float = 0.1,
               ghost_size_ratio: float = 0.9, move_to_main_threshold: int = 2) -> S3FIFOState:
    """Empty S3-FIFO state for ``flat.num_keys`` block ids and the given capacity (blocks).

    Raises:
        ValueError: a bad parameter (see :func:`queue_sizes`).
    """
    n = flat.num_keys
    sizes = queue_sizes(capacity_blocks, small_size_ratio, ghost_size_ratio, move_to_main_threshold)
    prev, nxt = make_lists(n, 3)
    return S3FIFOState(prev, nxt, np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.int8),
                       np.array([0, 0, 0, capacity_blocks, *sizes, move_to_main_threshold, 0], dtype=np.int64))


@kernel_jit(inline="always")
def _evict(prev, nxt, where, freq, counters):  # noqa: ANN001, ANN202
    """Evict one block of a non-empty cache (the module docstring's rules); returns it."""
    small_q, main_q, ghost_q = where.shape[0], where.shape[0] + 1, where.shape[0] + 2
    counters[8] = 1  # something was evicted
    victim = -1
    if counters[0] > 0 and counters[1] <= counters[5]:
        while victim < 0 and counters[0] > 0:  # small's oldest: to main if hit enough, else out
            k = list_pop_front(prev, nxt, small_q)
            counters[0] -= 1
            if freq[k] >= counters[7]:
                list_push_back(prev, nxt, main_q, k)
                where[k], freq[k] = MAIN, 0
                counters[1] += 1
                continue
            victim, where[k] = k, 0
            if counters[6] > 0:
                if counters[2] >= counters[6]:  # drop the oldest ghost id
                    where[list_pop_front(prev, nxt, ghost_q)] = 0
                    counters[2] -= 1
                list_push_back(prev, nxt, ghost_q, k)
                where[k] = GHOST
                counters[2] += 1
    while victim < 0:  # main's oldest: reinserted with freq - 1 while freq > 0
        k = list_pop_front(prev, nxt, main_q)
        if freq[k] > 0:
            freq[k] -= 1
            list_push_back(prev, nxt, main_q, k)
        else:
            victim, where[k] = k, 0
            counters[1] -= 1
    return victim


@kernel_jit(inline="always")
def _leave_ghost(prev, nxt, where, counters, block_id):  # noqa: ANN001, ANN202
    """Take a missing block's id out of the ghost; returns whether it was there."""
    if where[block_id] != GHOST:
        return False
    list_unlink(prev, nxt, block_id)
    where[block_id] = 0
    counters[2] -= 1
    return True


@kernel_jit(inline="always")
def _insert(prev, nxt, where, freq, counters, block_id, ghost_hit):  # noqa: ANN001, ANN202
    """Insert a missing block into a cache with room: to main after a ghost hit, or while
    nothing was evicted and small is full; else to small."""
    to_main = ghost_hit or (counters[8] == 0 and counters[0] >= counters[4])
    list_push_back(prev, nxt, where.shape[0] + (1 if to_main else 0), block_id)
    where[block_id] = MAIN if to_main else SMALL
    freq[block_id] = 0
    counters[1 if to_main else 0] += 1


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return SMALL <= state.where[block_id] <= MAIN


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    prev, nxt, where, freq, counters = state.prev, state.next, state.where, state.freq, state.counters
    capacity = counters[3]
    num_evicted = 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        w = where[block_id]
        if w == SMALL or w == MAIN:  # hit
            freq[block_id] = min(freq[block_id] + 1, 3)
            continue
        if capacity == 0:
            continue
        ghost_hit = _leave_ghost(prev, nxt, where, counters, block_id)  # before anything is evicted
        if counters[0] + counters[1] >= capacity:
            evicted[num_evicted] = _evict(prev, nxt, where, freq, counters)
            num_evicted += 1
        _insert(prev, nxt, where, freq, counters, block_id, ghost_hit)
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook
    state.freq[block_id] = min(state.freq[block_id] + 1, 3)


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    ghost_hit = _leave_ghost(state.prev, state.next, state.where, state.counters, block_id)
    _insert(state.prev, state.next, state.where, state.freq, state.counters, block_id, ghost_hit)


def evict(state) -> int:  # noqa: ANN001 - numba hook
    if state.counters[0] + state.counters[1] == 0:
        return -1
    return _evict(state.prev, state.next, state.where, state.freq, state.counters)


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook: no ghost entry
    w = state.where[block_id]
    if w != SMALL and w != MAIN:
        return False
    list_unlink(state.prev, state.next, block_id)
    state.where[block_id] = 0
    state.counters[0 if w == SMALL else 1] -= 1
    return True


def used(state) -> int:  # noqa: ANN001 - numba hook
    return state.counters[0] + state.counters[1]


register_kernel(S3FIFOState, contains=contains, access=access, used=used, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="s3fifo",
    summary="S3-FIFO: small FIFO filter, main FIFO with 2-bit reinsertion, ghost of small's victims",
    models="S3-FIFO (Yang et al., SOSP'23) as libCacheSim 'S3FIFO' (defaults 0.1 / 0.9 / threshold 2)",
    reference=S3FIFO,
    make_state=make_state,
)
