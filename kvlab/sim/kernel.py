"""The numba replay driver: hits, then touch/insert, for any registered policy.

The driver is generic over the policy: it calls the hooks of
:mod:`kvlab.policies.base`, and numba compiles one specialisation per policy state
type, compiled without numba's reference counting (``_nrt=False``, see
:mod:`kvlab.policies.base`). It is cached on disk by :func:`kvlab.core.jit.kernel_jit`,
keyed on a digest of every kvlab source (numba's own cache would not notice an edit to a
policy module, and a stale kernel would silently disagree with its reference class).

Orphan tracking (optional) counts resident blocks whose parent block is not resident —
unreachable under chained hashing, yet occupying capacity. It keeps a shadow of the
residency and, per key, its number of resident children, and updates the count from
the blocks each request touched and the victims the policy reports::

    insert k:  children[parent(k)] += 1;  orphans += [parent(k) absent];  orphans -= children[k]
    evict  k:  children[parent(k)] -= 1;  orphans -= [parent(k) absent];  orphans += children[k]

(``parent = -1`` marks a first block, which is never an orphan.) Applying the flips
one at a time against the shadow keeps the count exact whatever their order.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.policies.base import each_block, kernel_access, kernel_contains, kernel_replay_independent, kernel_used


def make_orphan_tracker(parents: np.ndarray, enabled: bool) -> tuple[np.ndarray, ...]:
    """Arrays for orphan tracking: parents, shadow residency, resident-children counts,
    and the running orphan count (empty arrays when disabled)."""
    n = parents.shape[0] if enabled else 0
    return (parents if enabled else np.zeros(0, dtype=np.int64), np.zeros(n, dtype=np.bool_),
            np.zeros(n, dtype=np.int64), np.zeros(1, dtype=np.int64))


@kernel_jit(inline="always")
def _flip(parents: np.ndarray, shadow: np.ndarray, children: np.ndarray, count: np.ndarray, k: int) -> None:
    p = parents[k]
    if shadow[k]:
        shadow[k] = False
        if p >= 0:
            children[p] -= 1
            if not shadow[p]:
                count[0] -= 1
        count[0] += children[k]
    else:
        shadow[k] = True
        if p >= 0:
            children[p] += 1
            if not shadow[p]:
                count[0] += 1
        count[0] -= children[k]


@kernel_jit(nogil=True, _nrt=False)
def replay_range(offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                 independent: bool, state, evicted: np.ndarray,  # noqa: ANN001
                 parents: np.ndarray, shadow: np.ndarray, children: np.ndarray, count: np.ndarray,
                 hit_blocks: np.ndarray, used_blocks: np.ndarray, evictions: np.ndarray,
                 orphans: np.ndarray) -> None:
    """Replay requests ``start..stop-1`` of a flat trace through a policy's state.

    For each request ``r``: with prefix semantics (``independent=False``) the hit is
    the longest run of leading blocks that are resident, then every block is accessed —
    from the tail to the head when ``reverse`` (the head ends most recent, as vLLM frees
    a request's blocks in reverse), else from the head to the tail. With
    ``independent=True`` each block, in that order, is looked up and then accessed on
    its own (a plain object cache, as libCacheSim replays a request stream), and the hit
    counts every resident block.

    Args:
        offsets: ``int64[num_requests + 1]`` CSR offsets.
        block_ids: ``int32[num_refs]`` dense block ids.
        start, stop: request range to replay (state carries over between calls).
        reverse: touch order, ``True`` = head most recent.
        independent: per-block lookups instead of the prefix cut-off.
        state: a registered policy state (``NamedTuple`` of arrays), mutated.
        evicted: scratch for the policy's victims, at least the longest request long.
        parents, shadow, children, count: orphan tracking
            (:func:`make_orphan_tracker`; empty arrays turn it off).
        hit_blocks, used_blocks, evictions, orphans: ``int32[num_requests]`` outputs —
            hit blocks, resident blocks after the request, blocks evicted by it, and
            orphaned resident blocks after it (0 when not tracked).
    """
    track = shadow.shape[0] > 0
    if independent and not track:  # the policy's own loop over the requests
        kernel_replay_independent(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks, used_blocks,
                                  evictions)
        return
    for r in range(start, stop):
        a = offsets[r]
        b = offsets[r + 1]
        h = 0
        ev = 0
        if independent:  # each block looked up, then accessed on its own
            h, ev = each_block(state, block_ids, a, b, reverse, evicted)
        else:
            while a + h < b and kernel_contains(state, block_ids[a + h]):
                h += 1
            ev = kernel_access(state, block_ids, a, b, reverse, evicted)
        hit_blocks[r] = h
        evictions[r] = ev
        used_blocks[r] = kernel_used(state)
        if track:
            for q in range(ev):
                k = evicted[q]
                if shadow[k] and not kernel_contains(state, k):
                    _flip(parents, shadow, children, count, k)
            for i in range(a, b):
                k = block_ids[i]
                if shadow[k] != kernel_contains(state, k):
                    _flip(parents, shadow, children, count, k)
            orphans[r] = count[0]
