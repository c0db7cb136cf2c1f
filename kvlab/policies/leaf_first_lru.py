"""Leaf-first LRU: evict the least recently used block that no resident block depends on.

SGLang's radix cache evicts only leaves: a node is freed when no cached node extends
it, the least recently used leaf first, so a cached prefix is never cut in the middle.
Here the tree is the trace's parent relation (a block's parent is the block before it
where the key first appears, :meth:`kvlab.traces.flat.FlatTrace.parent_ids`): a resident
block with a resident child is never evicted; among resident blocks without resident
children the least recently used (by last access) goes first. A parent whose last
resident child leaves becomes evictable at its own recency, not as most recent. Nothing
locks the running request's blocks (SGLang's ``lock_ref`` protects a matched prefix
while its request runs): with ``touch_order="head_most_recent"`` a request's tail is
inserted before its matched head is touched and can evict that prefix's last block;
``"tail_most_recent"`` (parents touched first) is the closer model of SGLang. A request
longer than the capacity still orphans blocks in that order: to insert its block ``j`` the
cache must evict the leaf ``j - 1`` it just inserted (measured on the bundled traces: none at
or above the longest request, 247 / 374 blocks; up to 7–10 % of a 16-block cache).

The reference needs the parent relation, which the driver's ``(block_id, ref_index)``
calls cannot carry (in forward order a request's first block looks like the previous
request's next one): pass ``requests``, the per-request block keys in replay order;
without it no block has a parent and the policy is plain LRU.

The kernel keeps, per block, its number of resident children and last access time, and
the leaves (resident blocks without resident children) in two structures ordered by last
access: an intrusive LRU list for blocks that became leaves by being accessed (appended
with the newest time, so it stays sorted) and an indexed binary min-heap for parents that
became leaves when their last child left (they return at their old time). The victim is
the older of the list's head and the heap's root. Under chained keys such a parent is
usually accessed right before or after its child, so it is usually the next victim: the
heap stays small and nearly every access is ``O(1)``.

References:
    L. Zheng et al., "SGLang: Efficient Execution of Structured Language Model
    Programs", NeurIPS 2024, §3 (RadixAttention, LRU leaf eviction); SGLang
    ``python/sglang/srt/mem_cache/radix_cache.py`` (``evict``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import heap_push, heap_remove, list_push_back, list_unlink, make_lists
from kvlab.traces.flat import FlatTrace


class LeafFirstLRU:
    """Reference leaf-first LRU cache over block ids (the oracle for the kernel).

    Models SGLang ``RadixCache.evict`` (LRU among leaves) at block granularity.

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.
        requests: the trace's block keys per request, in replay order: a key's parent
            is the key before it where it first appears. ``None``: no parents (LRU).

    Raises:
        ValueError: negative or non-integer capacity.

    Example:
        >>> cache = LeafFirstLRU(capacity_blocks=3, requests=[[1, 2], [3], [4]])
        >>> [cache.access(k, i) for i, k in enumerate([1, 2, 3])]
        [[], [], []]
        >>> cache.access(4, 3)  # 1 is least recent but 2 depends on it: the leaf 2 goes
        [2]
        >>> cache.access(5, 4)  # now 1 is a leaf again, and the least recent
        [1]
    """

    def __init__(self, capacity_blocks: int | None, requests: Sequence[Sequence[int]] | None = None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._parent: dict[int, int | None] = {}
        for keys in requests or ():
            for i, key in enumerate(keys):
                self._parent.setdefault(key, keys[i - 1] if i else None)
        self._last: dict[int, int] = {}  # resident block -> last access time
        self._clock = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._last

    def __len__(self) -> int:
        return len(self._last)

    def leaves(self) -> list[int]:
        """Resident blocks without a resident child, least recently used first."""
        parents = {self._parent.get(k) for k in self._last}
        return sorted((k for k in self._last if k not in parents), key=self._last.__getitem__)

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Touch ``block_id`` or insert it; return evicted ids."""
        self._clock += 1
        if block_id in self._last or self.capacity_blocks == 0:
            if block_id in self._last:
                self._last[block_id] = self._clock
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._last) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._last[block_id] = self._clock
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        Its parent no longer counts it as a resident child: with no other, the parent
        becomes a leaf at its own last access time. A removed inner block's resident
        children stay resident (nothing cascades); being a leaf depends only on a block's
        own children, so theirs does not change."""
        return self._last.pop(block_id, None) is not None

    def evict(self) -> int | None:
        """Evict the least recently used leaf (the victim of the next insertion into a
        full cache); ``None`` if nothing is resident."""
        if not self._last:
            return None
        victim = self.leaves()[0]  # a non-empty forest always has a leaf
        del self._last[victim]
        return victim


class LeafFirstLRUState(NamedTuple):
    """Kernel state: ``parent`` (``int64[num_keys]``, -1 = none); per block ``children``
    (``int32``, resident children), ``resident`` (``bool``), ``last`` (``int64``, last access
    time), ``where`` (``int8``: 0 not a queued leaf, 1 in the list, 2 in the heap) and
    ``slot`` (``int32``, heap index); the list's ``prev``/``next`` (``int32[num_keys + 1]``,
    sentinel ``num_keys``: ``next`` = least recent); ``heap`` (``int32[capacity + 1]``,
    min-heap on ``last``); ``counters`` (``int64[4]``: used, capacity, clock, heap size)."""

    parent: np.ndarray
    children: np.ndarray
    resident: np.ndarray
    last: np.ndarray
    where: np.ndarray
    slot: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    heap: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LeafFirstLRUState:
    """Empty state for ``flat.num_keys`` block ids and the given capacity (blocks), with the
    trace's parent relation."""
    n = flat.num_keys
    prev, nxt = make_lists(n, 1)
    return LeafFirstLRUState(flat.parent_ids(), np.zeros(n, np.int32), np.zeros(n, np.bool_), np.zeros(n, np.int64),
                             np.zeros(n, np.int8), np.full(n, -1, np.int32), prev, nxt,
                             np.zeros(capacity_blocks + 1, np.int32), np.array([0, capacity_blocks, 0, 0], np.int64))


