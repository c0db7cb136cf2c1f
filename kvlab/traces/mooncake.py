"""Reader for the Mooncake trace format (kvcache-ai/Mooncake ``FAST25-release/traces``).

One JSON object per line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is the arrival in milliseconds from the trace start, ``hash_ids`` one
prefix-chained id per 512-token block of the prompt (the last block partial).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl

from kvlab.core.validate import U64_MAX, check_int, check_positive, check_real, check_u64
from kvlab.traces.chain import check_chained_keys
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.textfile import check_trace_path, iter_lines, parse_json_line
from kvlab.traces.trace import Trace

#: Block size of the published Mooncake traces (repo README; FAST'25 appendix A.2).
MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


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
    columns: dict[str, list] = {"arrival_s": [], "input_tokens": [], "output_tokens": [], "block_keys": []}
    unknown: dict[str, int] = {}
    lines: list[int] = []
    last_ms = -math.inf
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        record = parse_json_line(path, lineno, line)
        if not isinstance(record, dict):
            raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(record).__name__}")
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
                      UserWarning, stacklevel=2)
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
