"""Building a :class:`~kvlab.traces.Trace` from numpy arrays (object ids, or CSR block keys),
with no Python loop per request."""

from __future__ import annotations

import numpy as np
import polars as pl

from kvlab.core.validate import check_flag, check_positive, check_str
from kvlab.traces.trace import Trace, trusted_trace


def trace_from_arrays(block_keys: object, *, offsets: object = None, arrival_s: object = None,
                      input_tokens: object = None, output_tokens: object = None, request_id: object = None,
                      block_size: int = 1, partial_block_keyed: bool = True, source: str = "arrays") -> Trace:
    """A :class:`Trace` from flat arrays: one object id per request, or CSR block keys.

    Without ``offsets`` every request references one block, ``block_keys[r]`` — the
    object-cache workload of libCacheSim and the caching literature (a stream of object
    ids). With ``offsets`` (CSR row pointers, as :class:`~kvlab.traces.FlatTrace` holds
    them) request ``r`` references ``block_keys[offsets[r]:offsets[r + 1]]`` in prompt
    order (chained keys, e.g. Mooncake ``hash_ids`` or a hasher's output).

    Args:
        block_keys: ``uint64``-compatible integers ``[num_refs]`` (any non-negative
            integer dtype; keys need not be dense).
        offsets: ``int[num_requests + 1]``, ``offsets[0] == 0``, non-decreasing,
            ``offsets[-1] == len(block_keys)``; ``None``: one block per request.
        arrival_s: ``float[num_requests]`` seconds, finite, ≥ 0, non-decreasing;
            ``None``: a logical clock, request ``r`` arrives at ``r`` seconds.
        input_tokens: ``int[num_requests]`` prompt tokens; ``None``: every block full
            (``blocks × block_size``).
        output_tokens: ``int[num_requests]``; ``None``: 0.
        request_id: ``int[num_requests]``, unique; ``None``: ``0, 1, …``.
        block_size: tokens per block (1 for object ids).
        partial_block_keyed: as :class:`Trace` (whether a trailing partial block has a key).
        source: where the arrays came from.

    Returns:
        The trace; its ``block_keys`` column and its flat form are built from the arrays
        (no per-request Python), the columns given are checked as every trace's are
        (:class:`Trace` raises) and the ones made here are right by construction. The
        trace holds copies: changing the arrays afterwards does not change it.

    Raises:
        ValueError: an argument that is not a one-dimensional integer array (floats and
            bools are refused, not truncated), a negative value, a length that does not
            match, bad ``offsets``; or what :class:`Trace` refuses (duplicate
            ``request_id``, decreasing arrivals, block counts that do not match
            ``input_tokens``), naming the field and the first offending row.

    Example:
        >>> import numpy as np
        >>> trace = trace_from_arrays(np.array([5, 7, 5], dtype=np.uint64))
        >>> trace.frame["block_keys"].to_list(), trace.flat.block_ids.tolist()
        ([[5], [7], [5]], [0, 1, 0])
        >>> csr = trace_from_arrays([7, 9, 7, 3, 4], offsets=[0, 2, 5], block_size=16, input_tokens=[20, 40])
        >>> csr.frame["block_keys"].to_list(), csr.frame["input_tokens"].to_list()
        ([[7, 9], [7, 3, 4]], [20, 40])
    """
    block_size = check_positive("block_size", block_size)
    check_flag("partial_block_keyed", partial_block_keyed)
    check_str("source", source)
    keys = np.array(_int_array("block_keys", block_keys), dtype=np.uint64)  # a copy: the trace's own
    if offsets is None:
        num_requests = keys.shape[0]
        offsets = np.arange(num_requests + 1, dtype=np.int64)
        blocks = np.broadcast_to(np.int64(1), (num_requests,))  # no array of ones
        row_numbers = offsets[:-1].view(np.uint64)  # offsets[r] == r: the default request ids, no second array
        default_tokens = None if input_tokens is not None else np.full(
            num_requests, block_size, dtype=np.uint32 if block_size < 2**32 else np.int64)
    else:
        offsets = np.array(_int_array("offsets", offsets), dtype=np.int64)  # a copy: the flat form's own
        _check_offsets(offsets, keys.shape[0])
        num_requests = offsets.shape[0] - 1
        blocks = np.diff(offsets)
        default_tokens = blocks * block_size if input_tokens is None else None
        row_numbers = np.arange(num_requests, dtype=np.uint64) if request_id is None else None
    if num_requests == 0:
        raise ValueError("a trace needs at least one request; block_keys/offsets describe none")
    frame = pl.DataFrame({
        "request_id": _column("request_id", request_id, num_requests, row_numbers),
        "arrival_s": _times(arrival_s, num_requests),
        "input_tokens": _column("input_tokens", input_tokens, num_requests, default_tokens),
        "output_tokens": _column("output_tokens", output_tokens, num_requests, np.zeros(num_requests, np.uint32)),
        "block_keys": _list_column(keys, offsets, blocks),
    })
    # the columns made here hold their row invariants by construction: only given ones are checked
    trusted = [name for name, given in (("request_id", request_id), ("arrival_s", arrival_s),
                                        ("block_keys", input_tokens)) if given is None]
    return trusted_trace(frame, block_size, source, partial_block_keyed, trusted=trusted, lengths=blocks,
                         csr=(offsets, keys))


