"""The replay panel, driven headlessly: set controls, assert on results and chart data."""

from __future__ import annotations

import polars as pl
import pytest

from kvlab.ui import UNBOUNDED, ReplayPanel, capacity_options, replay_panel


def chart_rows(panel: ReplayPanel) -> pl.DataFrame:
    (rows,) = [d for d in panel.chart.chart.to_dict()["datasets"].values() if d and "metric" in d[0]]
    return pl.DataFrame(rows)


def metric_max(rows: pl.DataFrame, metric: str) -> float:
    return rows.filter(pl.col("metric") == metric)["value"].max()


def test_slider_reruns_replay_and_updates_chart(conversation) -> None:
    panel = replay_panel(conversation, capacity_blocks=10_000)
    assert metric_max(chart_rows(panel), "capacity_blocks") == 10_000
    assert "0.2116" in panel.summary.value
    panel.capacity.value = 1_000
    rows = chart_rows(panel)
    assert metric_max(rows, "capacity_blocks") == 1_000
    assert metric_max(rows, "used_blocks") == 1_000
    assert panel.result.config.capacity_blocks == 1_000
    assert "0.0445" in panel.summary.value  # traces.md §5.1: LRU 1,000 blocks


def test_a_capacity_move_sends_rows_only(conversation) -> None:
    """Issue 18: the chart's spec does not depend on the controls; a move sends datasets
    (columns) and the browser updates the drawn view in place."""
    panel = ReplayPanel(conversation, capacity_blocks=10_000)
    spec = panel.chart.spec
    assert panel.chart.embeds == 1 and "datasets" not in spec
    for value in (1_000, UNBOUNDED, 200_000):
        revision = panel.chart.revision
        panel.capacity.value = value
        assert panel.chart.spec is spec and panel.chart.embeds == 1 and panel.chart.revision == revision + 1
    # the y axis follows the capacity (1.1x: its line just below the top); unbounded: the peak in use
    assert panel.chart.columns("d1") == {"value": [pytest.approx(220_000.0)]}
    panel.capacity.value = UNBOUNDED
    assert panel.chart.columns("d1") == {"value": []}
    panel.capacity.value = 1_000
    assert panel.chart.columns("d1") == {"value": [pytest.approx(1_100.0)]}
    timeline = pl.DataFrame(panel.chart.columns("d0"))
    assert metric_max(timeline, "capacity_blocks") == 1_000
    assert timeline.group_by("metric").len()["len"].max() <= 640  # one point per pixel of width
    assert "<b>capacity</b> 1,000 blocks" in panel.summary.value


def test_touch_order_moves_the_orphans(conversation) -> None:
    """Head most recent (vLLM) never orphans a block; tail most recent does, which the
    summary shows (the hit ratio moves only in the 4th decimal on this trace)."""
    panel = ReplayPanel(conversation, capacity_blocks=10_000)
    assert panel.result.summary.mean_orphaned_share == 0.0 and "<b>orphaned</b> 0.000%" in panel.summary.value
    panel.touch_order.value = "tail_most_recent"
    assert panel.result.summary.mean_orphaned_share == pytest.approx(9.148e-05, rel=1e-3)
    assert "<b>orphaned</b> 0.009%" in panel.summary.value
    assert round(panel.result.summary.block_hit_ratio, 4) == 0.2112


def test_unbounded_and_touch_order_and_warmup(synthetic) -> None:
    panel = ReplayPanel(synthetic, capacity_blocks=10_000)
    panel.touch_order.value = "tail_most_recent"
    assert panel.result.summary.block_hit_ratio == pytest.approx(0.4235, abs=5e-5)
    panel.warmup.value = 0.5
    assert panel.result.summary.requests == 1_997
    panel.capacity.value = UNBOUNDED
    rows = chart_rows(panel)
    assert "capacity_blocks" not in rows["metric"].to_list()
    assert panel.result.summary.block_hit_ratio == pytest.approx(0.8511, abs=5e-5)
    assert "<b>capacity</b> unbounded" in panel.summary.value


def test_capacity_options_reach_the_working_set() -> None:
    options = capacity_options(43_924)
    values = [v for _, v in options]
    assert values[0] == 100 and values[-2] == 50_000 and values[-1] == UNBOUNDED
    assert values[:-1] == sorted(values[:-1])


def test_panel_rejects_bad_arguments(synthetic) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        ReplayPanel(synthetic, policy="nope")
    with pytest.raises(ValueError, match=r"capacity_blocks must be an integer in \[0, 2\*\*63\) or None, got -5"):
        ReplayPanel(synthetic, capacity_blocks=-5)
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        ReplayPanel("synthetic")


def test_initial_capacity_is_kept_exactly(synthetic) -> None:
    panel = ReplayPanel(synthetic, capacity_blocks=3_000)
    assert panel.capacity.value == 3_000 and panel.result.config.capacity_blocks == 3_000
    values = [v for _, v in panel.capacity.options]
    assert values[:-1] == sorted(values[:-1]) and values[-1] == UNBOUNDED
    for start in (None, UNBOUNDED):
        assert ReplayPanel(synthetic, capacity_blocks=start).config().capacity_blocks is None


def test_warmup_is_marked_on_the_chart(synthetic) -> None:
    panel = ReplayPanel(synthetic, capacity_blocks=10_000)
    panel.warmup.value = 0.5
    datasets = panel.chart.chart.to_dict()["datasets"].values()
    assert any(rows and rows[0].get("label") == "warm-up ends" for rows in datasets)
