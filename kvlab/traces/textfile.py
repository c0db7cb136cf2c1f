"""Opening trace files as text lines: plain or gzip-compressed, UTF-8 (a leading byte-order mark
skipped), errors with file:line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from kvlab.traces.errors import TraceFormatError


def check_trace_path(path: Path) -> None:
    """Raise a clear error unless ``path`` names an existing regular file.

    Raises:
        FileNotFoundError: missing, empty path, or a directory / device instead of a file.
    """
    if str(path) in ("", "."):
        raise FileNotFoundError("empty trace path")
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a directory, not a trace file")
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path}")


def is_gzip_name(path: Path) -> bool:
    """Whether ``path`` is gzip-compressed: its name ends in ``.gz`` in any case (``.GZ`` from some
    tools), or its first two bytes are gzip's magic number (a compressed file under another name)."""
    if path.suffix.lower() == ".gz":
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == _GZIP_MAGIC
    except OSError:
        return False


_GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: Path) -> str:
    """The whole file as text (gzip decompressed, UTF-8, a byte-order mark skipped).

    Raises:
        TraceFormatError: not UTF-8 text, or unreadable (as :func:`iter_lines`).
    """
    return "".join(line for _, line in iter_lines(path))


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, line)`` of a UTF-8 text file, gzip (:func:`is_gzip_name`)
    decompressed; a UTF-8 byte-order mark at the start (as some Windows editors write) is
    skipped.

    Raises:
        TraceFormatError: the bytes are not UTF-8 text (or not gzip for ``.gz``), with
            the line where decoding failed.
    """
    opener = gzip.open if is_gzip_name(path) else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, start=1):  # noqa: B007 - lineno used after the loop
                yield lineno, line
    except UnicodeDecodeError as err:
        line, byte, reason = _first_bad_utf8(path, opener, lineno + 1, err)
        raise TraceFormatError(path, line, f"not UTF-8 text ({reason} at byte {byte} of the line); a binary "
                               "or compressed file? (gzip files are read compressed)") from None
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise TraceFormatError(path, lineno + 1, f"cannot read: {err}") from None


def _first_bad_utf8(path: Path, opener: object, fallback_line: int,
                    err: UnicodeDecodeError) -> tuple[int, int, str]:
    """``(1-based line, 0-based byte in the line, reason)`` of the first byte that is not UTF-8: the
    text reader decodes in chunks, so its error knows neither (read again as bytes, on error only)."""
    try:
        with opener(path, "rb") as fh:
            raw = fh.read().removeprefix(b"\xef\xbb\xbf")
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        start = raw.rfind(b"\n", 0, bad.start) + 1
        return raw.count(b"\n", 0, bad.start) + 1, bad.start - start, bad.reason
    except (OSError, EOFError):
        pass
    return fallback_line, err.start, err.reason


def iter_records(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(1-based line number, object)`` for every non-blank line of a JSON-lines file
    (plain or gzip, :func:`iter_lines`).

    Raises:
        TraceFormatError: a line that is not JSON, or not a JSON object, naming file and line.
    """
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        record = parse_json_line(path, lineno, line)
        if not isinstance(record, dict):
            raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(record).__name__}")
        yield lineno, record


def parse_json_line(path: Path, lineno: int, line: str) -> object:
    """``json.loads`` with a :class:`TraceFormatError` naming file and line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceFormatError(path, lineno, f"malformed JSON: {err.msg} at column {err.colno}") from None
