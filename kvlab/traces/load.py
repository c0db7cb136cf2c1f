"""``load_trace``: open a trace file of any supported format."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.traces.errors import TraceFormatError
from kvlab.traces.mooncake import MOONCAKE_FIELDS, load_mooncake
from kvlab.traces.trace import Trace, read_trace_parquet

#: Formats :func:`load_trace` recognises, for error messages.
KNOWN_FORMATS = (
    "Mooncake JSONL (one object per line with timestamp, input_length, output_length, hash_ids)",
    "kvlab Parquet (written by Trace.write_parquet)",
)


def load_trace(path: str | Path) -> Trace:
    """Load a trace, choosing the reader from the file's content.

    ``.parquet`` files are read as kvlab Parquet; otherwise the first non-blank line
    is parsed and a Mooncake record (an object with ``hash_ids`` and
    ``input_length``) selects :func:`~kvlab.traces.load_mooncake`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceFormatError: the format is not recognised (the message lists the known
            formats), or the reader found a bad record.

    Example:
        >>> from kvlab.paths import bundled_trace_path
        >>> load_trace(bundled_trace_path("conversation")).describe().requests
        12031
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path}")
    if path.suffix == ".parquet":
        return read_trace_parquet(path)
    first, lineno = _first_record(path)
    if isinstance(first, dict) and {"hash_ids", "input_length"} <= first.keys():
        return load_mooncake(path)
    known = "; ".join(KNOWN_FORMATS)
    raise TraceFormatError(path, lineno, f"unrecognised trace format (first record has keys "
                                         f"{sorted(first) if isinstance(first, dict) else type(first).__name__}); "
                                         f"known formats: {known}; Mooncake fields are {list(MOONCAKE_FIELDS)}")


def _first_record(path: Path) -> tuple[object, int]:
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    return json.loads(line), lineno
                except json.JSONDecodeError as err:
                    raise TraceFormatError(path, lineno, f"malformed JSON: {err.msg} at column {err.colno}; "
                                                         f"known formats: {'; '.join(KNOWN_FORMATS)}") from None
    raise TraceFormatError(path, None, "no records (empty file)")
