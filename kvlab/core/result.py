"""The one result type every kvlab driver returns, and its contract.

A run of any driver — the cache-level replay, the tiered replay, the CacheBlend replay, the
engine replay, the routed cluster replay, the reference oracle — returns a
:class:`RunResult` (or a subclass) with four parts:

* ``requests``: a polars frame, one row per request, starting with the core columns
  :data:`CORE_REQUEST_COLUMNS` (``request_id``, ``arrival_s``, ``input_tokens``,
  ``hit_blocks``, ``hit_tokens``), then ``rejected`` (bool) where admission can fail, then
  the driver's own columns;
* ``timeline``: the long format :data:`TIMELINE_SCHEMA` (``step, time_s, tier, metric,
  value``), ready for altair (:func:`timeline_frame` builds it); metric names come from
  :data:`TIMELINE_METRICS`, so one chart draws every driver's timeline;
* ``summary``: a frozen dataclass deriving from :class:`RunSummary` whose ``to_dict()`` echoes
  the whole configuration and the trace's ``source``;
* ``config``: the (frozen) configuration that was run.

:func:`check_result` states the contract in code; the contract test runs it over every driver.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import PurePath
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.validate import check_count, check_int, check_positive

#: Columns every ``requests`` frame starts with, and the dtype family each must have.
CORE_REQUEST_COLUMNS: dict[str, str] = {
    "request_id": "unsigned integer",
    "arrival_s": "float",
    "input_tokens": "integer",
    "hit_blocks": "integer",
    "hit_tokens": "integer",
}

#: The long timeline format shared by every driver (column → polars dtype).
TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "time_s": pl.Float64(),
    "tier": pl.String(),
    "metric": pl.String(),
    "value": pl.Float64(),
}

#: The timeline's metric vocabulary: name → (how a bin of steps aggregates it, meaning). A driver
#: records the metrics its model has; ``hit_blocks`` and ``miss_blocks`` (the block references of
#: each step, split by who served them) let :mod:`kvlab.viz` draw hit ratios and per-tier
#: breakdowns for any driver.
TIMELINE_METRICS: dict[str, tuple[str, str]] = {
    "used_blocks": ("max", "blocks resident in the tier after the step"),
    "capacity_blocks": ("max", "the tier's capacity, blocks (bounded tiers only)"),
    "evictions": ("sum", "blocks the tier evicted during the step"),
    "hit_blocks": ("sum", "blocks of the step's request the tier served (a prefix hit)"),
    "miss_blocks": ("sum", "blocks of the step's request no tier served (computed), recorded under the "
                           "tier that computes them (the first tier; in a cluster, the chosen pod)"),
    "hit_ratio_rolling": ("mean", "block hit ratio over the last window of requests"),
    "orphaned_blocks": ("max", "resident blocks whose parent block is not resident"),
    "free_blocks": ("min", "blocks the worker's pool can hand out at the step (a cluster simulation)"),
    "running_requests": ("max", "requests in the worker's running batch at the step"),
    "waiting_requests": ("max", "requests queued on the worker, not loading, at the step"),
    "fetching_requests": ("max", "requests loading tier hits (FETCH_KVC) at the step"),
}

_FAMILIES = {
    "unsigned integer": lambda d: d.is_unsigned_integer(),
    "integer": lambda d: d.is_integer(),
    "float": lambda d: d.is_float(),
}


def to_jsonable(value: object) -> object:
    """``value`` as plain JSON types: an object with a ``to_dict()`` method → its result,
    dataclasses and mappings → ``dict`` (string keys), tuples, lists and 1-D arrays → ``list``,
    numpy scalars → Python scalars, paths and enums → ``str``; a non-finite float → ``None``.

    Raises:
        ValueError: a value of another type (names its type).

    Example:
        >>> to_jsonable({"a": (1, np.int64(2)), "b": PurePath("x/y"), "c": float("nan")})
        {'a': [1, 2], 'b': 'x/y', 'c': None}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if callable(getattr(value, "to_dict", None)) and not isinstance(value, type):
        return to_jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    raise ValueError(f"cannot turn a {type(value).__name__} into JSON: {value!r}")


