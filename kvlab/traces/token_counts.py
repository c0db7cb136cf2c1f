"""Traces with arrivals and token counts only: the Azure LLM inference CSVs and Vidur's processed
traces (docs/trace_formats/token_counts.md).

Azure (Azure/AzurePublicDataset, 2023 ``AzureLLMInferenceTrace_{conv,code}.csv`` and the 2024
one-week files)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Vidur (microsoft/vidur ``data/processed_traces/splitwise_{conv,code}.csv``; other columns are
reported once and not loaded)::

    arrived_at,num_prefill_tokens,num_decode_tokens
    0.0,374,44

Neither says what a prompt holds, so the trace has no block identity: every block of every
request gets its own placeholder key and cache replays refuse it
(:meth:`kvlab.traces.Trace.require_block_identity`); the timed cluster simulation runs it, and
:func:`kvlab.traces.synthesize_prefix` adds a stated synthetic sharing model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import check_positive
from kvlab.traces.arrays import trace_from_arrays
from kvlab.traces.csvtable import CsvTable, missing_column, read_csv_table
from kvlab.traces.sniff import Peek, TraceFormat, provenance, stamp
from kvlab.traces.trace import Trace

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
#: Placeholder-key block size when none is given (vLLM's default block).
DEFAULT_BLOCK_SIZE = 16
_NAIVE = "%Y-%m-%d %H:%M:%S%.f"
_OFFSET = "%Y-%m-%d %H:%M:%S%.f%#z"
_NO_IDENTITY = ("no block identity: the file gives token counts only; each request's ceil(input/block_size) "
                "blocks have placeholder keys 0, 1, 2, ... over all blocks of all requests (distinct, so no "
                "prefix is shared); cache replays refuse this trace")


def load_azure_llm(path: str | Path, *, block_size: int = DEFAULT_BLOCK_SIZE) -> Trace:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``).

    ``TIMESTAMP`` is a wall-clock time, ``2023-11-16 18:15:46.6805900`` (2023: 7 fractional
    digits, 100 ns) or ``2024-05-12 00:00:00.001163+00:00`` (2024: a UTC offset, the fraction
    sometimes absent); it is parsed exactly to nanoseconds, and ``arrival_s`` is the time from
    the earliest request. Rows out of time order are sorted stably (a provenance note says how
    many); ``request_id`` is the 0-based record number in the file. The trace has no block
    identity (module docstring): its keys are placeholders.

    Args:
        path: the ``.csv`` file (gzip-compressed read by its magic bytes).
        block_size: tokens per placeholder block (the simulated engine's block size is the
            cluster configuration's own).

    Returns:
        A :class:`Trace` with ``block_identity=False``; ``provenance`` records the first
        timestamp (``first_timestamp``), the clock and the notes.

    Raises:
        FileNotFoundError: no such file.
        TraceFormatError: ``file:line: field 'x': what is wrong`` (a missing column, an empty
            cell, a token count that is not an integer ≥ 0 and < 2**32, a time that is not one
            of the two formats, times with and without a UTC offset in one file), or an empty file.
        ValueError: ``block_size`` < 1.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "azure.csv"
        >>> _ = p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\\n"
        ...                  "2023-11-16 18:15:46.6805900,374,44\\n2023-11-16 18:15:50.9951690,20,9\\n")
        >>> trace = load_azure_llm(p)
        >>> trace.frame["arrival_s"].to_list(), trace.frame["block_keys"].to_list()[1], trace.block_identity
        ([0.0, 4.314579], [24, 25], False)
        >>> trace.provenance["first_timestamp"]
        '2023-11-16 18:15:46.6805900'
    """
    block_size = check_positive("block_size", block_size)
    table = read_csv_table(path, AZURE_COLUMNS)
    _warn_extra(table, "Azure LLM")
    text = table.strings("TIMESTAMP")
    ns, clock = _timestamps_ns(table, text)
    first = int(np.argmin(ns))
    notes = [f"arrival_s = TIMESTAMP - the earliest TIMESTAMP ({text[first]}, line {int(table.lines[first])}); "
             f"{clock}"]
    return _placeholder_trace(table, "azure-llm", (ns - ns[first]) / 1e9, table.ints("ContextTokens"),
                              table.ints("GeneratedTokens"), block_size, notes, first_timestamp=text[first])


