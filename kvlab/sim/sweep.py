"""Hit ratio over a grid of capacities and policies, one replay per point, in parallel."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed

import polars as pl

from kvlab.sim.replay import ReplayConfig, run_kernel, summarize
from kvlab.traces import Trace

#: Columns of a sweep frame (and of :func:`kvlab.sim.mrc`): what varies and the results first, so a
#: printed frame shows them; the long ``source`` path last.
SWEEP_SCHEMA = {"policy": pl.String, "capacity_blocks": pl.Int64, "block_hit_ratio": pl.Float64,
                "token_hit_ratio": pl.Float64, "rejected_requests": pl.Int64, "block_refs": pl.Int64,
                "hit_blocks": pl.Int64, "evictions": pl.Int64, "mean_orphaned_share": pl.Float64,
                "mode": pl.String, "hit_semantics": pl.String, "touch_order": pl.String,
                "warmup_fraction": pl.Float64, "source": pl.String}

_WORKER_TRACE: Trace | None = None  # the trace a pool worker replays (set by its initializer)


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = trace


def _run_config(config: ReplayConfig, trace: Trace | None = None) -> dict[str, object]:
    trace = _WORKER_TRACE if trace is None else trace
    s = summarize(trace, config, run_kernel(trace, config))
    return {"source": s.source, "policy": config.policy, "mode": config.mode, "hit_semantics": config.hit_semantics,
            "touch_order": config.touch_order, "warmup_fraction": config.warmup_fraction,
            "capacity_blocks": config.capacity_blocks, "block_refs": s.block_refs, "hit_blocks": s.hit_blocks,
            "evictions": s.evictions, "block_hit_ratio": s.block_hit_ratio, "token_hit_ratio": s.token_hit_ratio,
            "rejected_requests": s.rejected_requests, "mean_orphaned_share": s.mean_orphaned_share}


def sweep(trace: Trace, capacities_blocks: Iterable[int | None], policies: Iterable[str] | str = ("lru",), *,
          touch_order: str = "head_most_recent", warmup_fraction: float = 0.0, mode: str = "prefix",
          free_order: str | None = None, hit_semantics: str = "prefix", track_orphans: bool = False,
          executor: Executor | str | None = None, progress: bool = False) -> pl.DataFrame:
    """Replay ``trace`` at every (policy, capacity) pair.

    Args:
        trace: the workload.
        capacities_blocks: cache capacities in blocks; ``None`` = unbounded.
        policies: policy names (a single name is accepted too).
        touch_order, warmup_fraction, mode, free_order, hit_semantics, track_orphans: as
            in :class:`~kvlab.sim.ReplayConfig`.
        executor: ``None`` (default) runs the grid in parallel on this machine's CPUs
            with threads — the replay kernels release the GIL, so threads run them on all
            cores without copying the trace or recompiling (measured here: 8 capacities of
            the conversation trace 0.014 s with threads vs 2.2 s with processes; a 10 M
            reference trace 0.17 s vs 3.6 s); ``"processes"`` uses worker processes (one
            per CPU, each receives the trace once and compiles its kernels — for policy
            kernels that hold the GIL); ``"serial"`` runs in this process; or any
            ``concurrent.futures.Executor`` (its tasks carry the trace).
        progress: a progress bar over the runs.

    Returns:
        One row per run, in grid order (policies × capacities), columns in
        :data:`SWEEP_SCHEMA` order: ``policy`` (str), ``capacity_blocks`` (i64, null =
        unbounded), ``block_hit_ratio``, ``token_hit_ratio`` (f64), ``rejected_requests``
        (i64: measured requests a ``"vllm"``-mode pool never admitted, counted as misses;
        0 in mode ``"prefix"``), ``block_refs``, ``hit_blocks``, ``evictions`` (i64),
        ``mean_orphaned_share`` (f64; null unless ``track_orphans``), ``mode``,
        ``hit_semantics``, ``touch_order`` (str), ``warmup_fraction`` (f64), ``source``
        (str) — the input of :func:`kvlab.viz.hit_ratio_curve`.

    Raises:
        ValueError: an invalid or empty capacity or policy list, an invalid option or
            executor.

    With ``executor="processes"`` every worker imports kvlab afresh (``spawn``): a
    plug-in policy must be registered at import of a module the workers import too —
    one registered in a notebook cell or under ``if __name__ == "__main__"`` is unknown
    there. Threads (the default) see every registered policy.

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> trace = chat_sessions(ChatWorkload(num_sessions=20, block_size=64), seed=0)
        >>> frame = sweep(trace, [10, 100, None], executor="serial")
        >>> frame["block_hit_ratio"].is_sorted()
        True
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    capacities = _nonempty_list("capacities_blocks", capacities_blocks)  # iterated once per policy
    policies = [policies] if isinstance(policies, str) else _nonempty_list("policies", policies)
    configs = [ReplayConfig(policy=p, capacity_blocks=c, touch_order=touch_order, warmup_fraction=warmup_fraction,
                            mode=mode, free_order=free_order, hit_semantics=hit_semantics,
                            track_orphans=track_orphans)
               for p in policies for c in capacities]
    rows = _run_all(trace, configs, executor, progress)
    return pl.DataFrame(rows, schema=SWEEP_SCHEMA)


def _nonempty_list(name: str, values: object) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list, got {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one")
    return values


def _run_all(trace: Trace, configs: list[ReplayConfig], executor: Executor | str | None,
             progress: bool) -> list[dict[str, object]]:
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(configs), unit="run", desc="sweep", file=sys.stderr)
    try:
        workers = min(os.cpu_count() or 1, len(configs))
        if executor == "serial" or (executor is None and workers < 2):
            rows = []
            for config in configs:
                rows.append(_run_config(config, trace))
                if bar is not None:
                    bar.update()
            return rows
        if executor is None:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                return _gather([pool.submit(_run_config, c, trace) for c in configs], bar)
        if executor == "processes":
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker, initargs=(trace,)) as pool:
                return _gather([pool.submit(_run_config, c) for c in configs], bar)
        if not isinstance(executor, Executor):
            raise ValueError(f"executor must be None, 'serial', 'processes' or a concurrent.futures.Executor, "
                             f"got {executor!r}")
        return _gather([executor.submit(_run_config, c, trace) for c in configs], bar)
    finally:
        if bar is not None:
            bar.close()


def _gather(futures: list, bar: object) -> list[dict[str, object]]:
    index = {f: i for i, f in enumerate(futures)}
    rows: list[dict[str, object] | None] = [None] * len(futures)
    for future in as_completed(futures):
        rows[index[future]] = future.result()
        if bar is not None:
            bar.update()
    return rows
