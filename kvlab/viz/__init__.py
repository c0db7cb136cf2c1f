"""Altair chart builders: a polars frame in, a chart out.

================================  ============================================================
function                          chart
================================  ============================================================
:func:`occupancy_chart`           used blocks (and capacity) over time, rolling hit ratio below
:func:`hit_ratio_curve`           hit ratio vs capacity (log x), one line per series
:func:`save_chart`                write a chart as PNG, SVG, PDF or standalone HTML (offline)
:func:`use_offline_rendering`     show charts in Jupyter with no internet access
:func:`block_pool_chart`          a vLLM block pool: blocks by state, ref counts, free queue
:func:`radix_tree_chart`          an SGLang radix tree: nodes, locks, evictable leaves
:func:`cache_ratio_chart`         FAST'25 Table 2 "cache ratio" vs ours under each definition
:func:`figure9_chart`             FAST'25 Figure 9: hit ratio vs capacity in tokens, 3 M labels
:func:`table1_chart`              arXiv Table 1 shape: LRU / LFU / LengthAware vs capacity
================================  ============================================================

Timelines are pre-aggregated in polars (at most ``max_points`` bins per metric) so the
charts stay small whatever the trace length.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl

from kvlab.viz.engine_charts import block_pool_chart, radix_tree_chart, tree_layout
from kvlab.viz.figures import cache_ratio_chart, figure9_chart, table1_chart

#: How each timeline metric is aggregated inside a bin of steps.
_BIN_AGG = {"used_blocks": "max", "capacity_blocks": "max", "evictions": "sum", "hit_ratio_rolling": "mean"}


def downsample_timeline(timeline: pl.DataFrame, max_points: int = 1000) -> pl.DataFrame:
    """Aggregate a long timeline into at most ``max_points`` bins of steps per metric.

    Within a bin: ``used_blocks`` and ``capacity_blocks`` take the maximum (the
    envelope, so a capacity violation cannot be hidden), ``evictions`` the sum,
    ``hit_ratio_rolling`` the mean; ``time_s`` is the bin's last arrival.

    Raises:
        ValueError: ``max_points < 1`` or a column of the timeline is missing.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points!r}")
    missing = {"step", "time_s", "tier", "metric", "value"} - set(timeline.columns)
    if missing:
        raise ValueError(f"timeline lacks column(s) {sorted(missing)}")
    n_steps = int(timeline["step"].max()) + 1 if timeline.height else 0
    width = max(1, -(-n_steps // max_points))
    agg = pl.col("metric").first()
    value = pl.col("value")
    chosen = pl.when(agg == "evictions").then(value.sum()).when(agg == "hit_ratio_rolling").then(value.mean())
    return (
        timeline.with_columns((pl.col("step") // width).alias("bin"))
        .group_by("bin", "tier", "metric", maintain_order=True)
        .agg(pl.col("step").last(), pl.col("time_s").last(), chosen.otherwise(value.max()).alias("value"))
        .drop("bin")
        .sort("tier", "metric", "step")
    )


def occupancy_chart(timeline: pl.DataFrame, *, max_points: int = 1000, title: str | None = None,
                    warmup_end_s: float | None = None) -> alt.VConcatChart:
    """Cache occupancy over time, with the rolling hit ratio underneath.

    Args:
        timeline: a replay timeline (``step, time_s, tier, metric, value``).
        max_points: bins per metric after downsampling.
        title: chart title.
        warmup_end_s: arrival time of the first measured request; drawn as a grey rule
            in both panels when given.

    Returns:
        Top: ``used_blocks`` (solid) and ``capacity_blocks`` (dashed), colour by tier;
        bottom: ``hit_ratio_rolling``; x is the arrival time in seconds.
    """
    data = downsample_timeline(timeline, max_points)
    x = alt.X("time_s:Q", title="arrival time (s)", scale=alt.Scale(nice=False, zero=False))
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
        tooltip=["step:Q", "time_s:Q", alt.Tooltip("value:Q", title="hit ratio", format=".3f")])
    top, bottom = blocks, ratio
    if warmup_end_s is not None:
        rule = alt.Chart(pl.DataFrame({"time_s": [float(warmup_end_s)], "label": ["warm-up ends"]})).mark_rule(
            color="grey", strokeDash=[2, 2]).encode(x="time_s:Q", tooltip=["label:N", "time_s:Q"])
        top, bottom = blocks + rule, ratio + rule
    chart = alt.vconcat(top.properties(width=640, height=220), bottom.properties(width=640, height=120))
    return chart.properties(title=title) if title else chart


def hit_ratio_curve(frame: pl.DataFrame, *, metric: str = "token_hit_ratio", color: str = "policy",
                    title: str | None = None) -> alt.LayerChart:
    """Hit ratio against capacity (log scale), one line per ``color`` value.

    Args:
        frame: rows with ``capacity_blocks`` (null = unbounded), ``metric`` and
            ``color`` columns — e.g. the output of :func:`kvlab.sim.sweep`.
        metric: ``"token_hit_ratio"`` or ``"block_hit_ratio"``.
        color: the column that names a series.
        title: chart title.

    Returns:
        Lines with points for bounded capacities; unbounded rows become dashed
        horizontal rules (the series' ceiling).

    Raises:
        ValueError: a required column is missing.
    """
    missing = {"capacity_blocks", metric, color} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}; has {frame.columns}")
    label = metric.replace("_", " ")
    bounded = frame.filter(pl.col("capacity_blocks").is_not_null())
    ceiling = frame.filter(pl.col("capacity_blocks").is_null())
    enc_color = alt.Color(f"{color}:N", title=color)
    ticks = sorted(set(bounded["capacity_blocks"].to_list()))
    lines = alt.Chart(bounded).mark_line(point=True).encode(
        x=alt.X("capacity_blocks:Q", scale=alt.Scale(type="log"), title="capacity (blocks)",
                axis=alt.Axis(values=ticks, format="~s", labelOverlap="greedy")),
        y=alt.Y(f"{metric}:Q", title=label, scale=alt.Scale(domain=[0, 1])),
        color=enc_color,
        tooltip=[f"{color}:N", "capacity_blocks:Q", alt.Tooltip(f"{metric}:Q", format=".4f")],
    )
    rules = alt.Chart(ceiling).mark_rule(strokeDash=[4, 4]).encode(
        y=f"{metric}:Q", color=enc_color, tooltip=[f"{color}:N", alt.Tooltip(f"{metric}:Q", format=".4f")])
    chart = alt.layer(lines, rules).properties(width=560, height=320)
    return chart.properties(title=title) if title else chart


def save_chart(chart: alt.TopLevelMixin, directory: str | Path, name: str,
               formats: tuple[str, ...] = ("png", "html")) -> list[Path]:
    """Save ``chart`` as ``name.<format>`` for each of ``formats``: ``png`` (2× scale),
    ``svg``, ``pdf``, standalone ``html`` (the Vega libraries inlined) or ``json`` (the
    Vega-Lite spec). All render offline (vl-convert).

    Returns:
        The paths written, in ``formats`` order.

    Raises:
        ValueError: an unknown format.
    """
    unknown = set(formats) - {"png", "svg", "pdf", "html", "json"}
    if unknown:
        raise ValueError(f"unknown chart format(s) {sorted(unknown)}; known: html, json, pdf, png, svg")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = directory / f"{name}.{fmt}"
        options = {"png": {"scale_factor": 2}, "html": {"inline": True}}.get(fmt, {})
        chart.save(path, **options)
        paths.append(path)
    return paths


def use_offline_rendering() -> None:
    """Render charts in Jupyter without internet (workshops on closed networks).

    Switches altair to its ``jupyter`` renderer with the Vega libraries served from
    the kernel (vl-convert), for plain charts and for ``JupyterChart`` widgets.
    """
    alt.renderers.enable("jupyter", offline=True)
    alt.JupyterChart.enable_offline()


__all__ = ["block_pool_chart", "cache_ratio_chart", "downsample_timeline", "figure9_chart", "hit_ratio_curve",
           "occupancy_chart", "radix_tree_chart", "save_chart", "table1_chart", "tree_layout",
           "use_offline_rendering"]