def load_vidur(path: str | Path, *, block_size: int = DEFAULT_BLOCK_SIZE) -> Trace:
    """Load a Vidur processed trace CSV (``arrived_at`` seconds, ``num_prefill_tokens``,
    ``num_decode_tokens``; other columns are reported once with a ``UserWarning`` and not loaded).

    ``arrival_s = arrived_at - min(arrived_at)``; rows out of time order are sorted stably (a
    provenance note says how many); ``request_id`` is the 0-based record number in the file. The
    trace has no block identity (module docstring): its keys are placeholders.

    Args:
        path: the ``.csv`` file (gzip-compressed read by its magic bytes).
        block_size: tokens per placeholder block.

    Returns:
        A :class:`Trace` with ``block_identity=False``.

    Raises:
        FileNotFoundError: no such file.
        TraceFormatError: ``file:line: field 'x': what is wrong`` (a missing column, an empty
            cell, a time that is not a finite number, a token count that is not an integer ≥ 0
            and < 2**32), or an empty file.
        ValueError: ``block_size`` < 1.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "splitwise_conv.csv"
        >>> _ = p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\\n0.0,374,44\\n4.314579,20,9\\n")
        >>> trace = load_vidur(p, block_size=512)
        >>> trace.frame["input_tokens"].to_list(), trace.frame["block_keys"].to_list()
        ([374, 20], [[0], [1]])
    """
    block_size = check_positive("block_size", block_size)
    table = read_csv_table(path, VIDUR_COLUMNS)
    _warn_extra(table, "Vidur")
    seconds = table.reals("arrived_at")
    first = int(np.argmin(seconds))
    notes = [f"arrival_s = arrived_at - the earliest arrived_at ({float(seconds[first])!r} s, "
             f"line {int(table.lines[first])})"]
    return _placeholder_trace(table, "vidur", seconds - seconds[first], table.ints("num_prefill_tokens"),
                              table.ints("num_decode_tokens"), block_size, notes)


def _warn_extra(table: CsvTable, what: str) -> None:
    if table.extra:
        warnings.warn(f"{table.path}: columns not part of the {what} format were not loaded: "
                      f"{', '.join(map(repr, table.extra))}", UserWarning, stacklevel=3)


def _timestamps_ns(table: CsvTable, text: pl.Series) -> tuple[np.ndarray, str]:
    """Nanoseconds since the epoch (``int64``) of every ``TIMESTAMP``, and how the clock was read."""
    naive = text.str.to_datetime(_NAIVE, time_unit="ns", strict=False)
    if not naive.null_count():  # the 2023 files: one parse
        return naive.dt.epoch("ns").to_numpy(), "wall-clock times without a UTC offset (as in the file)"
    aware = text.str.to_datetime(_OFFSET, time_unit="ns", strict=False)
    bad = naive.is_null() & aware.is_null()
    if bad.any():
        row = int(bad.arg_true()[0])
        raise table.error(row, "TIMESTAMP", f"{text[row]!r} is not a time like '2023-11-16 18:15:46.6805900' "
                                            "or '2024-05-12 00:00:00.001163+00:00'")
    if naive.is_null().any() and aware.is_null().any():  # both kinds present
        row = int((naive.is_null() if naive[0] is not None else aware.is_null()).arg_true()[0])
        raise table.error(row, "TIMESTAMP", f"{text[row]!r}: the file mixes times with and without a UTC offset")
    return aware.dt.epoch("ns").to_numpy(), "times with UTC offsets, differences taken in UTC"


def _placeholder_trace(table: CsvTable, fmt: str, arrival_s: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                       block_size: int, notes: list[str], **facts: object) -> Trace:
    """The trace of one row per record, in time order (stable), with placeholder block keys."""
    back = arrival_s[1:] < arrival_s[:-1]
    request_id = None
    if back.any():
        row = int(np.argmax(back)) + 1
        order = np.argsort(arrival_s, kind="stable")
        notes.append(f"{int(back.sum())} record(s) arrive before the record above them (first: line "
                     f"{int(table.lines[row])}); rows sorted stably by time, request_id keeps the file's record number")
        arrival_s, inputs, outputs, request_id = arrival_s[order], inputs[order], outputs[order], order
    blocks = -(-inputs // block_size)
    offsets = np.zeros(blocks.shape[0] + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    trace = trace_from_arrays(np.arange(offsets[-1], dtype=np.uint64), offsets=offsets, arrival_s=arrival_s,
                              input_tokens=inputs, output_tokens=outputs, request_id=request_id,
                              block_size=block_size, source=str(table.path))
    object.__setattr__(trace, "block_identity", False)  # a loader's own new trace, as stamp() sets provenance
    notes.append(_NO_IDENTITY)
    return stamp(trace, provenance(fmt, table.path, {"block_size": block_size}, notes, **facts))


def _sniff_azure(peek: Peek) -> str | None:
    return missing_column(peek, AZURE_COLUMNS)


def _sniff_vidur(peek: Peek) -> str | None:
    return missing_column(peek, VIDUR_COLUMNS)


AZURE_LLM_FORMAT = TraceFormat(
    "azure-llm", "Azure LLM inference CSV: TIMESTAMP (wall clock), ContextTokens, GeneratedTokens; token counts "
    "only, no block identity", _sniff_azure, load_azure_llm, ("block_size",))
VIDUR_FORMAT = TraceFormat(
    "vidur", "Vidur processed trace CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens; token counts only, "
    "no block identity", _sniff_vidur, load_vidur, ("block_size",))
