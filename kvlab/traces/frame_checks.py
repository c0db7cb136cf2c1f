"""The checks every :class:`~kvlab.traces.Trace` frame passes: required columns, dtypes (cast to
the canonical ones), no nulls, and the row invariants, with no per-row Python."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import polars as pl

#: Required columns and their canonical dtypes (docs/DESIGN.md "Data model").
REQUIRED_COLUMNS: dict[str, pl.DataType] = {
    "request_id": pl.UInt64(),
    "arrival_s": pl.Float64(),
    "input_tokens": pl.UInt32(),
    "output_tokens": pl.UInt32(),
    "block_keys": pl.List(pl.UInt64()),
}
#: Optional columns with a fixed dtype (others, e.g. ``session_id``, ``model``,
#: ``lora_name``, are kept as given).
TYPED_OPTIONAL_COLUMNS: dict[str, pl.DataType] = {"token_ids": pl.List(pl.UInt32())}
#: Row invariants a builder may vouch for (:func:`canonical_frame`'s ``trusted``).
ROW_INVARIANTS = ("request_id", "arrival_s", "block_keys")


def _dtype_ok(col: str, dtype: pl.DataType) -> bool:
    """Integers stay integers and times stay numbers: no truncating or parsing casts."""
    if col == "arrival_s":
        return dtype.is_numeric()
    if isinstance(dtype, pl.List):
        inner = dtype.inner
        return inner == pl.Null or inner.is_integer()
    return dtype.is_integer()


def canonical_frame(frame: pl.DataFrame, block_size: int, partial_block_keyed: bool, *,
                    trusted: Collection[str] = (), lengths: np.ndarray | None = None) -> pl.DataFrame:
    """Check dtypes, cast required columns to theirs and check the trace invariants.

    Args:
        frame: the requests (see :class:`~kvlab.traces.Trace` for the columns).
        block_size: tokens per block.
        partial_block_keyed: whether a trailing partial block has a key (the block-count rule).
        trusted: row invariants (names from :data:`ROW_INVARIANTS`) that hold by
            construction and are not checked again: ``request_id`` increasing (e.g. a
            ``0, 1, …`` the builder made), ``arrival_s`` finite, >= 0 and non-decreasing,
            ``block_keys`` counts matching ``input_tokens``. Dtypes and nulls are always checked.
        lengths: ``int[num_requests]``, the block count of each row when the builder has it
            (no list lengths computed); ``None``: taken from ``block_keys``.

    Returns:
        The frame, required columns first, cast to their canonical dtypes.

    Raises:
        ValueError: as :class:`~kvlab.traces.Trace` says, naming the column and first bad row.
    """
    unknown = set(trusted) - set(ROW_INVARIANTS)
    if unknown:
        raise ValueError(f"trusted must name row invariants among {ROW_INVARIANTS}, got {sorted(unknown)}")
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"trace frame is missing column(s) {missing}; has {frame.columns}")
    if frame.height == 0:
        raise ValueError("a trace needs at least one request; the frame is empty")
    casts = {**REQUIRED_COLUMNS, **{c: t for c, t in TYPED_OPTIONAL_COLUMNS.items() if c in frame.columns}}
    for col, dtype in casts.items():
        if not _dtype_ok(col, frame.schema[col]):
            kind = "numeric" if col == "arrival_s" else "integer"
            raise ValueError(f"column {col!r} must have {kind} values ({dtype}), got dtype {frame.schema[col]}")
        try:
            frame = frame.with_columns(frame[col].cast(dtype, strict=True))
        except Exception as err:  # polars raises several error types for a failed cast
            raise ValueError(f"column {col!r} has a value out of range for {dtype} (negative?): {err}") from None
        _reject_nulls(frame[col], col)
    frame = frame.select(*REQUIRED_COLUMNS, *[c for c in frame.columns if c not in REQUIRED_COLUMNS])
    _check_rows(frame, block_size, partial_block_keyed, trusted, lengths)
    return frame


def _first_row(mask: pl.Series) -> int:
    return int(mask.arg_true()[0])


def _reject_nulls(series: pl.Series, col: str) -> None:
    if isinstance(series.dtype, pl.List):
        if not series.null_count() and not series.explode(empty_as_null=False).null_count():
            return
        nulls = series.is_null() | series.list.eval(pl.element().is_null().any()).list.first().fill_null(False)
    elif not series.null_count():
        return
    else:
        nulls = series.is_null()
    raise ValueError(f"column {col!r} has a null at row {_first_row(nulls)}")


def _check_rows(frame: pl.DataFrame, block_size: int, partial_block_keyed: bool, trusted: Collection[str],
                lengths: np.ndarray | None) -> None:
    """The row invariants not ``trusted``, on numpy views of the columns (no per-row Python;
    the slower searches for the offending row run only when a check fails)."""
    if "request_id" not in trusted:
        _check_request_ids(frame)
    if "arrival_s" not in trusted:
        _check_arrivals(frame["arrival_s"].to_numpy())
    _check_token_counts(frame, block_size, partial_block_keyed, "block_keys" not in trusted, lengths)


def _check_request_ids(frame: pl.DataFrame) -> None:
    ids = frame["request_id"].to_numpy()
    if ids.shape[0] > 1 and not (ids[1:] > ids[:-1]).all():  # increasing ids are unique
        repeat = ~frame["request_id"].is_first_distinct()
        if repeat.any():
            row = _first_row(repeat)
            raise ValueError(f"column 'request_id' has duplicate value {ids[row]} (row {row})")


def _check_arrivals(arrival: np.ndarray) -> None:
    bad = ~(np.isfinite(arrival) & (arrival >= 0))
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"column 'arrival_s' must be finite and >= 0; row {row} has {arrival[row]}")
    back = arrival[1:] < arrival[:-1]
    if back.any():
        row = int(np.argmax(back)) + 1
        raise ValueError(f"column 'arrival_s' must be non-decreasing (rows in arrival order); "
                         f"row {row} has {arrival[row]} after {arrival[row - 1]}")


def _check_token_counts(frame: pl.DataFrame, block_size: int, partial_block_keyed: bool, check_blocks: bool,
                        lengths: np.ndarray | None) -> None:
    """Block counts (when ``check_blocks``) and ``token_ids`` lengths against ``input_tokens``."""
    token_counts = frame["token_ids"].list.len().to_numpy() if "token_ids" in frame.columns else None
    if not check_blocks and token_counts is None:
        return
    rounding = block_size - 1 if partial_block_keyed else 0
    tokens = frame["input_tokens"].to_numpy()
    if check_blocks and lengths is None:
        lengths = frame["block_keys"].list.len().to_numpy()
    for start in range(0, tokens.shape[0], _CHECK_CHUNK):  # chunks: no int64 copy of a whole column
        part = tokens[start:start + _CHECK_CHUNK].astype(np.int64)
        expected = (part + rounding) // block_size if check_blocks else None
        wrong = lengths[start:start + _CHECK_CHUNK] != expected if check_blocks else None
        if check_blocks and wrong.any():
            row = start + int(np.argmax(wrong))
            rule = "ceil" if partial_block_keyed else "floor (full blocks only)"
            raise ValueError(
                f"row {row}: {lengths[row]} block keys but input_tokens="
                f"{tokens[row]} needs {rule.split()[0]}({tokens[row]}/{block_size})="
                f"{expected[row - start]} ({rule})")
        if token_counts is not None:
            wrong = token_counts[start:start + _CHECK_CHUNK] != part
            if wrong.any():
                row = start + int(np.argmax(wrong))
                raise ValueError(f"row {row}: token_ids has {token_counts[row]} tokens "
                                 f"but input_tokens={tokens[row]}")


#: Rows checked at a time by :func:`_check_token_counts`.
_CHECK_CHUNK = 1 << 20
