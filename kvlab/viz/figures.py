"""Charts of the Mooncake figures recomputed by :mod:`kvlab.sim.mooncake_figures`."""

from __future__ import annotations

import textwrap

import altair as alt
import polars as pl

from kvlab.sim.mooncake_figures import CAPACITY_3M_TOKENS, FIGURE9_NOTES, paper_figure9_points
from kvlab.viz.theme import PALETTE, count_axis, humanize, log_ticks, policy_encodings

#: Figure 9's trace colours (indices of the kvlab palette, the paper's legend order): blue, orange,
#: green, wine — the figure's own matplotlib blue / orange / green / red, made colour-blind safe.
_FIGURE9_SLOTS = (0, 1, 2, 6, 4, 5)

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
    data = frame.with_columns(panel=pl.format("{} trace — paper's cache ratio {}%", pl.col("trace"),
                                              (pl.col("paper") * 100).round(0).cast(pl.Int64)))
    y = alt.Y("definition:N", title=None, sort=None)
    x = alt.X("ours:Q", title="unbounded-cache hit ratio", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format=".0%"))
    bars = alt.Chart().mark_bar(color=PALETTE[0]).encode(
        y=y, x=x,
        tooltip=["trace:N", "definition:N", alt.Tooltip("ours:Q", title="ours", format=".1%"),
                 alt.Tooltip("paper:Q", title="paper", format=".0%")])
    values = alt.Chart().mark_text(align="right", dx=-6, color="white", fontWeight="bold").encode(
        y=y, x=x, text=alt.Text("ours:Q", format=".1%"))
    rule = alt.Chart().mark_rule(strokeDash=[6, 3], color="black", strokeWidth=2).encode(x="paper:Q")
    return alt.layer(bars, values, rule, data=data).properties(width=420, height=190).facet(
        facet=alt.Facet("panel:N", title=None, sort=None, header=alt.Header(labelAnchor="start", labelPadding=6)),
        columns=1).properties(title="FAST'25 Table 2 'cache ratio' (dashed line) vs ours by definition")


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
    capacities = pl.concat([ours["capacity_tokens"], theirs["capacity_tokens"]])
    x = alt.X("capacity_tokens:Q", scale=alt.Scale(type="log", nice=False), title="cache capacity (tokens, log scale)",
              axis=count_axis(log_ticks(capacities.min(), capacities.max()), grid=True))
    y = alt.Y("token_hit_ratio:Q", title="token hit ratio (LRU, prefix)", scale=alt.Scale(domain=[0, 0.7]),
              axis=alt.Axis(format=".0%"))
    names = list(dict.fromkeys([*theirs["trace"], *ours["trace"]]))  # the paper's legend order first
    legend = alt.Legend(orient="bottom", direction="vertical", title="trace")
    color = alt.Color("trace:N", title="trace", legend=legend, scale=alt.Scale(
        domain=names, range=[PALETTE[_FIGURE9_SLOTS[i % len(_FIGURE9_SLOTS)]] for i in range(len(names))]))
    tooltip = ["source:N", "trace:N", alt.Tooltip("capacity_tokens:Q", title="capacity (tokens)", format=","),
               alt.Tooltip("token_hit_ratio:Q", title="token hit ratio", format=".4f")]
    dash = alt.StrokeDash("source:N", title="values", legend=alt.Legend(orient="bottom", direction="vertical",
                                                                         symbolStrokeWidth=2.5), scale=alt.Scale(
        domain=["ours (LRU, bundled trace)", "≈ paper (read off)"], range=[[1, 0], [2, 3]]))
    lines = alt.Chart(ours).mark_line(strokeWidth=3).encode(x=x, y=y, color=color, strokeDash=dash, tooltip=tooltip)
    paper_lines = alt.Chart(theirs).mark_line(opacity=0.8, strokeWidth=2).encode(x=x, y=y, color=color,
                                                                                  strokeDash=dash)
    paper_points = alt.Chart(theirs).mark_point(filled=False, size=50, strokeWidth=2).encode(
        x=x, y=y, color=color, tooltip=tooltip)
    marks = curves.join(shares, on="trace").filter(pl.col("capacity_tokens") == CAPACITY_3M_TOKENS).with_columns(
        label=pl.format("{}: {}% of max (paper {}%)", pl.col("trace"),
                        (pl.col("share_of_max") * 100).round(0).cast(pl.Int64),
                        (pl.col("paper") * 100).round(0).cast(pl.Int64)))
    rule = alt.Chart(pl.DataFrame({"capacity_tokens": [CAPACITY_3M_TOKENS]})).mark_rule(
        strokeDash=[5, 4], color="#444444").encode(x=x)
    points = alt.Chart(marks).mark_point(filled=True, size=90).encode(x=x, y=y, color=color)
    text = alt.Chart(marks).encode(x=x, y=y, text="label:N")
    halo = text.mark_text(align="left", dx=8, dy=-10, stroke="white", strokeWidth=5, strokeJoin="round")
    ink = text.mark_text(align="left", dx=8, dy=-10, fontWeight="bold").encode(color=color)
    notes = [line for note in FIGURE9_NOTES for line in textwrap.wrap(note, 100, subsequent_indent="  ")]
    title = alt.TitleParams("FAST'25 Figure 9 on the bundled traces (dashed line: 3 M tokens)", subtitle=notes,
                            subtitleColor="#333333")
    return alt.layer(paper_lines, paper_points, lines, rule, points, halo, ink).properties(
        width=700, height=360, title=title)


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
    bounded = humanize(bounded, "policy")
    ticks = sorted(set(bounded["capacity_blocks"].to_list()))
    x = alt.X("capacity_blocks:Q", scale=alt.Scale(type="log"), title="cache capacity (512-token blocks, log scale)",
              axis=alt.Axis(values=ticks, format=","))
    enc = policy_encodings("policy", bounded["policy"].unique(maintain_order=True).to_list())
    dash = alt.StrokeDash("source:N", title="values", sort=["ours", "paper"], scale=alt.Scale(
        domain=["ours", "paper"], range=[[1, 0], [3, 3]]),
        legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=2.5))
    base = alt.Chart(bounded).encode(x=x, y=alt.Y("hit_ratio:Q", title="token hit ratio",
                                                  scale=alt.Scale(domain=[0, 0.6]), axis=alt.Axis(format=".0%")),
                                     color=enc["color"], strokeDash=dash,
                                     tooltip=["policy:N", "source:N", alt.Tooltip("capacity_blocks:Q", format=","),
                                              alt.Tooltip("hit_ratio:Q", title="token hit ratio", format=".4f")])
    # hollow markers: a filled point layer would leave the dash legend's stroke symbols blank
    points = base.mark_point(size=80, filled=False, strokeWidth=2).encode(shape=enc["shape"])
    return alt.layer(base.mark_line(strokeWidth=2.5), points).properties(
        width=560, height=320, title=alt.TitleParams("arXiv Table 1 shape: ours (solid, conversation trace) vs "
                                                     "the paper's (dashed, its trace)"))
