"""The design explorer's chart: resident KV per tier against its capacity, and who served the blocks.

Split as every live chart is (:mod:`kvlab.viz.live`): :func:`explorer_template` depends only
on the tier names and colours (one object per tuple), :func:`explorer_data` holds everything
a control moves (timeline, capacities and their labels, the breakdown), so moving a capacity,
policy, model or chunk size sends rows only and the browser redraws the existing view.
"""

from __future__ import annotations

import functools

import altair as alt
import polars as pl

from kvlab.core.result import RunResult
from kvlab.core.validate import check_positive
from kvlab.viz.run_charts import (
    BREAKDOWN_DATASET,
    CAPACITY_STYLE,
    downsample_timeline,
    tier_breakdown,
    tier_breakdown_template,
)

#: Dataset names of :func:`explorer_template` besides :data:`~kvlab.viz.run_charts.BREAKDOWN_DATASET`.
RESIDENT_DATASET, CAPACITY_DATASET = "explorer_resident", "explorer_capacity"
#: Width of the explorer's charts, pixels; the resident timeline keeps about one point per pixel.
CHART_WIDTH = 560
_GIB = 2**30


def explorer_data(result: RunResult, tier_names: list[str], capacity_blocks: list[int], block_bytes: int,
                  max_points: int = CHART_WIDTH) -> dict[str, pl.DataFrame]:
    """The rows :func:`explorer_template` draws, by dataset name.

    Args:
        result: a tiered replay's result (timeline metric ``used_blocks`` per tier, ``hit_blocks``).
        tier_names: the tiers, fastest first (as in the timeline).
        capacity_blocks: each tier's capacity, blocks.
        block_bytes: KV bytes of one block.
        max_points: bins per tier of the resident timeline (the envelope: the most resident).

    Returns:
        ``explorer_resident``: ``tier`` (str), ``time_s`` (f64), ``blocks`` (f64), ``gib``
        (f64); ``explorer_capacity``: ``tier``, ``capacity_gib``, ``top_gib`` (the row's axis
        top, 1.3 × capacity, room for the label), ``label`` (e.g. ``"capacity 32 GiB = 512
        blocks"``); ``tier_breakdown``: :func:`~kvlab.viz.run_charts.tier_breakdown`.

    Raises:
        ValueError: ``capacity_blocks`` not one per tier, ``block_bytes`` or ``max_points`` < 1.
    """
    block_bytes = check_positive("block_bytes", block_bytes)
    if len(capacity_blocks) != len(tier_names):
        raise ValueError(f"capacity_blocks must give one capacity per tier ({len(tier_names)}), "
                         f"got {len(capacity_blocks)}")
    gib = block_bytes / _GIB
    used = downsample_timeline(result.timeline.filter(metric="used_blocks"), max_points)
    resident = used.select("tier", "time_s", blocks=pl.col("value"), gib=pl.col("value") * gib)
    caps = [c * gib for c in capacity_blocks]
    capacity = pl.DataFrame({
        "tier": tier_names, "capacity_gib": caps, "top_gib": [max(c, 1e-9) * 1.3 for c in caps],
        "label": [f"capacity {c:,.4g} GiB = {b:,} blocks" for c, b in zip(caps, capacity_blocks)]},
        schema={"tier": pl.String, "capacity_gib": pl.Float64, "top_gib": pl.Float64, "label": pl.String})
    return {RESIDENT_DATASET: resident, CAPACITY_DATASET: capacity, BREAKDOWN_DATASET: tier_breakdown(result)}


@functools.lru_cache(maxsize=16)
def explorer_template(tier_names: tuple[str, ...], colors: tuple[str, ...]) -> alt.VConcatChart:
    """One row per tier (resident GiB over time, solid, in the tier's colour; its capacity,
    dark dashed and labelled; y from 0 to 1.3 × the capacity, so each row shows how full its
    tier is), then the breakdown bars (:func:`~kvlab.viz.run_charts.tier_breakdown_template`),
    one colour scale (the same explicit domain and range in both) and one legend.

    Args:
        tier_names: the active tiers, fastest first.
        colors: CSS colours, one per tier and then one for the computed blocks.

    Raises:
        ValueError: ``colors`` not one per tier plus one.
    """
    if len(colors) != len(tier_names) + 1:
        raise ValueError(f"colors must give {len(tier_names) + 1} colours (tiers, then computed), got {len(colors)}")
    names = [*tier_names, "computed"]
    color = alt.Color("tier:N", title=None, scale=alt.Scale(domain=names, range=list(colors)),
                      legend=alt.Legend(orient="top", direction="horizontal", symbolStrokeWidth=4))
    resident = alt.Chart(alt.NamedData(name=RESIDENT_DATASET))
    capacity = alt.Chart(alt.NamedData(name=CAPACITY_DATASET))
    rows = []
    for i, tier in enumerate(tier_names):
        last = i == len(tier_names) - 1
        x = alt.X("time_s:Q", scale=alt.Scale(nice=False, zero=False),
                  title="time (s)" if last else None, axis=alt.Axis(labels=last, ticks=last))
        y = alt.Y("gib:Q", title=f"{tier} GiB")
        line = resident.transform_filter(alt.datum.tier == tier).mark_line(strokeWidth=2).encode(
            x=x, y=y, color=color, tooltip=["tier:N", alt.Tooltip("time_s:Q", title="time (s)", format=",.1f"),
                                            alt.Tooltip("gib:Q", title="resident GiB", format=",.2f"),
                                            alt.Tooltip("blocks:Q", title="blocks", format=",.0f")])
        mine = capacity.transform_filter(alt.datum.tier == tier)
        rule = mine.mark_rule(**CAPACITY_STYLE).encode(y=alt.Y("capacity_gib:Q"), tooltip=["label:N"])
        top = mine.mark_point(opacity=0).encode(y="top_gib:Q")
        label = mine.mark_text(align="left", x=4, dy=-9, color=CAPACITY_STYLE["color"], fontWeight="bold").encode(
            y="capacity_gib:Q", text="label:N")
        rows.append(alt.layer(line, rule, top, label).properties(width=CHART_WIDTH, height=85))
    bars = tier_breakdown_template(tuple(names), tuple(colors), CHART_WIDTH).properties(
        title="block references served by each tier (or computed)")
    # one legend, of the tier rows (the bars name their tiers on the y axis); one colour scale
    return alt.vconcat(alt.vconcat(*rows, spacing=8), bars).resolve_legend(color="independent").properties(
        title="resident KV per tier (dashed: capacity)")


__all__ = ["CAPACITY_DATASET", "CHART_WIDTH", "RESIDENT_DATASET", "explorer_data", "explorer_template"]
