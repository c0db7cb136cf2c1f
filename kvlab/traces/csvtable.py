"""CSV trace files read by polars into string columns that remember each row's file line, and
the column checks the CSV loaders share (errors ``file:line: field 'x': what is wrong``)."""

from __future__ import annotations

import csv
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.traces.errors import TraceFormatError
from kvlab.traces.sniff import Peek
from kvlab.traces.textfile import check_trace_path, is_gzip_name

_LEADING_BLANK = re.compile(rb"(?:[ \t\r]*\n)*")
_BLANK_LINE = re.compile(rb"(?m)^[ \t\r]*$")
_BOM = b"\xef\xbb\xbf"


def header_names(line: str) -> list[str]:
    """The column names of a CSV header line (split on commas; spaces and quotes around a name
    dropped).

    >>> header_names(' "TIMESTAMP", ContextTokens,GeneratedTokens\\r')
    ['TIMESTAMP', 'ContextTokens', 'GeneratedTokens']
    """
    return [name.strip().strip('"').strip() for name in line.strip().split(",")]


def missing_column(peek: Peek, required: tuple[str, ...]) -> str | None:
    """The CSV formats' sniff: ``None`` when the first non-blank line is a header naming every
    ``required`` column, else the line and the first column it lacks."""
    if peek.entries:
        return "a folder, not a file"
    if peek.first_line is None:
        return peek.error or "no first line"
    names = header_names(peek.first_line)
    for name in required:
        if name not in names:
            return f"{peek.where(name)}: missing from the CSV header (first line {peek.first_line[:60]!r})"
    return None


@dataclass(frozen=True, eq=False)
class CsvTable:
    """A CSV file's records as string columns, with the 1-based line of each.

    Attributes:
        path: the file.
        frame: one ``String`` column per header name, one row per non-blank data line.
        lines: ``int64[rows]``, the file line of each row (the header is line 1 unless blank
            lines precede it).
        extra: header names beyond the ones asked for, in header order.
    """

    path: Path
    frame: pl.DataFrame
    lines: np.ndarray
    extra: tuple[str, ...]

    def error(self, row: int, name: str, what: str) -> TraceFormatError:
        """``file:line: field 'name': what`` for row ``row``."""
        return TraceFormatError(self.path, int(self.lines[row]), f"field {name!r}: {what}")

    def strings(self, name: str) -> pl.Series:
        """Column ``name`` with surrounding spaces stripped; an empty cell raises.

        Raises:
            TraceFormatError: the first row whose cell is empty or missing.
        """
        values = self.frame[name].str.strip_chars()
        empty = values.is_null() | (values.str.len_bytes() == 0)
        if empty.any():
            raise self.error(_first(empty), name, "empty or missing")
        return values

    def ints(self, name: str, *, high: int = 2**32 - 1) -> np.ndarray:
        """Column ``name`` as ``int64`` integers in ``[0, high]``.

        Raises:
            TraceFormatError: at the first cell that is empty, not an integer (``1.5``, ``abc``),
                negative, or above ``high``.
        """
        text = self.strings(name)
        values = text.cast(pl.Int64, strict=False)
        bad = values.is_null()
        if bad.any():
            row = _first(bad)
            raise self.error(row, name, f"{text[row]!r} is not an integer")
        array = values.to_numpy()
        for mask, what in ((array < 0, "is negative"), (array > high, f"is above {high:,}")):
            if mask.any():
                row = int(np.argmax(mask))
                raise self.error(row, name, f"{array[row]} {what}")
        return array

    def reals(self, name: str) -> np.ndarray:
        """Column ``name`` as finite ``float64`` numbers.

        Raises:
            TraceFormatError: at the first cell that is empty, not a number, or not finite.
        """
        text = self.strings(name)
        values = text.cast(pl.Float64, strict=False)
        bad = values.is_null()
        if bad.any():
            row = _first(bad)
            raise self.error(row, name, f"{text[row]!r} is not a number")
        array = values.to_numpy()
        if not np.isfinite(array).all():
            row = int(np.argmax(~np.isfinite(array)))
            raise self.error(row, name, f"{text[row]!r} is not a finite number")
        return array


