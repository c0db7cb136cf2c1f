"""Charts of any run: occupancy, hit ratio and the per-tier breakdown of a :class:`kvlab.core.RunResult`.

Every chart takes a result (whatever driver made it, one tier or many) or its long timeline
(``step, time_s, tier, metric, value``; metric names from :data:`kvlab.core.TIMELINE_METRICS`).
Timelines are pre-aggregated in polars (at most ``max_points`` bins per metric) so the charts
stay small whatever the trace length.
"""

from __future__ import annotations

import functools

import altair as alt
import numpy as np
import polars as pl

from kvlab.core.result import TIMELINE_METRICS, TIMELINE_SCHEMA, RunResult, rolling_hit_ratio
from kvlab.core.validate import check_positive, check_real
from kvlab.viz.live import with_datasets

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


#: Width of the run charts in pixels: timelines are binned to about one point per pixel.
CHART_WIDTH = 640
#: Colour and dash of capacity lines: dark, so a full cache's line stays visible on top of its used line.
CAPACITY_STYLE = {"color": "#222222", "strokeDash": [8, 4], "strokeWidth": 2.5}
#: Human names of the timeline metrics the run charts draw.
METRIC_LABELS = {"used_blocks": "blocks in use", "capacity_blocks": "capacity", "hit_ratio_rolling": "hit ratio"}


#: Dataset names of :func:`occupancy_template` (the frames of :func:`occupancy_data`).
OCCUPANCY_DATASETS = ("occupancy_timeline", "occupancy_axis_top", "occupancy_marks")


def occupancy_data(source: RunResult | pl.DataFrame, *, max_points: int = CHART_WIDTH,
                   warmup_end_s: float | None = None, y_max: float | None = None) -> dict[str, pl.DataFrame]:
    """The rows :func:`occupancy_template` draws, by dataset name (:data:`OCCUPANCY_DATASETS`).

    Returns:
        ``occupancy_timeline``: the long timeline (``time_s, tier, metric, value``) of
        ``used_blocks``, ``capacity_blocks`` and ``hit_ratio_rolling``, binned to at most
        ``max_points`` per tier and metric (:func:`downsample_timeline`, fewer past
        :data:`MAX_CHART_ROWS` rows); ``occupancy_axis_top``: ``value`` (f64), the y-axis top
        (0 or 1 row); ``occupancy_marks``: ``time_s`` (f64), ``label`` (str), ``opacity`` (f64),
        the warm-up end (one row; without a warm-up an invisible one at the first time, so no
        layer of the chart is ever empty).

    Raises:
        ValueError: as :func:`occupancy_chart`.
    """
    timeline = run_timeline(source)
    occupancy = timeline.filter(pl.col("metric").is_in(["used_blocks", "capacity_blocks"]))
    has_hits = timeline.filter(pl.col("metric").is_in(["hit_ratio_rolling", "hit_blocks"])).height > 0
    ratio_rows = hit_ratio_timeline(source) if has_hits else timeline.clear()
    top = [] if y_max is None else [check_real("y_max", y_max, low=0.0)]
    marks = [] if warmup_end_s is None else [check_real("warmup_end_s", warmup_end_s)]
    binned = _binned(pl.concat([occupancy, ratio_rows]), max_points).drop("step")
    start = binned["time_s"].min() if binned.height else 0.0
    return {"occupancy_timeline": binned,
            "occupancy_axis_top": pl.DataFrame({"value": top}, schema={"value": pl.Float64}),
            "occupancy_marks": pl.DataFrame({"time_s": marks or [start], "label": ["warm-up ends"] * len(marks) or [""],
                                             "opacity": [1.0] * len(marks) or [0.0]},
                                            schema={"time_s": pl.Float64, "label": pl.String, "opacity": pl.Float64})}


