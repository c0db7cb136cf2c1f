"""Cluster simulation charts (TTFT CDF, per-worker queues, TTFT vs rate): data and encodings, not pixels."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import font_sizes
from kvlab.core import RunResult, RunSummary, timeline_frame
from kvlab.sim.cluster import ClusterTier, simulate
from kvlab.viz import ttft_cdf, ttft_cdf_chart, ttft_vs_rate_chart, worker_queue_chart
from kvlab.viz.cluster_charts import FONT_PX, SINGLE_RUN


def toy_result(ttft: list[float | None], timeline: pl.DataFrame | None = None) -> RunResult:
    n = len(ttft)
    requests = pl.DataFrame({"request_id": pl.Series(range(n), dtype=pl.UInt64), "arrival_s": [0.0] * n,
                             "input_tokens": [16] * n, "hit_blocks": [0] * n, "hit_tokens": [0] * n,
                             "ttft_s": pl.Series(ttft, dtype=pl.Float64)})
    return RunResult(requests, timeline if timeline is not None else timeline_frame([], [], "w0", {}),
                     RunSummary(), {})


def chart_data(chart: object) -> pl.DataFrame:
    (rows,) = chart.to_dict()["datasets"].values()
    return pl.DataFrame(rows)


def test_ttft_cdf_of_hand_values() -> None:
    """Null TTFTs (rejected, unfinished) are left out; share = rank / completed requests."""
    cdf = ttft_cdf({"b": toy_result([3.0, 1.0, None, 2.0]), "a": toy_result([0.5, 0.25])})
    assert cdf.rows() == [("b", 1.0, 1 / 3, 3), ("b", 2.0, 2 / 3, 3), ("b", 3.0, 1.0, 3),
                          ("a", 0.25, 0.5, 2), ("a", 0.5, 1.0, 2)]
    assert ttft_cdf(toy_result([2.0, 1.0]))["run"].to_list() == [SINGLE_RUN] * 2


def test_ttft_cdf_thins_evenly_and_keeps_both_ends() -> None:
    cdf = ttft_cdf({"x": toy_result(list(np.arange(10_000, 0, -1) / 1000)), "y": toy_result([1.0])}, max_points=100)
    x = cdf.filter(run="x")
    assert x.height == 50 and x["ttft_s"][0] == 0.001 and x["ttft_s"][-1] == 10.0 and x["share"][-1] == 1.0
    assert x["share"][1] == pytest.approx(205 / 10_000)  # rank linspace(0, 9999, 50)[1] = 204 → share 205/n
    assert cdf.filter(run="y").rows() == [("y", 1.0, 1.0, 1)]


def test_ttft_cdf_chart_encodings() -> None:
    results = {"on": toy_result([0.0, 1.0, 4.0]), "off": toy_result([2.0, 8.0])}
    spec = ttft_cdf_chart(results, title="TTFT").to_dict()
    enc = spec["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"]) == ("ttft_s", "share", "run")
    assert enc["x"]["axis"]["title"] == "TTFT (s)" and enc["y"]["scale"]["domain"] == [0, 1]
    assert spec["mark"]["interpolate"] == "step-after" and spec["title"]["text"] == "TTFT"
    assert min(font_sizes(spec)) >= FONT_PX
    log = ttft_cdf_chart(results, log_x=True)
    assert log.to_dict()["encoding"]["x"]["scale"] == {"type": "log"}
    assert chart_data(log)["ttft_s"].min() == 1.0  # the zero TTFT cannot sit on a log axis
    assert chart_data(ttft_cdf_chart(results))["ttft_s"].min() == 0.0


def test_ttft_cdf_of_a_simulation_is_its_sorted_ttfts(conversation) -> None:
    result = simulate(conversation.head(40), num_workers=2, capacity_blocks=5000, rate=3.0)
    cdf = ttft_cdf(result)
    ttft = result.requests.filter(pl.col("ttft_s").is_not_null())["ttft_s"].sort()
    assert cdf["ttft_s"].to_list() == ttft.to_list()
    assert cdf["requests"][0] == result.summary.completed_requests == ttft.len()
    assert cdf["ttft_s"].mean() == pytest.approx(result.summary.ttft_mean_s)


def test_ttft_cdf_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="non-empty mapping"):
        ttft_cdf({})
    with pytest.raises(ValueError, match=r"results\['x'\] must be a simulate\(\) result"):
        ttft_cdf({"x": 3})
    toy = toy_result([1.0])
    no_ttft = RunResult(toy.requests.drop("ttft_s"), toy.timeline, toy.summary, {})
    with pytest.raises(ValueError, match="requests with ttft_s"):
        ttft_cdf_chart({"x": no_ttft})


def test_worker_queue_chart_of_a_hand_timeline() -> None:
    timeline = pl.concat([
        timeline_frame([0, 1, 2], [0.0, 0.5, 1.5], "w0",
                       {"running_requests": [1, 2, 1], "waiting_requests": [0, 3, 0]}),
        timeline_frame([0, 1], [0.0, 2.0], "w1", {"running_requests": [4, 0], "waiting_requests": [1, 0]})])
    chart = worker_queue_chart(toy_result([1.0], timeline), title="queues")
    spec = chart.to_dict()
    assert [p["encoding"]["y"]["axis"]["title"] for p in spec["vconcat"]] == ["running requests", "waiting requests"]
    assert [p["transform"][0]["filter"] for p in spec["vconcat"]] == [
        "(datum.metric === 'running_requests')", "(datum.metric === 'waiting_requests')"]
    assert spec["vconcat"][0]["encoding"]["color"]["field"] == "tier"
    assert spec["vconcat"][0]["encoding"]["color"]["legend"]["title"] == "worker"
    assert min(font_sizes(spec)) >= FONT_PX
    data = chart_data(chart).sort("tier", "metric", "step")
    assert data.select("tier", "metric", "time_s", "value").rows() == [
        ("w0", "running_requests", 0.0, 1.0), ("w0", "running_requests", 0.5, 2.0),
        ("w0", "running_requests", 1.5, 1.0), ("w0", "waiting_requests", 0.0, 0.0),
        ("w0", "waiting_requests", 0.5, 3.0), ("w0", "waiting_requests", 1.5, 0.0),
        ("w1", "running_requests", 0.0, 4.0), ("w1", "running_requests", 2.0, 0.0),
        ("w1", "waiting_requests", 0.0, 1.0), ("w1", "waiting_requests", 2.0, 0.0)]
    binned = chart_data(worker_queue_chart(timeline, max_points=1)).sort("tier", "metric")
    assert binned["value"].to_list() == [2.0, 3.0, 4.0, 1.0]  # one bin each: the maximum (the envelope)
    with pytest.raises(ValueError, match=r"missing \['fetching_requests'\]"):
        worker_queue_chart(timeline, metrics=("running_requests", "fetching_requests"))


def test_worker_queue_chart_of_a_simulation_with_a_tier(conversation) -> None:
    result = simulate(conversation.head(30), num_workers=3, capacity_blocks=4000, rate=5.0,
                      tiers=(ClusterTier("CPU", 20_000),))
    chart = worker_queue_chart(result, metrics=("running_requests", "waiting_requests", "fetching_requests"))
    data = chart_data(chart)
    assert set(data["tier"]) == {"w0", "w1", "w2"}
    steps = result.steps
    for worker in ("w0", "w1", "w2"):
        mine = data.filter(tier=worker, metric="running_requests")
        assert mine["value"].max() == steps.filter(worker=worker)["num_running"].max()
    assert data.filter(metric="waiting_requests")["value"].max() == steps["num_waiting"].max()


def test_ttft_vs_rate_chart() -> None:
    frame = pl.DataFrame({"rate": [1, 2, 1, 2], "variant": ["on", "on", "off", "off"],
                          "ttft_mean_s": [0.5, 0.9, 0.7, 1.5], "ttft_p99_s": [1.0, 2.0, None, 4.0], "extra": 1})
    chart = ttft_vs_rate_chart(frame, title="load")
    spec = chart.to_dict()
    enc = spec["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"], enc["color"]["field"], enc["strokeDash"]["field"]) == (
        "rate", "ttft_s", "variant", "statistic")
    assert (enc["x"]["axis"]["title"], enc["y"]["axis"]["title"]) == ("arrival rate (requests/s)", "TTFT (s)")
    assert min(font_sizes(spec)) >= FONT_PX
    data = chart_data(chart).sort("statistic", "variant", "rate")
    assert data.select("statistic", "variant", "rate", "ttft_s").rows() == [
        ("mean", "off", 1.0, 0.7), ("mean", "off", 2.0, 1.5), ("mean", "on", 1.0, 0.5), ("mean", "on", 2.0, 0.9),
        ("p99", "off", 2.0, 4.0), ("p99", "on", 1.0, 1.0), ("p99", "on", 2.0, 2.0)]  # a null p99 is dropped
    assert ttft_vs_rate_chart(frame, log_y=True).to_dict()["encoding"]["y"]["scale"] == {"type": "log"}
    with pytest.raises(ValueError, match=r"frame lacks column\(s\) \['ttft_p99_s'\]"):
        ttft_vs_rate_chart(frame.drop("ttft_p99_s"))
    with pytest.raises(ValueError, match="must be a polars DataFrame"):
        ttft_vs_rate_chart(frame.to_dicts())
