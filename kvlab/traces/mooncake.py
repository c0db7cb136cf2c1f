"""Reader for the Mooncake trace format (kvcache-ai/Mooncake ``FAST25-release/traces``).

One JSON object per line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is the arrival in milliseconds from the trace start, ``hash_ids`` one
prefix-chained id per 512-token block of the prompt (the last block partial).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import polars as pl

from kvlab.traces.errors import TraceFormatError
from kvlab.traces.trace import Trace

#: Block size of the published Mooncake traces (repo README; FAST'25 appendix A.2).
MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_U64_MAX = 2**64 - 1


def load_mooncake(path: str | Path, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Load a Mooncake JSONL trace.

    Rows keep file order (which is arrival order); ``request_id`` is the 0-based row
    number, ``arrival_s = timestamp / 1000``, ``block_keys = hash_ids``. Blank lines
    are skipped; fields other than the four known ones are reported once with a
    ``UserWarning`` and not loaded.

    Args:
        path: the ``.jsonl`` file.
        block_size: tokens per hash id (512 for the published traces).

    Returns:
        A :class:`~kvlab.traces.Trace` with ``source = str(path)``.

    Raises:
        TraceFormatError: naming the file and 1-based line, for a malformed JSON line,
            a record that is not an object, a missing field, a non-numeric or negative
            timestamp, a timestamp earlier than the previous line's, a negative or
            non-integer length, a non-integer or out-of-range (not u64) hash id, or
            ``len(hash_ids) != ceil(input_length / block_size)``; also for a file with
            no records.
        FileNotFoundError: the file does not exist.

    Example:
        >>> from kvlab.paths import bundled_trace_path
        >>> trace = load_mooncake(bundled_trace_path("synthetic"))
        >>> len(trace), trace.block_size, trace.block_refs
        (3993, 512, 121877)
    """
    path = Path(path)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    columns: dict[str, list] = {"arrival_s": [], "input_tokens": [], "output_tokens": [], "block_keys": []}
    unknown: dict[str, int] = {}
    last_ms = -math.inf
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            record = _parse_line(path, lineno, line)
            ts, n_in, n_out, ids = _check_record(path, lineno, record, block_size)
            if ts < last_ms:
                raise TraceFormatError(path, lineno, f"timestamp {ts} is earlier than the previous "
                                                     f"record's {last_ms}; records must be in arrival order")
            last_ms = ts
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
    return Trace(frame, block_size=block_size, source=str(path))


def _parse_line(path: Path, lineno: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceFormatError(path, lineno, f"malformed JSON: {err.msg} at column {err.colno}") from None
    if not isinstance(record, dict):
        raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(record).__name__}")
    return record


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_record(path: Path, lineno: int, record: dict, block_size: int) -> tuple[float, int, int, list]:
    for field in MOONCAKE_FIELDS:
        if field not in record:
            raise TraceFormatError(path, lineno, f"missing field {field!r}")
    ts = record["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise TraceFormatError(path, lineno, f"field 'timestamp' must be a finite number >= 0 (ms), got {ts!r}")
    lengths = []
    for field in ("input_length", "output_length"):
        value = record[field]
        if not _is_int(value):
            raise TraceFormatError(path, lineno, f"field {field!r} must be an integer, got {value!r}")
        if value < 0:
            raise TraceFormatError(path, lineno, f"field {field!r} must be >= 0, got {value}")
        if value > 2**32 - 1:
            raise TraceFormatError(path, lineno, f"field {field!r} exceeds u32: {value}")
        lengths.append(value)
    ids = record["hash_ids"]
    if not isinstance(ids, list):
        raise TraceFormatError(path, lineno, f"field 'hash_ids' must be a list, got {type(ids).__name__}")
    for i, value in enumerate(ids):
        if not _is_int(value) or not 0 <= value <= _U64_MAX:
            raise TraceFormatError(path, lineno, f"hash_ids[{i}] must be an integer in [0, 2**64), got {value!r}")
    expected = -(-lengths[0] // block_size)
    if len(ids) != expected:
        raise TraceFormatError(
            path, lineno,
            f"{len(ids)} hash_ids but input_length={lengths[0]} needs ceil({lengths[0]}/{block_size})={expected}")
    return float(ts), lengths[0], lengths[1], ids
