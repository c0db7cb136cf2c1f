"""LFU: evict the block with the fewest accesses since it was inserted; ties go to LRU.

A block's count starts at 1 on insertion, grows by 1 on every hit and is forgotten on
eviction (no history outside the cache). Among blocks of equal count the least recently
used is evicted.

The reference keeps frequency buckets of ``OrderedDict`` (the O(1) LFU of Shah, Mitra and
Matani); the kernel keeps one intrusive doubly linked list over dense block ids, ordered
by (count, recency) — the victim is always the first block — plus ``group_tail[f]``, the
last (most recent) block of count ``f``. A hit moves a block behind the last block of
count ``f + 1`` (or of count ``f`` if there is none, or leaves it in place if it was
alone): O(1) per access, no search.

libCacheSim's ``LFU`` (libcachesim 0.3.5) keeps per-frequency lists to whose tail a
block is appended when it reaches that frequency, evicting the head of the lowest
non-empty one: that is the same order (a block enters its current frequency list at its
last access). Checked against libcachesim 0.3.5 (one block per request, or
``hit_semantics="independent"`` with ``touch_order="tail_most_recent"``) on small id
streams, the Mooncake conversation trace and a 10 M-reference chat trace: identical hits.

References:
    K. Shah, A. Mitra, D. Matani, "An O(1) algorithm for implementing the LFU cache
    eviction scheme", 2010; libCacheSim ``cache/eviction/LFU.c``
    (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import list_insert_after, list_pop_front, list_unlink, make_lists
from kvlab.traces.flat import FlatTrace


class LFU:
    """Reference LFU cache over block ids (readable; the oracle for the kernel).

    Models in-cache LFU with LRU tie-breaking (libCacheSim's ``LFU``).

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.

    Raises:
        ValueError: negative or non-integer capacity.

    References:
        Shah, Mitra, Matani 2010; libCacheSim ``LFU.c``.

    Example:
        >>> cache = LFU(capacity_blocks=3)
        >>> [cache.access(k, i) for i, k in enumerate([1, 2, 1, 3])]
        [[], [], [], []]
        >>> cache.access(4, 4)  # 2 and 3 were accessed once; 2 less recently
        [2]
        >>> cache.access(5, 5)  # 3 and 4 once; 3 less recently
        [3]
        >>> cache.counts()
        {1: 2, 4: 1, 5: 1}
    """

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._count: dict[int, int] = {}
        self._buckets: dict[int, OrderedDict[int, None]] = {}  # count -> blocks, least recent first
        self._min_count = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._count

    def __len__(self) -> int:
        return len(self._count)

    def counts(self) -> dict[int, int]:
        """Access count of every resident block, sorted by block id."""
        return dict(sorted(self._count.items()))

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Count a hit on ``block_id`` or insert it with count 1; return evicted ids."""
        count = self._count.get(block_id)
        if count is not None:
            bucket = self._buckets[count]
            del bucket[block_id]
            if not bucket:
                del self._buckets[count]
                if self._min_count == count:
                    self._min_count = count + 1
            self._count[block_id] = count + 1
            self._buckets.setdefault(count + 1, OrderedDict())[block_id] = None
            return []
        if self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._count) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._count[block_id] = 1
        self._buckets.setdefault(1, OrderedDict())[block_id] = None
        self._min_count = 1
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        Its count is forgotten, as on eviction: if it comes back it starts at 1."""
        if block_id not in self._count:
            return False
        self._drop(block_id)
        return True

    def evict(self) -> int | None:
        """Evict the block of lowest count, least recently used among equals (the victim
        of the next insertion into a full cache); ``None`` if nothing is resident."""
        if not self._count:
            return None
        victim = next(iter(self._buckets[self._min_count]))
        self._drop(victim)
        return victim

    def _drop(self, block_id: int) -> None:
        count = self._count.pop(block_id)
        bucket = self._buckets[count]
        del bucket[block_id]
        if not bucket:
            del self._buckets[count]
            if count == self._min_count:
                self._min_count = min(self._buckets, default=0)


class LFUState(NamedTuple):
    """Kernel state: ``prev``/``next`` links (``int32[num_keys + 1]``, sentinel at
    ``num_keys``; ``next[sentinel]`` is the victim: lowest count, least recent),
    ``count`` (``int32[num_keys]``, 0 = not resident), ``group_tail`` (``int32[max_refs +
    2]``: the most recent block of each count, the sentinel when none; ``max_refs`` is the
    most references of one block in the trace, the highest count possible) and
    ``counters`` (``int64[2]``: used, capacity)."""

    prev: np.ndarray
    next: np.ndarray
    count: np.ndarray
    group_tail: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LFUState:
    """Empty LFU state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    n = flat.num_keys
    max_refs = int(np.bincount(flat.block_ids).max()) if flat.num_refs else 0
    prev, nxt = make_lists(n, 1)
    return LFUState(prev, nxt, np.zeros(n, dtype=np.int32), np.full(max_refs + 2, n, dtype=np.int32),
                    np.array([0, capacity_blocks], dtype=np.int64))


