"""The numba replay of write-back with promotion (no tier of capacity 0): one LRU list split by recency.

Under write-back with promotion the tiers hold disjoint blocks and every access moves its
block to the top, so the tiers are one LRU list over their summed capacity, cut by
recency: tier 0 the most recent ``capacity[0]`` blocks, then tier 1 ... A demotion is
then a boundary moving by one block instead of an unlink and an insert. The same results
as :func:`kvlab.tiers.kernel.tiered_replay_range`, exactly, faster.

``nodes`` (``int32[slots + 1, 4]``: block, previous and next slot, tier; the sentinel
last, its next the least recent block; free slots chained through next) over
``min(sum(capacity), n_keys)`` slots, ``loc[k]`` the slot of block ``k`` (-1: absent).
A block's tier lives in its slot (a boundary move rewrites the crossing slot's, whose
node the move reads anyway), so an access reads ``loc[k]`` and one 16-byte node, and a
demotion touches no per-block table. ``bound[t]`` is the slot of tier ``t``'s least
recent block (-1: empty); a tier is full whenever a lower one holds blocks. The slots'
``loc`` and nodes are prefetched a few references ahead, in two stages.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from kvlab.tiers.kernel import (
    COUNTERS,
    DEMOTED_IN,
    DEMOTED_OUT,
    EVICTED,
    HIT,
    KEY,
    NEXT,
    PREV,
    PROMOTED_IN,
    PROMOTED_OUT,
    QUERIED,
    READ,
    WRITTEN,
    _prefetch,
    _record_used,
)

#: Column of :attr:`ExclusiveState.nodes` holding the slot's tier.
TIER = 3
#: References ahead whose ``loc`` entry is prefetched, (nearer) whose node is, and (nearer
#: still) whose neighbours in the list are (an access unlinks its block).
PREFETCH_LOC, PREFETCH_NODE, PREFETCH_LINKS = 12, 6, 3


class ExclusiveState(NamedTuple):
    """Kernel state of write-back with promotion (see the module docstring)."""

    loc: np.ndarray
    nodes: np.ndarray
    bound: np.ndarray
    free: np.ndarray
    capacity: np.ndarray
    used: np.ndarray
    counters: np.ndarray


def make_exclusive_state(n_keys: int, capacities_blocks: list[int | None]) -> ExclusiveState:
    """Empty :class:`ExclusiveState` (every capacity must be ``None`` or > 0).

    Example:
        >>> state = make_exclusive_state(10, [2, None])
        >>> state.capacity.tolist(), state.nodes.shape
        ([2, 10], (11, 4))
    """
    capacity = np.array([n_keys if c is None else min(int(c), n_keys) for c in capacities_blocks], dtype=np.int64)
    if (capacity <= 0).any():
        raise ValueError(f"the exclusive kernel needs capacities > 0, got {capacities_blocks}")
    n_slots = int(min(capacity.sum(), n_keys))
    if n_slots >= 2**31 - 1:
        raise ValueError(f"the exclusive kernel addresses at most 2**31 - 2 slots, got {n_slots + 1}")
    nodes = np.full((n_slots + 1, 4), -1, dtype=np.int32)
    nodes[:n_slots, NEXT] = np.arange(1, n_slots + 1)
    nodes[n_slots - 1, NEXT] = -1
    nodes[n_slots, PREV] = nodes[n_slots, NEXT] = n_slots
    n_tiers = len(capacity)
    return ExclusiveState(np.full(n_keys, -1, dtype=np.int32), nodes, np.full(n_tiers, -1, dtype=np.int64),
                          np.array([0], dtype=np.int64), capacity, np.zeros(n_tiers, dtype=np.int64),
                          np.zeros((n_tiers, len(COUNTERS)), dtype=np.int64))


@njit(nogil=True)
def exclusive_replay_range(offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                           state: ExclusiveState, hit_blocks: np.ndarray, used_log: np.ndarray,
                           n_logged: np.ndarray) -> None:
    """:func:`kvlab.tiers.kernel.tiered_replay_range` for write-back with promotion (same
    arguments but the state, same results)."""
    loc, nodes, bound, free = state.loc, state.nodes, state.bound, state.free
    capacity, used, counters = state.capacity, state.used, state.counters
    n_tiers = capacity.shape[0]
    last = n_tiers - 1
    sentinel = nodes.shape[0] - 1
    n_refs = block_ids.shape[0]
    queried = np.zeros(n_tiers + 1, dtype=np.int64)  # a difference array over the tiers
    hit = np.zeros(n_tiers, dtype=np.int64)
    # events, counted at the end: reads (below the top: promotions), crossings down, stores, drops
    read = np.zeros(n_tiers, dtype=np.int64)
    crossed = np.zeros(n_tiers, dtype=np.int64)
    stored = 0
    dropped = 0
    free_slot = free[0]
    logged = n_logged[0]
    dirty = True  # the resident blocks per tier may differ from the last logged
    for r in range(start, stop):
        a = offsets[r]
        b = offsets[r + 1]
        n = b - a
        for q in range(a + PREFETCH_LOC, min(b + PREFETCH_LOC, n_refs)):
            _prefetch(loc, block_ids[q])
        for q in range(a + PREFETCH_NODE, min(b + PREFETCH_NODE, n_refs)):
            s = loc[block_ids[q]]
            if s >= 0:
                _prefetch(nodes, s)
        for q in range(a + PREFETCH_LINKS, min(b + PREFETCH_LINKS, n_refs)):
            s = loc[block_ids[q]]
            if s >= 0:
                _prefetch(nodes, nodes[s, PREV])
                _prefetch(nodes, nodes[s, NEXT])
        for t in range(n_tiers):  # the blocks about to cross a boundary, and the next to drop
            c = bound[t]
            if c >= 0:
                _prefetch(nodes, nodes[c, NEXT])
        if bound[last] >= 0:
            _prefetch(loc, nodes[bound[last], KEY])
        # the lookup walk: the combined contiguous prefix (queried: a tier first asked at
        # block p is asked about n - p blocks)
        asked = 0
        for p in range(n):
            s = loc[block_ids[a + p]]
            w = nodes[s, TIER] if s >= 0 else n_tiers
            deepest = min(w, last) + 1
            if deepest > asked:
                queried[asked] += n - p
                queried[deepest] -= n - p
                asked = deepest
            if w >= n_tiers:
                break
            hit_blocks[r, w] += 1
            hit[w] += 1
        for j in range(n):
            k = block_ids[b - 1 - j] if reverse else block_ids[a + j]
            s = loc[k]
            if s >= 0:
                t = nodes[s, TIER]
                if t == 0:  # a top-tier hit: touch
                    read[0] += 1
                    if nodes[sentinel, PREV] == s:
                        continue  # already the most recent
                    if s == bound[0]:
                        bound[0] = nodes[s, NEXT]  # not the most recent: tier 0 holds another block
                    p = nodes[s, PREV]
                    q = nodes[s, NEXT]
                    nodes[p, NEXT] = q
                    nodes[q, PREV] = p
                    mru = nodes[sentinel, PREV]
                    nodes[mru, NEXT] = s
                    nodes[s, PREV] = mru
                    nodes[s, NEXT] = sentinel
                    nodes[sentinel, PREV] = s
                    continue
                # a lower-tier hit: move it to the top
                read[t] += 1
                emptied = t
                if s == bound[t]:
                    bound[t] = nodes[s, NEXT] if used[t] > 1 else -1
                used[t] -= 1
                p = nodes[s, PREV]
                q = nodes[s, NEXT]
                nodes[p, NEXT] = q
                nodes[q, PREV] = p
            elif used[last] == capacity[last]:  # computed, every tier full: reuse the least recent's slot
                s = bound[last]
                bound[last] = nodes[s, NEXT] if used[last] > 1 else -1
                p = nodes[s, PREV]
                q = nodes[s, NEXT]
                nodes[p, NEXT] = q
                nodes[q, PREV] = p
                loc[nodes[s, KEY]] = -1
                used[last] -= 1
                emptied = last
                dropped += 1
                nodes[s, KEY] = k
                loc[k] = s
                stored += 1
            else:  # computed: a free slot
                emptied = -1
                s = free_slot
                free_slot = nodes[s, NEXT]
                nodes[s, KEY] = k
                loc[k] = s
                stored += 1
            mru = nodes[sentinel, PREV]
            nodes[mru, NEXT] = s
            nodes[s, PREV] = mru
            nodes[s, NEXT] = sentinel
            nodes[sentinel, PREV] = s
            nodes[s, TIER] = 0
            u = 0
            while used[u] == capacity[u]:  # a full tier: its least recent block crosses down
                c = bound[u]
                bound[u] = nodes[c, NEXT]
                nodes[c, TIER] = u + 1
                crossed[u] += 1
                s = c
                u += 1
            used[u] += 1
            if used[u] == 1:
                bound[u] = s
            if u != emptied:
                dirty = True
        if dirty:
            logged = _record_used(used, used_log, logged, r)
            dirty = False
    n_logged[0] = logged
    free[0] = free_slot
    total = 0
    for t in range(n_tiers):
        total += queried[t]
        counters[t, QUERIED] += total
        counters[t, HIT] += hit[t]
    counters[0, WRITTEN] += stored
    counters[last, EVICTED] += dropped
    for t in range(n_tiers):
        counters[t, READ] += read[t]
        counters[t, EVICTED] += crossed[t]
        counters[t, DEMOTED_OUT] += crossed[t]
        if t > 0:
            counters[t, PROMOTED_OUT] += read[t]
            counters[0, PROMOTED_IN] += read[t]
            counters[0, WRITTEN] += read[t]
            counters[t, DEMOTED_IN] += crossed[t - 1]
            counters[t, WRITTEN] += crossed[t - 1]
