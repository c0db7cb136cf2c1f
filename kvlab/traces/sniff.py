"""What a trace reader needs to be chosen by :func:`kvlab.traces.load_trace`: a :class:`TraceFormat`
(name, description, a ``sniff`` test on a :class:`Peek` of the file, the loader and its options),
and :func:`provenance`, the record every loader leaves in :attr:`kvlab.traces.Trace.provenance`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kvlab.traces.errors import TraceFormatError
from kvlab.traces.textfile import iter_lines, parse_json_line, read_text
from kvlab.traces.trace import Trace

#: ``Peek.record`` when the first non-blank line is not JSON.
NOT_JSON = object()
_PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True, eq=False)
class Peek:
    """A first look at a trace path: enough for every format's ``sniff`` to say yes or why not.

    Attributes:
        path: the file or folder.
        entries: a folder's regular files, sorted by name (``()`` for a file).
        magic: the file's first 4 bytes (``b""`` for a folder).
        lineno: 1-based line of the first non-blank line (``None``: folder, Parquet, empty).
        first_line: that line, without its line break.
        record: that line parsed as JSON, or :data:`NOT_JSON`.
        error: why the file could not be read as text or the line is not JSON (else ``None``).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = p.write_text("\\n\\narrived_at,num_prefill_tokens,num_decode_tokens\\n0.0,10,2\\n")
        >>> peek = Peek.of(p)
        >>> peek.lineno, peek.first_line, peek.record is NOT_JSON
        (3, 'arrived_at,num_prefill_tokens,num_decode_tokens', True)
    """

    path: Path
    entries: tuple[str, ...] = ()
    magic: bytes = b""
    lineno: int | None = None
    first_line: str | None = None
    record: object = NOT_JSON
    error: str | None = None

    @classmethod
    def of(cls, path: str | Path) -> Peek:
        """Look at ``path`` (a folder's entries, or a file's magic bytes and first non-blank line).

        Raises:
            FileNotFoundError: ``path`` is neither a folder nor a regular file.
        """
        path = Path(path)
        if path.is_dir():
            return cls(path, entries=tuple(sorted(p.name for p in path.iterdir() if p.is_file())))
        if not path.is_file():
            raise FileNotFoundError(f"no trace file at {path}")
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic == _PARQUET_MAGIC:
            return cls(path, magic=magic)
        try:
            for lineno, line in iter_lines(path):
                if line.strip():
                    text = line.rstrip("\r\n")
                    try:
                        return cls(path, magic=magic, lineno=lineno, first_line=text,
                                   record=parse_json_line(path, lineno, line))
                    except TraceFormatError as err:
                        return cls(path, magic=magic, lineno=lineno, first_line=text, error=err.reason)
        except TraceFormatError as err:
            return cls(path, magic=magic, lineno=err.line, error=err.reason)
        return cls(path, magic=magic, error="no records (empty file)")

    @cached_property
    def document(self) -> object:
        """The whole file parsed as one JSON document (for pretty-printed JSON files), or
        :data:`NOT_JSON`."""
        if self.entries or self.magic == _PARQUET_MAGIC or not self.path.is_file():
            return NOT_JSON
        try:
            return json.loads(read_text(self.path))
        except (TraceFormatError, json.JSONDecodeError):
            return NOT_JSON

    def where(self, field_name: str | None = None) -> str:
        """``"line N: field 'f'"`` (or as much of it as is known), for a sniff's reason."""
        parts = [f"line {self.lineno}"] if self.lineno is not None else []
        if field_name is not None:
            parts.append(f"field {field_name!r}")
        return ": ".join(parts)


@dataclass(frozen=True)
class TraceFormat:
    """A trace format :func:`kvlab.traces.load_trace` can recognise and read.

    Attributes:
        name: short name (``format=`` and the CLI's ``--format``), e.g. ``"mooncake"``.
        description: one line: what the files look like and where they come from.
        sniff: ``Peek -> None`` when the path looks like this format, else the reason it does
            not, naming the line and field (``"line 1: field 'hash_ids': missing"``).
        load: ``load(path, **options) -> Trace``.
        options: the keyword options ``load`` takes (``block_size``, ``rate_per_s`` …).

    Example:
        >>> from kvlab.traces import FORMATS
        >>> FORMATS["mooncake"].sniff(Peek(Path("x.jsonl"), lineno=1, record={"requests": []}))
        "line 1: field 'timestamp': missing (no Mooncake field in ['requests'])"
    """

    name: str
    description: str
    sniff: Callable[[Peek], str | None]
    load: Callable[..., object]
    options: tuple[str, ...] = field(default=())


def missing_field(peek: Peek, required: Sequence[str], *, kind: str = "a JSON object") -> str | None:
    """The usual JSON-lines sniff: ``None`` when the first record is an object with every
    ``required`` field, else the first line and field that do not fit."""
    if peek.entries:
        return "a folder, not a file"
    if peek.error is not None:
        hint = ""
        if peek.first_line is not None and peek.first_line.strip() in ("{", "["):
            hint = ("; the file looks like one JSON document over several lines (pretty-printed), not one "
                    "JSON object per line")
        return (f"{peek.where()}: {peek.error}" if peek.lineno is not None else peek.error) + hint
    if not isinstance(peek.record, dict):
        what = "not JSON" if peek.record is NOT_JSON else f"a JSON {type(peek.record).__name__}"
        return f"{peek.where()}: {what}, not {kind}"
    for name in required:
        if name not in peek.record:
            return f"{peek.where(name)}: missing"
    return None


def stamp(trace: Trace, record: Mapping[str, object]) -> Trace:
    """``trace`` with ``record`` as its provenance, in place (a loader's own new trace: no copy and
    no second check of the frame; the flat form stays cached)."""
    object.__setattr__(trace, "provenance", dict(record))
    return trace


def provenance(fmt: str, path: str | Path, options: Mapping[str, object] | None = None,
               notes: Sequence[str] = (), **facts: object) -> dict[str, object]:
    """What a loader records in :attr:`kvlab.traces.Trace.provenance`: the format, the path read,
    the options it ran with, notes (what was assumed, reordered or synthesized) and other facts
    (all JSON-serialisable).

    >>> provenance("mooncake", "t.jsonl", {"block_size": 512})
    {'format': 'mooncake', 'path': 't.jsonl', 'options': {'block_size': 512}, 'notes': []}
    """
    return {"format": fmt, "path": str(path), "options": dict(options or {}), "notes": list(notes), **facts}
