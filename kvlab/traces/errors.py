"""Errors raised while reading traces."""

from __future__ import annotations

from pathlib import Path


class TraceFormatError(ValueError):
    """A trace file does not follow its format; names the file and the 1-based line.

    Attributes:
        path: the file that was being read.
        line: 1-based line number of the offending record (``None`` for whole-file
            problems, e.g. an empty file).
        reason: what is wrong, without the location prefix.

    Example:
        >>> err = TraceFormatError("t.jsonl", 3, "missing field 'hash_ids'")
        >>> str(err)
        "t.jsonl:3: missing field 'hash_ids'"
        >>> isinstance(err, ValueError)
        True
    """

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {reason}")
