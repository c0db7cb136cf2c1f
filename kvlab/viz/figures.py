"""Charts of the Mooncake figures recomputed by :mod:`kvlab.sim.mooncake_figures`."""

from __future__ import annotations

import altair as alt
import polars as pl

from kvlab.sim.mooncake_figures import CAPACITY_3M_TOKENS, FIGURE9_NOTES, paper_figure9_points

#: Figure 9's colours (matplotlib's first four), in its legend order.
_PAPER_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _need(frame: pl.DataFrame, columns: set[str]) -> None:
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}; has {frame.columns}")


def cache_ratio_chart(frame: pl.DataFrame) -> alt.FacetChart:
    """Our hit ratio under each definition (bars) against the paper's "cache ratio"
    (dashed rule), one panel per trace — FAST'25 Table 2.

    Args:
        frame: :func:`kvlab.sim.mooncake_figures.cache_ratio_definitions`.

    Raises:
        ValueError: missing columns.
    """
    _need(frame, {"definition", "trace", "ours", "paper"})
    bars = alt.Chart().mark_bar().encode(
        y=alt.Y("definition:N", title=None, sort=None),
        x=alt.X("ours:Q", title="unbounded-cache hit ratio", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("definition:N", legend=None),
        tooltip=["trace:N", "definition:N", alt.Tooltip("ours:Q", format=".4f"), "paper:Q"])
    rule = alt.Chart().mark_rule(strokeDash=[5, 3], color="black").encode(x="paper:Q")
    label = alt.Chart().mark_text(align="left", dx=4, dy=-60, fontSize=11).encode(
        x="paper:Q", text=alt.Text("paper:Q", format=".0%"))
    return alt.layer(bars, rule, label, data=frame).properties(width=300, height=150).facet(
        facet=alt.Facet("trace:N", title=None), columns=1).properties(
        title="FAST'25 Table 2 'cache ratio' (dashed) vs ours by definition")


def figure9_chart(curves: pl.DataFrame, shares: pl.DataFrame, paper: pl.DataFrame | None = None) -> alt.LayerChart:
    """LRU token hit ratio vs cache capacity in tokens (log x), with the 3 M-token line and
    "x % of maximum (paper: y %)" labels — FAST'25 Figure 9 — over the paper's own points
    (hollow, dotted, "≈" in the legend and tooltip: read off the figure); the notes under the
    title give their source, the curves with no trace here, and the unexplained
    conversation gap (:data:`kvlab.sim.mooncake_figures.FIGURE9_NOTES`).

    Args:
        curves: :func:`kvlab.sim.mooncake_figures.figure9_curves`.
        shares: :func:`kvlab.sim.mooncake_figures.share_at_3m_tokens`.
        paper: the paper's points (default
            :func:`kvlab.sim.mooncake_figures.paper_figure9_points`).

    Raises:
        ValueError: missing columns.
    """
    _need(curves, {"trace", "capacity_tokens", "token_hit_ratio"})
    _need(shares, {"trace", "share_of_max", "paper"})
    paper = paper_figure9_points() if paper is None else paper
    _need(paper, {"trace", "capacity_tokens", "token_hit_ratio", "have_trace"})
    ours = curves.select("trace", "capacity_tokens", "token_hit_ratio").with_columns(
        source=pl.lit("ours (LRU, bundled trace)"))
    theirs = paper.select(
        pl.when(pl.col("have_trace")).then(pl.col("trace")).otherwise(pl.col("trace") + " (no trace here)")
        .alias("trace"), "capacity_tokens", "token_hit_ratio").with_columns(source=pl.lit("≈ paper (read off)"))
    x = alt.X("capacity_tokens:Q", scale=alt.Scale(type="log"), title="cache capacity (tokens)")
    y = alt.Y("token_hit_ratio:Q", title="token hit ratio (LRU, prefix)", scale=alt.Scale(domain=[0, 0.7]))
    names = list(dict.fromkeys([*theirs["trace"], *ours["trace"]]))  # the paper's legend order first
    color = alt.Color("trace:N", title="trace", scale=alt.Scale(
        domain=names, range=[_PAPER_COLORS[i % len(_PAPER_COLORS)] for i in range(len(names))]))
    tooltip = ["source:N", "trace:N", alt.Tooltip("capacity_tokens:Q", format=","),
               alt.Tooltip("token_hit_ratio:Q", format=".4f")]
    dash = alt.StrokeDash("source:N", title="values", scale=alt.Scale(
        domain=["ours (LRU, bundled trace)", "≈ paper (read off)"], range=[[1, 0], [2, 2]]))
    lines = alt.Chart(ours).mark_line().encode(x=x, y=y, color=color, strokeDash=dash, tooltip=tooltip)
    paper_lines = alt.Chart(theirs).mark_line(opacity=0.7).encode(x=x, y=y, color=color, strokeDash=dash)
    paper_points = alt.Chart(theirs).mark_point(filled=False, size=40).encode(x=x, y=y, color=color,
                                                                                tooltip=tooltip)
    marks = curves.join(shares, on="trace").filter(pl.col("capacity_tokens") == CAPACITY_3M_TOKENS).with_columns(
        label=pl.format("{}: {}% of max (paper {}%)", pl.col("trace"),
                        (pl.col("share_of_max") * 100).round(0).cast(pl.Int64),
                        (pl.col("paper") * 100).round(0).cast(pl.Int64)))
    rule = alt.Chart(pl.DataFrame({"capacity_tokens": [CAPACITY_3M_TOKENS]})).mark_rule(strokeDash=[4, 4]).encode(
        x="capacity_tokens:Q")
    points = alt.Chart(marks).mark_point(filled=True, size=60).encode(
        x="capacity_tokens:Q", y="token_hit_ratio:Q", color=color)
    text = alt.Chart(marks).mark_text(align="left", dx=6, dy=-8).encode(
        x="capacity_tokens:Q", y="token_hit_ratio:Q", text="label:N", color=color)
    title = alt.TitleParams("FAST'25 Figure 9 on the bundled traces (dashed: 3 M tokens)",
                            subtitle=list(FIGURE9_NOTES), subtitleFontSize=10)
    return alt.layer(paper_lines, paper_points, lines, rule, points, text).properties(
        width=560, height=320, title=title)


def table1_chart(frame: pl.DataFrame) -> alt.LayerChart:
    """Token hit ratio vs capacity per policy on our trace (lines) beside the arXiv Table 1
    values for the paper's own trace (hollow points, dashed).

    Args:
        frame: :func:`kvlab.sim.mooncake_figures.table1_shape`.

    Raises:
        ValueError: missing columns.
    """
    _need(frame, {"policy", "capacity_blocks", "ours", "paper"})
    bounded = frame.filter(pl.col("capacity_blocks").is_not_null()).unpivot(
        index=["policy", "capacity_blocks"], on=["ours", "paper"], variable_name="source", value_name="hit_ratio")
    ticks = sorted(set(bounded["capacity_blocks"].to_list()))
    x = alt.X("capacity_blocks:Q", scale=alt.Scale(type="log"), title="capacity (512-token blocks)",
              axis=alt.Axis(values=ticks, format=","))
    base = alt.Chart(bounded).encode(x=x, y=alt.Y("hit_ratio:Q", title="hit ratio", scale=alt.Scale(domain=[0, 0.6])),
                                     color=alt.Color("policy:N"),
                                     strokeDash=alt.StrokeDash("source:N", title="values"),
                                     tooltip=["policy:N", "source:N", "capacity_blocks:Q",
                                              alt.Tooltip("hit_ratio:Q", format=".4f")])
    return alt.layer(base.mark_line(), base.mark_point()).properties(
        width=520, height=300, title="arXiv Table 1 shape: ours (conversation trace) vs the paper's (its own trace)")
