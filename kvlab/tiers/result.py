"""What a tiered replay returns: :class:`TieredReplayResult`, the shared :class:`kvlab.core.RunResult`
with a :class:`TieredSummary` (every tier's name, capacity, policy and counters)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.result import RunResult, RunSummary, timeline_frame
from kvlab.tiers.driver import request_columns
from kvlab.tiers.tier import TierCounters
from kvlab.tiers.types import TieredConfig
from kvlab.traces import Trace


@dataclass(frozen=True)
class TierSummary:
    """One tier of a run: its ``name``, ``capacity_blocks`` (``None`` = unbounded),
    ``policy`` (``None``: never evicts) and its :class:`~kvlab.tiers.tier.TierCounters`
    over the measured requests.

    Example:
        >>> TierSummary("GPU", 2_000, "lru", TierCounters(hit_blocks=5)).counters.hit_blocks
        5
    """

    name: str
    capacity_blocks: int | None
    policy: str | None
    counters: TierCounters


@dataclass(frozen=True)
class TieredSummary(RunSummary):
    """Totals over the measured requests (after warm-up) of one tiered replay.

    ``requests`` counts the measured requests, ``warmup_requests`` the excluded ones before
    them; ``block_refs``, ``hit_blocks`` (the combined prefix found over the tiers),
    ``input_tokens`` and ``hit_tokens`` are sums over the measured requests, ratios 0.0 when
    their denominator is 0; ``tier_hit_blocks`` maps each tier's name to the hit blocks it
    answered; ``tiers`` gives every tier's configuration and counters, fastest first;
    ``engine`` is the engine that ran (``"kernel"`` or ``"reference"``).
    """

    driver: ClassVar[str] = "replay_tiered"
    source: str
    config: TieredConfig
    engine: str
    requests: int
    warmup_requests: int
    block_refs: int
    hit_blocks: int
    block_hit_ratio: float
    input_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    tier_hit_blocks: dict[str, int]
    tiers: tuple[TierSummary, ...]

    def __str__(self) -> str:
        c = self.config
        return "\n".join([
            f"trace        {self.source}",
            f"tiers        {', '.join(f'{t.name} {t.capacity_blocks} {t.policy}' for t in self.tiers)}; "
            f"{c.write_policy}, promote={c.promote}, {c.touch_order}",
            f"requests     {self.requests:,} measured ({self.warmup_requests:,} warm-up)",
            f"block hits   {self.hit_blocks:,} / {self.block_refs:,} = {self.block_hit_ratio:.4f}  by tier "
            f"{self.tier_hit_blocks}",
            f"token hits   {self.hit_tokens:,} / {self.input_tokens:,} = {self.token_hit_ratio:.4f}",
        ])


@dataclass(frozen=True, eq=False)
class TieredReplayResult(RunResult):
    """Output of :func:`~kvlab.tiers.replay.replay_tiered`.

    Attributes:
        requests: one row per request: ``request_id`` (u64), ``arrival_s`` (f64),
            ``input_tokens`` (u32), ``hit_blocks`` (u32, the combined prefix found over the
            tiers), ``hit_tokens`` (u32, full blocks as ``block_size`` tokens, at most the
            input), ``computed_blocks`` (u32, the rest), then per tier ``hit_blocks_<tier>``
            (u32, hit blocks that tier answered) and ``used_blocks_<tier>`` (u32, resident
            blocks after the request), and ``measured`` (bool, false during warm-up).
        timeline: long format: metric ``used_blocks`` (resident blocks after the request)
            for every tier (``tier`` = its name), at the requests (``step``, ``time_s`` =
            arrival) where some tier's resident blocks changed, the request before each
            change, and the last request: the values between two steps are the earlier
            step's, so a line through the points is the exact occupancy.
        summary: a :class:`TieredSummary`.
        config: the :class:`~kvlab.tiers.types.TieredConfig` run.
    """

    summary: TieredSummary
    config: TieredConfig

    @property
    def engine(self) -> str:
        """The engine that ran (``"kernel"`` or ``"reference"``)."""
        return self.summary.engine

    @property
    def tier_names(self) -> list[str]:
        """The tiers' names, fastest first."""
        return [t.name for t in self.summary.tiers]

    @property
    def tier_counters(self) -> pl.DataFrame:
        """One row per tier: ``tier``, ``capacity_blocks`` (null = unbounded), ``policy``
        (null: never evicts), then the :class:`~kvlab.tiers.tier.TierCounters` and
        ``removed_blocks`` (i64 blocks, over the measured requests)."""
        tiers = self.summary.tiers
        rows = [t.counters.to_dict() for t in tiers]
        return pl.DataFrame({
            "tier": [t.name for t in tiers],
            "capacity_blocks": pl.Series([t.capacity_blocks for t in tiers], dtype=pl.Int64),
            "policy": pl.Series([t.policy for t in tiers], dtype=pl.String),
            **{name: pl.Series([row[name] for row in rows], dtype=pl.Int64) for name in rows[0]},
        })