@functools.lru_cache(maxsize=16)
def occupancy_template(title: str | None = None) -> alt.VConcatChart:
    """The chart of :func:`occupancy_chart` over the named datasets of :func:`occupancy_data`
    (``alt.NamedData``; no rows): one object per ``title``, so a :class:`kvlab.viz.LiveChart`
    showing it again sends rows only."""
    timeline = alt.Chart(alt.NamedData(name=OCCUPANCY_DATASETS[0]))
    x = alt.X("time_s:Q", title="time (s)", scale=alt.Scale(nice=False, zero=False), axis=alt.Axis(tickCount=8))
    y = alt.Y("value:Q", title="blocks")
    color = alt.Color("tier:N", title="tier")
    used = timeline.transform_filter(alt.datum.metric == "used_blocks").mark_line(strokeWidth=2).encode(
        x=x, y=y, color=color, tooltip=[alt.Tooltip("time_s:Q", title="time (s)", format=",.1f"), "tier:N",
                                        alt.Tooltip("value:Q", title="blocks in use", format=",.0f")])
    capacity = timeline.transform_filter(alt.datum.metric == "capacity_blocks")
    cap_line = capacity.mark_line(**CAPACITY_STYLE).encode(
        x=x, y=y, detail="tier:N", tooltip=["tier:N", alt.Tooltip("value:Q", title="capacity (blocks)", format=",.0f")])
    label = ("'capacity ' + format(datum.value, ',.0f') + ' blocks'"
             " + (datum.tier == 'cache' ? '' : ' (' + datum.tier + ')')")
    cap_label = capacity.transform_aggregate(
        value="max(value)", time_s="min(time_s)", groupby=["tier"]).transform_calculate(label=label).mark_text(
        align="left", dx=4, dy=-9, color=CAPACITY_STYLE["color"], fontWeight="bold").encode(
        x="time_s:Q", y="value:Q", text="label:N")
    axis_top = alt.Chart(alt.NamedData(name=OCCUPANCY_DATASETS[1])).mark_point(opacity=0).encode(y="value:Q")
    ratio = timeline.transform_filter(alt.datum.metric == "hit_ratio_rolling").mark_line(strokeWidth=2).encode(
        x=x, y=alt.Y("value:Q", title="hit ratio (rolling)", scale=alt.Scale(domain=[0, 1]),
                     axis=alt.Axis(format=".0%")),
        color=color, tooltip=[alt.Tooltip("time_s:Q", title="time (s)", format=",.1f"), "tier:N",
                              alt.Tooltip("value:Q", title="block hit ratio", format=".3f")])
    rule = alt.Chart(alt.NamedData(name=OCCUPANCY_DATASETS[2])).mark_rule(
        color="grey", strokeDash=[2, 2], strokeWidth=1.5).encode(
        x="time_s:Q", opacity=alt.Opacity("opacity:Q", scale=None, legend=None),
        tooltip=["label:N", alt.Tooltip("time_s:Q", title="time (s)", format=",.1f")])
    chart = alt.vconcat(alt.layer(used, cap_line, cap_label, axis_top, rule).properties(width=CHART_WIDTH, height=220),
                        alt.layer(ratio, rule).properties(width=CHART_WIDTH, height=120))
    return chart.properties(title=title) if title else chart


def occupancy_chart(source: RunResult | pl.DataFrame, *, max_points: int = CHART_WIDTH, title: str | None = None,
                    warmup_end_s: float | None = None, y_max: float | None = None) -> alt.VConcatChart:
    """Cache occupancy over time, with the rolling hit ratio underneath.

    :func:`occupancy_template` with the rows of :func:`occupancy_data`: the spec depends only
    on ``title``; everything that varies with the run (capacity and its label, the axis top,
    the warm-up mark) is data, so a panel redrawing another run updates its view in place
    (:meth:`kvlab.viz.LiveChart.show`).

    Args:
        source: a :class:`~kvlab.core.RunResult` or its timeline.
        max_points: bins per tier and metric after downsampling (fewer when the chart would
            embed more than :data:`MAX_CHART_ROWS` rows); default one per pixel of width.
        title: chart title.
        warmup_end_s: arrival time of the first measured request, seconds; drawn as a grey
            rule in both panels when given.
        y_max: top of the blocks axis (at least the data's maximum), blocks — e.g. the largest
            capacity a panel offers, so the axis stays put as the capacity changes.

    Returns:
        Top: blocks in use (solid, colour by tier) and each tier's capacity (dark dashed line
        drawn over it, labelled with its size), y in blocks; bottom: the rolling hit ratio
        (:func:`hit_ratio_timeline`, when the timeline has the counts for it); x is the time
        in seconds.

    Raises:
        ValueError: not a result or a timeline; ``y_max`` not a number ≥ 0 or
            ``warmup_end_s`` not a finite number.
    """
    frames = occupancy_data(source, max_points=max_points, warmup_end_s=warmup_end_s, y_max=y_max)
    return with_datasets(occupancy_template(title), frames)


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
        x=alt.X("time_s:Q", title="time (s)", scale=alt.Scale(nice=False, zero=False), axis=alt.Axis(tickCount=8)),
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