@dataclass(frozen=True)
class RunSummary:
    """Base of every driver's summary: a frozen dataclass of totals.

    A subclass sets the class attribute ``driver`` (the driver's name, e.g. ``"replay"``) and has
    at least the fields ``source`` (the trace's source) and ``config`` (the configuration run,
    echoed whole by :meth:`to_dict`).

    Example:
        >>> @dataclass(frozen=True)
        ... class DemoSummary(RunSummary):
        ...     driver: ClassVar[str] = "demo"
        ...     source: str
        ...     config: dict
        ...     hit_blocks: int
        >>> DemoSummary("toy", {"capacity_blocks": 4}, 3).to_dict()
        {'driver': 'demo', 'source': 'toy', 'config': {'capacity_blocks': 4}, 'hit_blocks': 3}
    """

    driver: ClassVar[str] = ""

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON types: ``driver``, then every field (the config echoed whole)."""
        return {"driver": self.driver, **{f.name: to_jsonable(getattr(self, f.name)) for f in fields(self)}}

    def __str__(self) -> str:
        """One line per field for a terminal: the config as ``name=value`` pairs, counts with
        thousands separators, ratios to 4 places (a driver may print its own table instead).

        Example:
            >>> @dataclass(frozen=True)
            ... class DemoSummary(RunSummary):
            ...     driver: ClassVar[str] = "demo"
            ...     source: str
            ...     config: dict
            ...     hit_blocks: int
            ...     hit_ratio: float
            >>> print(DemoSummary("toy", {"capacity_blocks": 4}, 12345, 0.5))
            driver      demo
            source      toy
            config      capacity_blocks=4
            hit_blocks  12,345
            hit_ratio   0.5000
        """
        def text(value: object) -> str:
            if isinstance(value, bool) or value is None:
                return str(value)
            if isinstance(value, int):
                return f"{value:,}"
            if isinstance(value, float):
                return f"{value:.4f}"
            if isinstance(value, dict):
                return ", ".join(f"{k}={text(v)}" for k, v in value.items())
            return str(value)

        rows = {"driver": self.driver, **to_jsonable(self.to_dict())}
        width = max(map(len, rows)) + 2
        return "\n".join(f"{name:<{width}}{text(value)}" for name, value in rows.items())


@dataclass(frozen=True, eq=False)
class RunResult:
    """What every kvlab driver returns.

    Attributes:
        requests: one row per request; :data:`CORE_REQUEST_COLUMNS` first, then ``rejected``
            (bool) where admission can fail, then the driver's own columns.
        timeline: long format, :data:`TIMELINE_SCHEMA`.
        summary: the driver's :class:`RunSummary`.
        config: the configuration run (also echoed in ``summary.to_dict()["config"]``).

    Example:
        >>> from kvlab.core.semantics import SINGLE_TIER
        >>> @dataclass(frozen=True)
        ... class DemoSummary(RunSummary):
        ...     driver: ClassVar[str] = "demo"
        ...     source: str
        ...     config: dict
        >>> requests = pl.DataFrame({"request_id": pl.Series([0], dtype=pl.UInt64), "arrival_s": [0.0],
        ...                          "input_tokens": [16], "hit_blocks": [0], "hit_tokens": [0]})
        >>> timeline = timeline_frame([0], [0.0], SINGLE_TIER, {"used_blocks": [1]})
        >>> check_result(RunResult(requests, timeline, DemoSummary("toy", {}), {}))
    """

    requests: pl.DataFrame
    timeline: pl.DataFrame
    summary: RunSummary
    config: object


def timeline_frame(step: object, time_s: object, tier: str | object, metrics: Mapping[str, object]) -> pl.DataFrame:
    """The long timeline: one row per (step, metric), in :data:`TIMELINE_SCHEMA`.

    Args:
        step: ``int[n]`` step of each row group (a request index or an event-loop step).
        time_s: ``float[n]`` time of each step, seconds (an arrival or a simulated clock).
        tier: the tier name of every row (``str``), or ``str[n]``.
        metrics: metric name → ``[n]`` values (any numeric dtype, stored as float64).

    Raises:
        ValueError: a metric whose length differs from ``step``'s (names it).

    Example:
        >>> timeline_frame([0, 1], [0.0, 2.5], "GPU", {"used_blocks": [3, 4]}).rows()
        [(0, 0.0, 'GPU', 'used_blocks', 3.0), (1, 2.5, 'GPU', 'used_blocks', 4.0)]
    """
    step = np.asarray(step, dtype=np.int64)
    time_s = np.asarray(time_s, dtype=np.float64)
    if time_s.shape != step.shape:
        raise ValueError(f"time_s has {time_s.shape[0]} values, step {step.shape[0]}")
    frames = []
    for name, values in metrics.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != step.shape:
            raise ValueError(f"metric {name!r} has {values.shape[0] if values.ndim else 0} values, "
                             f"step {step.shape[0]}")
        frames.append(pl.DataFrame({"step": step, "time_s": time_s, "tier": _repeat(tier, step.shape[0]),
                                    "metric": _repeat(name, step.shape[0]), "value": values},
                                   schema=TIMELINE_SCHEMA))
    return pl.concat(frames) if frames else pl.DataFrame(schema=TIMELINE_SCHEMA)


def timeline_steps(num_steps: int, points: int | None) -> np.ndarray:
    """The steps a bounded timeline records: the last step of each bucket of consecutive steps.

    The ``num_steps`` steps are cut into buckets of ``width = ceil(num_steps / points)``
    consecutive steps (the last bucket may be shorter), so there are at most ``points`` of
    them; ``points=None`` (or ``points >= num_steps``) keeps every step. A timeline built on
    these steps records a gauge (``used_blocks``, ``hit_ratio_rolling`` ...) at the bucket's
    last step and a counter (``evictions``, ``hit_blocks``, ``miss_blocks``: the metrics
    :data:`TIMELINE_METRICS` aggregates by ``"sum"``) summed over the bucket
    (:func:`bucket_sums`), so the counters' totals are the full resolution's.

    Returns:
        ``int64[k]``, increasing, ``k = ceil(num_steps / width) <= points``; the last one is
        ``num_steps - 1`` (empty when ``num_steps == 0``).

    Raises:
        ValueError: ``num_steps`` not an integer ≥ 0, or ``points`` not an integer ≥ 1 or ``None``.

    Example:
        >>> timeline_steps(10, 4).tolist(), timeline_steps(3, None).tolist()
        ([2, 5, 8, 9], [0, 1, 2])
    """
    num_steps = check_count("num_steps", num_steps)
    points = check_int("points", points, low=1, optional=True)
    width = 1 if points is None else max(1, -(-num_steps // points))
    return np.minimum(np.arange(width, num_steps + width, width, dtype=np.int64), num_steps) - 1


def bucket_sums(values: object, ends: object) -> np.ndarray:
    """Sums of ``values`` over the buckets ending at ``ends``: ``values[ends[i-1]+1 : ends[i]+1]``
    (from step 0 for the first), with no array of the full length allocated.

    Args:
        values: ``int[n]`` or ``float[n]`` per-step counts.
        ends: ``int[k]`` increasing last steps of the buckets (:func:`timeline_steps`), ``< n``.

    Returns:
        ``int64[k]`` for integer ``values`` (exact), else ``float64[k]``.

    Raises:
        ValueError: ``ends`` not increasing, or outside ``[0, n)``.

    Example:
        >>> bucket_sums(np.array([1, 2, 3, 4, 5]), np.array([1, 4])).tolist()
        [3, 12]
    """
    values, ends = np.asarray(values), np.asarray(ends, dtype=np.int64)
    if ends.size and (ends[0] < 0 or ends[-1] >= values.shape[0] or np.any(np.diff(ends) <= 0)):
        raise ValueError(f"ends must be increasing steps in [0, {values.shape[0]}), got {ends[:5].tolist()}...")
    return np.diff(_prefix_sums_at(values, ends + 1), prepend=0)


def _prefix_sums_at(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values[:p].sum()`` for each ``p`` of ``positions`` (int64 for integer values, else
    float64), accumulated over chunks of :data:`_SUM_CHUNK` steps: no array of the full length
    is allocated (a whole-array cast to int64 would be 8 bytes a step)."""
    dtype = np.int64 if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_ else np.float64
    cuts, where = np.unique(positions, return_inverse=True)
    sums = np.zeros(cuts.shape[0], dtype=dtype)
    total = dtype(0)
    stop = int(cuts[-1]) if cuts.size else 0
    for a in range(0, stop, _SUM_CHUNK):
        b = min(a + _SUM_CHUNK, stop)
        running = np.cumsum(values[a:b], dtype=dtype)
        lo, hi = np.searchsorted(cuts, [a, b], side="right")
        sums[lo:hi] = total + running[cuts[lo:hi] - a - 1]
        total += running[-1]
    return sums[where]