@kernel_jit(inline="always")
def _hit(prev, nxt, count, group_tail, block_id):  # noqa: ANN001, ANN202
    """A hit: the block becomes the most recent block of count ``f + 1`` (behind the last
    block of that count, or of count ``f`` if there is none, or in place if it was alone)."""
    sentinel = count.shape[0]
    f = count[block_id]
    before = prev[block_id]
    if group_tail[f] == block_id:
        group_tail[f] = before if before != sentinel and count[before] == f else sentinel
    after = group_tail[f + 1]
    if after == sentinel:
        after = group_tail[f]
    if after != sentinel:  # else it was alone at count f: its place is right
        list_unlink(prev, nxt, block_id)
        list_insert_after(prev, nxt, after, block_id)
    count[block_id] = f + 1
    group_tail[f + 1] = block_id


@kernel_jit(inline="always")
def _evict(prev, nxt, count, group_tail):  # noqa: ANN001, ANN202
    """Evict the first block (lowest count, least recent; it heads the list, so its own
    ``prev`` need not be read) and return it; its count is forgotten."""
    victim = list_pop_front(prev, nxt, count.shape[0])
    if group_tail[count[victim]] == victim:
        group_tail[count[victim]] = count.shape[0]
    count[victim] = 0
    return victim


@kernel_jit(inline="always")
def _insert(prev, nxt, count, group_tail, block_id):  # noqa: ANN001, ANN202
    """A new block, count 1: behind the count-1 blocks, or first."""
    list_insert_after(prev, nxt, group_tail[1], block_id)
    count[block_id] = 1
    group_tail[1] = block_id


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.count[block_id] > 0


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    prev, nxt, count, group_tail, counters = state.prev, state.next, state.count, state.group_tail, \
        state.counters
    used, capacity = counters[0], counters[1]
    num_evicted = 0
    for j in range(stop - start):
        block_id = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        if count[block_id] > 0:
            _hit(prev, nxt, count, group_tail, block_id)
            continue
        if capacity == 0:
            continue
        if used >= capacity:  # evict the first block: lowest count, least recent
            victim = _evict(prev, nxt, count, group_tail)
            used -= 1
            evicted[num_evicted] = victim
            num_evicted += 1
        _insert(prev, nxt, count, group_tail, block_id)
        used += 1
    counters[0] = used
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook
    _hit(state.prev, state.next, state.count, state.group_tail, block_id)


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook
    _insert(state.prev, state.next, state.count, state.group_tail, block_id)
    state.counters[0] += 1


def evict(state) -> int:  # noqa: ANN001 - numba hook
    if state.counters[0] == 0:
        return -1
    victim = _evict(state.prev, state.next, state.count, state.group_tail)
    state.counters[0] -= 1
    return victim


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    prev, count, group_tail = state.prev, state.count, state.group_tail
    f = count[block_id]
    if f == 0:
        return False
    if group_tail[f] == block_id:  # the block before it, if of the same count, ends the group now
        before = prev[block_id]
        group_tail[f] = before if before != count.shape[0] and count[before] == f else count.shape[0]
    list_unlink(prev, state.next, block_id)
    count[block_id] = 0
    state.counters[0] -= 1
    return True


register_kernel(LFUState, contains=contains, access=access, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="lfu",
    summary="evict the block with the fewest accesses since insertion (ties: least recently used)",
    models="in-cache LFU, O(1) (Shah et al. 2010); libCacheSim 'LFU' (identical hits)",
    reference=LFU,
    make_state=make_state,
)