#: Dataset name of :func:`tier_breakdown_template`.
BREAKDOWN_DATASET = "tier_breakdown"


@functools.lru_cache(maxsize=32)
def tier_breakdown_template(names: tuple[str, ...], colors: tuple[str, ...] | None = None,
                            width: int = 560) -> alt.LayerChart:
    """The bars of :func:`tier_breakdown_chart` over the named dataset :data:`BREAKDOWN_DATASET`
    (the rows of :func:`tier_breakdown`; no rows in the spec): bars in the order of ``names``
    (its ``served_by`` values), coloured by ``colors`` (CSS colours, one per name; default
    the theme's palette), each labelled with its count and share. One object per argument
    tuple (a :class:`kvlab.viz.LiveChart` showing it again sends rows only).

    Raises:
        ValueError: ``colors`` not one per name.
    """
    if colors is not None and len(colors) != len(names):
        raise ValueError(f"colors must give one colour per name ({len(names)}), got {len(colors)}")
    scale = alt.Scale() if colors is None else alt.Scale(domain=list(names), range=list(colors))
    base = alt.Chart(alt.NamedData(name=BREAKDOWN_DATASET)).encode(
        x=alt.X("blocks:Q", title="block references"), y=alt.Y("served_by:N", sort=list(names), title=None))
    bars = base.mark_bar().encode(
        color=alt.Color("served_by:N", legend=None, scale=scale),
        tooltip=[alt.Tooltip("served_by:N", title="served by"), alt.Tooltip("blocks:Q", format=",.0f"),
                 alt.Tooltip("share:Q", format=".1%")])
    labels = base.transform_calculate(label="format(datum.blocks, ',.0f') + ' (' + format(datum.share, '.1%') + ')'"
                                      ).mark_text(align="left", dx=4).encode(text="label:N")
    room = base.transform_joinaggregate(most="max(blocks)").transform_calculate(
        room="datum.most * 1.25").mark_point(opacity=0).encode(x="room:Q")  # the labels fit right of the bars
    return alt.layer(bars, labels, room).properties(width=width, height=30 * len(names))


def tier_breakdown_chart(source: RunResult | pl.DataFrame, *, title: str | None = None,
                         colors: dict[str, str] | None = None, width: int = 560) -> alt.LayerChart:
    """Bars of :func:`tier_breakdown`: block references served by each tier, and computed,
    each labelled with its count and share (:func:`tier_breakdown_template` with its rows).

    Args:
        source: a :class:`~kvlab.core.RunResult` or its timeline.
        title: chart title.
        colors: CSS colour per ``served_by`` name (every tier and ``"computed"``), e.g. to
            match another chart's tier colours; default: the theme's palette.
        width: bar area width in pixels.

    Raises:
        ValueError: as :func:`tier_breakdown`, or ``colors`` missing a name.
    """
    data = tier_breakdown(source)
    names = tuple(data["served_by"].to_list())
    if colors is not None and (missing := [n for n in names if n not in colors]):
        raise ValueError(f"colors lacks {missing}; has {sorted(colors)}")
    template = tier_breakdown_template(names, None if colors is None else tuple(colors[n] for n in names), width)
    chart = with_datasets(template, {BREAKDOWN_DATASET: data})
    return chart.properties(title=title) if title else chart
