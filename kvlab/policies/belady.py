"""Belady's MIN: evict the resident block whose next use is furthest in the future.

The offline optimum for a plain object cache: on a miss with a full cache, evict the
block referenced again latest (never again = infinitely far; ties among those go to the
least recently used). "Uses" are the trace's block references in flat order — request
by request in arrival order, each request's blocks in prompt order — and the next use
of a reference at flat position ``i`` is the next position ``j > i`` holding the same
key. A block's priority is the next use after its latest access (when a key repeats
inside one request and the request is touched tail first, that can lie in the past).

MIN is exactly optimal for ``hit_semantics="independent"`` in forward touch order (one
block per lookup). Under prefix semantics it is a strong upper bound, not a proven
optimum: a request's hit stops at its first miss, so a resident block behind that miss
earns nothing, and keeping a chain's head can be worth more than a deeper block with a
nearer next use. Within one request the order of uses is the flat order, whatever the
touch order.

The next-use table is a property of the whole trace, so the reference needs it: pass
``requests`` (the per-request block keys, in replay order); the reference computes its
own table from them with a dict, independently of the kernel's numpy one. Without it no
future is known: every block's next use is infinite and the policy is LRU.

The kernel keeps the next uses of live resident blocks (finite next use) as members of a
bit tree over flat positions (:func:`kvlab.policies.structs.make_bit_tree`): a next use is a
position, unique among resident blocks, and the block is the key at that position, so the
tree needs no ids and a hit is a bit update or two: its new next use goes in, and its old
one goes out unless it is the position being accessed (always, in forward order), which lies
below every later next use and is left in the tree, no block's next use. The largest
member is tracked with its block id: a new next use beyond it replaces it (the id is the
block being accessed); when it leaves, the tree's new largest member is found and its id
read from a small direct-mapped table of recently added ``(position, id)`` pairs or,
failing that, from the trace's ``block_ids`` — a read that is not needed before the next
eviction, so the memory latency of a far position overlaps the references in between. The
victim is the largest member that is its block's next use (a left-behind member found
there, possible only when a request is touched tail first, is dropped and the next tried).
Blocks never used again wait in a FIFO in the order they became dead (a dead block is never
touched again, so that is LRU order) and go first, oldest first. Per reference, the kernel
keeps an ``int32`` next use (up to ``2**31 - 2`` references) and a bit.

On the 600 small id streams of :mod:`kvlab.policies.arc` (one block per request,
independent lookups, forward order) the hits equal libCacheSim's ``Belady``
(``libcachesim`` 0.3.5) on every stream (95,359 hits over 134,154 references).

References:
    L. A. Belady, "A study of replacement algorithms for a virtual-storage computer",
    IBM Systems Journal 5(2), 1966; R. L. Mattson et al., "Evaluation techniques for
    storage hierarchies", IBM Systems Journal 9(2), 1970 (MIN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_count
from kvlab.policies.base import PolicySpec, register_kernel
from kvlab.policies.structs import bit_tree_add, bit_tree_remove, bit_tree_remove_max, make_bit_tree
from kvlab.traces.flat import FlatTrace

#: Next use of a reference never followed by another of the same key.
NEVER = np.iinfo(np.int64).max


class Belady:
    """Reference Belady MIN cache over block ids (the oracle for the kernel).

    Models Belady's MIN (1966) over the trace's flat reference order.

    Args:
        capacity_blocks: maximum resident blocks (≥ 0), ``None`` for unbounded.
        requests: the trace's block keys per request, in replay order; ``ref_index``
            of :meth:`access` is a flat position in it. ``None``: no future (LRU).

    Raises:
        ValueError: negative or non-integer capacity.

    Example:
        >>> cache = Belady(capacity_blocks=2, requests=[[1, 2], [3, 1], [2]])
        >>> [cache.access(k, i) for i, k in enumerate([1, 2])]
        [[], []]
        >>> cache.access(3, 2)  # 1 is next used at 3, 2 at 4: 2 goes
        [2]
        >>> cache.next_uses()
        {1: 3, 3: 9223372036854775807}
    """

    def __init__(self, capacity_blocks: int | None, requests: Sequence[Sequence[int]] | None = None) -> None:
        self.capacity_blocks = check_count("capacity_blocks", capacity_blocks, optional=True)
        flat = [key for keys in requests or () for key in keys]
        self._next_use = [int(NEVER)] * len(flat)
        seen: dict[int, int] = {}
        for i in range(len(flat) - 1, -1, -1):
            self._next_use[i] = seen.get(flat[i], int(NEVER))
            seen[flat[i]] = i
        self._resident: dict[int, tuple[int, int]] = {}  # block -> (next use, last access time)
        self._clock = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def next_uses(self) -> dict[int, int]:
        """Next use (flat reference position; ``NEVER`` if none) of each resident block."""
        return {k: v[0] for k, v in self._resident.items()}

    def access(self, block_id: int, ref_index: int) -> list[int]:
        """Touch ``block_id`` or insert it; return evicted ids."""
        self._clock += 1
        next_use = self._next_use[ref_index] if ref_index < len(self._next_use) else int(NEVER)
        if block_id in self._resident or self.capacity_blocks == 0:
            if block_id in self._resident:
                self._resident[block_id] = (next_use, self._clock)
            return []
        evicted = []
        if self.capacity_blocks is not None and len(self._resident) >= self.capacity_blocks:
            evicted.append(self.evict())
        self._resident[block_id] = (next_use, self._clock)
        return evicted

    def remove(self, block_id: int) -> bool:
        """Drop a resident block (not an eviction) with its next use and last access;
        ``False`` if it was not resident."""
        return self._resident.pop(block_id, None) is not None

    def evict(self) -> int | None:
        """Evict the block whose stored next use is furthest (never-used-again blocks
        first, least recent among them) — the victim of the next insertion into a full
        cache; ``None`` if nothing is resident. The choice does not depend on the current
        reference (only the inserted block's next use does), so there is no
        ``ref_index``; a stored next use is that of the block's latest access *here*, so
        it can lie in the past if the block's later references were not passed to this
        cache (e.g. served by another tier)."""
        if not self._resident:
            return None
        # furthest next use; among never-used-again blocks the least recent
        victim = max(self._resident, key=lambda k: (self._resident[k][0], -self._resident[k][1]))
        del self._resident[victim]
        return victim


class BeladyState(NamedTuple):
    """Kernel state: ``next_use`` (``int32[num_refs]``, :data:`NEVER32` = none), per block
    ``prio`` (``int32[num_keys]``: -1 not resident, :data:`NEVER32` resident and never used
    again, else the position of its next use after its latest access, a member of the bit
    tree ``bits``/``levels`` over positions, which also keeps positions of past hits that
    are no block's next use); ``dead`` (``int32[num_keys]``, FIFO of blocks
    never used again); ``recent`` (``int64[2**k]``, direct-mapped ``position << 32 | id`` of
    recently added next uses, ``-1`` empty); ``counters`` (``int64[6]``: used, capacity, dead
    head, dead tail, the tree's largest member (-1 if empty) and its block id)."""

    next_use: np.ndarray
    prio: np.ndarray
    bits: np.ndarray
    levels: np.ndarray
    dead: np.ndarray
    recent: np.ndarray
    counters: np.ndarray


#: The kernel's next use of a reference never followed by another of the same key.
NEVER32 = np.iinfo(np.int32).max
#: Entries of the kernel's direct-mapped table of recent next uses: the power of two above
#: twice the capacity, within these bounds (``int64`` each; measured best on the Zipf
#: streams of ``benchmarks/bench_policies_lcs.py``).
RECENT_MIN, RECENT_MAX = 1 << 12, 1 << 16


def next_use_table(flat: FlatTrace, dtype: type = np.int64) -> np.ndarray:
    """``dtype[num_refs]``: for each reference, the flat position of the next reference to
    the same block; if there is none, the largest ``dtype`` value (:data:`NEVER` for
    ``int64``, :data:`NEVER32` for ``int32``).

    Raises:
        ValueError: ``dtype`` cannot hold every position and the marker
            (``num_refs >= iinfo(dtype).max``).

    Example:
        >>> import polars as pl
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> keys = pl.Series([[7, 9], [7, 3]], dtype=pl.List(pl.UInt64))
        >>> next_use_table(flatten_block_keys(keys, pl.Series([8, 8]), block_size=4)).tolist()[:2]
        [2, 9223372036854775807]
    """
    never = np.iinfo(dtype).max
    if flat.num_refs >= never:
        raise ValueError(f"num_refs must be < {never} for an {np.dtype(dtype).name} next-use table, "
                         f"got {flat.num_refs}")
    table = np.empty(flat.num_refs, dtype=dtype)
    _fill_next_uses(flat.block_ids, table, np.full(flat.num_keys, never, dtype=dtype))
    return table


@kernel_jit(nogil=True)
def _fill_next_uses(block_ids, table, seen):  # noqa: ANN001, ANN202
    """One backward pass: a reference's next use is the latest position seen so far of
    its block (``seen``, the marker at first): O(num_refs), where a stable sort of the ids
    took 1.8 s on 10 M references."""
    for i in range(block_ids.shape[0] - 1, -1, -1):
        k = block_ids[i]
        table[i] = seen[k]
        seen[k] = i


def make_state(flat: FlatTrace, capacity_blocks: int) -> BeladyState:
    """Empty state for ``flat.num_keys`` block ids and the given capacity (blocks), with the
    trace's ``int32`` next-use table.

    Raises:
        ValueError: the trace has ``2**31 - 1`` references or more.
    """
    n = flat.num_keys
    bits, levels = make_bit_tree(flat.num_refs)
    recent = np.full(min(max(1 << (2 * capacity_blocks).bit_length(), RECENT_MIN), RECENT_MAX), -1, np.int64)
    return BeladyState(next_use_table(flat, np.int32), np.full(n, -1, np.int32), bits, levels,
                       np.zeros(n, np.int32), recent, np.array([0, capacity_blocks, 0, 0, -1, -1], np.int64))


@kernel_jit(inline="always")
def _block_at(block_ids, recent, j):  # noqa: ANN001, ANN202
    """The block whose next use is position ``j``: from ``recent`` if it still holds ``j``."""
    e = recent[j & (recent.shape[0] - 1)]
    return e & 0xFFFFFFFF if e >> 32 == j else np.int64(block_ids[j])


def contains(state, block_id) -> bool:  # noqa: ANN001 - numba hook
    return state.prio[block_id] >= 0


def access(state, block_ids, start, stop, reverse, evicted) -> int:  # noqa: ANN001 - numba hook
    next_use, prio, bits, levels, dead, recent = state.next_use, state.prio, state.bits, state.levels, state.dead, \
        state.recent
    counters = state.counters
    used, capacity, head, tail, far = counters[0], counters[1], counters[2], counters[3], counters[4]
    mask = recent.shape[0] - 1
    num_evicted = 0
    for j in range(stop - start):
        i = stop - 1 - j if reverse else start + j
        x = block_ids[i]
        old = prio[x]
        if old < 0:
            if capacity == 0:
                continue
            if used >= capacity:
                while head < tail and prio[dead[head]] != NEVER32:
                    head += 1  # skip blocks that came back to life (a key repeated in a request)
                if head < tail:
                    victim = np.int64(dead[head])
                    head += 1
                else:  # every resident block is live: the furthest next use goes
                    while True:  # (a member left behind by a hit is skipped: it is no block's next use)
                        victim = counters[5]
                        live = prio[victim] == far
                        far = bit_tree_remove_max(bits, levels, far)
                        if far >= 0:
                            counters[5] = _block_at(block_ids, recent, far)  # read at the next eviction
                        if live:
                            break
                prio[victim] = -1
                used -= 1
                evicted[num_evicted] = victim
                num_evicted += 1
            used += 1
        elif old != NEVER32 and old != i:  # live: its old next use leaves the tree, unless it is
            if old == far:  # this very position (below every later next use)
                far = bit_tree_remove_max(bits, levels, far)
                if far >= 0:
                    counters[5] = _block_at(block_ids, recent, far)
            else:
                bit_tree_remove(bits, levels, old)
        nu = next_use[i]
        prio[x] = nu
        if nu == NEVER32:
            dead[tail] = x
            tail += 1
        else:
            bit_tree_add(bits, levels, nu)
            recent[nu & mask] = (np.int64(nu) << 32) | x
            if nu > far:
                far = nu
                counters[5] = x
    counters[0], counters[2], counters[3], counters[4] = used, head, tail, far
    return num_evicted


register_kernel(BeladyState, contains=contains, access=access)

SPEC = PolicySpec(
    name="belady",
    summary="evict the block whose next use is furthest in the future (offline optimum, MIN)",
    models="Belady's MIN (1966) over the trace's flat reference order",
    reference=Belady,
    make_state=make_state,
    reference_uses_trace=True,
)
