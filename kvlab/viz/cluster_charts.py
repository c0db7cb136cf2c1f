"""Charts of the timed cluster simulation (:func:`kvlab.sim.cluster.simulate`): TTFT CDFs,
per-worker queues over time, TTFT against the arrival rate.

Sized for a room (:mod:`kvlab.viz.theme`): axis and legend labels at :data:`~kvlab.viz.theme.FONT_PX`
px or more, titles with units, each run / worker / variant its own colour and dash. Frames
are pre-aggregated in polars so a chart embeds at most
:data:`~kvlab.viz.run_charts.MAX_CHART_ROWS` rows whatever the trace length.
"""

from __future__ import annotations

from collections.abc import Mapping

import altair as alt
import numpy as np
import polars as pl

from kvlab.core.result import RunResult
from kvlab.viz.run_charts import MAX_CHART_ROWS, _binned, run_timeline
from kvlab.viz.theme import CHART_TITLE_PX, FONT_PX, TITLE_PX, series_encodings

#: The label of a single result passed to :func:`ttft_cdf_chart`.
SINGLE_RUN = "run"
#: Columns :func:`ttft_vs_rate_chart` needs.
RATE_COLUMNS = ("rate", "variant", "ttft_mean_s", "ttft_p99_s")
#: Panel titles of the :func:`worker_queue_chart` metrics (timeline metric → y title).
QUEUE_METRICS = {"running_requests": "running requests", "waiting_requests": "waiting requests",
                 "fetching_requests": "fetching requests (FETCH_KVC)"}


def _axis(title: str, **kwargs: object) -> alt.Axis:
    return alt.Axis(title=title, labelFontSize=FONT_PX, titleFontSize=TITLE_PX, **kwargs)


def _legend(title: str) -> alt.Legend:
    return alt.Legend(title=title, labelFontSize=FONT_PX, titleFontSize=TITLE_PX, labelLimit=320,
                      symbolStrokeWidth=2.5, symbolSize=200)


def _titled(chart: alt.TopLevelMixin, title: str | None) -> alt.TopLevelMixin:
    return chart.properties(title=alt.TitleParams(title, fontSize=CHART_TITLE_PX)) if title else chart