def used_log_of(used: np.ndarray) -> np.ndarray:
    """The log of resident blocks per tier (rows: the request where they changed, then one
    column per tier) from their values after every request (``[num_requests, T]``), as the
    driver logs them.

    Example:
        >>> used_log_of(np.array([[1, 0], [1, 0], [2, 0]])).tolist()
        [[0, 1, 0], [2, 2, 0]]
    """
    changed = np.ones(used.shape[0], dtype=np.bool_)
    changed[1:] = (used[1:] != used[:-1]).any(axis=1)
    rows = np.flatnonzero(changed)
    return np.column_stack((rows, used[rows])).astype(np.int64)


def build_result(trace: Trace, config: TieredConfig, engine: str, hit_blocks: np.ndarray, used_log: np.ndarray,
                 counters: list[TierCounters], skip: int) -> TieredReplayResult:
    """The frames and summary from the hit blocks per request and tier (``[num_requests, T]``),
    the log of the resident blocks (:func:`used_log_of`) and the counters per tier over the
    measured requests (from request ``skip`` on)."""
    flat, specs = trace.flat, config.tiers
    num_tiers, n = len(specs), flat.num_requests
    hits, used = np.empty((num_tiers, n), dtype=np.uint32), np.empty((num_tiers, n), dtype=np.uint32)
    total, hit_tokens, computed = (np.empty(n, dtype=np.uint32) for _ in range(3))
    tier_hits = np.zeros(num_tiers, dtype=np.int64)
    log = used_log if used_log.shape[0] else np.zeros((1, num_tiers + 1), dtype=np.int64)
    hit_sum, token_sum, num_inputs = (int(x) for x in request_columns(
        flat.offsets, flat.input_tokens, flat.block_size, skip, hit_blocks, log, hits, used, total, hit_tokens,
        computed, tier_hits))
    columns = {
        "request_id": trace.frame["request_id"],
        "arrival_s": trace.frame["arrival_s"],
        "input_tokens": trace.frame["input_tokens"],
        "hit_blocks": pl.Series(total),
        "hit_tokens": pl.Series(hit_tokens),
        "computed_blocks": pl.Series(computed),
        **{f"hit_blocks_{spec.name}": pl.Series(hits[t]) for t, spec in enumerate(specs)},
        **{f"used_blocks_{spec.name}": pl.Series(used[t]) for t, spec in enumerate(specs)},
        "measured": np.arange(n) >= skip,
    }
    refs = int(flat.offsets[-1] - flat.offsets[skip])
    summary = TieredSummary(
        source=trace.source, config=config, engine=engine, requests=n - skip, warmup_requests=skip,
        block_refs=refs, hit_blocks=hit_sum, block_hit_ratio=hit_sum / refs if refs else 0.0,
        input_tokens=num_inputs, hit_tokens=token_sum, token_hit_ratio=token_sum / num_inputs if num_inputs else 0.0,
        tier_hit_blocks={s.name: int(tier_hits[t]) for t, s in enumerate(specs)},
        tiers=tuple(TierSummary(s.name, s.capacity_blocks, s.policy, c) for s, c in zip(specs, counters)),
    )
    return TieredReplayResult(pl.DataFrame(columns), _timeline(trace, config, used_log, hits, total), summary, config)


def _timeline(trace: Trace, config: TieredConfig, used_log: np.ndarray, hits: np.ndarray,
              total: np.ndarray) -> pl.DataFrame:
    """Per tier: ``hit_blocks`` at every request (``hits``: ``[num_tiers, num_requests]``),
    ``used_blocks`` at the changes, the requests before them and the last request, and
    ``capacity_blocks`` (bounded tiers) at the first and last request; ``miss_blocks`` (the
    blocks no tier served, ``total`` the hits over all tiers) under the first tier."""
    n = len(trace)
    if n == 0:
        return timeline_frame([], [], "", {})
    arrival = trace.frame["arrival_s"].to_numpy()
    every = np.arange(n)
    changes = used_log[:, 0].astype(np.int64)
    pairs = np.column_stack((np.concatenate([changes[:1], changes[1:] - 1]), changes)).ravel()  # sorted
    steps = np.append(pairs, n - 1)
    steps = steps[np.concatenate([[True], np.diff(steps) > 0])]
    rows = np.searchsorted(changes, steps, side="right") - 1
    ends = np.unique([0, n - 1])
    frames = []
    for t, spec in enumerate(config.tiers):
        frames.append(timeline_frame(every, arrival, spec.name, {"hit_blocks": hits[t]}))
        if t == 0:
            blocks = trace.flat.blocks_per_request().astype(np.int64)
            frames.append(timeline_frame(every, arrival, spec.name, {"miss_blocks": blocks - total}))
        frames.append(timeline_frame(steps, arrival[steps], spec.name, {"used_blocks": used_log[rows, t + 1]}))
        if spec.capacity_blocks is not None:
            frames.append(timeline_frame(ends, arrival[ends], spec.name,
                                         {"capacity_blocks": np.full(ends.shape, spec.capacity_blocks)}))
    return pl.concat(frames)


def counters_of(values: dict[str, np.ndarray]) -> list[TierCounters]:
    """Per-tier :class:`~kvlab.tiers.tier.TierCounters` from arrays per counter name (absent
    names: 0).

    Example:
        >>> counters_of({"hit_blocks": np.array([3, 1])})[1].hit_blocks
        1
    """
    num_tiers = len(next(iter(values.values())))
    return [TierCounters(**{f.name: int(values[f.name][t]) for f in fields(TierCounters) if f.name in values})
            for t in range(num_tiers)]
