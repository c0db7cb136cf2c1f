"""Summary statistics of a trace (:meth:`kvlab.traces.Trace.describe`, ``kvlab info``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import polars as pl

from kvlab.traces.trace import Trace


@dataclass(frozen=True)
class TraceStats:
    """Summary statistics of a :class:`~kvlab.traces.Trace`.

    Token counts are in tokens, times in seconds, block counts in blocks. ``reused_blocks``
    counts distinct blocks referenced by more than one request (the share of blocks a cache could
    ever hit again; Mooncake's arXiv report: "over 50 % of cache blocks are never reused");
    ``distinct_blocks`` and ``reused_blocks`` are ``None`` for a trace without block identity, whose
    keys are placeholders; ``sessions`` is the
    number of distinct ``session_id`` values (``None`` without the column);
    ``format`` the reader (``provenance["format"]``, with the published file's name when known).

    Example:
        >>> from kvlab.traces import load_trace
        >>> s = load_trace("synthetic").describe()
        >>> s.format, s.reused_blocks, s.distinct_blocks
        ("mooncake (FAST'25 synthetic trace)", 18251, 43924)
    """

    source: str
    format: str
    block_size: int
    block_identity: bool
    requests: int
    sessions: int | None
    time_span_s: float
    input_tokens_min: int
    input_tokens_mean: float
    input_tokens_max: int
    output_tokens_min: int
    output_tokens_mean: float
    output_tokens_max: int
    input_tokens_total: int
    block_refs: int
    distinct_blocks: int | None
    reused_blocks: int | None
    max_blocks_per_request: int

    def to_dict(self) -> dict[str, object]:
        """The statistics as a plain ``dict`` (JSON-serialisable)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        reused = (f"{self.reused_blocks:,} of {self.distinct_blocks:,} "
                  f"({self.reused_blocks / max(self.distinct_blocks or 0, 1):.1%}) in more than one request"
                  if self.block_identity else "— (no block identity: token counts only)")
        rows = [
            ("source", self.source),
            ("format", self.format),
            ("block size", f"{self.block_size} tokens"),
            ("requests", f"{self.requests:,}"),
            ("sessions", "—" if self.sessions is None else f"{self.sessions:,}"),
            ("time span", f"{self.time_span_s:,.3f} s"),
            ("input tokens min/mean/max",
             f"{self.input_tokens_min:,} / {self.input_tokens_mean:,.1f} / {self.input_tokens_max:,}"),
            ("output tokens min/mean/max",
             f"{self.output_tokens_min:,} / {self.output_tokens_mean:,.1f} / {self.output_tokens_max:,}"),
            ("input tokens total", f"{self.input_tokens_total:,}"),
            ("block refs", f"{self.block_refs:,}"),
            ("distinct blocks", f"{self.distinct_blocks:,}" if self.block_identity else "— (placeholder keys)"),
            ("reused blocks", reused),
            ("max blocks per request", f"{self.max_blocks_per_request:,}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_label(trace: Trace) -> str:
    """``"mooncake (FAST'25 conversation trace)"``: the provenance's format and variant, or
    ``"in memory"`` for a trace no loader read."""
    fmt = trace.provenance.get("format")
    if fmt is None:
        return "in memory"
    variant = trace.provenance.get("variant")
    return f"{fmt} ({variant})" if variant else str(fmt)


def describe(trace: Trace) -> TraceStats:
    """The :class:`TraceStats` of ``trace`` (see :meth:`kvlab.traces.Trace.describe`)."""
    f = trace.frame
    flat = trace.flat
    blocks = flat.blocks_per_request()
    # chained keys never repeat inside a request, so a key's reference count is its request count
    reused = int((np.bincount(flat.block_ids, minlength=flat.num_keys) > 1).sum()) if trace.block_identity else None
    sessions = int(f["session_id"].n_unique()) if "session_id" in f.columns else None
    return TraceStats(
        source=trace.source, format=format_label(trace), block_size=trace.block_size,
        block_identity=trace.block_identity, requests=f.height, sessions=sessions,
        time_span_s=float(f["arrival_s"].max() - f["arrival_s"].min()),
        input_tokens_min=int(f["input_tokens"].min()), input_tokens_mean=float(f["input_tokens"].mean()),
        input_tokens_max=int(f["input_tokens"].max()),
        output_tokens_min=int(f["output_tokens"].min()), output_tokens_mean=float(f["output_tokens"].mean()),
        output_tokens_max=int(f["output_tokens"].max()),
        input_tokens_total=int(f["input_tokens"].cast(pl.UInt64).sum()),
        block_refs=trace.block_refs, distinct_blocks=trace.distinct_blocks if trace.block_identity else None,
        reused_blocks=reused,
        max_blocks_per_request=int(blocks.max()),
    )
