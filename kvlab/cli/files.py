"""What the ``kvlab`` command reads and writes: trace arguments (a file, a bundled name or
``-`` for stdin), output folders checked before the work, and a stdout closed early.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from kvlab.traces import Trace

#: The trace argument that reads the trace from standard input.
STDIN = "-"
#: How the trace read from stdin is named (its ``source``, error messages).
STDIN_NAME = "<stdin>"
#: Exit status when stdout is closed before the output is written (``kvlab ... | head``),
#: as a process killed by SIGPIPE reports it to the shell (128 + 13).
EXIT_BROKEN_PIPE = 141


def prepare_out(path: Path | None) -> None:
    """Create the output folder ``path`` and check a file can be written in it, before any
    work is done (``None``: no output folder).

    Raises:
        ValueError: the folder cannot be created or written to (the OS reason).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     prepare_out(Path(tmp) / "run" / "1")
        ...     (Path(tmp) / "run" / "1").is_dir()
        True
    """
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"cannot write to {path}: {err.strerror or err}") from None


@contextmanager
def stdin_as_file(argument: str, example: str, stdin: BinaryIO | None = None) -> Iterator[Path]:
    """Standard input saved to a temporary file, for a reader that takes a path; errors raised
    inside name ``<stdin>``, not the temporary path. The file is deleted afterwards.

    Args:
        argument: the argument that said ``-`` (for the error messages), e.g. ``"TRACE"``.
        example: a command line piping into it, for the error when stdin is a terminal.
        stdin: the binary stream to read (default ``sys.stdin.buffer``).

    Raises:
        ValueError: stdin is a terminal or empty; errors of the body, the path renamed
            (a :class:`~kvlab.traces.TraceFormatError` stays one).
    """
    if stdin is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise ValueError(f"{argument} '-' reads stdin, which is a terminal: pipe the input in (e.g. {example}) "
                             f"or give a file")
        stdin = sys.stdin.buffer
    data = stdin.read()
    if not data:
        raise ValueError(f"{argument} '-': stdin is empty (nothing was piped in)")
    folder = Path(tempfile.mkdtemp(prefix="kvlab-stdin-"))
    # named by content, for readers that choose by suffix (kvlab Parquet, gzip)
    path = folder / ("stdin.parquet" if data[:4] == b"PAR1" else "stdin.gz" if data[:2] == b"\x1f\x8b" else "stdin")
    path.write_bytes(data)
    try:
        yield path
    except ValueError as err:
        from kvlab.traces import TraceFormatError

        if isinstance(err, TraceFormatError) and err.path == path:
            raise TraceFormatError(STDIN_NAME, err.line, err.reason.replace(str(path), STDIN_NAME)) from None
        if str(path) in str(err):
            raise ValueError(str(err).replace(str(path), STDIN_NAME)) from None
        raise
    finally:
        path.unlink(missing_ok=True)
        folder.rmdir()


@contextmanager
def input_path(path: Path, argument: str, example: str) -> Iterator[Path]:
    """``path`` itself, or for ``-`` standard input saved to a file (:func:`stdin_as_file`)."""
    if str(path) != STDIN:
        yield path
        return
    with stdin_as_file(argument, example) as saved:
        yield saved


def load_trace_argument(text: str, block_size: int | None = None, stdin: BinaryIO | None = None, *,
                        format: str | None = None, **options: object) -> Trace:  # noqa: A002
    """The trace a ``TRACE`` argument names (:func:`kvlab.traces.load_trace`), or for ``-`` the
    trace on standard input (any format ``load_trace`` reads, gzip and Parquet included; its
    ``source`` and errors say ``<stdin>``).

    Args:
        text: a path, a bundled trace name, or ``-``.
        block_size, format, options: as :func:`~kvlab.traces.load_trace`.
        stdin: the binary stream ``-`` reads (default ``sys.stdin.buffer``).

    Raises:
        ValueError: ``-`` with a terminal or an empty stream on stdin; whatever
            ``load_trace`` raises (a :class:`~kvlab.traces.TraceFormatError` names ``<stdin>``).
        FileNotFoundError: as ``load_trace``.
    """
    from kvlab.traces import load_trace

    if text != STDIN:
        return load_trace(text, block_size=block_size, format=format, **options)
    with stdin_as_file("TRACE", "zcat trace.jsonl.gz | kvlab info -", stdin) as path:
        trace = load_trace(path, block_size=block_size, format=format, **options)
    source = STDIN_NAME if trace.source == str(path) else trace.source
    return replace(trace, source=source)


def silence_stdout() -> None:
    """After a ``BrokenPipeError``: point stdout at ``/dev/null`` so that the interpreter's
    final flush does not fail again (the recipe of Python's ``signal`` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (an in-process capture)
        pass


def step_bar(total: int, desc: str, enabled: bool) -> object:
    """A tqdm bar on stderr counting ``total`` steps of a long command (``kvlab demo``,
    ``kvlab figures``); set its description to the step under way. ``enabled=False``: a bar
    that prints nothing."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=not enabled, leave=True,
                bar_format="{desc:<48} {n_fmt}/{total_fmt} [{elapsed}]")