@kernel_jit(inline="always")
def _older(last, a, b):  # noqa: ANN001, ANN202 - the heap's order: least recent first
    return last[a] < last[b]


@kernel_jit(inline="always")
def _unqueue(where, slot, prev, nxt, heap, last, k, size):  # noqa: ANN001, ANN202 - returns the heap size
    if where[k] == 1:
        list_unlink(prev, nxt, k)
    elif where[k] == 2:
        size = heap_remove(heap, slot, slot[k], size, _older, last)
    where[k] = 0
    return size


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.resident[block_id]


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    parent, children, resident, last, where = state.parent, state.children, state.resident, state.last, state.where
    slot, prev, nxt, heap, counters = state.slot, state.prev, state.next, state.heap, state.counters
    sentinel = resident.shape[0]
    used, capacity, clock, size = counters[0], counters[1], counters[2], counters[3]
    num_evicted = 0
    for j in range(stop - start):
        x = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        clock += 1
        if resident[x]:
            last[x] = clock
            if where[x] != 0:  # a leaf: now the most recent one
                size = _unqueue(where, slot, prev, nxt, heap, last, x, size)
                list_push_back(prev, nxt, sentinel, x)
                where[x] = 1
            continue
        if capacity == 0:
            continue
        if used >= capacity:  # the least recent leaf (a non-empty forest has one)
            k = nxt[sentinel]
            if k == sentinel or (size > 0 and last[heap[0]] < last[k]):
                k = heap[0]
            size = _unqueue(where, slot, prev, nxt, heap, last, k, size)
            resident[k] = False
            used -= 1
            evicted[num_evicted] = k
            num_evicted += 1
            p = parent[k]
            if p >= 0:
                children[p] -= 1
                if children[p] == 0 and resident[p]:  # a leaf again, at its own recency
                    size = heap_push(heap, slot, p, size, _older, last)
                    where[p] = 2
        resident[x] = True
        last[x] = clock
        used += 1
        p = parent[x]
        if p >= 0:
            children[p] += 1
            if children[p] == 1 and resident[p]:  # no longer a leaf
                size = _unqueue(where, slot, prev, nxt, heap, last, p, size)
        if children[x] == 0:
            list_push_back(prev, nxt, sentinel, x)
            where[x] = 1
    counters[0], counters[2], counters[3] = used, clock, size
    return num_evicted


register_kernel(LeafFirstLRUState, contains=contains, access=access)

SPEC = PolicySpec(
    name="leaf_first_lru",
    summary="evict the least recently used block with no resident child (prefix-aware LRU)",
    models="SGLang RadixCache leaf-first LRU eviction, at block granularity",
    reference=LeafFirstLRU,
    make_state=make_state,
    reference_uses_trace=True,
)
