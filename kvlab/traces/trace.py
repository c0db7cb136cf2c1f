"""The :class:`Trace`: one row per request, each a sequence of chained block keys."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from kvlab.core.validate import check_flag, check_positive, check_str
from kvlab.hashing.base import BlockHasher
from kvlab.traces.flat import FlatTrace, flatten_block_keys, flatten_csr
from kvlab.traces.frame_checks import canonical_frame

if TYPE_CHECKING:
    from kvlab.traces.stats import TraceStats

_PARQUET_KEYS = ("kvlab.block_size", "kvlab.source", "kvlab.partial_block_keyed", "kvlab.block_identity",
                 "kvlab.provenance")


@dataclass(frozen=True, eq=False)
class Trace:
    """A workload: a polars frame with one row per request, plus block size and source.

    Columns (docs/DESIGN.md): ``request_id`` (u64, unique), ``arrival_s`` (f64, seconds,
    non-decreasing — rows are in arrival order), ``input_tokens`` (u32),
    ``output_tokens`` (u32), ``block_keys`` (``list[u64]``, chained: equal key ⇒ equal
    whole prefix, one key per ``block_size`` tokens of the prompt; with
    ``partial_block_keyed`` the last, partial block has a key too (Mooncake ids, SGLang
    pages), so ``len == ceil(input_tokens / block_size)``, else only full blocks are keyed
    (vLLM, llm-d, Dynamo) and ``len == floor(input_tokens / block_size)``); optional
    ``token_ids`` (``list[u32]``, ``len == input_tokens``), ``session_id``, ``model``,
    ``lora_name``. Columns are cast to these dtypes on construction.

    A trace *without block identity* (``block_identity=False``: Azure and Vidur CSVs give
    token counts only) holds placeholder keys, distinct for every block of every request, so
    that the timed cluster simulation can run it (no prefix is shared); cache replays refuse
    it (:meth:`require_block_identity`).

    Args:
        frame: the requests.
        block_size: tokens per block (≥ 1).
        partial_block_keyed: whether a request's trailing partial block has a key.
        source: where the trace came from (a path, or a generator and its parameters).
        block_identity: whether equal keys mean equal prompt prefixes (``False``: placeholders).
        provenance: JSON-serialisable facts about the file and how it was read (the loaders
            fill ``format``, ``path``, ``options`` and ``notes``: what was assumed or
            synthesized); written to and read from Parquet.

    Raises:
        ValueError: an empty frame, a missing column, a column of the wrong kind
            (integer columns must hold integers — floats are not truncated; times must
            be numbers), a negative or out-of-range value, a null, a duplicate
            ``request_id``, decreasing or non-finite arrivals, or a block count that
            does not match the input length; the message names the column and the
            first offending row.

    Example:
        >>> import polars as pl
        >>> frame = pl.DataFrame({
        ...     "request_id": [0, 1], "arrival_s": [0.0, 1.5],
        ...     "input_tokens": [20, 40], "output_tokens": [5, 5],
        ...     "block_keys": [[7, 9], [7, 3, 4]],
        ... })
        >>> trace = Trace(frame, block_size=16, source="example")
        >>> trace
        Trace(source='example', requests=2, block_size=16, block_refs=5, distinct_blocks=4)
        >>> trace.check_chained().height  # no key seen with two parents or depths
        0
    """

    frame: pl.DataFrame
    block_size: int
    source: str = "unknown"
    partial_block_keyed: bool = True
    block_identity: bool = True
    provenance: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check()

    def _check(self, trusted: Collection[str] = (), lengths: np.ndarray | None = None) -> None:
        """Check the arguments and canonicalise the frame (:func:`trusted_trace` vouches for
        some row invariants)."""
        if not isinstance(self.frame, pl.DataFrame):
            raise ValueError(f"frame must be a polars DataFrame, got {type(self.frame).__name__}")
        object.__setattr__(self, "block_size", check_positive("block_size", self.block_size))
        check_str("source", self.source)
        object.__setattr__(self, "partial_block_keyed", check_flag("partial_block_keyed", self.partial_block_keyed))
        object.__setattr__(self, "block_identity", check_flag("block_identity", self.block_identity))
        if not isinstance(self.provenance, Mapping):
            raise ValueError(f"provenance must be a mapping, got {type(self.provenance).__name__}")
        try:
            json.dumps(dict(self.provenance))
        except (TypeError, ValueError) as err:
            raise ValueError(f"provenance must be JSON-serialisable: {err}") from None
        object.__setattr__(self, "frame", canonical_frame(self.frame, self.block_size, self.partial_block_keyed,
                                                          trusted=trusted, lengths=lengths))

    # -- size ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.frame.height

    @property
    def block_refs(self) -> int:
        """Total block references (sum over requests of their block count)."""
        return self.flat.num_refs

    @property
    def distinct_blocks(self) -> int:
        """Number of distinct block keys (the working set of an infinite cache)."""
        return self.flat.num_keys

    @cached_property
    def flat(self) -> FlatTrace:
        """The CSR form used by the replay kernels (computed once, then cached)."""
        return flatten_block_keys(self.frame["block_keys"], self.frame["input_tokens"], self.block_size)

    def __repr__(self) -> str:
        tail = ("" if self.partial_block_keyed else ", full blocks only") + (
            "" if self.block_identity else ", no block identity")
        return (f"Trace(source={self.source!r}, requests={len(self)}, block_size={self.block_size}, "
                f"block_refs={self.block_refs}, distinct_blocks={self.distinct_blocks}{tail})")

    # -- views ----------------------------------------------------------------------------
    def head(self, n: int) -> Trace:
        """The first ``n`` requests as a new trace (same block size and source)."""
        return replace(self, frame=self.frame.head(n), source=f"{self.source}[:{n}]")

    def filter(self, predicate: pl.Expr, label: str | None = None) -> Trace:
        """The requests where ``predicate`` (a polars expression over the columns) holds, in order,
        as a new trace (same block size, key semantics and provenance; ``source`` gains
        ``[label]``, default the expression).

        Raises:
            ValueError: no request is left, or ``predicate`` is not a polars expression.

        Example:
            >>> from kvlab.traces import load_trace
            >>> len(load_trace("claude-code").filter(pl.col("session_id") == "trace_0001", "trace_0001"))
            41
        """
        if not isinstance(predicate, pl.Expr):
            raise ValueError(f"predicate must be a polars expression, got {type(predicate).__name__}")
        frame = self.frame.filter(predicate)
        if frame.height == 0:
            raise ValueError(f"no request of {self.source!r} satisfies {label or predicate}")
        return replace(self, frame=frame, source=f"{self.source}[{label or predicate}]")

    def require_block_identity(self, what: str = "a cache replay") -> None:
        """Raise unless the block keys identify prompt prefixes (every cache-level driver calls it).

        Raises:
            ValueError: the trace has no block identity (token counts only); the message says
                what to run instead.
        """
        if not self.block_identity:
            fmt = self.provenance.get("format", "this format")
            raise ValueError(
                f"trace {self.source!r} has no block identity ({fmt}: arrivals and token counts only), so "
                f"{what} has nothing to hit. Run the timed cluster simulation (kvlab simulate) for load, "
                "batching and TTFT, or give it a stated synthetic sharing model: "
                "kvlab.traces.synthesize_prefix(trace, ...) (CLI: --synthesize-prefix)")

    @classmethod
    def from_token_ids(cls, frame: pl.DataFrame, hasher: BlockHasher, *, source: str = "token_ids") -> Trace:
        """Build a trace whose ``block_keys`` are ``hasher``'s keys of each ``token_ids``.

        See :func:`kvlab.traces.build.trace_from_token_ids` for the columns read.
        """
        from kvlab.traces.build import trace_from_token_ids

        return trace_from_token_ids(frame, hasher, source=source)

    @classmethod
    def from_arrays(cls, block_keys: object, **columns: object) -> Trace:
        """Build a trace from numpy arrays: one object id per request, or CSR block keys
        (``offsets=``), with no Python loop per request.

        See :func:`kvlab.traces.arrays.trace_from_arrays` for the arguments.

        Example:
            >>> import numpy as np
            >>> Trace.from_arrays(np.array([3, 1, 3], dtype=np.uint64), source="ids")
            Trace(source='ids', requests=3, block_size=1, block_refs=3, distinct_blocks=2)
        """
        from kvlab.traces.arrays import trace_from_arrays

        return trace_from_arrays(block_keys, **columns)

    def rechunk(self, k: int) -> Trace:
        """The trace with blocks ``k`` times larger (see :func:`kvlab.traces.build.rechunk`)."""
        from kvlab.traces.build import rechunk

        return rechunk(self, k)

    def describe(self) -> TraceStats:
        """Rows, time span, input/output min/mean/max, block refs, distinct and reused blocks,
        sessions, and the format it was read from (:class:`~kvlab.traces.stats.TraceStats`;
        ``str()`` gives a readable table)."""
        from kvlab.traces.stats import describe

        return describe(self)

    def check_chained(self) -> pl.DataFrame:
        """Find block keys that break prefix chaining.

        Under chained hashing a key stands for a whole prefix, so every key must always
        appear at the same position with the same parent key. A key seen with two
        different parents or at two different positions is reported (this also catches
        a key repeated inside one request).

        Returns:
            One row per offending key: ``block_key`` (u64), ``parents``
            (``list[u64]``, distinct parents, null for "first block"), ``positions``
            (``list[u32]``, distinct 0-based positions), ``first_request_id`` (u64, the
            first request where the key appears). Empty when the trace is chained.
        """
        refs = (
            self.frame.lazy()
            .select("request_id", "block_keys")
            .with_columns(pl.int_ranges(0, pl.col("block_keys").list.len(), dtype=pl.UInt32).alias("position"))
            .explode("block_keys", "position")
            .drop_nulls("block_keys")
            .with_columns(
                pl.when(pl.col("position") > 0)
                .then(pl.col("block_keys").shift(1))
                .otherwise(None)
                .alias("parent")
            )
        )
        return (
            refs.group_by("block_keys", maintain_order=True)
            .agg(
                pl.col("parent").unique(maintain_order=True).alias("parents"),
                pl.col("position").unique(maintain_order=True).alias("positions"),
                pl.col("request_id").first().alias("first_request_id"),
            )
            .filter((pl.col("parents").list.len() > 1) | (pl.col("positions").list.len() > 1))
            .rename({"block_keys": "block_key"})
            .collect()
        )

    # -- storage --------------------------------------------------------------------------
    def write_parquet(self, path: str | Path) -> None:
        """Write the frame with ``block_size`` and ``source`` as Parquet metadata.

        :func:`kvlab.traces.load_trace` reads it back to an equal trace.
        """
        self.frame.write_parquet(path, metadata={
            _PARQUET_KEYS[0]: str(self.block_size), _PARQUET_KEYS[1]: self.source,
            _PARQUET_KEYS[2]: str(self.partial_block_keyed).lower(), _PARQUET_KEYS[3]: str(self.block_identity).lower(),
            _PARQUET_KEYS[4]: _json(self.provenance)})

    def same_as(self, other: Trace) -> bool:
        """Whether ``other`` has an equal frame (values and dtypes), block size, source, key
        semantics and provenance (what a written and re-read trace must keep)."""
        return (isinstance(other, Trace) and self.frame.equals(other.frame) and self.frame.schema == other.frame.schema
                and (self.block_size, self.source, self.partial_block_keyed, self.block_identity)
                == (other.block_size, other.source, other.partial_block_keyed, other.block_identity)
                and _json(self.provenance) == _json(other.provenance))


def _json(provenance: Mapping[str, object]) -> str:
    return json.dumps(dict(provenance), sort_keys=True)


def trusted_trace(frame: pl.DataFrame, block_size: int, source: str, partial_block_keyed: bool = True, *,
                  trusted: Collection[str] = (), lengths: np.ndarray | None = None,
                  csr: tuple[np.ndarray, np.ndarray] | None = None) -> Trace:
    """A :class:`Trace` from a builder that made some of its columns itself: the row invariants
    in ``trusted`` hold by construction and are not checked again, and the flat form is built
    from ``csr`` (the same keys as the ``block_keys`` column) rather than from the list column.

    For builders in :mod:`kvlab.traces` (:meth:`Trace.from_arrays`); everything else is checked
    as :class:`Trace` does.

    Args:
        frame, block_size, source, partial_block_keyed: as :class:`Trace`.
        trusted: names from :data:`kvlab.traces.frame_checks.ROW_INVARIANTS`.
        lengths: ``int[num_requests]`` block counts of the rows, if known.
        csr: ``(offsets, refs)``: ``int64[num_requests + 1]`` row pointers (kept by the flat
            form) and ``uint64[num_refs]`` keys, interned here
            (:func:`kvlab.traces.flat.flatten_csr`).

    Raises:
        ValueError: as :class:`Trace`.
    """
    trace = object.__new__(Trace)
    for name, value in (("frame", frame), ("block_size", block_size), ("source", source),
                        ("partial_block_keyed", partial_block_keyed), ("block_identity", True),
                        ("provenance", {})):
        object.__setattr__(trace, name, value)
    trace._check(trusted, lengths)
    if csr is not None:  # stored where the cached property would have stored it
        trace.__dict__["flat"] = flatten_csr(*csr, trace.frame["input_tokens"], trace.block_size)
    return trace


def read_trace_parquet(path: str | Path) -> Trace:
    """Read a trace written by :meth:`Trace.write_parquet`.

    Raises:
        kvlab.traces.TraceFormatError: the file lacks kvlab's metadata, its frame is not a
            valid trace, or its block keys are not prefix-chained (naming the row,
            :func:`kvlab.traces.chain.check_chained_keys`).
    """
    from kvlab.traces.chain import check_chained_keys
    from kvlab.traces.errors import TraceFormatError

    try:
        meta = pl.read_parquet_metadata(path)
    except Exception as err:  # polars raises ComputeError and others for non-Parquet bytes
        raise TraceFormatError(path, None, f"not a readable Parquet file: {err}") from None
    if _PARQUET_KEYS[0] not in meta:
        raise TraceFormatError(path, None, f"Parquet file has no {_PARQUET_KEYS[0]!r} metadata; "
                                           "write it with Trace.write_parquet")
    try:
        trace = Trace(pl.read_parquet(path), int(meta[_PARQUET_KEYS[0]]), meta.get(_PARQUET_KEYS[1], str(path)),
                      meta.get(_PARQUET_KEYS[2], "true") == "true", meta.get(_PARQUET_KEYS[3], "true") == "true",
                      json.loads(meta.get(_PARQUET_KEYS[4], "{}")))
    except ValueError as err:
        raise TraceFormatError(path, None, str(err)) from err
    check_chained_keys(trace.flat, path)
    return trace
