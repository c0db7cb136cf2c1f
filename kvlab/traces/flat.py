"""Flat (CSR) form of a trace for the numba kernels: offsets + dense block ids."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

from kvlab.core.jit import kernel_jit


@dataclass(frozen=True, eq=False)
class FlatTrace:
    """A trace's block keys as flat arrays, keys interned to dense ids.

    Request ``r`` references ``block_ids[offsets[r]:offsets[r + 1]]`` in prompt order.
    Dense ids are assigned in order of first appearance, so the first block ever seen
    is id 0 (for the Mooncake traces, whose ids are already dense and first-seen
    ordered, dense id == ``hash_id``).

    Attributes:
        offsets: ``int64[num_requests + 1]``, CSR row pointers.
        block_ids: ``int32[num_refs]``, dense block id of every block reference.
        keys: ``uint64[num_keys]``, the original block key of each dense id.
        input_tokens: ``uint32[num_requests]``, prompt length of each request in tokens (a
            read-only view of the trace's column, not a copy).
        block_size: tokens per block.

    Example:
        >>> import polars as pl
        >>> keys = pl.Series([[7, 9], [7, 3, 4]], dtype=pl.List(pl.UInt64))
        >>> flat = flatten_block_keys(keys, pl.Series([20, 40]), block_size=16)
        >>> flat.offsets.tolist(), flat.block_ids.tolist(), flat.keys.tolist()
        ([0, 2, 5], [0, 1, 0, 2, 3], [7, 9, 3, 4])
    """

    offsets: np.ndarray
    block_ids: np.ndarray
    keys: np.ndarray
    input_tokens: np.ndarray
    block_size: int

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return int(self.offsets.shape[0] - 1)

    @property
    def num_refs(self) -> int:
        """Number of block references (sum of blocks over requests)."""
        return int(self.block_ids.shape[0])

    @property
    def num_keys(self) -> int:
        """Number of distinct block keys."""
        return int(self.keys.shape[0])

    @cached_property
    def max_blocks_per_request(self) -> int:
        """Most blocks of any request (0 for no request), computed once."""
        return int(np.max(self.offsets[1:] - self.offsets[:-1], initial=0))

    def blocks_per_request(self) -> np.ndarray:
        """``int64[num_requests]``: number of blocks of each request."""
        return np.diff(self.offsets)

    def parent_ids(self) -> np.ndarray:
        """``int64[num_keys]``: the dense id of each key's parent block (the block before
        it where the key first appears), ``-1`` for a first block.

        Under chained keys a key always has the same parent
        (:meth:`kvlab.traces.Trace.check_chained`).

        Example:
            >>> import polars as pl
            >>> keys = pl.Series([[7, 9], [7, 3, 4]], dtype=pl.List(pl.UInt64))
            >>> flatten_block_keys(keys, pl.Series([20, 40]), block_size=16).parent_ids().tolist()
            [-1, 0, 0, 2]
        """
        starts = np.zeros(self.num_refs, dtype=np.bool_)
        starts[self.offsets[:-1][self.blocks_per_request() > 0]] = True
        parent_of_ref = np.where(starts, -1, np.roll(self.block_ids, 1).astype(np.int64))
        # dense ids follow first appearance: a reference is a key's first iff its id
        # exceeds every id before it
        ids = self.block_ids.astype(np.int64)
        seen_max = np.concatenate([[-1], np.maximum.accumulate(ids)[:-1]]) if ids.size else ids
        first = ids > seen_max
        parents = np.empty(self.num_keys, dtype=np.int64)
        parents[ids[first]] = parent_of_ref[first]
        return parents


def flatten_block_keys(block_keys: pl.Series, input_tokens: pl.Series, block_size: int) -> FlatTrace:
    """Build a :class:`FlatTrace` from a ``list[u64]`` series of block keys.

    Args:
        block_keys: one list of chained block keys per request.
        input_tokens: prompt length per request, tokens.
        block_size: tokens per block.

    Returns:
        The flat form; dense ids in order of first appearance.
    """
    lengths = block_keys.list.len().to_numpy()
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int64)
    del lengths  # the steps below hold one array of the references at a time
    refs = block_keys.explode(empty_as_null=False)
    if refs.null_count():
        refs = refs.drop_nulls()
    return flatten_csr(offsets, refs.to_numpy().astype(np.uint64, copy=False), input_tokens, block_size)


def flatten_csr(offsets: np.ndarray, refs: np.ndarray, input_tokens: pl.Series, block_size: int) -> FlatTrace:
    """Build a :class:`FlatTrace` from CSR block keys (the keys interned here).

    Args:
        offsets: ``int64[num_requests + 1]`` row pointers (kept as the flat form's own).
        refs: ``uint64[num_refs]``, the block keys of every request in order.
        input_tokens: prompt length per request, tokens (the trace's column).
        block_size: tokens per block.

    Returns:
        The flat form; dense ids in order of first appearance (:func:`intern_first_seen`).

    Example:
        >>> flat = flatten_csr(np.array([0, 2, 3]), np.array([5, 6, 5], dtype=np.uint64), pl.Series([2, 1]), 1)
        >>> flat.block_ids.tolist(), flat.keys.tolist()
        ([0, 1, 0], [5, 6])
    """
    block_ids, keys = intern_first_seen(refs)
    return FlatTrace(
        offsets=offsets,
        block_ids=block_ids,
        keys=keys,
        input_tokens=input_tokens.cast(pl.UInt32).to_numpy(),  # the trace's column itself (no copy)
        block_size=block_size,
    )


def intern_first_seen(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intern 64-bit keys to dense ids in order of first appearance.

    One pass over the references, no sort. Keys spanning a range no wider than twice the
    number of references (object ids, Mooncake ``hash_ids``: keys that are already nearly
    dense) index a table of ``max - min + 1`` ids directly; other keys go through an
    open-addressing hash map in numba (linear probing, splitmix64-mixed keys, load factor
    at most 1/2, doubled as it fills; a slot holds only the dense id, the key is read from
    the keys-by-id array). Both give the same ids.

    Args:
        refs: ``uint64[num_refs]``, the keys in reference order (any 64-bit value,
            0 and ``2**64 - 1`` included).

    Returns:
        ``(block_ids, keys)``: ``int32[num_refs]`` dense ids (the first key seen is 0)
        and ``uint64[num_keys]``, the key of each dense id, so ``keys[block_ids] == refs``.

    Raises:
        ValueError: ``refs`` is not a one-dimensional array of unsigned 64-bit integers,
            or holds more than ``2**31 - 1`` distinct keys (dense ids are ``int32``).

    Example:
        >>> ids, keys = intern_first_seen(np.array([9, 0, 9, 2**64 - 1], dtype=np.uint64))
        >>> ids.tolist(), keys.tolist()
        ([0, 1, 0, 2], [9, 0, 18446744073709551615])
        >>> intern_first_seen(np.array([12, 10, 12], dtype=np.uint64))[0].tolist()  # the direct table
        [0, 1, 0]
    """
    if not isinstance(refs, np.ndarray) or refs.dtype != np.uint64 or refs.ndim != 1:
        raise ValueError(f"refs must be a one-dimensional uint64 array, got "
                         f"{getattr(refs, 'dtype', type(refs).__name__)} of shape {getattr(refs, 'shape', None)}")
    refs = np.ascontiguousarray(refs)
    n = refs.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.uint64)
    low, high = _key_range(refs)
    span = int(high) - int(low) + 1
    # the large arrays come from numpy, which asks for transparent huge pages (numba's allocations
    # fault in 4 KiB pages: ~10,000 faults per 40 MB, a visible share of the CPU time)
    block_ids = np.empty(n, dtype=np.int32)
    if span <= min(max(2 * n, _DIRECT_MIN_SPAN), _MAX_KEYS):  # every id of the table fits an int32
        table = np.empty(min(n, span), dtype=np.uint64)
        num_keys = _intern_direct(refs, np.uint64(low), np.full(span, -1, dtype=np.int32), block_ids, table)
    else:
        table, num_keys = _intern_hashed(refs, min(max(_pow2_at_least(n // 2), 1024), _HASH_START_MAX), block_ids)
    if num_keys < 0:
        raise ValueError(f"refs holds more than {_MAX_KEYS} distinct keys; dense block ids are int32")
    # a view when most of the table is used (no copy of a large key table), else a right-sized copy
    return block_ids, table[:num_keys] if 2 * num_keys >= table.shape[0] else table[:num_keys].copy()


_MAX_KEYS = 2**31 - 1
_BATCH = 16
#: Key ranges up to this wide always use the direct table (it is at most 256 KiB).
_DIRECT_MIN_SPAN = 1 << 16
#: Largest first size of the hash map (slots; 4 MiB): traces with few distinct keys stay small.
_HASH_START_MAX = 1 << 20


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@kernel_jit(nogil=True)
def _key_range(refs: np.ndarray) -> tuple[np.uint64, np.uint64]:
    """The smallest and largest key of a non-empty ``refs``."""
    low = refs[0]
    high = refs[0]
    for i in range(refs.shape[0]):
        key = refs[i]
        low = min(low, key)
        high = max(high, key)
    return low, high


@kernel_jit(nogil=True)
def _intern_direct(refs: np.ndarray, low: np.uint64, table: np.ndarray, block_ids: np.ndarray,
                   keys: np.ndarray) -> int:
    """:func:`intern_first_seen` over keys in ``[low, low + len(table))``: ``table`` holds the
    id of ``key - low`` (all -1 on entry: not seen yet; fewer than ``2**31`` slots, so every id
    fits an int32). Fills ``block_ids`` and ``keys`` (by id); returns the key count."""
    n = refs.shape[0]
    count = 0
    for i in range(n):
        key = refs[i]
        slot = key - low
        sid = table[slot]
        if sid < 0:
            sid = count
            table[slot] = sid
            keys[count] = key
            count += 1
        block_ids[i] = sid
    return count


@kernel_jit(inline="always")
def _mix(key: np.uint64) -> np.uint64:
    """splitmix64's finaliser: every key bit moves every slot bit (sequential or strided ids spread)."""
    key = (key ^ (key >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    key = (key ^ (key >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return key ^ (key >> np.uint64(31))


@kernel_jit(nogil=True)
def _intern_hashed(refs: np.ndarray, cap: int, block_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Fill ``block_ids`` with the dense ids of ``refs`` (first seen first); return the keys by
    id (first ``num_keys`` valid) and ``num_keys`` (-1 past ``_MAX_KEYS``), through a map of
    ``cap`` slots to start with (a power of two). A slot holds a dense id (-1: free); its key
    is ``keys[id]``."""
    n = refs.shape[0]
    slots = np.full(cap, -1, dtype=np.int32)
    keys = np.empty(cap // 2, dtype=np.uint64)
    mask = np.uint64(cap - 1)
    count = 0
    touched = 0
    for i in range(n):
        if i % _BATCH == 0:  # load the next batch's slots together: their cache misses overlap
            for j in range(i, min(i + _BATCH, n)):
                touched += slots[_mix(refs[j]) & mask]
        key = refs[i]
        s = _mix(key) & mask
        while True:
            sid = slots[s]
            if sid < 0:
                if count == _MAX_KEYS:
                    return keys, -1
                slots[s] = count
                keys[count] = key
                block_ids[i] = count
                count += 1
                if 2 * count >= cap:  # keep the load factor below 1/2: double and reinsert
                    cap *= 2
                    mask = np.uint64(cap - 1)
                    slots = np.full(cap, -1, dtype=np.int32)
                    grown = np.empty(cap // 2, dtype=np.uint64)
                    grown[:count] = keys[:count]
                    keys = grown
                    for k in range(count):
                        t = _mix(keys[k]) & mask
                        while slots[t] >= 0:
                            t = (t + np.uint64(1)) & mask
                        slots[t] = k
                break
            if keys[sid] == key:
                block_ids[i] = sid
                break
            s = (s + np.uint64(1)) & mask
    block_ids[:0] = touched  # keeps the batched loads (an empty store)
    return keys, count


def list_series(arrays: list[np.ndarray], inner: pl.DataType = pl.UInt64) -> pl.Series:
    """A ``list[inner]`` series from per-row numpy arrays.

    Polars builds a fixed-size ``Array`` column when every row has the same length,
    whatever dtype is asked for; this always returns a ``List`` column.

    Example:
        >>> list_series([np.array([1, 2]), np.array([3, 4])]).dtype
        List(UInt64)
    """
    series = pl.Series(arrays) if arrays else pl.Series([], dtype=pl.List(inner))
    return series.cast(pl.List(inner))