def _first(mask: pl.Series) -> int:
    return int(mask.arg_true()[0])


def read_csv_table(path: str | Path, required: tuple[str, ...]) -> CsvTable:
    """Read a CSV trace file (plain or gzip by magic bytes, a UTF-8 byte-order mark skipped,
    blank lines skipped) with polars, every cell a string, keeping each row's file line.

    Args:
        path: the file.
        required: the columns the format needs (all must be in the header).

    Returns:
        A :class:`CsvTable`.

    Raises:
        FileNotFoundError: no such file.
        TraceFormatError: unreadable bytes, an empty file, a header without a required column
            (line of the header), a header only (no records), a line with more fields than the
            header, or not UTF-8 (naming the line).
    """
    path = Path(path)
    check_trace_path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if is_gzip_name(path) else path.read_bytes()
    except (OSError, EOFError) as err:
        raise TraceFormatError(path, None, f"cannot read: {err}") from None
    raw = raw.removeprefix(_BOM)
    start = _LEADING_BLANK.match(raw).end()
    if start >= len(raw.rstrip()):
        raise TraceFormatError(path, None, "no records (empty file)")
    header_line = raw.count(b"\n", 0, start) + 1
    body = raw[start:] if start else raw  # a copy only when blank lines precede the header
    try:
        frame = pl.read_csv(body, infer_schema=False, has_header=True)
    except Exception as err:  # polars raises several error types for malformed CSV
        _locate(path, raw, header_line, err)
    names = [name.strip() for name in frame.columns]  # as the sniff reads them: spaces around a name dropped
    if names != frame.columns:
        frame = frame.rename(dict(zip(frame.columns, names)))
    for name in required:
        if name not in names:
            raise TraceFormatError(path, header_line, f"field {name!r}: missing from the CSV header {names}")
    lines = header_line + 1 + np.arange(frame.height, dtype=np.int64)
    text_lines = raw.count(b"\n", start) + (0 if raw.endswith(b"\n") else 1) - 1  # data lines after the header
    if frame.height != text_lines:
        raise TraceFormatError(path, None, f"{frame.height} CSV records on {text_lines} data lines: a quoted field "
                                           "spanning lines? (not supported in a trace CSV)")
    blank = _blank_rows(raw, start, frame.height)
    if blank is not None:
        frame, lines = frame.filter(pl.Series(~blank)), lines[~blank]
    if frame.height == 0:
        raise TraceFormatError(path, header_line, "no records after the CSV header")
    return CsvTable(path, frame, lines, tuple(n for n in names if n not in required))


def _blank_rows(raw: bytes, start: int, rows: int) -> np.ndarray | None:
    """Which data rows are blank lines (``None``: none; the usual case, found by one regex scan)."""
    header_end = raw.find(b"\n", start)
    end = len(raw) - 1 if raw.endswith(b"\n") else len(raw)
    if header_end < 0 or header_end >= end or not _BLANK_LINE.search(raw, header_end + 1, end):
        return None
    return np.array([not line.strip() for line in raw[header_end + 1:end].split(b"\n")[:rows]], dtype=np.bool_)


def _locate(path: Path, raw: bytes, header_line: int, err: Exception) -> None:
    """Find the line polars could not read (not UTF-8, more fields than the header) and raise
    there; else raise polars' reason for the whole file."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = raw.count(b"\n", 0, bad.start) + 1
        column = bad.start - raw.rfind(b"\n", 0, bad.start) - 1
        raise TraceFormatError(path, line, f"not UTF-8 text ({bad.reason} at byte {column} of the line); "
                                           "a binary file?") from None
    width = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if lineno < header_line or not line.strip():
            continue
        fields = next(csv.reader([line]))
        if width is None:
            width = len(fields)
        elif len(fields) > width:
            raise TraceFormatError(path, lineno, f"{len(fields)} fields but the CSV header has {width}")
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    raise TraceFormatError(path, None, f"not readable as CSV: {reason}")
