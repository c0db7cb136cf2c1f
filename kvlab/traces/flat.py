"""Flat (CSR) form of a trace for the numba kernels: offsets + dense block ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


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
        input_tokens: ``int64[num_requests]``, prompt length of each request in tokens.
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
    lengths = block_keys.list.len().to_numpy().astype(np.int64)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    refs = block_keys.explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.uint64, copy=False)
    sorted_keys, first_index, inverse = np.unique(refs, return_index=True, return_inverse=True)
    order = np.argsort(first_index, kind="stable")  # dense id -> index into sorted_keys
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return FlatTrace(
        offsets=offsets,
        block_ids=rank[inverse].astype(np.int32),
        keys=sorted_keys[order],
        input_tokens=input_tokens.to_numpy().astype(np.int64),
        block_size=block_size,
    )


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
