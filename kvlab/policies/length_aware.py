"""Length-aware LFU: evict the least frequently used block, earlier-in-request blocks first.

Mooncake's LengthAwareCache is "similar to LFU but prioritizing cache blocks occurring
later in requests" (arXiv 2407.00079 §4, Table 1); the paper gives no formula. kvlab's
choice: each resident block has a score ``(count, depth)``, compared lexicographically,
and the block with the lowest score is evicted, ties going to the least recently used.

* ``count``: accesses since the block was inserted (1 on insertion, +1 per hit; forgotten
  on eviction, like :mod:`kvlab.policies.lfu`);
* ``depth``: the deepest position (0-based index of the block within its request) at
  which the block was accessed since its insertion. Under chained keys a key is always at
  the same position (it has that many ancestors), so ``depth`` is the chain depth.

So among equally frequent blocks the ones that sit early in requests go first and the
later ones are kept. A position is a property of a *reference* (``i - offsets[r]``), so
the reference class needs the trace: pass ``requests`` (the per-request block keys, in
replay order); without it every position is 0 and the policy is plain LFU with LRU ties.

The reference scans its resident blocks for the minimum; the kernel keeps them in an
indexed binary min-heap on ``(count, depth, last access)`` (``O(log c)`` per access).

References:
    R. Qin et al., "Mooncake: A KVCache-centric Disaggregated Architecture for LLM
    Serving", arXiv 2407.00079, §4 (Table 1, "LengthAwareCache").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import heap_push, heap_sift
from kvlab.traces.flat import FlatTrace


class LengthAware:
    """Reference length-aware LFU cache over block ids (the oracle for the kernel).

    Models Mooncake's LengthAwareCache (arXiv 2407.00079 §4) with kvlab's formula:
    evict the lowest ``(count, depth)``, ties by LRU (see the module docstring).

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.
        requests: the trace's block keys per request, in replay order; ``ref_index``
            of :meth:`access` is a flat position in it (as :func:`kvlab.sim.replay_reference`
            passes). ``None``: every position is 0 (plain LFU).

    Raises:
        ValueError: negative or non-integer capacity.

    Example:
        >>> cache = LengthAware(capacity_blocks=3, requests=[[1, 2, 3], [4]])
        >>> [cache.access(k, i) for i, k in enumerate([1, 2, 3])]
        [[], [], []]
        >>> cache.access(4, 3)  # all seen once; 1 sits earliest in its request
        [1]
        >>> cache.scores()
        {2: (1, 1), 3: (1, 2), 4: (1, 0)}
    """

    def __init__(self, capacity_blocks: int | None, requests: Sequence[Sequence[int]] | None = None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self._position = [i for keys in requests or () for i in range(len(keys))]
        self._score: dict[int, list[int]] = {}  # block -> [count, depth, last access]
        self._clock = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._score

    def __len__(self) -> int:
        return len(self._score)

    def scores(self) -> dict[int, tuple[int, int]]:
        """``(count, depth)`` of each resident block."""
        return {k: (s[0], s[1]) for k, s in self._score.items()}

    def access(self, block_id: int, ref_index: int) -> list[int]:
        """Touch ``block_id`` (count + 1) or insert it (count 1); return evicted ids."""
        self._clock += 1
        position = self._position[ref_index] if ref_index < len(self._position) else 0
        score = self._score.get(block_id)
        if score is not None:
            score[0] += 1
            score[1] = max(score[1], position)
            score[2] = self._clock
            return []
        if self.capacity_blocks == 0:
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._score) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._score[block_id] = [1, position, self._clock]
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction); ``False`` if it was not resident.
        Its count and depth are forgotten, as on eviction (it returns with count 1)."""
        return self._score.pop(block_id, None) is not None

    def evict(self) -> int | None:
        """Evict the block of lowest ``(count, depth)``, least recent among equals (the
        victim of the next insertion into a full cache); ``None`` if nothing is resident."""
        if not self._score:
            return None
        victim = min(self._score, key=lambda k: tuple(self._score[k]))
        del self._score[victim]
        return victim


class LengthAwareState(NamedTuple):
    """Kernel state: per block ``count``, ``depth``, ``last`` (``int64[num_keys]``) and
    ``slot`` (``int32[num_keys]``, heap index, -1 = not resident); ``heap``
    (``int32[capacity + 1]``); ``position`` (``int32[num_refs]``, index of each reference
    within its request); ``counters`` (``int64[3]``: used, capacity, clock)."""

    count: np.ndarray
    depth: np.ndarray
    last: np.ndarray
    slot: np.ndarray
    heap: np.ndarray
    position: np.ndarray
    counters: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> LengthAwareState:
    """Empty state for ``flat.num_keys`` block ids and the given capacity (blocks), with
    the position of every reference within its request."""
    n = flat.num_keys
    position = (np.arange(flat.num_refs, dtype=np.int64)
                - np.repeat(flat.offsets[:-1], flat.blocks_per_request())).astype(np.int32)
    return LengthAwareState(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                            np.full(n, -1, np.int32), np.zeros(capacity_blocks + 1, np.int32), position,
                            np.array([0, capacity_blocks, 0], dtype=np.int64))


@kernel_jit(inline="always")
def _lower(scores, a, b):  # noqa: ANN001, ANN202 - the heap's order: lowest (count, depth, last access) first
    count, depth, last = scores
    if count[a] != count[b]:
        return count[a] < count[b]
    if depth[a] != depth[b]:
        return depth[a] < depth[b]
    return last[a] < last[b]


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.slot[block_id] >= 0


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    count, depth, last, slot, heap = state.count, state.depth, state.last, state.slot, state.heap
    position, counters = state.position, state.counters
    used, capacity, clock = counters[0], counters[1], counters[2]
    num_evicted = 0
    for j in range(stop - start):
        i = stop - 1 - j if reverse else start + j
        x = block_ids[i]
        clock += 1
        if slot[x] >= 0:  # hit: the score only grows, so the block sinks
            count[x] += 1
            depth[x] = max(depth[x], position[i])
            last[x] = clock
            heap_sift(heap, slot, slot[x], used, _lower, (count, depth, last))
        elif capacity == 0:
            continue
        else:
            count[x] = 1
            depth[x] = position[i]
            last[x] = clock
            if used >= capacity:  # the root is the victim; x takes its place
                victim = heap[0]
                slot[victim] = -1
                evicted[num_evicted] = victim
                num_evicted += 1
                heap[0] = x
                heap_sift(heap, slot, 0, used, _lower, (count, depth, last))
            else:
                used = heap_push(heap, slot, x, used, _lower, (count, depth, last))
    counters[0] = used
    counters[2] = clock
    return num_evicted


register_kernel(LengthAwareState, contains=contains, access=access)

SPEC = PolicySpec(
    name="length_aware",
    summary="evict the lowest (access count, depth in request); ties by LRU",
    models="Mooncake LengthAwareCache (arXiv 2407.00079 §4), kvlab's formula",
    reference=LengthAware,
    make_state=make_state,
    reference_uses_trace=True,
)
