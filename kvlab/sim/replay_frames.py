"""The result frames of a single-cache replay (:func:`kvlab.sim.replay`), built from arrays:
the requests frame shares the trace's columns and the kernel's outputs, the timeline holds one
value per point (``ReplayConfig.timeline_points``). One pass (:func:`kvlab.sim.replay_pass.request_pass`)
computes the derived columns, the summary's totals and the timeline's running sums."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from kvlab.core.result import timeline_frame, timeline_steps
from kvlab.core.semantics import SINGLE_TIER
from kvlab.sim.replay_pass import CUT_BLOCKS, CUT_EVICTIONS, CUT_HITS, RequestColumns, RequestTotals, request_pass
from kvlab.traces import Trace

if TYPE_CHECKING:
    from kvlab.sim.replay import KernelRun, ReplayConfig


def run_totals(trace: Trace, config: ReplayConfig, run: KernelRun, cuts: np.ndarray | None = None,
               columns: RequestColumns | None = None) -> RequestTotals:
    """:func:`~kvlab.sim.replay_pass.request_pass` over a kernel run of ``trace`` (warm-up from
    ``config``)."""
    flat = trace.flat
    return request_pass(flat.offsets, flat.input_tokens, flat.block_size, config.warmup_requests(flat.num_requests),
                        run.hit_blocks, run.evictions, run.used_blocks, run.admitted, cuts=cuts, columns=columns)


def frames_of(trace: Trace, config: ReplayConfig, run: KernelRun) -> tuple[pl.DataFrame, pl.DataFrame, RequestTotals]:
    """The ``requests`` and ``timeline`` frames of a kernel run (see :func:`kvlab.sim.replay`)
    and the run's totals, from one pass over the per-request arrays."""
    n = trace.flat.num_requests
    steps = timeline_steps(n, config.timeline_points)
    if 0 < (skip := config.warmup_requests(n)) and config.timeline_points is not None:
        steps = np.union1d(steps, [skip - 1])  # no bucket mixes warm-up and measured requests
    ends = steps + 1
    starts = np.maximum(ends - config.window_requests, 0)
    cuts = np.union1d(ends, starts)
    columns = RequestColumns.empty(n)
    totals = run_totals(trace, config, run, cuts=cuts, columns=columns)
    return (_requests_frame(trace, run, columns),
            _timeline_frame(trace, config, run, steps, totals.cut_sums[np.searchsorted(cuts, ends)],
                            totals.cut_sums[np.searchsorted(cuts, starts)]),
            totals)


def _requests_frame(trace: Trace, run: KernelRun, columns: RequestColumns) -> pl.DataFrame:
    """One row per request: the trace's columns shared, the kernel's non-negative ``int32``
    outputs viewed as ``u32`` where the contract wants it, the pass's derived columns."""
    frame = trace.frame
    values = {
        "request_id": frame["request_id"],
        "arrival_s": frame["arrival_s"],
        "input_tokens": frame["input_tokens"],
        "hit_blocks": run.hit_blocks.view(np.uint32),
        "hit_tokens": columns.hit_tokens,
        "rejected": columns.rejected,
        "blocks": columns.blocks,
        "miss_blocks": columns.miss_blocks,
        "miss_tokens": columns.miss_tokens,
        "evictions": run.evictions,
        "used_blocks": run.used_blocks,
        "measured": columns.measured,
    }
    return pl.DataFrame({name: pl.Series(name, v) if isinstance(v, np.ndarray) else v for name, v in values.items()})


def _timeline_frame(trace: Trace, config: ReplayConfig, run: KernelRun, steps: np.ndarray, at_end: np.ndarray,
                    at_start: np.ndarray) -> pl.DataFrame:
    """The timeline at ``steps`` (see :func:`kvlab.sim.replay`) from the running sums at each
    bucket's end (``at_end``) and at each rolling window's start (``at_start``), ``int64[k, 3]``."""
    hit_blocks = np.diff(at_end[:, CUT_HITS], prepend=0)
    window_refs = (at_end[:, CUT_BLOCKS] - at_start[:, CUT_BLOCKS]).astype(np.float64)
    window_hits = (at_end[:, CUT_HITS] - at_start[:, CUT_HITS]).astype(np.float64)
    metrics = {
        "used_blocks": run.used_blocks[steps],
        "evictions": np.diff(at_end[:, CUT_EVICTIONS], prepend=0),
        "hit_ratio_rolling": np.divide(window_hits, window_refs, out=np.zeros_like(window_refs),
                                       where=window_refs > 0),
    }
    if config.capacity_blocks is not None:
        metrics["capacity_blocks"] = np.full(steps.shape[0], config.capacity_blocks)
    if config.track_orphans:
        metrics["orphaned_blocks"] = run.orphans[steps]
    metrics["hit_blocks"] = hit_blocks
    metrics["miss_blocks"] = np.diff(at_end[:, CUT_BLOCKS], prepend=0) - hit_blocks
    arrival = trace.frame["arrival_s"].to_numpy()
    return timeline_frame(steps, arrival[steps], SINGLE_TIER, metrics)