def ttft_cdf(results: Mapping[str, RunResult] | RunResult, *, max_points: int = MAX_CHART_ROWS) -> pl.DataFrame:
    """The empirical CDF of TTFT per labelled run, for :func:`ttft_cdf_chart`.

    Args:
        results: ``{label: result}`` (e.g. ``{"prefix caching on": r1, "off": r2}``) or one result
            (labelled :data:`SINGLE_RUN`); each result's ``requests`` needs a ``ttft_s`` column
            (rejected and unfinished requests, with a null TTFT, are left out).
        max_points: rows kept in all (evenly spaced ranks per run, the last one always kept).

    Returns:
        ``run`` (str), ``ttft_s`` (f64, ascending per run), ``share`` (f64, the fraction of the
        run's completed requests with a TTFT ≤ ``ttft_s``: ``rank / n``), ``requests`` (i64, n).

    Raises:
        ValueError: no results, a value that is not a result, a result without ``ttft_s``.
    """
    if isinstance(results, RunResult):
        results = {SINGLE_RUN: results}
    if not isinstance(results, Mapping) or not results:
        raise ValueError(f"results must be a ClusterResult or a non-empty mapping label → result, got {results!r}")
    per_run = max(2, max_points // len(results))
    frames = []
    for label, result in results.items():
        if not isinstance(result, RunResult) or "ttft_s" not in result.requests.columns:
            raise ValueError(f"results[{label!r}] must be a simulate() result (requests with ttft_s), "
                             f"got {type(result).__name__}")
        ttft = np.sort(result.requests["ttft_s"].drop_nulls().to_numpy())
        n = ttft.size
        keep = np.unique(np.linspace(0, n - 1, min(n, per_run)).astype(np.int64)) if n else np.zeros(0, np.int64)
        frames.append(pl.DataFrame({"run": str(label), "ttft_s": ttft[keep], "share": (keep + 1) / n if n else [],
                                    "requests": n},
                                   schema={"run": pl.String, "ttft_s": pl.Float64, "share": pl.Float64,
                                           "requests": pl.Int64}))
    return pl.concat(frames)


def ttft_cdf_chart(results: Mapping[str, RunResult] | RunResult, *, log_x: bool = False,
                   title: str | None = None) -> alt.Chart:
    """Empirical CDF of TTFT, one step line per labelled run (:func:`ttft_cdf`).

    Args:
        results: as :func:`ttft_cdf`.
        log_x: a log TTFT axis (runs whose TTFTs span decades; zero TTFTs are left out then).
        title: chart title.

    Raises:
        ValueError: as :func:`ttft_cdf`.
    """
    data = ttft_cdf(results)
    if log_x:
        data = data.filter(pl.col("ttft_s") > 0)
    scale = alt.Scale(type="log") if log_x else alt.Scale(zero=True)
    enc = series_encodings("run", data["run"].unique(maintain_order=True).to_list(), title="run", shapes=False)
    for channel in enc.values():
        channel.legend = _legend("run")
    chart = alt.Chart(data).mark_line(interpolate="step-after", strokeWidth=2.5).encode(
        x=alt.X("ttft_s:Q", scale=scale, axis=_axis("TTFT (s)" + (", log scale" if log_x else ""))),
        y=alt.Y("share:Q", scale=alt.Scale(domain=[0, 1]), axis=_axis("share of requests with TTFT ≤ x",
                                                                       format="%")),
        **enc,
        tooltip=["run:N", alt.Tooltip("ttft_s:Q", title="TTFT (s)", format=".3f"),
                 alt.Tooltip("share:Q", format=".1%"), "requests:Q"],
    ).properties(width=560, height=300)
    return _titled(chart, title)


def worker_queue_chart(result: RunResult | pl.DataFrame, *,
                       metrics: tuple[str, ...] = ("running_requests", "waiting_requests"),
                       max_points: int = 1000, title: str | None = None) -> alt.VConcatChart:
    """Per-worker queues over time, one panel per metric, one line per worker.

    Args:
        result: a :func:`~kvlab.sim.cluster.simulate` result or its timeline (``tier`` = worker).
        metrics: timeline metrics to draw, one panel each (:data:`QUEUE_METRICS`:
            ``running_requests``, ``waiting_requests``, ``fetching_requests``).
        max_points: bins per worker and metric (the maximum in each bin: the envelope), fewer
            when the chart would embed more than :data:`~kvlab.viz.run_charts.MAX_CHART_ROWS` rows.
        title: chart title.

    Raises:
        ValueError: not a result or a timeline, no metrics, a metric the timeline does not record.
    """
    timeline = run_timeline(result)
    metrics = tuple(metrics)
    missing = [m for m in metrics if m not in set(timeline["metric"].unique().to_list())]
    if not metrics or missing:
        raise ValueError(f"metrics must be timeline metrics of a simulate() run ({', '.join(QUEUE_METRICS)}); "
                         f"missing {missing or 'all'}")
    data = _binned(timeline.filter(pl.col("metric").is_in(metrics)), max_points)
    x = alt.X("time_s:Q", scale=alt.Scale(nice=False, zero=False), axis=_axis("simulated time (s)"))
    enc = series_encodings("tier", data["tier"].unique(maintain_order=True).to_list(), title="worker", shapes=False)
    for channel in enc.values():
        channel.legend = _legend("worker")
    line = alt.MarkDef(type="line", interpolate="step-after", strokeWidth=2.5)
    panels = [alt.Chart(data, mark=line).transform_filter(alt.datum.metric == metric).encode(
        x=x, y=alt.Y("value:Q", axis=_axis(QUEUE_METRICS.get(metric, metric.replace("_", " ")), tickMinStep=1,
                                           format="d")), **enc,
        tooltip=[alt.Tooltip("tier:N", title="worker"), alt.Tooltip("time_s:Q", format=".3f"),
                 alt.Tooltip("value:Q", title=metric)],
    ).properties(width=640, height=150) for metric in metrics]
    return _titled(alt.vconcat(*panels), title)


def ttft_vs_rate_chart(frame: pl.DataFrame, *, log_y: bool = False, title: str | None = None) -> alt.Chart:
    """Mean and p99 TTFT against the arrival rate, colour = variant, dash = statistic.

    Args:
        frame: one row per (rate, variant) run with columns ``rate`` (requests/s), ``variant``
            (str, e.g. ``"prefix caching on"``), ``ttft_mean_s`` and ``ttft_p99_s`` (seconds;
            the :class:`~kvlab.sim.cluster.ClusterSummary` fields).
        log_y: a log TTFT axis.
        title: chart title.

    Raises:
        ValueError: not a polars DataFrame, or a column of :data:`RATE_COLUMNS` is missing.
    """
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"frame must be a polars DataFrame, got {type(frame).__name__}")
    missing = [c for c in RATE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing}; has {frame.columns}")
    data = (frame.select(pl.col("rate").cast(pl.Float64), pl.col("variant").cast(pl.String),
                         mean=pl.col("ttft_mean_s"), p99=pl.col("ttft_p99_s"))
            .unpivot(index=["rate", "variant"], variable_name="statistic", value_name="ttft_s")
            .drop_nulls("ttft_s").sort("statistic", "variant", "rate"))
    variants = frame["variant"].cast(pl.String).unique(maintain_order=True).to_list()  # the caller's order
    enc = series_encodings("variant", variants, title="variant")
    for channel in (enc["color"], enc["shape"]):
        channel.legend = _legend("variant")
    chart = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(filled=False, size=70, strokeWidth=2),
                                      strokeWidth=2.5).encode(
        x=alt.X("rate:Q", axis=_axis("arrival rate (requests/s)", values=sorted(set(data["rate"].to_list())),
                                     format="~g")),
        y=alt.Y("ttft_s:Q", scale=alt.Scale(type="log") if log_y else alt.Scale(zero=True),
                axis=_axis("TTFT (s)")),
        color=enc["color"], shape=enc["shape"],
        strokeDash=alt.StrokeDash("statistic:N", sort=["mean", "p99"],
                                  legend=alt.Legend(symbolType="stroke", symbolStrokeColor="#333333",
                                                    **_legend("TTFT statistic").to_dict()),
                                  scale=alt.Scale(domain=["mean", "p99"], range=[[1, 0], [6, 4]])),
        tooltip=["variant:N", "statistic:N", alt.Tooltip("rate:Q", title="rate (req/s)"),
                 alt.Tooltip("ttft_s:Q", title="TTFT (s)", format=".3f")],
    ).properties(width=560, height=320)
    return _titled(chart, title)
