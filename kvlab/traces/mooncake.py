"""Reader for the Mooncake trace format (kvcache-ai/Mooncake ``FAST25-release/traces``).

One JSON object per line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is the arrival in milliseconds from the trace start, ``hash_ids`` one
prefix-chained id per 512-token block of the prompt (the last block partial).
"""

from __future__ import annotations

import gzip
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import U64_MAX, check_int, check_positive, check_real, check_u64
from kvlab.traces.chain import check_chained_keys
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.sniff import Peek, TraceFormat, missing_field, provenance, stamp
from kvlab.traces.textfile import check_trace_path, is_gzip_name, iter_records
from kvlab.traces.trace import Trace

#: Block size of the published Mooncake traces (repo README; FAST'25 appendix A.2).
MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_BLANK_LINE = re.compile(rb"\n[ \t\r]*\n")
_BLANK_FIRST_LINE = re.compile(rb"[ \t\r]*\n")
#: The published Mooncake traces by file stem (``.jsonl`` or ``.jsonl.gz``): all one format.
MOONCAKE_TRACES = {
    "conversation_trace": "FAST'25 conversation trace",
    "synthetic_trace": "FAST'25 synthetic trace",
    "toolagent_trace": "FAST'25 tool&agent trace",
    "mooncake_trace": "arXiv 2407.00079 trace (FAST25-release/arxiv-trace)",
}
#: The columnar reader's schema: strict, so a value of another type fails the read.
_SCHEMA = {"timestamp": pl.Float64, "input_length": pl.Int64, "output_length": pl.Int64,
           "hash_ids": pl.List(pl.UInt64)}


