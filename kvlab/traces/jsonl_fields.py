"""Reading JSON-lines traces whose records are flat objects with typed fields (Bailian / Qwen,
ServeGen offline): a columnar fast path (polars with a strict schema, vectorised checks) and a
line-by-line path that names the first bad line and field (``file:line: field 'x': what is wrong``).

The fast path answers for plainly valid files; anything it cannot vouch for (a blank line, a
missing field or null, a value of another type or out of range) sends the file to the
line-by-line reader, which either raises the precise error or reads the file itself.
Fields other than the declared ones are ignored.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import U64_MAX, check_int, check_real, check_u64
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.textfile import is_gzip_name, iter_records

_U32_END = 2**32 - 1
_BLANK_LINE = re.compile(rb"\n[ \t\r]*\n")
_BLANK_FIRST_LINE = re.compile(rb"[ \t\r]*\n")
_POLARS = {"count": pl.Int64, "int": pl.Int64, "id": pl.UInt64, "time": pl.Float64, "str": pl.String,
           "ids": pl.List(pl.UInt64), "strs": pl.List(pl.String)}


@dataclass(frozen=True)
class Field:
    """One field of a record.

    Attributes:
        name: the JSON key.
        kind: ``"count"`` (integer in ``[0, 2**32)``), ``"int"`` (integer in ``[low, high]``),
            ``"id"`` (integer in ``[0, 2**64)``),
            ``"time"`` (finite number >= 0), ``"str"``, ``"ids"`` (list of integers in
            ``[0, 2**64)``) or ``"strs"`` (list of strings).
        low, high: the bounds of an ``"int"`` field.
    """

    name: str
    kind: str
    low: int | None = None
    high: int | None = None


def read_fields(path: Path, fields: Sequence[Field]) -> tuple[pl.DataFrame, np.ndarray]:
    """The records of a JSON-lines file as columns, every field checked.

    Args:
        path: the file (gzip found by name or magic bytes; a UTF-8 byte-order mark skipped).
        fields: the fields every record must have.

    Returns:
        ``(frame, lines)``: one column per field (``count``/``int`` as i64, ``id`` u64, ``time`` f64,
        ``str`` string, ``ids`` list[u64], ``strs`` list[str]) in file order, and
        ``int64[rows]`` the 1-based line of each record (blank lines are skipped).

    Raises:
        TraceFormatError: naming the file and line: malformed JSON, a record that is not an
            object, a missing field, a value of the wrong type or out of range; or no records.
    """
    columnar = _read_columnar(path, fields)
    return columnar if columnar is not None else _read_by_line(path, fields)


def _read_columnar(path: Path, fields: Sequence[Field]) -> tuple[pl.DataFrame, np.ndarray] | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if is_gzip_name(path) else path.read_bytes()
    except (OSError, EOFError):
        return None
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    end = len(raw)
    while end and raw[end - 1] in b" \t\r\n":
        end -= 1
    if not end or _BLANK_FIRST_LINE.match(raw) or _BLANK_LINE.search(raw, 0, end):
        return None
    num_lines = raw.count(b"\n", 0, end) + 1
    body = raw[:end]
    for f in fields:  # polars turns a number or list into a string for a string field: count the keys
        if f.kind in ("str", "strs"):
            key = re.escape(f.name.encode())
            value = rb'"' if f.kind == "str" else rb'\[\s*(?:"[^"\\]*"\s*(?:,\s*"[^"\\]*"\s*)*)?\]'
            if len(re.findall(rb'"' + key + rb'"\s*:\s*' + value, body)) != num_lines:
                return None
    try:  # strict: a value of another numeric or list type raises
        frame = pl.read_ndjson(body, schema={f.name: _POLARS[f.kind] for f in fields})
    except Exception:  # polars raises several error types for malformed or mixed records
        return None
    if frame.height != num_lines or frame.null_count().sum_horizontal().item():
        return None
    for f in fields:
        col = frame[f.name]
        if f.kind in ("ids", "strs"):
            if col.explode(empty_as_null=False).null_count():
                return None
            continue
        if f.kind in ("str", "id"):  # the strict u64 schema checked an id
            continue
        values = col.to_numpy()
        if f.kind == "time":
            bad = not np.isfinite(values).all() or (values < 0).any()
        else:
            low, high = (0, _U32_END) if f.kind == "count" else (f.low, f.high)
            bad = (low is not None and (values < low).any()) or (high is not None and (values > high).any())
        if bad:
            return None
    return frame, np.arange(1, frame.height + 1, dtype=np.int64)


def _read_by_line(path: Path, fields: Sequence[Field]) -> tuple[pl.DataFrame, np.ndarray]:
    columns: dict[str, list] = {f.name: [] for f in fields}
    lines: list[int] = []
    for lineno, record in iter_records(path):
        for f in fields:
            columns[f.name].append(check_field(path, lineno, record, f))
        lines.append(lineno)
    if not lines:
        raise TraceFormatError(path, None, "no records (empty file)")
    frame = pl.DataFrame({f.name: pl.Series(f.name, columns[f.name], dtype=_POLARS[f.kind]) for f in fields})
    return frame, np.asarray(lines, dtype=np.int64)


def check_field(path: Path, lineno: int, record: dict, f: Field) -> object:
    """``record[f.name]`` checked against ``f`` (see :class:`Field`).

    Raises:
        TraceFormatError: ``file:line: field 'x': what is wrong`` (or ``missing field 'x'``).
    """
    if f.name not in record:
        raise TraceFormatError(path, lineno, f"missing field {f.name!r}")
    value = record[f.name]
    label = f"field {f.name!r}"
    try:
        if f.kind == "count":
            return check_int(label, value, low=0, high=_U32_END)
        if f.kind == "int":
            return check_int(label, value, low=f.low, high=f.high)
        if f.kind == "id":
            return check_u64(label, value)
        if f.kind == "time":
            return check_real(label, value, low=0.0)
        if f.kind == "str":
            if not isinstance(value, str):
                raise ValueError(f"{label} must be a string, got {value!r}")
            return value
        if not isinstance(value, list):
            raise ValueError(f"{label} must be a list, got {type(value).__name__}")
        if f.kind == "strs":
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise ValueError(f"{f.name}[{i}] must be a string, got {item!r}")
            return value
        if not all(type(v) is int for v in value) or (value and not 0 <= min(value) <= max(value) <= U64_MAX):
            for i, item in enumerate(value):  # name the first bad id (type() is int: JSON ints, not bools)
                check_u64(f"{f.name}[{i}]", item)
        return value
    except ValueError as err:
        raise TraceFormatError(path, lineno, str(err)) from None


def check_block_counts(path: Path, lines: np.ndarray, input_length: np.ndarray, ids: pl.Series,
                       block_size: int) -> np.ndarray:
    """``offsets`` (``int64[rows + 1]``) of the id lists after checking that each has
    ``ceil(input_length / block_size)`` ids (the last block partial).

    Raises:
        TraceFormatError: naming the first line whose count differs, with both numbers.
    """
    counts = ids.list.len().to_numpy().astype(np.int64)
    expected = -(-np.asarray(input_length, dtype=np.int64) // block_size)
    bad = np.flatnonzero(counts != expected)
    if bad.size:
        i = int(bad[0])
        n_in = int(input_length[i])
        raise TraceFormatError(path, int(lines[i]), f"{counts[i]} hash_ids but input_length={n_in} needs "
                                                    f"ceil({n_in}/{block_size})={expected[i]}")
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def flat_ids(ids: pl.Series) -> np.ndarray:
    """All ids of a ``list[u64]`` column, concatenated (``uint64[refs]``)."""
    return ids.explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.uint64, copy=False)


def first_duplicate(path: Path, lines: np.ndarray, values: np.ndarray, name: str) -> None:
    """Raise at the first row whose ``values`` entry appeared on an earlier row.

    Raises:
        TraceFormatError: ``file:line: field 'name': value v repeats line L``.
    """
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    dup = np.flatnonzero(sorted_values[1:] == sorted_values[:-1])
    if dup.size:
        later = order[dup + 1]  # for each repeat, the later row of the pair (stable sort)
        row = int(later.min())
        first = int(np.flatnonzero(values == values[row])[0])
        raise TraceFormatError(path, int(lines[row]), f"field {name!r}: value {int(values[row])} repeats "
                                                      f"line {int(lines[first])}; it must be unique")
