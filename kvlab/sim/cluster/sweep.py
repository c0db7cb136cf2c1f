"""``sweep``: :func:`~kvlab.sim.cluster.simulate` over a grid of configurations, one row per point.

A grid of cluster simulations is where a laptop runs out: each point is a full simulation
(seconds to minutes), the points are independent, and the simulation is deterministic (C24:
every random draw from ``config.seed``), so the same grid gives the same frame on this
machine's processes or on a Dask cluster (:mod:`kvlab.sim.executors`; ``docs/sweeps.md``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from functools import partial

import polars as pl

from kvlab.core.validate import check_list, config_with
from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.metrics import ClusterSummary
from kvlab.sim.cluster.simulate import arrival_times, simulate
from kvlab.sim.executors import check_executor, run_tasks
from kvlab.traces import Trace

#: Summary fields that are no column: the run's inputs (the varied fields are columns) and the
#: per-worker busy shares (the worker count may vary); ``tier_hit_ratio`` becomes one column per tier.
_NOT_METRICS = ("source", "config", "time_scale", "rate", "busy_share")
_DTYPES = {"int": pl.Int64, "float": pl.Float64, "float | None": pl.Float64, "bool": pl.Boolean}
#: The metric columns of a cluster sweep frame and their dtypes: the scalar fields of
#: :class:`~kvlab.sim.cluster.metrics.ClusterSummary`, in its order (``tier_hit_ratio`` apart).
SWEEP_METRICS: dict[str, pl.DataType] = {f.name: _DTYPES[f.type] for f in fields(ClusterSummary)
                                         if f.name not in (*_NOT_METRICS, "tier_hit_ratio")}
#: The fields a grid may vary (every field of :class:`ClusterConfig` a caller sets).
GRID_FIELDS = tuple(f.name for f in fields(ClusterConfig) if f.init)


def sweep(trace: Trace, grid: Mapping[str, Sequence[object]] | Sequence[Mapping[str, object]], *,
          config: ClusterConfig | None = None, executor: object = None, progress: bool = False,
          time_scale: float = 1.0, rate: float | None = None) -> pl.DataFrame:
    """Simulate ``trace`` at every point of ``grid`` (:class:`ClusterConfig` overrides).

    Args:
        trace: the requests (as :func:`~kvlab.sim.cluster.simulate` takes them).
        grid: either a dict ``{field: [values]}`` — the cartesian product, in
            ``itertools.product`` order: the first field varies slowest, the last fastest
            (``{"num_workers": [2, 4], "router": ["random", "least_loaded"]}`` runs (2, random),
            (2, least_loaded), (4, random), (4, least_loaded)) — or a list of dicts, one point
            each, in list order (a point leaves out the fields it does not change).
        config: the configuration every point starts from (``None``: the defaults).
        executor: where the simulations run — ``None`` (default) or ``"processes"``: this
            machine's CPUs, one ``spawn``-ed process each, the trace sent to each once;
            ``"serial"``: this process; a ``concurrent.futures.Executor`` (each task carries the
            trace); a ``dask.distributed.Client`` or a scheduler address ``"tcp://HOST:PORT"``
            (the trace scattered once to every Dask worker). See :mod:`kvlab.sim.executors`.
        progress: a tqdm bar on stderr, one step per finished point.
        time_scale, rate: every point's arrivals, as :func:`~kvlab.sim.cluster.arrival_times`.

    Returns:
        One row per point, in grid order. Columns: the varied fields (in the grid's order; the
        value the run used — ``capacity_blocks=None`` shows the derived count; a value that is
        not a number, string or bool, such as a router object or ``tiers``, as the JSON of
        :meth:`ClusterConfig.to_dict`); then :data:`SWEEP_METRICS`: ``requests``,
        ``completed_requests``, ``rejected_requests``, ``input_tokens``, ``output_tokens``,
        ``computed_prefill_tokens`` (i64), ``token_hit_ratio``, ``gpu_hit_ratio``, one
        ``tier_hit_ratio_<tier>`` per tier any point has (null where a point lacks it),
        ``remote_hit_ratio``, TTFT, TBT and E2E ``_mean_s``/``_p50_s``/``_p90_s``/``_p99_s``
        (f64, null without samples), ``goodput_rps``, ``makespan_s``, ``prefill_gpu_s``,
        ``decode_gpu_s`` (f64), ``preemptions``, ``steps``, ``events`` (i64), ``wall_s`` and
        ``simulated_requests_per_s`` (f64: the simulator's own speed, the only columns that
        differ between two runs), ``block_identity`` (bool: the trace's; false means the hit
        ratios are 0 by construction); last ``source`` (str).

    Raises:
        ValueError: not a Trace; a grid that is empty, names a field :class:`ClusterConfig`
            does not have, or gives a field no list of values (named); a point's bad value
            (the field named, as ``ClusterConfig`` says it); a bad ``time_scale``/``rate`` or
            executor — all before any simulation starts.

    Example:
        >>> from kvlab.traces import load_trace
        >>> grid = {"num_workers": [1, 2], "router": ["random", "least_loaded"], "capacity_blocks": [20_000]}
        >>> frame = sweep(load_trace("conversation").head(20), grid, executor="serial")
        >>> frame.select("num_workers", "router", "completed_requests").rows()
        [(1, 'random', 20), (1, 'least_loaded', 20), (2, 'random', 20), (2, 'least_loaded', 20)]
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    varied, points = grid_points(grid)
    configs = [config_with(ClusterConfig, config, point) for point in points]
    arrival_times(trace.head(1), time_scale=time_scale, rate=rate)  # checks both before any run
    check_executor(executor)
    rows = run_tasks(partial(_run_point, time_scale=time_scale, rate=rate), configs, trace, executor,
                     default="processes", progress=progress, desc="cluster sweep")
    return _frame(varied, configs, rows)