#: Steps summed at a time by :func:`_prefix_sums_at`.
_SUM_CHUNK = 1 << 20


def _repeat(value: object, length: int) -> object:
    """A string repeated ``length`` times as a polars column (``new_from_index``: ~5× cheaper
    than broadcasting a Python string in the frame constructor); anything else unchanged."""
    return pl.Series([value], dtype=pl.String).new_from_index(0, length) if isinstance(value, str) else value


def rolling_hit_ratio(hit_blocks: object, blocks: object, window_requests: int, at: object = None) -> np.ndarray:
    """Block-weighted hit ratio over the last ``window_requests`` steps (inclusive).

    Args:
        hit_blocks: ``[n]`` hit blocks of each step.
        blocks: ``[n]`` block references of each step (hits + misses).
        window_requests: the window, steps (≥ 1).
        at: ``int[k]`` steps to evaluate it at (e.g. :func:`timeline_steps`); ``None`` = every
            step. Only ``O(k)`` memory beyond the inputs either way it is given.

    Returns:
        ``float64[n]`` (or ``[k]``); 0.0 where the window holds no blocks.

    Raises:
        ValueError: ``window_requests`` not an integer ≥ 1, lengths that differ, or a step of
            ``at`` outside ``[0, n)``.

    Example:
        >>> rolling_hit_ratio(np.array([0, 2, 1]), np.array([2, 2, 2]), 2).tolist()
        [0.0, 0.5, 0.75]
        >>> rolling_hit_ratio(np.array([0, 2, 1]), np.array([2, 2, 2]), 2, at=[2]).tolist()
        [0.75]
    """
    window_requests = check_positive("window_requests", window_requests)
    hit_blocks, blocks = np.asarray(hit_blocks), np.asarray(blocks)
    if hit_blocks.shape != blocks.shape:
        raise ValueError(f"hit_blocks has {hit_blocks.shape[0]} values, blocks {blocks.shape[0]}")
    if at is None:
        hit_sum = np.concatenate([[0], np.cumsum(hit_blocks, dtype=np.float64)])
        ref_sum = np.concatenate([[0], np.cumsum(blocks, dtype=np.float64)])
        idx = np.arange(1, hit_blocks.shape[0] + 1)
        lo = np.maximum(idx - window_requests, 0)
        refs = ref_sum[idx] - ref_sum[lo]
        hits = hit_sum[idx] - hit_sum[lo]
    else:
        idx = np.asarray(at, dtype=np.int64) + 1
        if idx.size and (idx.min() < 1 or idx.max() > hit_blocks.shape[0]):
            raise ValueError(f"at must hold steps in [0, {hit_blocks.shape[0]}), got {np.asarray(at)[:5].tolist()}...")
        bounds = np.concatenate([idx, np.maximum(idx - window_requests, 0)])
        refs, hits = (np.diff(_prefix_sums_at(v, bounds).reshape(2, -1)[::-1], axis=0)[0].astype(np.float64)
                      for v in (blocks, hit_blocks))
    return np.divide(hits, refs, out=np.zeros(refs.shape[0]), where=refs > 0)


