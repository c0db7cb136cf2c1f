"""ARC: adaptive replacement between a recency list and a frequency list.

Megiddo and Modha's ARC keeps two resident LRU lists — ``T1`` (blocks seen once
recently) and ``T2`` (seen at least twice) — and two ghost lists of evicted ids, ``B1``
and ``B2``, that hold no data. A hit in a ghost list moves the target size ``p`` of
``T1``: up by ``δ1`` on a ``B1`` hit, down by ``δ2`` on a ``B2`` hit. The rules here are
the paper's Figure 4 verbatim: cases I–IV, ``REPLACE``, and a real-valued ``p`` with
``δ1 = 1 if |B1| >= |B2| else |B2| / |B1|`` (and symmetrically ``δ2``). Evicting a block
means moving it from ``T1``/``T2`` to its ghost list (or, in case IV.A with ``B1``
empty, dropping it). An unbounded cache never evicts, so it never adapts.

``remove`` (not in the paper) takes a block out of ``T1``/``T2`` without a ghost entry,
so the cache can hold ghosts while not full, which the paper's invariants exclude; the
reference then inserts without REPLACE while it is not full, only trimming the ghost
lists to their bounds (``|T1| + |B1| ≤ c``, all four ``≤ 2c``). Without ``remove``
every REPLACE happens in a full cache, so this changes nothing. The kernel's tier hooks
(``insert``, ``evict``, ``remove``) follow the reference.

The reference keeps four ``OrderedDict``; the kernel four intrusive doubly linked lists
over dense block ids sharing one ``prev``/``next`` pair (sentinels ``num_keys + 0..3``),
with ``where[k]`` naming the list a block is on: O(1) per access.

libCacheSim (``libcachesim`` 0.3.5, ``ARC``) implements the same cases with a
real-valued ``p`` too (its source notes it first used integers). On 600 small id streams
(3–60 ids, 50–400 references, capacities 1–30; one block per request,
``hit_semantics="independent"``, forward order) the hits are identical on every stream
(79,935 hits over 134,154 references, gap 0); flooring the deltas instead
(``ARC(c, integral_delta=True)``, libCacheSim's older integer rule) changes the hits on
148 of the 600 streams. Six of those streams are golden tests.

References:
    N. Megiddo, D. S. Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache",
    USENIX FAST 2003, Figure 4; libCacheSim ``cache/eviction/ARC.c``
    (https://github.com/1a1a11a/libCacheSim).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import list_pop_front, list_push_back, list_unlink, make_lists
from kvlab.traces.flat import FlatTrace


class ARC:
    """Reference ARC cache over block ids (readable; the oracle for the kernel).

    Models ARC (Megiddo & Modha, FAST'03, Figure 4) with a real-valued target ``p``.

    Args:
        capacity_blocks: maximum resident blocks ``c`` (≥ 0), ``None`` for unbounded;
            the ghost lists hold at most ``c`` more ids.
        integral_delta: floor ``δ1``/``δ2`` to integers, as libCacheSim's older
            integer version did (for comparisons only; the paper's rule is the default).

    Raises:
        ValueError: negative or non-integer capacity.

    Example:
        >>> cache = ARC(capacity_blocks=2)
        >>> [cache.access(k, i) for i, k in enumerate([1, 1, 2])]  # 1 is in T2, 2 in T1
        [[], [], []]
        >>> cache.access(3, 3)  # |T1| = 1 > p = 0: T1's LRU block 2 goes to ghost list B1
        [2]
        >>> cache.access(2, 4), cache.p  # B1 hit: p = 1; |T1| = 1 is not > p, so T2's 1 goes to B2
        ([1], 1.0)
        >>> cache.access(1, 5), cache.p  # B2 hit: p = 0; |T1| = 1 > p, so T1's 3 goes to B1
        ([3], 0.0)
        >>> cache.lists()
        {'T1': [], 'T2': [2, 1], 'B1': [3], 'B2': []}
    """

    def __init__(self, capacity_blocks: int | None, *, integral_delta: bool = False) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        self.integral_delta = integral_delta
        self.p = 0.0  # target size of T1
        self._t1: OrderedDict[int, None] = OrderedDict()  # first = least recent
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[int, None] = OrderedDict()
        self._b2: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._t1 or block_id in self._t2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def lists(self) -> dict[str, list[int]]:
        """The four lists' block ids, each least recently used first."""
        return {"T1": list(self._t1), "T2": list(self._t2), "B1": list(self._b1), "B2": list(self._b2)}

    def _delta(self, grow: int, other: int) -> float:
        """``δ`` for a hit in a ghost list of size ``grow`` against the other of size ``other``."""
        if grow >= other:
            return 1.0
        return float(other // grow) if self.integral_delta else other / grow

    def _replace(self, in_b2: bool) -> int:
        """The paper's REPLACE: move T1's or T2's LRU block to its ghost list; return it."""
        t1 = len(self._t1)
        if t1 >= 1 and (t1 > self.p or (in_b2 and t1 == self.p) or not self._t2):
            victim = self._t1.popitem(last=False)[0]
            self._b1[victim] = None
        else:  # T2 is non-empty here (T1 is empty, or the test above saw T2 non-empty)
            victim = self._t2.popitem(last=False)[0]
            self._b2[victim] = None
        return victim

    def access(self, block_id: int, ref_index: int) -> list[int]:  # noqa: ARG002 - Belady reads ref_index
        """Touch ``block_id`` (case I) or insert it (cases II–IV); return evicted ids."""
        x, c = block_id, self.capacity_blocks
        if x in self._t1 or x in self._t2:  # case I: hit, to the MRU end of T2
            self._t1.pop(x, None)
            self._t2.pop(x, None)
            self._t2[x] = None
            return []
        if c == 0:
            return []
        if c is None:  # unbounded: lists never fill, nothing is replaced
            self._t1[x] = None
            return []
        full = len(self) >= c  # always, on a ghost hit, unless blocks were removed
        if x in self._b1:  # case II
            self.p = min(self.p + self._delta(len(self._b1), len(self._b2)), float(c))
            evicted = [self._replace(in_b2=False)] if full else []
            del self._b1[x]
            self._t2[x] = None
            return evicted
        if x in self._b2:  # case III
            self.p = max(self.p - self._delta(len(self._b2), len(self._b1)), 0.0)
            evicted = [self._replace(in_b2=True)] if full else []
            del self._b2[x]
            self._t2[x] = None
            return evicted
        evicted = [self.evict()] if full else []  # case IV: a complete miss
        if len(self._t1) + len(self._b1) >= c:  # case A: L1 holds c pages (B1 is not empty here)
            self._b1.popitem(last=False)
        elif len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2) >= 2 * c:  # case B
            self._b2.popitem(last=False)
        self._t1[x] = None
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction) from T1 or T2; ``False`` if it was
        not resident (a ghost id is not resident: it stays). The block does *not* enter
        B1/B2 and ``p`` is unchanged. While the cache is not full afterwards, a ghost hit
        or a miss inserts without REPLACE (a miss still trims the ghost lists)."""
        for resident in (self._t1, self._t2):
            if block_id in resident:
                del resident[block_id]
                return True
        return False

    def evict(self) -> int | None:
        """Evict one block as inserting a block in no list would: REPLACE with ``x ∉
        B2`` — T1's LRU block to B1 if ``|T1| > p`` (or T2 is empty), else T2's LRU
        block to B2; ``p`` is unchanged. When T1 holds all ``c`` blocks its LRU block
        goes to B1 where the paper's case IV.A drops it; the ghost trimming of the
        insertion that follows drops it, so ``evict()`` then ``access(x, i)`` leave the
        state ``access(x, i)`` on the full cache leaves. Unbounded: no ghost entry (an
        unbounded cache keeps none). ``None`` if nothing is resident."""
        if not len(self):
            return None
        if self.capacity_blocks is None:
            return (self._t1 or self._t2).popitem(last=False)[0]
        return self._replace(in_b2=False)


class ARCState(NamedTuple):
    """Kernel state: ``prev``/``next`` links (``int32[num_keys + 4]``; sentinels ``num_keys + 0..3``
    head the lists T1, T2, B1, B2: ``next[s]`` = least recent, ``prev[s]`` = most recent),
    ``where`` (``int8[num_keys]``: 0 none, 1 T1, 2 T2, 3 B1, 4 B2), ``sizes`` (``int64[5]``:
    |T1|, |T2|, |B1|, |B2|, capacity) and ``p`` (``float64[1]``)."""

    prev: np.ndarray
    next: np.ndarray
    where: np.ndarray
    sizes: np.ndarray
    p: np.ndarray


def make_state(flat: FlatTrace, capacity_blocks: int) -> ARCState:
    """Empty ARC state for ``flat.num_keys`` block ids and the given capacity (blocks)."""
    n = flat.num_keys
    prev, nxt = make_lists(n, 4)
    return ARCState(prev, nxt, np.zeros(n, dtype=np.int8), np.array([0, 0, 0, 0, capacity_blocks], dtype=np.int64),
                    np.zeros(1, dtype=np.float64))


@kernel_jit(inline="always")
def _replace(prev, nxt, where, sizes, p, in_b2, n):  # noqa: ANN001, ANN202
    """The paper's REPLACE: T1's (or, when ``|T1| <= p``, T2's) LRU block to its ghost list."""
    t1 = sizes[0]
    if t1 >= 1 and (t1 > p or (in_b2 and t1 == p) or sizes[1] == 0):
        victim = list_pop_front(prev, nxt, n)
        list_push_back(prev, nxt, n + 2, victim)
        where[victim] = 3
        sizes[0] -= 1
        sizes[2] += 1
    else:
        victim = list_pop_front(prev, nxt, n + 1)
        list_push_back(prev, nxt, n + 3, victim)
        where[victim] = 4
        sizes[1] -= 1
        sizes[3] += 1
    return victim


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    w = state.where[block_id]
    return w == 1 or w == 2


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    prev, nxt, where, sizes = state.prev, state.next, state.where, state.sizes
    n = where.shape[0]  # sentinels: T1 = n, T2 = n + 1, B1 = n + 2, B2 = n + 3
    c = sizes[4]
    p = state.p[0]
    num_evicted = 0
    for j in range(stop - start):
        x = block_ids[stop - 1 - j] if reverse else block_ids[start + j]
        w = where[x]
        if w == 1 or w == 2:  # case I
            list_unlink(prev, nxt, x)
            list_push_back(prev, nxt, n + 1, x)
            if w == 1:
                where[x] = 2
                sizes[0] -= 1
                sizes[1] += 1
            continue
        if c == 0:
            continue
        if w == 3 or w == 4:  # cases II and III
            b1, b2 = sizes[2], sizes[3]
            if w == 3:
                p = min(p + (1.0 if b1 >= b2 else b2 / b1), float(c))
            else:
                p = max(p - (1.0 if b2 >= b1 else b1 / b2), 0.0)
            evicted[num_evicted] = _replace(prev, nxt, where, sizes, p, w == 4, n)
            num_evicted += 1
            list_unlink(prev, nxt, x)
            sizes[w - 1] -= 1
        else:  # case IV
            if sizes[0] + sizes[2] == c:  # case A
                if sizes[0] < c:
                    where[list_pop_front(prev, nxt, n + 2)] = 0
                    sizes[2] -= 1
                    evicted[num_evicted] = _replace(prev, nxt, where, sizes, p, False, n)
                else:
                    victim = list_pop_front(prev, nxt, n)
                    where[victim] = 0
                    sizes[0] -= 1
                    evicted[num_evicted] = victim
                num_evicted += 1
            elif sizes[0] + sizes[1] + sizes[2] + sizes[3] >= c:  # case B
                if sizes[0] + sizes[1] + sizes[2] + sizes[3] == 2 * c:
                    where[list_pop_front(prev, nxt, n + 3)] = 0
                    sizes[3] -= 1
                evicted[num_evicted] = _replace(prev, nxt, where, sizes, p, False, n)
                num_evicted += 1
            list_push_back(prev, nxt, n, x)
            where[x] = 1
            sizes[0] += 1
            continue
        list_push_back(prev, nxt, n + 1, x)  # cases II and III end in T2
        where[x] = 2
        sizes[1] += 1
    state.p[0] = p
    return num_evicted


def touch(state, block_id) -> None:  # noqa: ANN001 - numba hook: case I, to the MRU end of T2
    n = state.where.shape[0]
    list_unlink(state.prev, state.next, block_id)
    list_push_back(state.prev, state.next, n + 1, block_id)
    if state.where[block_id] == 1:
        state.where[block_id] = 2
        state.sizes[0] -= 1
        state.sizes[1] += 1


def insert(state, block_id) -> None:  # noqa: ANN001 - numba hook: the reference's access into a cache that is not full
    prev, nxt, where, sizes = state.prev, state.next, state.where, state.sizes
    n, c, x = where.shape[0], sizes[4], block_id
    w = where[x]
    if w == 3 or w == 4:  # cases II and III, without REPLACE: the ghost hit adapts p, x goes to T2
        b1, b2 = sizes[2], sizes[3]
        if w == 3:
            state.p[0] = min(state.p[0] + (1.0 if b1 >= b2 else b2 / b1), float(c))
        else:
            state.p[0] = max(state.p[0] - (1.0 if b2 >= b1 else b1 / b2), 0.0)
        list_unlink(prev, nxt, x)
        sizes[w - 1] -= 1
        list_push_back(prev, nxt, n + 1, x)
        where[x] = 2
        sizes[1] += 1
        return
    if sizes[0] + sizes[2] >= c:  # case IV.A: L1 holds c pages, B1's LRU id goes
        where[list_pop_front(prev, nxt, n + 2)] = 0
        sizes[2] -= 1
    elif sizes[0] + sizes[1] + sizes[2] + sizes[3] >= 2 * c:  # case IV.B: B2's LRU id goes
        where[list_pop_front(prev, nxt, n + 3)] = 0
        sizes[3] -= 1
    list_push_back(prev, nxt, n, x)
    where[x] = 1
    sizes[0] += 1


def evict(state) -> int:  # noqa: ANN001 - numba hook: REPLACE with x not in B2; p unchanged
    if state.sizes[0] + state.sizes[1] == 0:
        return -1
    return _replace(state.prev, state.next, state.where, state.sizes, state.p[0], False, state.where.shape[0])


def remove(state, block_id) -> bool:  # noqa: ANN001 - numba hook: out of T1/T2, no ghost entry
    w = state.where[block_id]
    if w != 1 and w != 2:
        return False
    list_unlink(state.prev, state.next, block_id)
    state.where[block_id] = 0
    state.sizes[w - 1] -= 1
    return True


def used(state) -> int:  # noqa: ANN001 - numba hook
    return state.sizes[0] + state.sizes[1]


register_kernel(ARCState, contains=contains, access=access, used=used, touch=touch, insert=insert, evict=evict,
                remove=remove)

SPEC = PolicySpec(
    name="arc",
    summary="adaptive replacement: LRU lists for once- and twice-seen blocks, sized by ghost hits",
    models="ARC (Megiddo & Modha, FAST'03, Figure 4), real-valued p as in libCacheSim's ARC",
    reference=ARC,
    make_state=make_state,
)
