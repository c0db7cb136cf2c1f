"""Charts of any run: occupancy, hit ratio and the per-tier breakdown of a :class:`kvlab.core.RunResult`.

Every chart takes a result (whatever driver made it, one tier or many) or its long timeline
(``step, time_s, tier, metric, value``; metric names from :data:`kvlab.core.TIMELINE_METRICS`).
Timelines are pre-aggregated in polars (at most ``max_points`` bins per metric) so the charts
stay small whatever the trace length.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

from kvlab.core.result import TIMELINE_METRICS, TIMELINE_SCHEMA, RunResult, rolling_hit_ratio
from kvlab.core.validate import check_positive

#: Tier name of the all-tiers line of :func:`hit_ratio_chart` when a run has several tiers.
ALL_TIERS = "all tiers"
#: Window of the rolling hit ratio when the result's config names none, steps.
DEFAULT_WINDOW_STEPS = 1000
#: Label of the computed (missed) blocks in :func:`tier_breakdown_chart`.
COMPUTED = "computed"
#: Rows a chart embeds at most (altair refuses more than 5,000 by default).
MAX_CHART_ROWS = 4_500


def run_timeline(source: RunResult | pl.DataFrame) -> pl.DataFrame:
    """The timeline of ``source`` (a :class:`~kvlab.core.RunResult`, or a timeline itself).

    Raises:
        ValueError: anything else, or a frame that lacks a timeline column.
    """
    timeline = source.timeline if isinstance(source, RunResult) else source
    if not isinstance(timeline, pl.DataFrame):
        raise ValueError(f"expected a kvlab RunResult or its timeline frame, got {type(source).__name__}")
    missing = set(TIMELINE_SCHEMA) - set(timeline.columns)
    if missing:
        raise ValueError(f"timeline lacks column(s) {sorted(missing)}")
    return timeline


def downsample_timeline(timeline: pl.DataFrame, max_points: int = 1000) -> pl.DataFrame:
    """Aggregate a long timeline into at most ``max_points`` bins of steps per tier and metric.

    Within a bin each metric aggregates as :data:`kvlab.core.TIMELINE_METRICS` says (unknown
    metrics by ``max``): ``used_blocks`` and ``capacity_blocks`` take the maximum (the
    envelope, so a capacity violation cannot be hidden), ``evictions``, ``hit_blocks`` and
    ``miss_blocks`` the sum, ``hit_ratio_rolling`` the mean; ``time_s`` is the bin's last one.

    Raises:
        ValueError: ``max_points`` not an integer ≥ 1, or a column of the timeline is missing.
    """
    max_points = check_positive("max_points", max_points)
    timeline = run_timeline(timeline)
    num_steps = int(timeline["step"].max()) + 1 if timeline.height else 0
    width = max(1, -(-num_steps // max_points))
    agg = pl.col("metric").first().replace_strict({m: a for m, (a, _) in TIMELINE_METRICS.items()}, default="max")
    value = pl.col("value")
    chosen = pl.when(agg == "sum").then(value.sum()).when(agg == "mean").then(value.mean())
    return (
        timeline.with_columns((pl.col("step") // width).alias("bin"))
        .group_by("bin", "tier", "metric", maintain_order=True)
        .agg(pl.col("step").last(), pl.col("time_s").last(), chosen.otherwise(value.max()).alias("value"))
        .drop("bin")
        .sort("tier", "metric", "step")
    )


def _binned(timeline: pl.DataFrame, max_points: int) -> pl.DataFrame:
    """:func:`downsample_timeline` with fewer bins when many series would exceed :data:`MAX_CHART_ROWS`."""
    series = max(1, timeline.select("tier", "metric").n_unique())
    points = min(check_positive("max_points", max_points), max(1, MAX_CHART_ROWS // series))
    return downsample_timeline(timeline, points)


def _window(source: RunResult | pl.DataFrame, window_steps: int | None) -> int:
    if window_steps is not None:
        return check_positive("window_steps", window_steps)
    return getattr(getattr(source, "config", None), "window_requests", DEFAULT_WINDOW_STEPS)


def hit_ratio_timeline(source: RunResult | pl.DataFrame, window_steps: int | None = None) -> pl.DataFrame:
    """The rolling block hit ratio of every tier, long format (metric ``hit_ratio_rolling``).

    A tier's ratio is the block references it served over all references, over the last
    ``window_steps`` steps (:func:`kvlab.core.rolling_hit_ratio` of the ``hit_blocks`` and
    ``miss_blocks`` metrics); with several tiers an :data:`ALL_TIERS` line adds them up. A
    timeline that records ``hit_ratio_rolling`` itself (:func:`kvlab.sim.replay`) is used as is.

    Args:
        source: a :class:`~kvlab.core.RunResult` or its timeline.
        window_steps: the window (default: the result's ``config.window_requests``, else
            :data:`DEFAULT_WINDOW_STEPS`).

    Raises:
        ValueError: a timeline with neither ``hit_ratio_rolling`` nor ``hit_blocks``, or a bad window.
    """
    timeline = run_timeline(source)
    if window_steps is None and (recorded := timeline.filter(pl.col("metric") == "hit_ratio_rolling")).height:
        return recorded
    window = _window(source, window_steps)
    counts = timeline.filter(pl.col("metric").is_in(["hit_blocks", "miss_blocks"]))
    if not counts.filter(pl.col("metric") == "hit_blocks").height:
        raise ValueError("the timeline records no hit_blocks: no hit ratio to draw")
    steps = counts.group_by("step").agg(pl.col("time_s").first(), refs=pl.col("value").sum()).sort("step")
    hits = counts.filter(pl.col("metric") == "hit_blocks").pivot(on="tier", index="step", values="value",
                                                                 aggregate_function="sum")
    tiers = counts.filter(pl.col("metric") == "hit_blocks")["tier"].unique(maintain_order=True).to_list()
    hits = steps.join(hits, on="step", how="left").fill_null(0.0)
    if len(tiers) > 1:
        hits = hits.with_columns(pl.sum_horizontal(tiers).alias(ALL_TIERS))
        tiers.append(ALL_TIERS)
    refs = hits["refs"].to_numpy()
    return pl.concat([pl.DataFrame({
        "step": hits["step"], "time_s": hits["time_s"], "tier": tier, "metric": "hit_ratio_rolling",
        "value": rolling_hit_ratio(hits[tier].to_numpy(), refs, window)}, schema=TIMELINE_SCHEMA) for tier in tiers])


def occupancy_chart(source: RunResult | pl.DataFrame, *, max_points: int = 1000, title: str | None = None,
                    warmup_end_s: float | None = None) -> alt.VConcatChart:
    """Cache occupancy over time, with the rolling hit ratio underneath.

    Args:
        source: a :class:`~kvlab.core.RunResult` or its timeline.
        max_points: bins per tier and metric after downsampling (fewer when the chart would
            embed more than :data:`MAX_CHART_ROWS` rows).
        title: chart title.
        warmup_end_s: arrival time of the first measured request; drawn as a grey rule
            in both panels when given.

    Returns:
        Top: ``used_blocks`` (solid) and ``capacity_blocks`` (dashed), colour by tier;
        bottom: the rolling hit ratio (:func:`hit_ratio_timeline`, when the timeline has
        the counts for it); x is the time in seconds.

    Raises:
        ValueError: not a result or a timeline.
    """
    timeline = run_timeline(source)
    occupancy = timeline.filter(pl.col("metric").is_in(["used_blocks", "capacity_blocks"]))
    has_hits = timeline.filter(pl.col("metric").is_in(["hit_ratio_rolling", "hit_blocks"])).height > 0
    ratio_rows = hit_ratio_timeline(source) if has_hits else timeline.clear()
    data = _binned(pl.concat([occupancy, ratio_rows]), max_points)
    x = alt.X("time_s:Q", title="time (s)", scale=alt.Scale(nice=False, zero=False))
    color = alt.Color("tier:N", title="tier")
    dash = alt.StrokeDash("metric:N", title="series", scale=alt.Scale(
        domain=["used_blocks", "capacity_blocks"], range=[[1, 0], [6, 4]]))
    blocks = alt.Chart(data).transform_filter(
        alt.FieldOneOfPredicate(field="metric", oneOf=["used_blocks", "capacity_blocks"])
    ).mark_line().encode(
        x=x, y=alt.Y("value:Q", title="blocks"), color=color, strokeDash=dash,
        tooltip=["step:Q", "time_s:Q", "tier:N", "metric:N", alt.Tooltip("value:Q", format=",")])
    ratio = alt.Chart(data).transform_filter(alt.datum.metric == "hit_ratio_rolling").mark_line().encode(
        x=x, y=alt.Y("value:Q", title="rolling block hit ratio", scale=alt.Scale(domain=[0, 1])), color=color,
        tooltip=["step:Q", "time_s:Q", "tier:N", alt.Tooltip("value:Q", title="hit ratio", format=".3f")])
    top, bottom = blocks, ratio
    if warmup_end_s is not None:
        rule = alt.Chart(pl.DataFrame({"time_s": [float(warmup_end_s)], "label": ["warm-up ends"]})).mark_rule(
            color="grey", strokeDash=[2, 2]).encode(x="time_s:Q", tooltip=["label:N", "time_s:Q"])
        top, bottom = blocks + rule, ratio + rule
    chart = alt.vconcat(top.properties(width=640, height=220), bottom.properties(width=640, height=120))
    return chart.properties(title=title) if title else chart


def hit_ratio_chart(source: RunResult | pl.DataFrame, *, window_steps: int | None = None, max_points: int = 1000,
                    title: str | None = None) -> alt.Chart:
    """The rolling block hit ratio over time, one line per tier (and all tiers together).

    Args:
        source: a :class:`~kvlab.core.RunResult` or its timeline.
        window_steps: as :func:`hit_ratio_timeline`.
        max_points: bins per line after downsampling (fewer past :data:`MAX_CHART_ROWS` rows).
        title: chart title.

    Raises:
        ValueError: as :func:`hit_ratio_timeline`.
    """
    data = _binned(hit_ratio_timeline(source, window_steps), max_points)
    chart = alt.Chart(data).mark_line().encode(
        x=alt.X("time_s:Q", title="time (s)", scale=alt.Scale(nice=False, zero=False)),
        y=alt.Y("value:Q", title="rolling block hit ratio", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("tier:N", title="served by"),
        tooltip=["step:Q", "time_s:Q", "tier:N", alt.Tooltip("value:Q", title="hit ratio", format=".3f")],
    ).properties(width=640, height=200)
    return chart.properties(title=title) if title else chart


def tier_breakdown(source: RunResult | pl.DataFrame) -> pl.DataFrame:
    """Block references by who served them: each tier's ``hit_blocks``, then :data:`COMPUTED`
    (the ``miss_blocks``), over the measured steps of a result (``requests["measured"]`` when it
    has one) or every step of a timeline.

    Returns:
        ``served_by`` (str, tiers in timeline order, then ``"computed"``), ``blocks`` (f64),
        ``share`` (f64, of all references; 0.0 when there are none).

    Raises:
        ValueError: a timeline without ``hit_blocks``.
    """
    timeline = run_timeline(source)
    tiers = timeline.filter(pl.col("metric") == "hit_blocks")["tier"].unique(maintain_order=True).to_list()
    if not tiers:
        raise ValueError("the timeline records no hit_blocks: no breakdown to draw")
    if isinstance(source, RunResult) and "measured" in source.requests.columns:
        timeline = timeline.filter(pl.col("step").is_in(np.flatnonzero(source.requests["measured"].to_numpy())))
    counts = timeline.filter(pl.col("metric").is_in(["hit_blocks", "miss_blocks"]))
    served = [counts.filter(metric="hit_blocks", tier=t)["value"].sum() for t in tiers]
    rows = pl.DataFrame({"served_by": [*tiers, COMPUTED],
                         "blocks": [*served, counts.filter(metric="miss_blocks")["value"].sum()]},
                        schema={"served_by": pl.String, "blocks": pl.Float64})
    total = rows["blocks"].sum()
    return rows.with_columns(share=pl.col("blocks") / total if total else pl.lit(0.0))


def tier_breakdown_chart(source: RunResult | pl.DataFrame, *, title: str | None = None) -> alt.Chart:
    """Bars of :func:`tier_breakdown`: block references served by each tier, and computed.

    Raises:
        ValueError: as :func:`tier_breakdown`.
    """
    data = tier_breakdown(source)
    chart = alt.Chart(data).mark_bar().encode(
        x=alt.X("blocks:Q", title="block references"), y=alt.Y("served_by:N", sort=None, title=None),
        color=alt.Color("served_by:N", legend=None, sort=None),
        tooltip=["served_by:N", alt.Tooltip("blocks:Q", format=",.0f"), alt.Tooltip("share:Q", format=".1%")],
    ).properties(width=560, height=30 * data.height)
    return chart.properties(title=title) if title else chart