def check_result(result: object) -> None:
    """Check ``result`` against the result contract; return ``None`` when it holds.

    Raises:
        ValueError: every violation found, one per line: not a :class:`RunResult`, a missing or
            mistyped core column, a ``rejected`` column that is not bool, a timeline not in
            :data:`TIMELINE_SCHEMA`, a summary that is not a frozen :class:`RunSummary` with
            ``driver``, ``source`` and ``config`` or whose ``to_dict()`` is not JSON types,
            a null in a core column, a repeated ``request_id``, ``hit_tokens > input_tokens``.
    """
    if not isinstance(result, RunResult):
        raise ValueError(f"not a kvlab RunResult: {type(result).__name__}")
    problems = []
    requests = result.requests
    if not isinstance(requests, pl.DataFrame):
        problems.append(f"requests is a {type(requests).__name__}, not a polars DataFrame")
    else:
        names = requests.columns
        if names[: len(CORE_REQUEST_COLUMNS)] != list(CORE_REQUEST_COLUMNS):
            problems.append(f"requests must start with {list(CORE_REQUEST_COLUMNS)}, got {names[:6]}")
        for name, family in CORE_REQUEST_COLUMNS.items():
            if name in names and not _FAMILIES[family](requests.schema[name]):
                problems.append(f"requests.{name} must be {family}, got {requests.schema[name]}")
        if "rejected" in names and requests.schema["rejected"] != pl.Boolean:
            problems.append(f"requests.rejected must be Boolean, got {requests.schema['rejected']}")
        problems += [f"requests.{n} has nulls" for n in CORE_REQUEST_COLUMNS if n in names and requests[n].has_nulls()]
        if "request_id" in names and requests["request_id"].n_unique() != requests.height:
            problems.append("requests.request_id repeats a value")
        if {"hit_tokens", "input_tokens"} <= set(names):
            over = requests.filter(pl.col("hit_tokens").cast(pl.Int64) > pl.col("input_tokens").cast(pl.Int64))
            if over.height:
                problems.append(f"requests.hit_tokens > input_tokens in {over.height} row(s)")
    timeline = result.timeline
    if not isinstance(timeline, pl.DataFrame) or dict(timeline.schema) != TIMELINE_SCHEMA:
        got = dict(timeline.schema) if isinstance(timeline, pl.DataFrame) else type(timeline).__name__
        problems.append(f"timeline must have schema {TIMELINE_SCHEMA}, got {got}")
    summary = result.summary
    if not isinstance(summary, RunSummary) or not summary.__dataclass_params__.frozen:
        problems.append(f"summary must be a frozen RunSummary dataclass, got {type(summary).__name__}")
    else:
        names = {f.name for f in fields(summary)}
        problems += [f"summary has no field {n!r}" for n in ("source", "config") if n not in names]
        if not summary.driver:
            problems.append(f"{type(summary).__name__}.driver is not set")
        try:
            import json

            json.dumps(summary.to_dict())
        except (TypeError, ValueError) as exc:
            problems.append(f"summary.to_dict() is not JSON: {exc}")
    if problems:
        raise ValueError("result contract: " + "; ".join(problems))
