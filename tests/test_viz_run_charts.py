"""Charts of any run (occupancy, hit ratio, per-tier breakdown) and the capacity curve: specs, not pixels."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import make_trace
from kvlab.blend import replay_rag
from kvlab.core import TIMELINE_SCHEMA, timeline_frame
from kvlab.index import route_requests
from kvlab.sim import replay, sweep
from kvlab.traces import load_trace, rag
from kvlab.viz import (
    downsample_timeline,
    hit_ratio_chart,
    hit_ratio_curve,
    hit_ratio_timeline,
    occupancy_chart,
    run_timeline,
    tier_breakdown,
    tier_breakdown_chart,
)
from kvlab.viz.run_charts import MAX_CHART_ROWS


def chart_rows(chart: object) -> pl.DataFrame:
    (rows,) = [d for d in chart.to_dict()["datasets"].values() if d and "metric" in d[0]]
    return pl.DataFrame(rows)


def test_downsample_keeps_envelope_and_sums_counts(conversation) -> None:
    tl = replay(conversation, capacity_blocks=1_000).timeline
    small = downsample_timeline(tl, max_points=100)
    for metric in ("used_blocks", "evictions", "hit_ratio_rolling", "capacity_blocks", "hit_blocks"):
        assert small.filter(pl.col("metric") == metric).height <= 100
    used = tl.filter(pl.col("metric") == "used_blocks")["value"]
    assert small.filter(pl.col("metric") == "used_blocks")["value"].max() == used.max() == 1_000
    for metric in ("evictions", "hit_blocks", "miss_blocks"):
        assert (small.filter(pl.col("metric") == metric)["value"].sum()
                == tl.filter(pl.col("metric") == metric)["value"].sum())


def test_downsample_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="max_points must be an integer >= 1, got 0"):
        downsample_timeline(pl.DataFrame(), 0)
    with pytest.raises(ValueError, match="timeline lacks column"):
        downsample_timeline(pl.DataFrame({"step": [0]}), 10)
    with pytest.raises(ValueError, match="expected a kvlab RunResult or its timeline frame, got str"):
        run_timeline("conversation")


def test_occupancy_chart_spec() -> None:
    result = replay(make_trace([[1, 2, 3], [1, 2, 4]], block_size=1), capacity_blocks=3)
    for source in (result, result.timeline):
        spec = occupancy_chart(source, title="t").to_dict()
        assert spec["title"] == "t" and len(spec["vconcat"]) == 2
        rows = chart_rows(occupancy_chart(source))
        assert set(rows["metric"]) == {"used_blocks", "capacity_blocks", "hit_ratio_rolling"}
    spec = occupancy_chart(result, warmup_end_s=1.0, y_max=10).to_dict()
    assert spec["datasets"]["occupancy_axis_top"] == [{"value": 10.0}]
    assert spec["datasets"]["occupancy_marks"] == [{"time_s": 1.0, "label": "warm-up ends", "opacity": 1.0}]
    # the spec is the same whatever the data: only the datasets differ
    bare = {k: v for k, v in spec.items() if k != "datasets"}
    assert bare == {k: v for k, v in occupancy_chart(result.timeline.head(2)).to_dict().items() if k != "datasets"}
    with pytest.raises(ValueError, match="y_max must be a finite number >= 0.0, got -1"):
        occupancy_chart(result, y_max=-1)


def test_the_derived_hit_ratio_is_the_replays_own(conversation) -> None:
    """From hit_blocks and miss_blocks the charts recompute exactly the ratio the replay records
    (at full resolution: on a bounded timeline a step of the chart's window is a bucket)."""
    result = replay(conversation, capacity_blocks=2_000, window_requests=300, timeline_points=None)
    recorded = result.timeline.filter(pl.col("metric") == "hit_ratio_rolling")
    assert hit_ratio_timeline(result).equals(recorded)
    assert hit_ratio_timeline(result, window_steps=300).equals(recorded)
    assert hit_ratio_timeline(result.timeline.filter(pl.col("metric") != "hit_ratio_rolling"),
                              window_steps=300).equals(recorded)


def test_breakdown_of_a_replay_counts_the_measured_requests(synthetic) -> None:
    result = replay(synthetic, capacity_blocks=5_000, warmup_fraction=0.5)
    s = result.summary
    breakdown = tier_breakdown(result)
    assert breakdown["served_by"].to_list() == ["cache", "computed"]
    assert breakdown["blocks"].to_list() == [s.hit_blocks, s.block_refs - s.hit_blocks]
    assert breakdown["share"][0] == pytest.approx(s.block_hit_ratio)
    whole = tier_breakdown(result.timeline)  # a bare timeline: every step, warm-up included
    assert whole["blocks"].sum() == synthetic.block_refs


def two_tier_timeline() -> pl.DataFrame:
    """Four steps; GPU serves 2, 0, 1, 0 blocks, CPU 0, 1, 1, 0, 1 computed each step."""
    step, time_s = [0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0]
    gpu = timeline_frame(step, time_s, "GPU", {"used_blocks": [3, 3, 3, 3], "hit_blocks": [2, 0, 1, 0],
                                               "miss_blocks": [1, 1, 1, 1]})
    cpu = timeline_frame(step, time_s, "CPU", {"used_blocks": [0, 1, 2, 2], "hit_blocks": [0, 1, 1, 0]})
    return pl.concat([gpu, cpu])


def test_every_tier_gets_its_line_and_its_bar() -> None:
    timeline = two_tier_timeline()
    ratio = hit_ratio_timeline(timeline, window_steps=2).pivot(on="tier", index="step", values="value")
    # refs per step: 3, 2, 3, 1; over the last 2 steps: 3, 5, 5, 4
    assert ratio["GPU"].to_list() == pytest.approx([2 / 3, 2 / 5, 1 / 5, 1 / 4])
    assert ratio["CPU"].to_list() == pytest.approx([0, 1 / 5, 2 / 5, 1 / 4])
    assert ratio["all tiers"].to_list() == pytest.approx([2 / 3, 3 / 5, 3 / 5, 2 / 4])
    breakdown = tier_breakdown(timeline)
    assert breakdown.rows() == [("GPU", 3.0, 3 / 9), ("CPU", 2.0, 2 / 9), ("computed", 4.0, 4 / 9)]
    assert set(chart_rows(hit_ratio_chart(timeline, window_steps=2))["tier"]) == {"GPU", "CPU", "all tiers"}
    spec = tier_breakdown_chart(timeline, title="t").to_dict()
    assert spec["title"] == "t" and [layer["mark"]["type"] for layer in spec["layer"]] == ["bar", "text", "point"]
    assert spec["datasets"]["tier_breakdown"] == breakdown.to_dicts()
    colors = {"GPU": "#0072B2", "CPU": "#E69F00", "computed": "#8C8C8C"}
    scale = tier_breakdown_chart(timeline, colors=colors).to_dict()["layer"][0]["encoding"]["color"]["scale"]
    assert scale == {"domain": ["GPU", "CPU", "computed"], "range": ["#0072B2", "#E69F00", "#8C8C8C"]}
    with pytest.raises(ValueError, match=r"colors lacks \['computed'\]"):
        tier_breakdown_chart(timeline, colors={"GPU": "red", "CPU": "blue"})


def test_many_tiers_stay_under_the_row_limit() -> None:
    steps = list(range(3_000))
    timeline = pl.concat([timeline_frame(steps, [float(s) for s in steps], f"pod-{i}",
                                         {"used_blocks": steps, "hit_blocks": [1] * 3_000, "miss_blocks": [1] * 3_000})
                          for i in range(6)])
    for chart in (occupancy_chart(timeline), hit_ratio_chart(timeline)):
        rows = chart_rows(chart)
        assert MAX_CHART_ROWS // 2 < rows.height <= MAX_CHART_ROWS  # 13 or 7 series: fewer bins each
        assert rows.filter(metric="used_blocks")["value"].max() in (None, 2_999.0)  # the envelope survives


def test_a_timeline_without_hits_has_no_ratio_or_breakdown() -> None:
    occupancy = timeline_frame([0, 1], [0.0, 1.0], "GPU", {"used_blocks": [1, 2]})
    with pytest.raises(ValueError, match="records no hit_blocks"):
        hit_ratio_chart(occupancy)
    with pytest.raises(ValueError, match="records no hit_blocks"):
        tier_breakdown(occupancy)
    assert set(chart_rows(occupancy_chart(occupancy))["metric"]) == {"used_blocks"}
    with pytest.raises(ValueError, match="window_steps must be an integer >= 1, got 0"):
        hit_ratio_timeline(two_tier_timeline(), window_steps=0)
    assert dict(hit_ratio_timeline(two_tier_timeline()).schema) == TIMELINE_SCHEMA


@pytest.mark.parametrize("run", [
    lambda: replay(load_trace("conversation").head(200), capacity_blocks=500),
    lambda: replay_rag(rag(6, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
                           order="shuffled", seed=0), capacity_chunks=8),
    lambda: route_requests(load_trace("conversation").head(60), block_size=4, capacity_blocks=300),
], ids=["replay", "replay_rag", "route_requests"])
def test_the_charts_draw_every_driver(run) -> None:
    result = run()
    breakdown = tier_breakdown(result)
    assert breakdown.filter(pl.col("served_by") != "computed")["blocks"].sum() == result.summary.hit_blocks
    for chart in (occupancy_chart(result), hit_ratio_chart(result), tier_breakdown_chart(result)):
        assert chart.to_dict()["$schema"].startswith("https://vega.github.io/schema/vega-lite/")


def test_hit_ratio_curve_draws_unbounded_as_rule() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 4], [1, 2, 3]], block_size=1)
    frame = sweep(trace, [1, 2, 3, None])
    spec = hit_ratio_curve(frame, metric="block_hit_ratio").to_dict()
    lines, rules = spec["layer"]  # lines under hollow markers (kvlab.viz.theme.lines_with_markers), then rules
    assert [layer["mark"]["type"] for layer in lines["layer"]] == ["line", "point"]
    assert rules["mark"]["type"] == "rule"
    assert lines["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    with pytest.raises(ValueError, match="frame lacks column"):
        hit_ratio_curve(frame, color="trace")
    with pytest.raises(ValueError, match="frame must be a polars DataFrame .*got list"):
        hit_ratio_curve([1, 2])
