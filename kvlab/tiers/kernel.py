"""The numba tiered replay: T tiers that all evict LRU, every write policy, promotion.

The fast counterpart of :meth:`kvlab.tiers.store.TieredStore.access_request` replayed
request by request (the readable reference and the tests' oracle): the same lookup walk
and order of touches, inserts, evictions and demotions, so the same hits, residency and
counters, exactly. Block ids are the trace's dense ids ``0 .. n_keys - 1``.

:func:`tiered_replay_range` (any write policy; :class:`TieredState`): ``where``
(``uint8[n_keys]``, bit ``t`` set when the block is in tier ``t`` — write-through keeps a
block in several tiers — so the fastest tier holding it is one table lookup; at most
:data:`MAX_TIERS` tiers), and per tier an LRU list over that tier's own slots:
``nodes`` (``int32[slots, 3]``: block, previous and next slot; each tier's sentinel's
next is its least recent block, its previous the most recent, as
:mod:`kvlab.policies.lru`; free slots chained through next), ``loc``
(``int32[n_keys, T]``, each block's slot per tier, valid where its ``where`` bit is set:
an eviction leaves it stale, sparing a random write). Slots keep a tier's list compact
in memory (a 20,000-block GPU tier stays in L2 whatever the key space) and an eviction
reuses its victim's slot. ``uses`` (saturating at ``selective_hits``) drives
``write_through_selective``. One block access is a touch and/or a sequence of inserts,
each evicting before it inserts (a tier never exceeds its capacity) and, under
write-back, cascading its victim down, run in a single loop (numba reference-counts the
arrays of every call it does not inline, so there is one insert site).

:func:`kvlab.tiers.kernel_exclusive.exclusive_replay_range` (write-back with promotion,
no tier of capacity 0) runs the same replay over one LRU list split by recency.

Both prefetch the residency of the blocks a few references ahead, their nodes and their
neighbours nearer, and the next victims: on a 1 M-object Zipf stream that hides much of
the memory latency. Both write per request only the hit blocks per tier; the resident
blocks per tier are logged where they change (:func:`_record_used`: once the tiers are
full, seldom), and :func:`request_columns` builds the frame's columns in one pass.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: Write policy codes of the kernel (index into :data:`kvlab.tiers.store.WRITE_POLICIES`).
WRITE_THROUGH, WRITE_BACK, WRITE_THROUGH_SELECTIVE = 0, 1, 2
#: At most this many tiers (the residency bitmap is ``uint8``).
MAX_TIERS = 8
#: Columns of :attr:`TieredState.counters` (the :class:`~kvlab.tiers.tier.TierCounters` fields a replay changes).
COUNTERS = ("queried_blocks", "hit_blocks", "read_blocks", "written_blocks", "promoted_in_blocks",
            "demoted_in_blocks", "evicted_blocks", "demoted_out_blocks", "promoted_out_blocks")
QUERIED, HIT, READ, WRITTEN, PROMOTED_IN, DEMOTED_IN, EVICTED, DEMOTED_OUT, PROMOTED_OUT = range(len(COUNTERS))

#: References ahead whose residency the kernel prefetches (see :func:`_prefetch_ahead`).
PREFETCH_REFS = 12
#: Columns of :attr:`TieredState.nodes`.
KEY, PREV, NEXT = 0, 1, 2
#: The fastest tier holding a block, from its residency byte (bit t: in tier t); 8 for none.
_FIRST_TIER = np.array([(m & -m).bit_length() - 1 if m else MAX_TIERS for m in range(256)], dtype=np.int64)


class TieredState(NamedTuple):
    """Kernel state of T LRU tiers over ``n_keys`` dense block ids (see the module docstring)."""

    where: np.ndarray
    loc: np.ndarray
    nodes: np.ndarray
    sentinel: np.ndarray
    free: np.ndarray
    uses: np.ndarray
    capacity: np.ndarray
    used: np.ndarray
    counters: np.ndarray


def make_tiered_state(n_keys: int, capacities_blocks: list[int | None]) -> TieredState:
    """Empty state for ``n_keys`` block ids and one capacity per tier (``None``: unbounded).

    Example:
        >>> state = make_tiered_state(10, [2, None])
        >>> state.capacity.tolist(), state.sentinel.tolist(), state.nodes.shape
        ([2, 10], [2, 13], (14, 3))
    """
    n_tiers = len(capacities_blocks)
    if not 1 <= n_tiers <= MAX_TIERS:
        raise ValueError(f"the tiered kernel takes 1 to {MAX_TIERS} tiers, got {n_tiers}")
    capacity = np.array([n_keys if c is None else min(int(c), n_keys) for c in capacities_blocks], dtype=np.int64)
    sentinel = np.cumsum(capacity + 1) - 1
    if sentinel[-1] >= 2**31 - 1:
        raise ValueError(f"the tiered kernel addresses at most 2**31 - 2 slots, got {int(sentinel[-1]) + 1}")
    nodes = np.full((int(sentinel[-1]) + 1, 3), -1, dtype=np.int32)
    for t in range(n_tiers):  # the free slots of each tier, chained through NEXT; the sentinel alone in its list
        base, s = sentinel[t] - capacity[t], sentinel[t]
        nodes[base:s, NEXT] = np.arange(base + 1, s + 1)
        nodes[s - 1 if capacity[t] else s, NEXT] = -1
        nodes[s, PREV] = nodes[s, NEXT] = s
    return TieredState(np.zeros(n_keys, dtype=np.uint8), np.full((n_keys, n_tiers), -1, dtype=np.int32), nodes,
                       sentinel, np.where(capacity > 0, sentinel - capacity, -1), np.zeros(n_keys, dtype=np.int32),
                       capacity, np.zeros(n_tiers, dtype=np.int64), np.zeros((n_tiers, len(COUNTERS)), dtype=np.int64))


@intrinsic
def _prefetch(typingctx, arr, i):  # noqa: ANN001, ARG001 - numba intrinsic
    """Hint the CPU to fetch the cache line of ``arr[i]`` (its row, for a 2-D array)."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        arrty = signature.args[0]
        ary = context.make_array(arrty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        index = [context.cast(builder, args[1], signature.args[1], types.intp)] + [zero] * (arrty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, arrty, ary, index, wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(),
                                                                                     [i8p, i32, i32, i32]))
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _prefetch_ahead(block_ids: np.ndarray, a: int, b: int, where: np.ndarray, loc: np.ndarray,
                    nodes: np.ndarray) -> None:
    """For the references ``a .. b - 1``, prefetch the residency of the blocks
    ``PREFETCH_REFS`` references ahead, the node of their fastest copy half as far, and its
    neighbours in the list (which an access unlinks) a quarter as far: hides much of the
    memory latency of a large key space."""
    n_refs = block_ids.shape[0]
    for q in range(a + PREFETCH_REFS, min(b + PREFETCH_REFS, n_refs)):
        k = block_ids[q]
        _prefetch(where, k)
        _prefetch(loc, k)
    for q in range(a + PREFETCH_REFS // 2, min(b + PREFETCH_REFS // 2, n_refs)):
        k = block_ids[q]
        t = _FIRST_TIER[where[k]]
        if t < MAX_TIERS:
            _prefetch(nodes, loc[k, t])
    for q in range(a + PREFETCH_REFS // 4, min(b + PREFETCH_REFS // 4, n_refs)):
        k = block_ids[q]
        t = _FIRST_TIER[where[k]]
        if t < MAX_TIERS:
            s = loc[k, t]
            _prefetch(nodes, nodes[s, PREV])
            _prefetch(nodes, nodes[s, NEXT])


@njit(inline="always")
def _unlink(nodes: np.ndarray, s: int) -> None:
    p = nodes[s, PREV]
    q = nodes[s, NEXT]
    nodes[p, NEXT] = q
    nodes[q, PREV] = p


@njit(inline="always")
def _push(nodes: np.ndarray, s: int, sentinel: int) -> None:
    last = nodes[sentinel, PREV]
    nodes[last, NEXT] = s
    nodes[s, PREV] = last
    nodes[s, NEXT] = sentinel
    nodes[sentinel, PREV] = s


@njit(inline="always")
def _lookup(block_ids: np.ndarray, a: int, n: int, where: np.ndarray, queried: np.ndarray, counters: np.ndarray,
            hits: np.ndarray, r: int) -> None:
    """The lookup walk of request ``r`` (blocks ``a .. a + n - 1``): ``hits[r, t]`` += the blocks
    tier ``t`` answers; ``queried`` is a difference array over the tiers (a tier first
    asked at block ``p`` is asked about ``n - p`` blocks: ``queried[lo] += n - p``,
    ``queried[hi + 1] -= n - p`` for the tiers ``lo .. hi`` first asked there)."""
    n_tiers = hits.shape[1]
    asked = 0  # tiers asked so far: 0 .. asked - 1
    for p in range(n):
        w = _FIRST_TIER[where[block_ids[a + p]]]
        deepest = min(w, n_tiers - 1) + 1
        if deepest > asked:
            queried[asked] += n - p
            queried[deepest] -= n - p
            asked = deepest
        if w >= n_tiers:
            break
        hits[r, w] += 1
        counters[w, HIT] += 1


@njit(inline="always")
def _fold_queried(queried: np.ndarray, counters: np.ndarray) -> None:
    total = 0
    for t in range(counters.shape[0]):
        total += queried[t]
        counters[t, QUERIED] += total


@njit(inline="always")
def _record_used(used: np.ndarray, used_log: np.ndarray, m: int, r: int) -> int:
    """Log the resident blocks per tier after request ``r`` if they differ from the last
    logged (rows ``0 .. m - 1`` of ``used_log``: the request, then one column per tier);
    returns the rows logged. They change seldom once the tiers are full, so the log stays
    short (and a preallocated ``np.empty`` log is never touched beyond it)."""
    n_tiers = used.shape[0]
    changed = m == 0
    t = 0
    while not changed and t < n_tiers:
        changed = used_log[m - 1, t + 1] != used[t]
        t += 1
    if changed:
        used_log[m, 0] = r
        for t in range(n_tiers):
            used_log[m, t + 1] = used[t]
        m += 1
    return m


@njit(nogil=True)
def max_request_blocks(offsets: np.ndarray) -> int:
    """The longest request's blocks (0 if none), from the CSR ``offsets``."""
    longest = 0
    for r in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[r + 1] - offsets[r])
    return longest


@njit(nogil=True)
def request_columns(offsets: np.ndarray, input_tokens: np.ndarray, block_size: int, skip: int,
                    hit_blocks: np.ndarray, used_log: np.ndarray, hits: np.ndarray, used: np.ndarray,
                    total: np.ndarray, computed: np.ndarray, tier_hits: np.ndarray) -> tuple[int, int, int]:
    """The per-request columns of a replay in one pass, into ``hits`` and ``used``
    (``uint32[T, n_requests]``, tier by tier: hit blocks, and resident blocks after the
    request expanded from ``used_log`` as :func:`expand_used`), ``total`` and ``computed``
    (``uint32[n_requests]``: hit blocks over the tiers, and the rest) — numpy's arrays:
    it asks the kernel for huge pages, which a 10 M-request frame faults in much faster —
    and over the requests from ``skip`` on: hit blocks per tier (into ``tier_hits``,
    ``int64[T]``, zeroed), and returned, hit blocks, hit tokens (full blocks as
    ``block_size`` tokens, at most the input) and input tokens."""
    n, n_tiers = hit_blocks.shape
    hit_sum = 0
    hit_tokens = 0
    n_inputs = 0
    row = 0
    for r in range(n):
        while row + 1 < used_log.shape[0] and used_log[row + 1, 0] <= r:
            row += 1
        h = 0
        for t in range(n_tiers):
            x = hit_blocks[r, t]
            hits[t, r] = x
            h += x
            used[t, r] = used_log[row, t + 1]
        total[r] = h
        computed[r] = offsets[r + 1] - offsets[r] - h
        if r >= skip:
            for t in range(n_tiers):
                tier_hits[t] += hit_blocks[r, t]
            hit_sum += h
            hit_tokens += min(h * block_size, input_tokens[r])
            n_inputs += input_tokens[r]
    return hit_sum, hit_tokens, n_inputs


def expand_used(used_log: np.ndarray, n_requests: int) -> np.ndarray:
    """The resident blocks per tier after each request (``[n_requests, T]``) from a
    log of the kernels (its rows: the request where they changed, then one per tier)."""
    counts = np.diff(np.append(used_log[:, 0], n_requests))
    return np.repeat(used_log[:, 1:], counts, axis=0)


@njit(nogil=True)
def tiered_replay_range(offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                        write_policy: int, promote: bool, selective_hits: int, state: TieredState,
                        hit_blocks: np.ndarray, used_log: np.ndarray, n_logged: np.ndarray) -> None:
    """Replay requests ``start .. stop - 1`` (``offsets``: ``int64`` CSR, ``block_ids``:
    ``int32`` dense ids) through the tiers of ``state`` (mutated; it carries over between
    calls). Per request: the lookup (the combined contiguous prefix, each block answered
    by the fastest tier holding it), then every block accessed — from the tail to the
    head when ``reverse`` (``touch_order="head_most_recent"``) — served from the fastest
    tier holding it now or, resident nowhere, stored. ``write_policy`` is
    :data:`WRITE_THROUGH`, :data:`WRITE_BACK` or :data:`WRITE_THROUGH_SELECTIVE`.
    Outputs: ``hit_blocks`` (``[n_requests, T]``, zeroed on entry, any integer type
    holding a request's length) per tier; the resident blocks per tier after each request
    logged where they change (``used_log``, ``int32[n_requests, T + 1]``; ``n_logged[0]``
    rows, carried over between calls; see :func:`expand_used`); counters in
    ``state.counters``.
    """
    where, loc, nodes, sentinel, free, uses = state.where, state.loc, state.nodes, state.sentinel, state.free, \
        state.uses
    capacity, used, counters = state.capacity, state.used, state.counters
    n_tiers = capacity.shape[0]
    write_back = write_policy == WRITE_BACK
    selective = write_policy == WRITE_THROUGH_SELECTIVE
    queried = np.zeros(n_tiers + 1, dtype=np.int64)
    sentinel0 = sentinel[0]
    logged = n_logged[0]
    dirty = True  # the resident blocks per tier may differ from the last logged
    for r in range(start, stop):
        a = offsets[r]
        n = offsets[r + 1] - a
        _prefetch_ahead(block_ids, a, a + n, where, loc, nodes)
        for t in range(n_tiers):  # the next victims of the full tiers, with their successors
            if used[t] >= capacity[t] and capacity[t] > 0:
                s = nodes[sentinel[t], NEXT]
                _prefetch(where, nodes[s, KEY])
                _prefetch(nodes, nodes[s, NEXT])
        _lookup(block_ids, a, n, where, queried, counters, hit_blocks, r)
        # ---- access every block in touch order
        for j in range(n):
            k = block_ids[a + n - 1 - j] if reverse else block_ids[a + j]
            m = where[k]
            if selective and uses[k] < selective_hits:
                uses[k] += 1
            if m & 1:  # served from the top tier: touch
                counters[0, READ] += 1
                s = loc[k, 0]
                _unlink(nodes, s)
                _push(nodes, s, sentinel0)
                if not selective or uses[k] < selective_hits:
                    continue
            # the inserts this access makes: tiers down_from, down_from - 1, ... (n_down of
            # them, promoted in), then the tiers up_from .. up_to - 1 that lack the block
            n_down = 0
            down_from = 0
            up_from = 0
            up_to = 0
            t = _FIRST_TIER[m]
            if m == 0:  # computed: store per the write policy
                up_to = n_tiers if write_policy == WRITE_THROUGH else 1
            elif t > 0:  # served from a lower tier
                s = loc[k, t]
                counters[t, READ] += 1
                _unlink(nodes, s)
                up = 0  # exclusive promotion: to the first tier above that stores anything
                while up < t and capacity[up] == 0:
                    up += 1
                if write_back and promote and up < t:  # move it up
                    nodes[s, NEXT] = free[t]
                    free[t] = s
                    where[k] = 0
                    used[t] -= 1
                    dirty = True
                    counters[t, PROMOTED_OUT] += 1
                    n_down = 1
                    down_from = up
                else:  # touch (in place, or no tier above can take it)
                    _push(nodes, s, sentinel[t])
                    if promote and not write_back:  # copy into every tier above
                        n_down = t
                        down_from = t - 1
            if selective and uses[k] >= selective_hits:  # copy down to every lower tier
                up_from = 0 if m == 0 else 1
                up_to = n_tiers
            for step in range(n_down + up_to - up_from):
                if step < n_down:
                    u = down_from - step
                    promoted = True
                else:
                    u = up_from + step - n_down
                    promoted = False
                    if where[k] >> u & 1:
                        continue
                while capacity[u] == 0 and write_back and u + 1 < n_tiers:  # does not fit: next tier
                    u += 1
                if capacity[u] == 0:
                    continue
                block = k
                while True:  # insert block into u: evict first, then, under write-back, demote the victim
                    victim = -1
                    if used[u] >= capacity[u]:  # the least recent block's slot is reused
                        s = nodes[sentinel[u], NEXT]
                        victim = nodes[s, KEY]
                        _unlink(nodes, s)
                        where[victim] &= ~np.uint8(1 << u)  # its loc goes stale: where says absent
                        counters[u, EVICTED] += 1
                    else:
                        s = free[u]
                        free[u] = nodes[s, NEXT]
                        used[u] += 1
                        dirty = True
                    nodes[s, KEY] = block
                    _push(nodes, s, sentinel[u])
                    where[block] |= np.uint8(1 << u)
                    loc[block, u] = s
                    counters[u, WRITTEN] += 1
                    if promoted:
                        counters[u, PROMOTED_IN] += 1
                        promoted = False
                    if victim < 0 or not write_back:
                        break  # nothing evicted, or the victim is dropped
                    w = u + 1
                    while w < n_tiers and capacity[w] == 0:  # the victim skips tiers that store nothing
                        w += 1
                    if w >= n_tiers:
                        break  # no tier below: dropped
                    counters[u, DEMOTED_OUT] += 1
                    counters[w, DEMOTED_IN] += 1
                    block = victim
                    u = w
        if dirty:
            logged = _record_used(used, used_log, logged, r)
            dirty = False
    n_logged[0] = logged
    _fold_queried(queried, counters)
