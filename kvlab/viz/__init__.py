"""Altair chart builders: a polars frame (or a :class:`kvlab.core.RunResult`) in, a chart out.

================================  ============================================================
function                          chart
================================  ============================================================
:func:`occupancy_chart`           any run: used blocks (and capacity) per tier over time,
                                  rolling hit ratio below
:func:`hit_ratio_chart`           any run: rolling block hit ratio per tier over time
:func:`tier_breakdown_chart`      any run: block references served by each tier, and computed
:func:`hit_ratio_curve`           hit ratio vs capacity (log x), one line per series
:func:`ttft_cdf_chart`            cluster simulation: empirical TTFT CDF per labelled run
:func:`worker_queue_chart`        cluster simulation: running / waiting requests per worker over time
:func:`ttft_vs_rate_chart`        cluster simulation: mean and p99 TTFT vs arrival rate per variant
:func:`save_chart`                write a chart as PNG, SVG, PDF or standalone HTML (offline)
:func:`use_offline_rendering`     show charts in Jupyter with no internet access
:class:`LiveChart`                a chart widget whose data updates redraw in place
:func:`block_pool_chart`          a vLLM block pool: blocks by state, ref counts, free queue
:func:`radix_tree_chart`          an SGLang radix tree: nodes, locks, evictable leaves
:func:`cache_ratio_chart`         FAST'25 Table 2 "cache ratio" vs ours under each definition
:func:`figure9_chart`             FAST'25 Figure 9: hit ratio vs capacity in tokens, 3 M labels
:func:`table1_chart`              arXiv Table 1 shape: LRU / LFU / LengthAware vs capacity
================================  ============================================================

Importing :mod:`kvlab.viz` enables kvlab's altair theme (:mod:`kvlab.viz.theme`: fonts of 13 px
or more, a colour-blind-safe palette with a colour, dash and marker per policy, human labels) for
every chart, inline ones included.

The run charts (:mod:`kvlab.viz.run_charts`) take a result whatever driver made it, or its
timeline; timelines are pre-aggregated in polars (at most ``max_points`` bins per metric) so
the charts stay small whatever the trace length.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl

from kvlab.viz import theme  # importing it registers and enables the kvlab altair theme
from kvlab.viz.cluster_charts import ttft_cdf, ttft_cdf_chart, ttft_vs_rate_chart, worker_queue_chart
from kvlab.viz.engine_charts import block_pool_chart, radix_tree_chart, tree_layout
from kvlab.viz.figures import cache_ratio_chart, figure9_chart, table1_chart
from kvlab.viz.live import LiveChart, live_renderer, split_spec, with_datasets
from kvlab.viz.run_charts import (
    downsample_timeline,
    hit_ratio_chart,
    hit_ratio_timeline,
    occupancy_chart,
    run_timeline,
    tier_breakdown,
    tier_breakdown_chart,
)


def hit_ratio_curve(frame: pl.DataFrame, *, metric: str = "token_hit_ratio", color: str = "policy",
                    title: str | None = None) -> alt.LayerChart:
    """Hit ratio against capacity (log scale), one line per ``color`` value.

    Each series has its own colour, dash and marker (:func:`kvlab.viz.theme.policy_encodings` when
    ``color`` is ``"policy"``, so a policy looks the same in every chart; else
    :func:`~kvlab.viz.theme.series_encodings` in order of appearance), so series that coincide stay
    visible; one legend shows all three. Series values and the metric are shown with
    :func:`~kvlab.viz.theme.human` labels (``"s3fifo"`` → ``"S3-FIFO"``); the capacity axis has
    round 1-2-5 ticks (:func:`~kvlab.viz.theme.log_ticks`), the points keep the exact capacities.

    Args:
        frame: rows with ``capacity_blocks`` (null = unbounded), ``metric`` and
            ``color`` columns — e.g. the output of :func:`kvlab.sim.sweep`.
        metric: ``"token_hit_ratio"`` or ``"block_hit_ratio"``.
        color: the column that names a series.
        title: chart title.

    Returns:
        Lines with points for bounded capacities; unbounded rows become rules in the series'
        colour and dash (the series' ceiling).

    Raises:
        ValueError: not a polars DataFrame, or a required column is missing.
    """
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"frame must be a polars DataFrame (e.g. kvlab.sim.sweep's), got {type(frame).__name__}")
    missing = {"capacity_blocks", metric, color} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}; has {frame.columns}")
    frame = theme.humanize(frame.select("capacity_blocks", metric, color), color)
    if color == "policy":
        encodings = theme.policy_encodings(color, frame[color].unique(maintain_order=True).to_list())
    else:
        encodings = theme.series_encodings(color, frame[color].unique(maintain_order=True).to_list())
    bounded = frame.filter(pl.col("capacity_blocks").is_not_null())
    ceiling = frame.filter(pl.col("capacity_blocks").is_null())
    capacities = bounded["capacity_blocks"]
    axis = theme.count_axis(theme.log_ticks(capacities.min(), capacities.max()) if len(capacities) else None)
    label = theme.human(metric)
    tooltip = [alt.Tooltip(f"{color}:N", title=theme.human(color)),
               alt.Tooltip("capacity_blocks:Q", title="capacity (blocks)", format=","),
               alt.Tooltip(f"{metric}:Q", title=label, format=".4f")]
    y = alt.Y(f"{metric}:Q", title=label, scale=alt.Scale(domain=[0, 1]))
    x = alt.X("capacity_blocks:Q", scale=alt.Scale(type="log", nice=False),
              title="cache capacity (blocks, log scale)", axis=axis)
    lines = theme.lines_with_markers(alt.Chart(bounded).encode(x=x, y=y, tooltip=tooltip), encodings)
    rules = alt.Chart(ceiling).mark_rule(strokeWidth=2).encode(
        y=y, color=encodings["color"], strokeDash=encodings["strokeDash"],
        tooltip=[tooltip[0], alt.Tooltip(f"{metric}:Q", title=f"{label}, unbounded", format=".4f")])
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
    """Render charts in Jupyter without internet (workshops on closed networks), in small notebooks.

    Registers and enables the altair renderer ``"kvlab"``: every plain chart shows as a
    :class:`LiveChart` widget, whose Vega runtime the kernel sends once per page by custom
    message (so a saved notebook holds each chart's spec and rows, not ~0.9 MB of Vega per
    chart as altair's offline ``jupyter`` renderer does). Opened later without a kernel, the
    charts load Vega from esm.sh (needs internet). ``altair.JupyterChart`` widgets are switched
    to their offline mode too (they inline the Vega bundle into their saved state; the kvlab
    panels use :class:`LiveChart` instead).
    """
    if "kvlab" not in alt.renderers.names():
        alt.renderers.register("kvlab", live_renderer)
    alt.renderers.enable("kvlab")
    alt.JupyterChart.enable_offline()


__all__ = ["LiveChart", "block_pool_chart", "cache_ratio_chart", "downsample_timeline", "figure9_chart",
           "hit_ratio_chart", "hit_ratio_curve", "hit_ratio_timeline", "occupancy_chart", "radix_tree_chart",
           "run_timeline", "save_chart", "split_spec", "table1_chart", "tier_breakdown", "tier_breakdown_chart",
           "tree_layout", "ttft_cdf", "ttft_cdf_chart", "ttft_vs_rate_chart", "use_offline_rendering", "with_datasets",
           "worker_queue_chart"]
