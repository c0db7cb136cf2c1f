"""Segment reuse: prefix hits versus reuse of whole segments at any position (RAGPulse's non-prefix reuse)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.jit import kernel_jit
from kvlab.core.result import RunResult, RunSummary, timeline_frame
from kvlab.core.semantics import SINGLE_TIER
from kvlab.core.validate import check_real
from kvlab.traces.chain import rechain
from kvlab.traces.flat import intern_first_seen
from kvlab.traces.trace import Trace

__all__ = ["SegmentConfig", "SegmentSummary", "replay_segments", "trace_segments"]


@dataclass(frozen=True)
class SegmentConfig:
    """What :func:`replay_segments` runs: an unbounded cache of segments, a warm-up share.

    Attributes:
        warmup_fraction: share in ``[0, 1)`` of the first requests not measured (their segments
            still fill the cache): ``floor(warmup_fraction × requests)`` requests, as
            :func:`kvlab.sim.replay` (0.5: the kvcache-blog figures' last 50 %).

    Raises:
        ValueError: ``warmup_fraction`` outside ``[0, 1)``.

    Example:
        >>> SegmentConfig().warmup_requests(7106)
        3553
        >>> SegmentConfig(warmup_fraction=1.0)
        Traceback (most recent call last):
        ...
        ValueError: warmup_fraction must be a number in [0, 1), got 1.0
    """

    warmup_fraction: float = 0.5

    def __post_init__(self) -> None:
        value = check_real("warmup_fraction", self.warmup_fraction)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"warmup_fraction must be a number in [0, 1), got {self.warmup_fraction!r}")
        object.__setattr__(self, "warmup_fraction", value)

    def warmup_requests(self, num_requests: int) -> int:
        """The number of leading requests not measured."""
        return int(np.floor(self.warmup_fraction * num_requests))


@dataclass(frozen=True)
class SegmentSummary(RunSummary):
    """Totals of one :func:`replay_segments`.

    ``input_tokens``, ``hit_blocks``, ``hit_tokens``: every request (the block-level prefix hit);
    ``measured_*``, ``prefix_hit_tokens``, ``blend_hit_tokens``: the measured requests only
    (after the warm-up); the two ratios are token-weighted over the measured input tokens (0.0
    when there are none).

    Example:
        >>> SegmentSummary.driver
        'replay_segments'
    """

    driver: ClassVar[str] = "replay_segments"
    source: str
    config: SegmentConfig
    requests: int
    warmup_requests: int
    input_tokens: int
    hit_blocks: int
    hit_tokens: int
    measured_requests: int
    measured_input_tokens: int
    measured_segments: int
    prefix_hit_tokens: int
    blend_hit_tokens: int
    prefix_hit_ratio: float
    blend_hit_ratio: float


def trace_segments(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A trace's segments as CSR arrays: its ``segment_ids`` / ``segment_tokens`` columns (RAGPulse),
    else its blocks (each block key a segment of ``block_size`` tokens, the last one partial).

    Returns:
        ``(offsets, segment_ids, segment_tokens)``: ``int64[num_requests + 1]``, ``uint64[num_segments]``,
        ``int64[num_segments]``.

    Raises:
        ValueError: a request whose segments hold more tokens than ``input_tokens``.
    """
    frame = trace.frame
    inputs = frame["input_tokens"].to_numpy().astype(np.int64)
    if {"segment_ids", "segment_tokens"} <= set(frame.columns):
        lens = frame["segment_ids"].list.len().to_numpy().astype(np.int64)
        if (frame["segment_tokens"].list.len().to_numpy() != lens).any():
            raise ValueError("segment_ids and segment_tokens must have one entry each per segment")
        ids = frame["segment_ids"].explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.uint64)
        tokens = frame["segment_tokens"].explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.int64)
        offsets = np.zeros(frame.height + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
    else:
        flat = trace.flat
        offsets, ids = flat.offsets.astype(np.int64), flat.keys[flat.block_ids]
        tokens = np.full(ids.shape[0], trace.block_size, dtype=np.int64)
        last = offsets[1:][np.diff(offsets) > 0] - 1
        rows = np.flatnonzero(np.diff(offsets) > 0)
        tokens[last] = np.minimum(inputs[rows] - (last - offsets[rows]) * trace.block_size, trace.block_size)
    rows = np.repeat(np.arange(frame.height), np.diff(offsets))
    over = np.bincount(rows, weights=tokens, minlength=frame.height) > inputs
    if over.any():
        r = int(np.argmax(over))
        raise ValueError(f"request row {r}: its segments hold more tokens than input_tokens={inputs[r]}")
    return offsets, ids, tokens


def replay_segments(trace: Trace, *, warmup_fraction: float = 0.5) -> RunResult:
    """Prefix reuse and segment ("blend") reuse of a trace's segments in an unbounded cache.

    Each request, in the trace's (arrival) order, against every earlier request:

    * prefix hit: the longest run of its leading segments whose whole segment prefix (the same
      segments in the same order from the start) an earlier request had — what a prefix cache
      can reuse; its tokens are the sum of those segments' tokens;
    * segment reuse ("blend"): every segment an earlier request had, at any position — the upper
      bound of CacheBlend-style non-prefix reuse (no recompute share, no position limit). A
      segment repeated inside one request counts only if an earlier request had it.

    Tokens past the segments (RAGPulse's template tokens) never hit. The core ``hit_blocks`` /
    ``hit_tokens`` are the prefix hit in the trace's blocks: the ``floor(prefix tokens / block
    size)`` full blocks inside it — exactly :func:`kvlab.sim.replay`'s unbounded prefix hit on the
    full-block keys :func:`kvlab.traces.load_ragpulse` builds (a trace without segment columns: its
    blocks, all of them when the whole prompt hits).

    Args:
        trace: a trace with ``segment_ids`` and ``segment_tokens`` (:func:`kvlab.traces.load_ragpulse`),
            or any trace (its blocks are then the segments, :func:`trace_segments`).
        warmup_fraction: as :class:`SegmentConfig`.

    Returns:
        A :class:`~kvlab.core.RunResult`: ``requests`` has the core columns, then ``measured``
        (bool), ``segments``, ``prefix_hit_segments``, ``prefix_hit_tokens``, ``blend_hit_segments``,
        ``blend_hit_tokens`` (i64); ``timeline`` per request (tier ``"cache"``): ``hit_blocks``,
        ``miss_blocks``; ``summary`` a :class:`SegmentSummary`; ``config`` a :class:`SegmentConfig`.

    Raises:
        ValueError: not a Trace, a trace without block identity, segments longer than the prompt,
            a bad ``warmup_fraction``.

    Example:
        >>> t = Trace.from_arrays([1, 2, 2, 1, 1, 2], offsets=[0, 2, 4, 6], block_size=10)
        >>> r = replay_segments(t, warmup_fraction=0.0)   # the block keys are the segments here
        >>> r.requests["prefix_hit_tokens"].to_list(), r.requests["blend_hit_tokens"].to_list()
        ([0, 0, 20], [0, 20, 20])
    """
    config = SegmentConfig(warmup_fraction=warmup_fraction)
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    trace.require_block_identity("replay_segments")
    offsets, ids, tokens = trace_segments(trace)
    prefix = intern_first_seen(rechain(offsets, ids))[0].astype(np.int64)
    dense = intern_first_seen(ids)[0].astype(np.int64)
    counts = _reuse(offsets, prefix, dense, tokens, int(prefix.max(initial=-1)) + 1, int(dense.max(initial=-1)) + 1)
    pre_seg, pre_tok, blend_seg, blend_tok = counts
    inputs = trace.frame["input_tokens"].to_numpy().astype(np.int64)
    size = trace.block_size
    blocks = (inputs + (size - 1 if trace.partial_block_keyed else 0)) // size
    segmented = "segment_ids" in trace.frame.columns  # else the segments are the blocks: a full hit is all of them
    hit_blocks = np.where((pre_tok >= inputs) & ~segmented, blocks, pre_tok // size)
    n = inputs.shape[0]
    skip = config.warmup_requests(n)
    measured = np.arange(n) >= skip
    requests = pl.DataFrame({
        "request_id": trace.frame["request_id"], "arrival_s": trace.frame["arrival_s"], "input_tokens": inputs,
        "hit_blocks": hit_blocks, "hit_tokens": np.minimum(hit_blocks * size, inputs), "measured": measured,
        "segments": np.diff(offsets), "prefix_hit_segments": pre_seg, "prefix_hit_tokens": pre_tok,
        "blend_hit_segments": blend_seg, "blend_hit_tokens": blend_tok})
    timeline = timeline_frame(np.arange(n), trace.frame["arrival_s"].to_numpy(), SINGLE_TIER,
                              {"hit_blocks": hit_blocks, "miss_blocks": blocks - hit_blocks})
    denom = int(inputs[measured].sum())
    summary = SegmentSummary(
        source=trace.source, config=config, requests=n, warmup_requests=skip, input_tokens=int(inputs.sum()),
        hit_blocks=int(hit_blocks.sum()), hit_tokens=int(requests["hit_tokens"].sum()), measured_requests=n - skip,
        measured_input_tokens=denom, measured_segments=int(np.diff(offsets)[measured].sum()),
        prefix_hit_tokens=int(pre_tok[measured].sum()), blend_hit_tokens=int(blend_tok[measured].sum()),
        prefix_hit_ratio=int(pre_tok[measured].sum()) / denom if denom else 0.0,
        blend_hit_ratio=int(blend_tok[measured].sum()) / denom if denom else 0.0)
    return RunResult(requests, timeline, summary, config)


@kernel_jit(nogil=True)
def _reuse(offsets: np.ndarray, prefix: np.ndarray, dense: np.ndarray, tokens: np.ndarray, num_prefixes: int,
           num_segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request: leading segments (and tokens) whose chained prefix an earlier request had, and
    segments (and tokens) an earlier request had anywhere. One pass; a key's first request is
    recorded after the request that introduced it is counted."""
    n = offsets.shape[0] - 1
    prefix_first = np.full(num_prefixes, n, dtype=np.int64)
    segment_first = np.full(num_segments, n, dtype=np.int64)
    pre_seg = np.zeros(n, dtype=np.int64)
    pre_tok = np.zeros(n, dtype=np.int64)
    blend_seg = np.zeros(n, dtype=np.int64)
    blend_tok = np.zeros(n, dtype=np.int64)
    for r in range(n):
        leading = True
        for i in range(offsets[r], offsets[r + 1]):
            if leading and prefix_first[prefix[i]] < r:
                pre_seg[r] += 1
                pre_tok[r] += tokens[i]
            else:
                leading = False
            if segment_first[dense[i]] < r:
                blend_seg[r] += 1
                blend_tok[r] += tokens[i]
        for i in range(offsets[r], offsets[r + 1]):
            prefix_first[prefix[i]] = min(prefix_first[prefix[i]], r)
            segment_first[dense[i]] = min(segment_first[dense[i]], r)
    return pre_seg, pre_tok, blend_seg, blend_tok