def _list_column(keys: np.ndarray, offsets: np.ndarray, blocks: np.ndarray) -> pl.Series:
    """The ``block_keys`` column of CSR keys: ``keys`` reshaped when every request has as many
    blocks (≥ 1; no per-row work), else sliced per row by polars."""
    num_requests = blocks.shape[0]
    width = int(blocks[0])
    if width and (blocks.strides == (0,) or (blocks == width).all()):
        return pl.Series("block_keys", keys).reshape((num_requests, width)).cast(pl.List(pl.UInt64))
    return (pl.DataFrame({"start": pl.Series(offsets[:-1]), "len": pl.Series(blocks)})
            .select(pl.lit(pl.Series(keys)).implode().list.slice(pl.col("start"), pl.col("len")).alias("block_keys"))
            .to_series())


def _int_array(name: str, values: object) -> np.ndarray:
    """``values`` as a one-dimensional array of non-negative integers, or a ValueError naming it."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a one-dimensional array, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.signedinteger) and (array < 0).any():
        row = int(np.argmax(array < 0))
        raise ValueError(f"{name} must be >= 0; {name}[{row}] is {array[row]}")
    return array


def _check_offsets(offsets: np.ndarray, num_refs: int) -> None:
    if offsets.shape[0] == 0 or offsets[0] != 0 or offsets[-1] != num_refs:
        first, last = (offsets[0], offsets[-1]) if offsets.shape[0] else (None, None)
        raise ValueError(f"offsets must start at 0 and end at len(block_keys)={num_refs} (CSR row pointers), "
                         f"got offsets[0]={first}, offsets[-1]={last}")
    back = offsets[1:] < offsets[:-1]
    if back.any():
        row = int(np.argmax(back)) + 1
        raise ValueError(f"offsets must be non-decreasing; offsets[{row}]={offsets[row]} after {offsets[row - 1]}")


def _column(name: str, values: object, num_requests: int, default: np.ndarray | None) -> np.ndarray:
    if values is None:
        return default
    array = _int_array(name, values)
    if array.shape[0] != num_requests:
        raise ValueError(f"{name} has {array.shape[0]} values for {num_requests} requests")
    return array.copy()  # the frame would otherwise share the caller's memory


def _times(values: object, num_requests: int) -> np.ndarray:
    if values is None:
        return np.arange(num_requests, dtype=np.float64)
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"arrival_s must be a one-dimensional array of seconds, got dtype {array.dtype} "
                         f"of shape {array.shape}")
    if array.shape[0] != num_requests:
        raise ValueError(f"arrival_s has {array.shape[0]} values for {num_requests} requests")
    return array.astype(np.float64)  # a copy, as every column