def load_mooncake(path: str | Path, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Load a Mooncake JSONL trace.

    Rows keep file order (which is arrival order); ``request_id`` is the 0-based row
    number, ``arrival_s = timestamp / 1000``, ``block_keys = hash_ids``. Blank lines
    are skipped; fields other than the four known ones are reported once with a
    ``UserWarning`` and not loaded. The ids must be prefix-chained, as the format
    promises: every id always follows the same parent id at the same position.

    Args:
        path: the ``.jsonl`` file (``.jsonl.gz`` is read compressed).
        block_size: tokens per hash id (512 for the published traces).

    Returns:
        A :class:`~kvlab.traces.Trace` with ``source = str(path)``.

    Raises:
        TraceFormatError: naming the file and 1-based line, for a malformed JSON line,
            a record that is not an object, a missing field, a non-numeric or negative
            timestamp, a timestamp earlier than the previous line's, a negative or
            non-integer length, a non-integer or out-of-range (not u64) hash id, or
            ``len(hash_ids) != ceil(input_length / block_size)``, an id seen earlier
            with another parent or at another position (the ids are not chained; the
            message names both lines), bytes that are not UTF-8 text; also for a
            file with no records.
        FileNotFoundError: the file does not exist or is not a regular file.

    Example:
        >>> from kvlab.paths import bundled_trace_path
        >>> trace = load_mooncake(bundled_trace_path("synthetic"))
        >>> len(trace), trace.block_size, trace.block_refs
        (3993, 512, 121877)
    """
    path = Path(path)
    block_size = check_positive("block_size", block_size)
    check_trace_path(path)
    trace = _load_columnar(path, block_size)
    if trace is None:
        trace = _load_by_line(path, block_size)
    stem = path.name.lower().removesuffix(".gz").removesuffix(".jsonl")
    facts = {"variant": MOONCAKE_TRACES[stem]} if stem in MOONCAKE_TRACES else {}
    return stamp(trace, provenance("mooncake", path, {"block_size": block_size}, **facts))


def _sniff(peek: Peek) -> str | None:
    """Any object with a Mooncake field (tried after the formats whose records have more fields),
    so that a record missing one gets the reader's precise error."""
    reason = missing_field(peek, ())
    if reason is not None:
        return reason
    if not peek.record.keys() & set(MOONCAKE_FIELDS):
        return f"{peek.where(MOONCAKE_FIELDS[0])}: missing (no Mooncake field in {sorted(peek.record)[:6]})"
    ids = peek.record.get("hash_ids", [])
    if not isinstance(ids, list):
        return f"{peek.where('hash_ids')}: a JSON {type(ids).__name__}, not a list of ids"
    return None


MOONCAKE_FORMAT = TraceFormat(
    "mooncake", "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (chained, 512 tokens); "
    f"the {', '.join(MOONCAKE_TRACES)} files", _sniff, load_mooncake, ("block_size",))


def _load_columnar(path: Path, block_size: int) -> Trace | None:
    """The fast path: polars' JSON reader with the format's schema and vectorised checks;
    ``None`` when the file is not plainly valid (a blank line, an unknown field, a value of
    another type or out of range), so that :func:`_load_by_line` finds and names the line,
    or warns."""
    try:
        raw = gzip.decompress(path.read_bytes()) if is_gzip_name(path) else path.read_bytes()
    except (OSError, EOFError):
        return None
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    end = len(raw)  # the records end here: trailing white space found without copying the bytes
    while end and raw[end - 1] in b" \t\r\n":
        end -= 1
    if not end or _BLANK_FIRST_LINE.match(raw) or _BLANK_LINE.search(raw, 0, end):
        return None
    num_lines = raw.count(b"\n", 0, end) + 1
    # a record of the four fields and numbers alone has exactly 8 quotes (its keys): more
    # means another field (or a string value), which the schema below would silently drop
    if raw.count(b'"', 0, end) != 8 * num_lines:
        return None
    try:  # strict: a value of another type (a string, a float length or id, a negative id) raises
        frame = pl.read_ndjson(raw, schema=_SCHEMA)
    except Exception:  # polars raises several error types for malformed or mixed records
        return None
    if (frame.height != num_lines or frame.null_count().sum_horizontal().item()
            or frame["hash_ids"].explode(empty_as_null=False).null_count()):
        return None  # a missing field or a null
    ts = frame["timestamp"].to_numpy()
    n_in, n_out = (frame[f].to_numpy() for f in ("input_length", "output_length"))
    ids = frame["hash_ids"]
    if (not np.isfinite(ts).all() or (ts < 0).any() or (ts[1:] < ts[:-1]).any()
            or (n_in < 0).any() or (n_in > 2**32 - 1).any() or (n_out < 0).any() or (n_out > 2**32 - 1).any()
            or (ids.list.len().to_numpy() != -(-n_in // block_size)).any()):
        return None
    trace = Trace(pl.DataFrame({
        "request_id": np.arange(frame.height, dtype=np.uint64), "arrival_s": ts / 1000.0,
        "input_tokens": n_in.astype(np.uint32), "output_tokens": n_out.astype(np.uint32),
        "block_keys": ids}), block_size=block_size, source=str(path))
    check_chained_keys(trace.flat, path, field="hash_ids", noun="id", lines=np.arange(1, frame.height + 1))
    return trace


def _load_by_line(path: Path, block_size: int) -> Trace:
    """The line-by-line reader: every check names the file and line."""
    columns: dict[str, list] = {"arrival_s": [], "input_tokens": [], "output_tokens": [], "block_keys": []}
    unknown: dict[str, int] = {}
    lines: list[int] = []
    last_ms = -math.inf
    for lineno, record in iter_records(path):
        ts, n_in, n_out, ids = _check_record(path, lineno, record, block_size)
        if ts < last_ms:
            raise TraceFormatError(path, lineno, f"timestamp {ts} is earlier than the previous "
                                                 f"record's {last_ms}; records must be in arrival order")
        last_ms = ts
        lines.append(lineno)
        for key in record.keys() - set(MOONCAKE_FIELDS):
            unknown.setdefault(key, lineno)
        columns["arrival_s"].append(ts / 1000.0)
        columns["input_tokens"].append(n_in)
        columns["output_tokens"].append(n_out)
        columns["block_keys"].append(ids)
    if not columns["arrival_s"]:
        raise TraceFormatError(path, None, "no records (empty file)")
    if unknown:
        fields_at = ", ".join(f"{k!r} (first at line {n})" for k, n in sorted(unknown.items()))
        warnings.warn(f"{path}: fields not part of the Mooncake format were not loaded: {fields_at}",
                      UserWarning, stacklevel=3)
    frame = pl.DataFrame(
        {"request_id": range(len(columns["arrival_s"])), **columns},
        schema={"request_id": pl.UInt64, "arrival_s": pl.Float64, "input_tokens": pl.UInt32,
                "output_tokens": pl.UInt32, "block_keys": pl.List(pl.UInt64)},
    )
    trace = Trace(frame, block_size=block_size, source=str(path))
    check_chained_keys(trace.flat, path, field="hash_ids", noun="id", lines=lines)
    return trace


def _field(path: Path, lineno: int, check: Callable[..., object], name: str, value: object,
           **bounds: object) -> object:
    """``check(name, value, **bounds)`` (a :mod:`kvlab.core.validate` check), its error as a
    :class:`TraceFormatError` naming the file and line."""
    try:
        return check(name, value, **bounds)
    except ValueError as err:
        raise TraceFormatError(path, lineno, str(err)) from None


def _check_record(path: Path, lineno: int, record: dict, block_size: int) -> tuple[float, int, int, list]:
    for field in MOONCAKE_FIELDS:
        if field not in record:
            raise TraceFormatError(path, lineno, f"missing field {field!r}")
    ts = _field(path, lineno, check_real, "field 'timestamp'", record["timestamp"], low=0.0)
    lengths = [_field(path, lineno, check_int, f"field {field!r}", record[field], low=0, high=2**32 - 1)
               for field in ("input_length", "output_length")]
    ids = record["hash_ids"]
    if not isinstance(ids, list):
        raise TraceFormatError(path, lineno, f"field 'hash_ids' must be a list, got {type(ids).__name__}")
    if not all(type(value) is int for value in ids) or (ids and not 0 <= min(ids) <= max(ids) <= U64_MAX):
        for i, value in enumerate(ids):  # name the first bad id (type() is int: JSON ints, not bools)
            _field(path, lineno, check_u64, f"hash_ids[{i}]", value)
    expected = -(-lengths[0] // block_size)
    if len(ids) != expected:
        raise TraceFormatError(
            path, lineno,
            f"{len(ids)} hash_ids but input_length={lengths[0]} needs ceil({lengths[0]}/{block_size})={expected}")
    return ts, lengths[0], lengths[1], ids
