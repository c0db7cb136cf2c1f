"""``load_trace``: open a trace file of any supported format, or a bundled trace by name."""

from __future__ import annotations

from pathlib import Path

from kvlab.paths import BUNDLED_TRACES, bundled_trace_path
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.mooncake import MOONCAKE_BLOCK_SIZE, MOONCAKE_FIELDS, load_mooncake
from kvlab.traces.textfile import check_trace_path, iter_lines, parse_json_line
from kvlab.traces.trace import Trace, read_trace_parquet

#: Formats :func:`load_trace` recognises, for error messages.
KNOWN_FORMATS = (
    "Mooncake JSONL (one object per line with timestamp, input_length, output_length, hash_ids; .gz allowed)",
    "kvlab Parquet (written by Trace.write_parquet)",
)


def load_trace(path: str | Path, *, block_size: int | None = None) -> Trace:
    """Load a trace, choosing the reader from the file's content.

    ``path`` is a file; if no such file exists and it is the name of a bundled trace
    (``"conversation"``, ``"synthetic"``), that trace is loaded. ``.parquet`` files are
    read as kvlab Parquet; otherwise the first non-blank line is parsed and an object
    with any Mooncake field selects :func:`~kvlab.traces.load_mooncake`. Suffixes match in
    any case (``.GZ``, ``.PARQUET``); ``.gz`` files are read compressed; a UTF-8
    byte-order mark is skipped. (The ``kvlab`` command also reads ``-``, stdin.)

    Args:
        path: the file, or a bundled trace name.
        block_size: tokens per block id for formats that do not record it (Mooncake:
            default 512); must be ``None`` for Parquet, which records its own.

    Raises:
        FileNotFoundError: ``path`` is not an existing regular file nor a bundled name.
        TraceFormatError: the format is not recognised (the message lists the known
            formats), or the reader found a bad record or keys that are not
            prefix-chained (every reader checks, :func:`kvlab.traces.chain.check_chained_keys`).
        ValueError: ``block_size`` given for a Parquet trace, or not an integer >= 1.

    Example:
        >>> load_trace("conversation").describe().requests
        12031
    """
    path = Path(path)
    if not path.exists():
        if str(path) in BUNDLED_TRACES:
            path = bundled_trace_path(str(path))
        elif str(path) not in ("", "."):
            raise FileNotFoundError(f"no trace file at {path} (bundled traces: {', '.join(sorted(BUNDLED_TRACES))})")
    check_trace_path(path)
    if path.suffix.lower() == ".parquet":
        if block_size is not None:
            raise ValueError("block_size cannot be set for a Parquet trace: the file records its own")
        return read_trace_parquet(path)
    first, lineno = _first_record(path)
    if isinstance(first, dict) and first.keys() & set(MOONCAKE_FIELDS):
        return load_mooncake(path, block_size=MOONCAKE_BLOCK_SIZE if block_size is None else block_size)
    what = f"an object with keys {sorted(first)}" if isinstance(first, dict) else f"a JSON {type(first).__name__}"
    raise TraceFormatError(path, lineno, f"unrecognised trace format: the first record is {what}; known formats: "
                                         f"{'; '.join(KNOWN_FORMATS)}")


def _first_record(path: Path) -> tuple[object, int]:
    for lineno, line in iter_lines(path):
        if line.strip():
            return parse_json_line(path, lineno, line), lineno
    raise TraceFormatError(path, None, "no records (empty file)")
