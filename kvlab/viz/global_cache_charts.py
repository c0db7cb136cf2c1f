"""Charts of the global-cache experiments in :mod:`kvlab.sim.cluster.mooncake_figures`: FAST'25
Figure 10 (global vs local cache), Figure 5 (§5.3 schedulers) and the staleness sweep (C22)."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from kvlab.viz.figures import _need
from kvlab.viz.theme import PALETTE, human, label_expr, series_encodings

#: Local cache orange, global cache blue (the kvlab palette's first two: apart under every colour-vision deficiency).
_SCOPE_COLORS = alt.Scale(domain=["local", "global"], range=[PALETTE[1], PALETTE[0]])


def _caption(title: str, notes: Sequence[str]) -> alt.TitleParams:
    return alt.TitleParams(title, subtitle=list(notes))


def figure10_chart(frame: pl.DataFrame, ratios: pl.DataFrame, notes: Sequence[str] = ()) -> alt.VConcatChart:
    """Token hit rate and mean prefill GPU time per request, local vs global cache, per trace,
    each pair labelled "×ours (paper ×p)" — FAST'25 Figure 10; one row of panels per router.

    Args:
        frame: :func:`~kvlab.sim.cluster.mooncake_figures.figure10`.
        ratios: :func:`~kvlab.sim.cluster.mooncake_figures.figure10_ratios` of it.
        notes: the assumptions, shown under the title (``MooncakeSetup.assumptions()``).

    Raises:
        ValueError: missing columns.
    """
    _need(frame, {"trace", "router", "cache_scope", "token_hit_ratio", "prefill_gpu_s_per_request"})
    _need(ratios, {"trace", "router", "metric", "kvlab", "paper"})
    labels = ratios.with_columns(label=pl.when(pl.col("paper").is_null())
                                 .then(pl.format("x{}", pl.col("kvlab").round(2)))
                                 .otherwise(pl.format("x{} (paper x{})", pl.col("kvlab").round(2), pl.col("paper"))))
    rows = []
    for router in frame["router"].unique(maintain_order=True):
        runs = frame.filter(pl.col("router") == router)
        panels = []
        for metric, column, title, fmt in (("hit_rate", "token_hit_ratio", "cache hit rate", ".0%"),
                                           ("prefill_gpu_time", "prefill_gpu_s_per_request",
                                            "prefill GPU time / request (s)", ".2f")):
            top = runs.group_by("trace", maintain_order=True).agg(pl.col(column).max().alias("top"))
            text = labels.filter((pl.col("metric") == metric) & (pl.col("router") == router)).join(top, on="trace")
            x = alt.X("trace:N", title=None, sort=None, axis=alt.Axis(labelAngle=0))
            bars = alt.Chart(runs).mark_bar().encode(
                x=x, xOffset=alt.XOffset("cache_scope:N", sort=["local", "global"]),
                y=alt.Y(f"{column}:Q", title=title, axis=alt.Axis(format=fmt),
                        scale=alt.Scale(domain=[0, 1.15 * (runs[column].max() or 1.0)])),
                color=alt.Color("cache_scope:N", title="cache", scale=_SCOPE_COLORS, sort=["local", "global"]),
                tooltip=["trace:N", "router:N", "cache_scope:N", alt.Tooltip(f"{column}:Q", format=".4f")])
            label = alt.Chart(text).mark_text(dy=-10).encode(x=x, y="top:Q", text="label:N")
            panels.append(alt.layer(bars, label).properties(width=320, height=220))
        rows.append(alt.hconcat(*panels).properties(title=alt.TitleParams(f"scheduler: {human(router)}",
                                                                          fontSize=16)))
    return alt.vconcat(*rows).properties(title=_caption("FAST'25 Figure 10 on kvlab's timed cluster: "
                                                        "global vs local cache", notes))


def scheduler_chart(comparison: pl.DataFrame, notes: Sequence[str] = ()) -> alt.LayerChart:
    """Mean TTFT per prefill scheduler, ours beside the paper's (hollow bars, read from FAST'25
    Figure 5), each bar labelled with its seconds.

    Args:
        comparison: :func:`~kvlab.sim.cluster.mooncake_figures.scheduler_comparison`.
        notes: the assumptions, shown under the title.

    Raises:
        ValueError: missing columns.
    """
    _need(comparison, {"router", "ttft_mean_s", "paper_ttft_mean_s"})
    long = comparison.select("router", pl.col("ttft_mean_s").alias("kvlab"),
                             pl.col("paper_ttft_mean_s").alias("paper (FAST'25 Fig. 5)")).unpivot(
        index="router", variable_name="source", value_name="ttft_mean_s").drop_nulls("ttft_mean_s")
    order = comparison["router"].to_list()
    y = alt.Y("router:N", title=None, sort=order, axis=alt.Axis(labelExpr=label_expr(order)))
    base = alt.Chart(long).encode(
        y=y, yOffset=alt.YOffset("source:N", sort=["kvlab", "paper (FAST'25 Fig. 5)"]),
        x=alt.X("ttft_mean_s:Q", title="mean TTFT (s)"),
        color=alt.Color("source:N", title=None, sort=["kvlab", "paper (FAST'25 Fig. 5)"],
                        scale=alt.Scale(range=[PALETTE[0], "#AAAAAA"])),
        tooltip=["router:N", "source:N", alt.Tooltip("ttft_mean_s:Q", title="mean TTFT (s)", format=".2f")])
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text("ttft_mean_s:Q", format=".2f"))
    return alt.layer(base.mark_bar(), text).properties(
        width=460, height=alt.Step(22), title=_caption("FAST'25 §5.3 schedulers on the conversation trace", notes))


def staleness_chart(frame: pl.DataFrame, metric: str = "ttft_p99_s") -> alt.Chart:
    """TTFT p99 (or another ``metric`` column) against the load-snapshot interval, one line per
    KV-event delay (cluster_sim.md C22).

    Args:
        frame: :func:`~kvlab.sim.cluster.mooncake_figures.staleness_sweep`.
        metric: the column on the y axis.

    Raises:
        ValueError: missing columns.
    """
    _need(frame, {"snapshot_interval_s", "event_delay_s", metric})
    delays = sorted(set(frame["event_delay_s"].to_list()))
    return alt.Chart(frame).mark_line(point=True, strokeWidth=2.5).encode(
        x=alt.X("snapshot_interval_s:Q", title="load snapshot interval (s)"),
        y=alt.Y(f"{metric}:Q", title=human(metric)),
        **series_encodings("event_delay_s", delays, title="KV event delay (s)"),
        tooltip=["snapshot_interval_s:Q", "event_delay_s:Q", alt.Tooltip(f"{metric}:Q", format=".3f")],
    ).properties(width=420, height=260, title="Routing on stale signals (C22)")


#: The panels of :func:`scope_comparison_chart`: (column, axis title, number format).
SCOPE_METRICS = (("token_hit_ratio", "token hit rate", ".1%"), ("ttft_mean_s", "mean TTFT (s)", ".2f"),
                 ("ttft_p99_s", "p99 TTFT (s)", ".2f"),
                 ("prefill_gpu_s_per_request", "prefill GPU time / request (s)", ".3f"))


def scope_comparison_chart(frame: pl.DataFrame, title: str | Sequence[str] | None = None) -> alt.HConcatChart:
    """Local vs global cache side by side: token hit rate, mean and p99 TTFT and prefill GPU time
    per request, one small panel each, every bar labelled with its value (the global-cache panel's
    chart, :class:`kvlab.ui.GlobalCachePanel`).

    Args:
        frame: one row per ``cache_scope`` (``"local"``, ``"global"``) with the
            :data:`SCOPE_METRICS` columns, e.g. ``GlobalCachePanel.compute()``.
        title: the chart's title, or its lines (the first is the title, the others its subtitle).

    Raises:
        ValueError: missing columns.
    """
    _need(frame, {"cache_scope", *(column for column, _, _ in SCOPE_METRICS)})
    x = alt.X("cache_scope:N", title=None, sort=["local", "global"], axis=alt.Axis(labelAngle=0))
    panels = []
    for column, label, fmt in SCOPE_METRICS:
        axis = alt.Axis(format=".0%") if fmt.endswith("%") else alt.Axis()
        top = max((v for v in frame[column].to_list() if v is not None), default=0.0) or 1.0
        base = alt.Chart(frame).encode(x=x, y=alt.Y(f"{column}:Q", title=label, axis=axis,
                                                    scale=alt.Scale(domain=[0, 1.15 * top])))  # room for the label
        bars = base.mark_bar().encode(
            color=alt.Color("cache_scope:N", scale=_SCOPE_COLORS, sort=["local", "global"], legend=None),
            tooltip=["cache_scope:N", alt.Tooltip(f"{column}:Q", format=".4f")])
        text = base.mark_text(dy=-8).encode(text=alt.Text(f"{column}:Q", format=fmt))
        panels.append(alt.layer(bars, text).properties(width=130, height=200))
    chart = alt.hconcat(*panels)
    if isinstance(title, str):
        return chart.properties(title=title)
    return chart.properties(title=alt.TitleParams(title[0], subtitle=list(title[1:]))) if title else chart
