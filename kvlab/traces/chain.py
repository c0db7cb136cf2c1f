"""The loaders' chaining check: every block key always follows the same parent key at the same
position (docs/DESIGN.md "Data model": equal key ⇒ equal whole prefix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvlab.traces.errors import TraceFormatError
from kvlab.traces.flat import FlatTrace


def check_chained_keys(flat: FlatTrace, path: str | Path, *, field: str = "block_keys", noun: str = "key",
                       lines: object = None) -> None:
    """Raise at the first block reference whose key was seen before with another parent key or
    at another position (a key repeated inside one request is one such case).

    Every trace file reader calls it (:func:`kvlab.traces.load_mooncake`, the kvlab Parquet
    reader); :meth:`kvlab.traces.Trace.check_chained` lists every offending key instead.

    Args:
        flat: the trace's flat form (:attr:`kvlab.traces.Trace.flat`).
        path: the file, named in the error.
        field: the column or JSON field of the keys, named in the error (``block_keys``,
            Mooncake's ``hash_ids``).
        noun: what the error calls one key (``key``, Mooncake's ``id``).
        lines: ``int[num_requests]``, the 1-based line of each request in the file (text
            formats: the error names the lines); ``None`` names 0-based rows instead.

    Raises:
        TraceFormatError: naming the file, the row (or line) of the offending reference,
            the key, both parents and positions and the row (or line) where the key was
            first seen.

    Example:
        >>> import polars as pl
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> keys = pl.Series([[1, 2], [3, 2]], dtype=pl.List(pl.UInt64))
        >>> check_chained_keys(flatten_block_keys(keys, pl.Series([8, 8]), 4), "t.parquet")
        Traceback (most recent call last):
        ...
        kvlab.traces.errors.TraceFormatError: t.parquet: row 1: block_keys[1]=2 follows key 3 here but key 1 \
at position 1 in row 0: the keys are not prefix-chained
    """
    ids = flat.block_ids.astype(np.int64)
    if not ids.size:
        return
    starts = flat.offsets[:-1]
    blocks = flat.blocks_per_request()
    position = np.arange(ids.size, dtype=np.int64) - np.repeat(starts, blocks)
    parent = np.where(position == 0, -1, np.roll(ids, 1))
    # dense ids follow first appearance: a reference is its key's first iff its id exceeds every id before it
    first = ids > np.concatenate([[-1], np.maximum.accumulate(ids)[:-1]])
    first_ref = np.empty(flat.num_keys, dtype=np.int64)
    first_ref[ids[first]] = np.flatnonzero(first)
    seen = first_ref[ids]
    bad = (parent != parent[seen]) | (position != position[seen])
    if not bad.any():
        return
    ref = int(np.argmax(bad))
    ref0 = int(seen[ref])
    row, row0 = (int(r) for r in np.searchsorted(flat.offsets, [ref, ref0], side="right") - 1)

    def after(parent_id: int) -> str:
        return "nothing (first block)" if parent_id < 0 else f"{noun} {int(flat.keys[parent_id])}"

    here = (f"{field}[{position[ref]}]={int(flat.keys[ids[ref]])} follows {after(parent[ref])} here but "
            f"{after(parent[ref0])} at position {position[ref0]}")
    if lines is None:
        raise TraceFormatError(path, None, f"row {row}: {here} in row {row0}: the {noun}s are not prefix-chained")
    lines = np.asarray(lines)
    raise TraceFormatError(path, int(lines[row]), f"{here} on line {int(lines[row0])}: the {noun}s are not "
                                                  f"prefix-chained")
