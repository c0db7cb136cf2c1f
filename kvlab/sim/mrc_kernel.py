"""Numba kernel of :func:`kvlab.sim.mrc`: LRU stack distances with a Fenwick tree.

Mattson et al. (1970): LRU has the inclusion property — the cache of capacity ``C``
always holds the ``C`` most recently used blocks — so one pass that measures each
lookup's *stack distance* (1 + the number of distinct blocks used since the block's
last use; ``∞`` if never used) answers every capacity at once: the block is resident
at capacity ``C`` iff its distance is ``<= C``.

The distance is counted with a Fenwick (binary indexed) tree over access timestamps
(Bennett & Kruskal 1975; Olken 1981): every block's *last* access time holds a mark,
so the distance of a block last used at time ``t`` is the number of marks at times
``>= t`` — one prefix-sum query, ``O(log refs)``. An access moves the block's mark
to the current time (two point updates).

This module also holds the SHARDS sampling hash (Waldspurger et al., FAST'15):
``splitmix64(key XOR splitmix64(seed))``, whose top 24 bits select the sampled keys.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit

#: SHARDS modulus ``P``: a key is sampled iff the top 24 bits of its hash are ``< T``.
SHARDS_MODULUS = 1 << 24

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """Vigna's SplitMix64 output function of each ``uint64`` in ``x`` (one step from
    state ``x``): ``z = x + 0x9E3779B97F4A7C15``, then the Stafford variant-13 mixer.

    Returns ``uint64`` of ``x``'s shape; arithmetic wraps mod 2**64.

    Example:
        >>> hex(int(splitmix64(np.zeros(1, dtype=np.uint64))[0]))  # first output of seed 0
        '0xe220a8397b1dcdaf'
    """
    z = np.asarray(x, dtype=np.uint64) + _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def shards_keep(keys: np.ndarray, threshold: int, seed: int) -> np.ndarray:
    """SHARDS spatial sampling of block keys: ``bool`` mask, ``True`` = sampled.

    A key is kept iff ``splitmix64(key ^ splitmix64(seed)) >> 40 < threshold``, i.e. its
    hash mod ``P = 2**24`` (top 24 bits) is below ``T = threshold``: a fixed fraction
    ``T / P`` of the *distinct* keys, every reference of a kept key kept.

    Args:
        keys: ``uint64[num_keys]`` block keys.
        threshold: ``T`` in ``[1, 2**24]``.
        seed: integer in ``[0, 2**64)``, chooses the sample.
    """
    salt = splitmix64(np.array([seed], dtype=np.uint64))[0]
    return (splitmix64(keys.astype(np.uint64, copy=False) ^ salt) >> np.uint64(40)) < np.uint64(threshold)


@kernel_jit(inline="always")
def _add(tree: np.ndarray, i: int, value: int) -> None:
    n = tree.shape[0]
    while i < n:
        tree[i] += value
        i += i & -i


@kernel_jit(inline="always")
def _prefix(tree: np.ndarray, i: int) -> int:
    s = 0
    while i > 0:
        s += tree[i]
        i &= i - 1
    return s


@kernel_jit(nogil=True)
def stack_distance_histograms(offsets: np.ndarray, block_ids: np.ndarray, input_tokens: np.ndarray,
                              block_size: int, skip: int, reverse: bool, sampled: bool, keep: np.ndarray,
                              num_slots: int, block_hist: np.ndarray, token_hist: np.ndarray,
                              evict_hist: np.ndarray) -> int:
    """One pass over a flat trace: histograms of prefix-lookup and access distances.

    For each request ``r``, before its accesses: the LRU distance ``d_j`` of each of its
    blocks ``j`` (``∞`` = never seen), and the running maximum ``m_j = max(d_0..d_j)`` —
    block ``j`` is a prefix hit at capacity ``C`` iff ``m_j <= C``. If ``r >= skip``
    (measured), ``block_hist[m_j] += 1`` and ``token_hist[m_j] +=`` the block's tokens
    (``min((j+1)·B, input) − min(j·B, input)``, so the last block counts the remainder).
    Then every block is accessed — tail to head when ``reverse`` — and, when measured,
    ``evict_hist[x] += 1`` where an access evicts at every capacity ``1 <= C < x``
    (``x`` = its distance at access time, or ``1 +`` the distinct blocks seen so far for
    a first access: LRU evicts iff it misses with a full cache).

    With ``sampled``, blocks whose ``keep[id]`` is false are skipped entirely (SHARDS):
    the distances count sampled blocks only and the running maximum runs over the
    request's sampled blocks.

    Args:
        offsets: ``int64[num_requests + 1]`` CSR offsets; ``block_ids``: ``int32[num_refs]``
            dense ids; ``input_tokens``: ``uint32[num_requests]``; ``block_size``: tokens.
        skip: requests ``< skip`` are warm-up (they update the stack, not the histograms).
        reverse: touch order, ``True`` = head most recent.
        sampled, keep: SHARDS sampling (``keep``: ``bool[num_keys]``, ignored unless
            ``sampled``).
        num_slots: number of accesses that reach the tree (sampled refs), its timestamps.
        block_hist, token_hist, evict_hist: ``int64[num_keys + 2]``, zeroed, added to;
            index ``num_keys + 1`` is ``∞``.

    Returns:
        The number of distinct (sampled) blocks seen.
    """
    num_keys = keep.shape[0]
    inf = num_keys + 1
    tree = np.zeros(num_slots + 1, dtype=np.int32)  # marks at last-access times 1..num_slots
    last = np.zeros(num_keys, dtype=np.int64)  # 0 = never accessed
    marks = 0  # distinct blocks seen = marks in the tree
    now = 0
    for r in range(offsets.shape[0] - 1):
        a = offsets[r]
        b = offsets[r + 1]
        measured = r >= skip
        if measured:
            inp = np.int64(input_tokens[r])
            run = 0
            for j in range(b - a):
                k = block_ids[a + j]
                if sampled and not keep[k]:
                    continue
                if run < inf:
                    t = last[k]
                    d = inf if t == 0 else marks - _prefix(tree, t - 1)
                    run = max(run, d)
                block_hist[run] += 1
                token_hist[run] += min((j + 1) * block_size, inp) - min(j * block_size, inp)
        for q in range(b - a):
            i = b - 1 - q if reverse else a + q
            k = block_ids[i]
            if sampled and not keep[k]:
                continue
            t = last[k]
            if t == 0:
                marks += 1
                x = marks
            else:
                x = marks - _prefix(tree, t - 1)
                _add(tree, t, -1)
            if measured:
                evict_hist[x] += 1
            now += 1
            _add(tree, now, 1)
            last[k] = now
    return marks
