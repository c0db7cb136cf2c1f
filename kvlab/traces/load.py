"""``load_trace``: open a trace file or folder of any supported format, or a bundled trace by name.

The formats, in the order they are tried (:data:`FORMATS`): each has a ``sniff`` test on the
file's first record (or a folder's files) and a loader. The first format whose test passes reads
the file; ``format=`` forces one.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.paths import BUNDLED_TRACES, bundled_trace_path
from kvlab.traces.bailian import BAILIAN_FORMAT
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.kv_cache_tester import KV_CACHE_TESTER_FORMAT
from kvlab.traces.mooncake import MOONCAKE_FORMAT
from kvlab.traces.ragpulse import RAGPULSE_FORMAT
from kvlab.traces.servegen import SERVEGEN_FORMAT
from kvlab.traces.sniff import Peek, TraceFormat, provenance, stamp
from kvlab.traces.token_counts import AZURE_LLM_FORMAT, VIDUR_FORMAT
from kvlab.traces.trace import Trace, read_trace_parquet


def _load_parquet(path: str | Path) -> Trace:
    trace = read_trace_parquet(path)
    if not trace.provenance:  # written before provenance was recorded
        stamp(trace, provenance("parquet", path))
    return trace


def _sniff_parquet(peek: Peek) -> str | None:
    if peek.magic == b"PAR1":
        return None
    return "a folder, not a file" if peek.entries else "no Parquet magic bytes 'PAR1' at the start of the file"


PARQUET_FORMAT = TraceFormat("parquet", "kvlab Parquet (written by Trace.write_parquet or kvlab convert)",
                             _sniff_parquet, _load_parquet)

#: Every format :func:`load_trace` knows, by name, in the order they are tried (specific first).
FORMATS: dict[str, TraceFormat] = {f.name: f for f in (
    PARQUET_FORMAT,
    RAGPULSE_FORMAT,
    KV_CACHE_TESTER_FORMAT,
    BAILIAN_FORMAT,
    SERVEGEN_FORMAT,
    MOONCAKE_FORMAT,
    AZURE_LLM_FORMAT,
    VIDUR_FORMAT,
)}


def detect_format(path: str | Path) -> TraceFormat:
    """The first format in :data:`FORMATS` whose sniff test accepts ``path``.

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a folder.
        TraceFormatError: no format fits; one message lists every format tried with the first
            line and field that did not fit.
    """
    peek = Peek.of(path)
    if Path(path).is_dir() and not peek.entries:
        raise TraceFormatError(path, None, "an empty folder: no trace files in it")
    if peek.error is not None and peek.first_line is None and peek.lineno is not None:
        raise TraceFormatError(path, peek.lineno, peek.error)  # not text at all: no format can read it
    reasons = []
    for fmt in FORMATS.values():
        reason = fmt.sniff(peek)
        if reason is None:
            return fmt
        reasons.append(f"  {fmt.name} ({fmt.description}): {reason}")
    raise TraceFormatError(path, None, "no known trace format fits; tried:\n" + "\n".join(reasons)
                           + "\nforce one with format=NAME (kvlab: --format NAME)")


def load_trace(path: str | Path, *, format: str | None = None, **options: object) -> Trace:  # noqa: A002
    """Load a trace, choosing the reader from the content (or ``format``).

    ``path`` is a file or a folder (formats that come as folders: kv-cache-tester, RAGPulse);
    if no such path exists and it is the name of a bundled trace (``"conversation"``,
    ``"synthetic"``), that trace is loaded. The format is found by content, not by suffix: Parquet
    by its magic bytes, text formats by their first record (gzip is recognised by its magic bytes
    too; a UTF-8 byte-order mark is skipped). (The ``kvlab`` command also reads ``-``, stdin.)

    Args:
        path: the file or folder, or a bundled trace name.
        format: a name from :data:`FORMATS` to skip detection.
        **options: the loader's options (``block_size`` for formats that do not record it, …;
            see each format's ``options``); ``None`` values are ignored.

    Raises:
        FileNotFoundError: ``path`` is not an existing file or folder nor a bundled name.
        TraceFormatError: no format fits (the message lists every format tried and the first
            line and field that did not fit), or the reader found a bad record (naming the file,
            line and field) or keys that are not prefix-chained.
        ValueError: ``path`` not a str or Path, an unknown ``format``, or an option the format does
            not take.

    Example:
        >>> load_trace("conversation").describe().requests
        12031
        >>> load_trace("conversation").provenance["variant"]
        "FAST'25 conversation trace"
    """
    if not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a file or folder path (str or pathlib.Path), got {type(path).__name__}")
    if format is not None and not isinstance(format, str):
        raise ValueError(f"format must be a format name ({', '.join(FORMATS)}), got {type(format).__name__}")
    path = Path(path)
    if not path.exists():
        if str(path) in BUNDLED_TRACES:
            path = bundled_trace_path(str(path))
        elif str(path) not in ("", "."):
            raise FileNotFoundError(f"no trace file at {path} (bundled traces: {', '.join(sorted(BUNDLED_TRACES))})")
    if str(path) in ("", "."):
        raise FileNotFoundError("empty trace path")
    if format is None:
        fmt = detect_format(path)
    elif format in FORMATS:
        fmt = FORMATS[format]
    else:
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(FORMATS)}")
    options = {k: v for k, v in options.items() if v is not None}
    if fmt.name == "parquet" and "block_size" in options:
        raise ValueError("block_size cannot be set for a Parquet trace: the file records its own")
    extra = sorted(set(options) - set(fmt.options))
    if extra:
        takes = ", ".join(fmt.options) if fmt.options else "none"
        raise ValueError(f"option(s) {', '.join(extra)} do not apply to {fmt.name} traces; its options: {takes}")
    return fmt.load(path, **options)
