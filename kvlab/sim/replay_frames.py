"""The result frames of a single-cache replay (:func:`kvlab.sim.replay`), built from arrays:
the requests frame shares the trace's columns and the kernel's outputs, the timeline holds one
value per point (``ReplayConfig.timeline_points``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from kvlab.core.result import bucket_sums, rolling_hit_ratio, timeline_frame, timeline_steps
from kvlab.core.semantics import SINGLE_TIER
from kvlab.traces import Trace

if TYPE_CHECKING:
    from kvlab.sim.replay import KernelRun, ReplayConfig


def hit_tokens_u32(hit_blocks: np.ndarray, input_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """``min(hit_blocks * block_size, input_tokens)`` per request, ``u32`` (the ``requests``
    frame's dtype; ``hit_blocks * block_size`` is below ``input_tokens + block_size``), computed
    in place in one array."""
    tokens = hit_blocks.astype(np.uint32)
    tokens *= np.uint32(block_size)
    return np.minimum(tokens, input_tokens, out=tokens, casting="unsafe")


def requests_frame(trace: Trace, config: ReplayConfig, run: KernelRun, blocks: np.ndarray) -> pl.DataFrame:
    """One row per request, built from arrays (``blocks``: ``u32`` blocks of each request): the
    trace's columns are shared, not copied; the kernel's non-negative ``int32`` outputs are viewed
    as ``u32`` where the contract wants it."""
    flat = trace.flat
    n = flat.num_requests
    input_tokens = trace.frame["input_tokens"].to_numpy()
    hit_tokens = hit_tokens_u32(run.hit_blocks, input_tokens, flat.block_size)
    measured = np.ones(n, dtype=np.bool_)
    measured[: config.warmup_requests(n)] = False
    columns = {
        "request_id": trace.frame["request_id"],
        "arrival_s": trace.frame["arrival_s"],
        "input_tokens": trace.frame["input_tokens"],
        "hit_blocks": run.hit_blocks.view(np.uint32),
        "hit_tokens": hit_tokens,
        "rejected": ~run.admitted,
        "blocks": blocks,
        "miss_blocks": np.subtract(blocks, run.hit_blocks.view(np.uint32)),
        "miss_tokens": np.subtract(input_tokens, hit_tokens, dtype=np.uint32, casting="unsafe"),
        "evictions": run.evictions,
        "used_blocks": run.used_blocks,
        "measured": measured,
    }
    return pl.DataFrame({name: pl.Series(name, values) if isinstance(values, np.ndarray) else values
                         for name, values in columns.items()})


def timeline_frame_of(trace: Trace, config: ReplayConfig, run: KernelRun, blocks: np.ndarray) -> pl.DataFrame:
    """The timeline at ``config.timeline_points`` (see :func:`replay`), built from arrays of one
    value per point (no array per request beyond the kernel's outputs and ``blocks``)."""
    flat = trace.flat
    steps = timeline_steps(flat.num_requests, config.timeline_points)
    if 0 < (skip := config.warmup_requests(flat.num_requests)) and config.timeline_points is not None:
        steps = np.union1d(steps, [skip - 1])  # no bucket mixes warm-up and measured requests
    hit_blocks = bucket_sums(run.hit_blocks, steps)
    metrics = {
        "used_blocks": run.used_blocks[steps],
        "evictions": bucket_sums(run.evictions, steps),
        "hit_ratio_rolling": rolling_hit_ratio(run.hit_blocks, blocks, config.window_requests, at=steps),
    }
    if config.capacity_blocks is not None:
        metrics["capacity_blocks"] = np.full(steps.shape[0], config.capacity_blocks)
    if config.track_orphans:
        metrics["orphaned_blocks"] = run.orphans[steps]
    metrics["hit_blocks"] = hit_blocks
    metrics["miss_blocks"] = np.diff(flat.offsets[steps + 1], prepend=flat.offsets[0]) - hit_blocks
    arrival = trace.frame["arrival_s"].to_numpy()
    return timeline_frame(steps, arrival[steps], SINGLE_TIER, metrics)
