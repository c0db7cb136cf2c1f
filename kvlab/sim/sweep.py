"""Hit ratio over a grid of capacities and policies (one replay per point)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

import polars as pl

from kvlab.sim.replay import ReplayConfig, run_kernel, summarize
from kvlab.traces import Trace


def sweep(trace: Trace, capacities_blocks: Iterable[int | None], policies: Iterable[str] = ("lru",), *,
          touch_order: str = "head_most_recent", warmup_fraction: float = 0.0, mode: str = "prefix",
          free_order: str = "current", progress: bool = False) -> pl.DataFrame:
    """Replay ``trace`` at every (policy, capacity) pair, sequentially.

    Args:
        trace: the workload.
        capacities_blocks: cache capacities in blocks; ``None`` = unbounded.
        policies: policy names (a single name is accepted too).
        touch_order, warmup_fraction, mode, free_order: as in :class:`~kvlab.sim.ReplayConfig`.
        progress: a progress bar over the runs.

    Returns:
        One row per run: ``source``, ``policy``, ``mode``, ``touch_order`` (str),
        ``warmup_fraction`` (f64), ``capacity_blocks`` (i64, null = unbounded),
        ``block_refs``, ``hit_blocks``, ``evictions`` (i64), ``block_hit_ratio``,
        ``token_hit_ratio`` (f64) — the input of :func:`kvlab.viz.hit_ratio_curve`.

    Raises:
        ValueError: an invalid capacity, policy, touch order or warm-up fraction.

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> trace = chat_sessions(ChatWorkload(n_sessions=20, block_size=64), seed=0)
        >>> frame = sweep(trace, [10, 100, None])
        >>> frame["block_hit_ratio"].is_sorted()
        True
    """
    capacities = list(capacities_blocks)  # iterated once per policy
    policies = [policies] if isinstance(policies, str) else list(policies)
    configs = [ReplayConfig(policy=p, capacity_blocks=c, touch_order=touch_order, warmup_fraction=warmup_fraction,
                            mode=mode, free_order=free_order)
               for p in policies for c in capacities]
    if progress:
        from tqdm.auto import tqdm

        configs_iter = tqdm(configs, unit="run", desc="sweep", file=sys.stderr)
    else:
        configs_iter = configs
    rows = []
    for config in configs_iter:
        s = summarize(trace, config, run_kernel(trace, config))
        rows.append({
            "source": s.source, "policy": s.policy, "mode": s.mode, "touch_order": s.touch_order,
            "warmup_fraction": s.warmup_fraction, "capacity_blocks": s.capacity_blocks,
            "block_refs": s.block_refs, "hit_blocks": s.hit_blocks, "evictions": s.evictions,
            "block_hit_ratio": s.block_hit_ratio, "token_hit_ratio": s.token_hit_ratio,
        })
    schema = {"source": pl.String, "policy": pl.String, "mode": pl.String, "touch_order": pl.String, "warmup_fraction": pl.Float64,
              "capacity_blocks": pl.Int64, "block_refs": pl.Int64, "hit_blocks": pl.Int64, "evictions": pl.Int64,
              "block_hit_ratio": pl.Float64, "token_hit_ratio": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