def grid_points(grid: object) -> tuple[list[str], list[dict[str, object]]]:
    """The varied fields (in order of first appearance) and one overrides dict per point, in grid
    order, of a :func:`sweep` grid.

    Raises:
        ValueError: as :func:`sweep` says of its grid.

    Example:
        >>> grid_points({"num_workers": [1, 2], "router": ["random"]})
        (['num_workers', 'router'], [{'num_workers': 1, 'router': 'random'}, {'num_workers': 2, 'router': 'random'}])
        >>> grid_points({"num_workers": 4})
        Traceback (most recent call last):
        ValueError: grid['num_workers'] must be a list, got 4
    """
    if isinstance(grid, Mapping):
        if not grid:
            raise ValueError("grid is empty: give at least one ClusterConfig field and its values")
        varied = [_check_field("grid", name) for name in grid]
        values = [check_list(f"grid[{name!r}]", grid[name]) for name in varied]
        return varied, [dict(zip(varied, point)) for point in itertools.product(*values)]
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence):
        raise ValueError(f"grid must be a dict {{field: [values]}} or a list of dicts, got {grid!r}")
    points = check_list("grid", grid)
    varied: dict[str, None] = {}
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ValueError(f"grid[{i}] must be a dict of ClusterConfig fields, got {point!r}")
        varied.update(dict.fromkeys(_check_field(f"grid[{i}]", name) for name in point))
    return list(varied), [dict(point) for point in points]


def _check_field(where: str, name: object) -> str:
    if name not in GRID_FIELDS:
        raise ValueError(f"{where} names {name!r}, not a ClusterConfig field; fields: {sorted(GRID_FIELDS)}")
    return name


def _run_point(config: ClusterConfig, trace: Trace, *, time_scale: float, rate: float | None) -> dict[str, object]:
    """One point's :func:`summary_row`."""
    return summary_row(simulate(trace, config, time_scale=time_scale, rate=rate).summary)


def summary_row(s: ClusterSummary) -> dict[str, object]:
    """A run's row of a sweep frame: :data:`SWEEP_METRICS` of its summary, a
    ``tier_hit_ratio_<tier>`` per tier, and ``source``.

    Example:
        >>> from kvlab.traces import load_trace
        >>> row = summary_row(simulate(load_trace("conversation").head(3), num_workers=1).summary)
        >>> row["requests"], "tier_hit_ratio" in row
        (3, False)
    """
    row: dict[str, object] = {name: getattr(s, name) for name in SWEEP_METRICS}
    row.update({f"tier_hit_ratio_{tier}": ratio for tier, ratio in s.tier_hit_ratio.items()})
    row["source"] = s.source
    return row


def _label(config: ClusterConfig, name: str) -> object:
    """A varied field's value as a frame cell: scalars as they are, the rest as JSON."""
    value = getattr(config, name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    value = config.to_dict()[name]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _frame(varied: list[str], configs: list[ClusterConfig], rows: list[dict[str, object]]) -> pl.DataFrame:
    tiers = list(dict.fromkeys(k for row in rows for k in row if k.startswith("tier_hit_ratio_")))
    columns = [pl.Series(name, [_label(c, name) for c in configs], strict=False) for name in varied]
    for name in (f.name for f in fields(ClusterSummary)):
        if name == "tier_hit_ratio":
            columns += [pl.Series(t, [row.get(t) for row in rows], dtype=pl.Float64) for t in tiers]
        elif name in SWEEP_METRICS:
            columns.append(pl.Series(name, [row[name] for row in rows], dtype=SWEEP_METRICS[name]))
    columns.append(pl.Series("source", [row["source"] for row in rows], dtype=pl.String))
    return pl.DataFrame(columns)
