"""The bounded timeline of :func:`kvlab.replay` (``ReplayConfig.timeline_points``, issue 17 item 4)
and the core helpers it is built with (:func:`kvlab.core.timeline_steps`, :func:`kvlab.core.bucket_sums`,
:func:`kvlab.core.rolling_hit_ratio` at given steps)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chained_traces, make_trace
from kvlab.core import SINGLE_TIER, bucket_sums, rolling_hit_ratio, timeline_frame, timeline_steps
from kvlab.sim import ReplayConfig, replay
from kvlab.sim.replay import run_kernel, summarize
from kvlab.viz import tier_breakdown

A, B, C, D, E = 11, 22, 33, 44, 55
# LRU, capacity 4, head most recent, prefix hits, by hand:
#   request  keys       hits  misses  evictions (which)  used after
#   0        A B C      0     3       0                  3
#   1        A B D      2     1       0                  4
#   2        A E        1     1       1 (C)              4
#   3        A B C      2     1       1 (D)              4
#   4        A E        2     0       0                  4
SCENARIO = [[A, B, C], [A, B, D], [A, E], [A, B, C], [A, E]]


def points(result, metric: str) -> list[tuple[int, float, float]]:
    rows = result.timeline.filter(pl.col("metric") == metric).sort("step")
    return list(zip(rows["step"].to_list(), rows["time_s"].to_list(), rows["value"].to_list()))


def test_buckets_of_the_hand_built_trace() -> None:
    """5 requests at 2 points: buckets of ceil(5/2) = 3 requests, [0, 2] and [3, 4]."""
    result = replay(make_trace(SCENARIO, block_size=1), capacity_blocks=4, window_requests=2, timeline_points=2)
    assert points(result, "hit_blocks") == [(2, 2.0, 3.0), (4, 4.0, 4.0)]
    assert points(result, "miss_blocks") == [(2, 2.0, 5.0), (4, 4.0, 1.0)]
    assert points(result, "evictions") == [(2, 2.0, 1.0), (4, 4.0, 1.0)]
    assert points(result, "used_blocks") == [(2, 2.0, 4.0), (4, 4.0, 4.0)]
    assert points(result, "capacity_blocks") == [(2, 2.0, 4.0), (4, 4.0, 4.0)]
    ratio = points(result, "hit_ratio_rolling")  # over requests 1-2 and 3-4
    assert [s for s, _, _ in ratio] == [2, 4] and [v for _, _, v in ratio] == pytest.approx([3 / 5, 4 / 5])
    assert result.requests.height == 5  # the per-request frame stays exact


def test_one_point_holds_the_totals_and_the_last_gauges() -> None:
    result = replay(make_trace(SCENARIO, block_size=1), capacity_blocks=4, window_requests=2, timeline_points=1)
    assert {m: points(result, m) for m in ("hit_blocks", "miss_blocks", "evictions", "used_blocks")} == {
        "hit_blocks": [(4, 4.0, 7.0)], "miss_blocks": [(4, 4.0, 6.0)], "evictions": [(4, 4.0, 2.0)],
        "used_blocks": [(4, 4.0, 4.0)]}


@pytest.mark.parametrize("timeline_points", [None, 5, 2_000])
def test_full_resolution_is_one_point_per_request(timeline_points) -> None:
    result = replay(make_trace(SCENARIO, block_size=1), capacity_blocks=4, window_requests=2,
                    timeline_points=timeline_points)
    assert points(result, "hit_blocks") == [(i, float(i), h) for i, h in enumerate([0.0, 2.0, 1.0, 2.0, 2.0])]
    assert [v for _, _, v in points(result, "evictions")] == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert [v for _, _, v in points(result, "used_blocks")] == [3.0, 4.0, 4.0, 4.0, 4.0]


def per_request_timeline(result, config: ReplayConfig) -> pl.DataFrame:
    """The timeline as kvlab built it before issue 17: one row per request and metric, from the
    requests frame (metrics in the replay's order)."""
    r = result.requests
    metrics = {"used_blocks": r["used_blocks"], "evictions": r["evictions"],
               "hit_ratio_rolling": rolling_hit_ratio(r["hit_blocks"].to_numpy(), r["blocks"].to_numpy(),
                                                      config.window_requests)}
    if config.capacity_blocks is not None:
        metrics["capacity_blocks"] = np.full(r.height, config.capacity_blocks)
    metrics["hit_blocks"], metrics["miss_blocks"] = r["hit_blocks"], r["miss_blocks"]
    return timeline_frame(np.arange(r.height), r["arrival_s"], SINGLE_TIER, metrics)


@settings(max_examples=60, deadline=None)
@given(trace=chained_traces(), capacity=st.none() | st.integers(0, 40), timeline_points=st.integers(1, 50),
       window=st.integers(1, 10))
def test_bounded_timeline_is_the_per_request_one_bucketed(trace, capacity, timeline_points, window) -> None:
    """Any trace and number of points: at most that many points per metric, each at the last
    request of its bucket; counters sum to the requests frame's totals over every bucket;
    gauges are the per-request values at the point; full resolution is the per-request frame."""
    config = ReplayConfig(capacity_blocks=capacity, window_requests=window, timeline_points=timeline_points)
    result = replay(trace, config)
    full = per_request_timeline(result, config)
    assert replay(trace, config, timeline_points=None).timeline.equals(full)
    n = result.requests.height
    width = -(-n // timeline_points)
    steps = [min(b * width + width, n) - 1 for b in range(-(-n // width))]
    assert len(steps) <= timeline_points
    for metric in full["metric"].unique(maintain_order=True):
        got = result.timeline.filter(pl.col("metric") == metric)
        assert got["step"].to_list() == steps
        per = full.filter(pl.col("metric") == metric)
        assert got["time_s"].to_list() == per["time_s"].gather(steps).to_list()
        if metric in ("hit_blocks", "miss_blocks", "evictions"):
            bucket = per.with_columns((pl.col("step") // width).alias("b")).group_by("b", maintain_order=True)
            assert got["value"].to_list() == bucket.agg(pl.col("value").sum())["value"].to_list()
            assert got["value"].sum() == result.requests[metric].sum()
        else:
            assert got["value"].to_list() == pytest.approx(per["value"].gather(steps).to_list())


def test_timeline_points_is_validated() -> None:
    with pytest.raises(ValueError, match="timeline_points must be an integer >= 1 or None, got 0"):
        ReplayConfig(timeline_points=0)
    assert ReplayConfig().timeline_points == 2_000


def test_timeline_steps_cut_into_equal_buckets() -> None:
    assert timeline_steps(10, 4).tolist() == [2, 5, 8, 9]
    assert timeline_steps(10, 5).tolist() == [1, 3, 5, 7, 9]
    assert timeline_steps(4, 10).tolist() == [0, 1, 2, 3]
    assert timeline_steps(0, 3).tolist() == [] and timeline_steps(3, None).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="points"):
        timeline_steps(3, 0)


def test_bucket_sums_are_exact_and_checked() -> None:
    values = np.array([2**40, 1, 2, 3, 4], dtype=np.int64)
    assert bucket_sums(values, [0, 3, 4]).tolist() == [2**40, 6, 4]
    assert bucket_sums(np.array([1, 2], dtype=np.int32), [1]).dtype == np.int64
    assert bucket_sums(np.array([0.5, 0.25]), [0, 1]).tolist() == [0.5, 0.25]
    for ends in ([1, 1], [5], [-1, 2]):
        with pytest.raises(ValueError, match="ends must be increasing"):
            bucket_sums(values, ends)


@settings(max_examples=80, deadline=None)
@given(data=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=60),
       window=st.integers(1, 70), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=10))
def test_rolling_hit_ratio_at_steps_is_the_full_one_there(data, window, picks) -> None:
    blocks = np.array([max(a, b) for a, b in data])
    hits = np.array([min(a, b) for a, b in data], dtype=np.int32)
    at = np.array(sorted({p % len(data) for p in picks}))
    assert rolling_hit_ratio(hits, blocks, window, at=at).tolist() == pytest.approx(
        rolling_hit_ratio(hits, blocks, window)[at].tolist())
    with pytest.raises(ValueError, match="at must hold steps"):
        rolling_hit_ratio(hits, blocks, window, at=[len(data)])


def test_summary_totals_are_the_requests_frames() -> None:
    """The one-pass totals (a warm-up of 3 requests) are the sums over the requests frame's measured
    rows, and summarize (totals alone) gives the same summary as replay."""
    trace = make_trace(SCENARIO * 3, block_size=4, input_tokens=[10, 12, 5, 9, 8] * 3)
    result = replay(trace, capacity_blocks=4, warmup_fraction=0.2)
    s, measured = result.summary, result.requests.filter("measured")
    assert (s.requests, s.warmup_requests) == (12, 3)
    assert (s.hit_blocks, s.hit_tokens, s.input_tokens, s.block_refs, s.evictions) == (
        measured["hit_blocks"].sum(), measured["hit_tokens"].sum(), measured["input_tokens"].sum(),
        measured["blocks"].sum(), measured["evictions"].sum())
    assert s.mean_request_block_hit_ratio == pytest.approx((measured["hit_blocks"] / measured["blocks"]).mean())
    assert summarize(trace, result.config, run_kernel(trace, result.config)) == s


def test_the_warm_up_ends_a_bucket() -> None:
    """Warm-up of 2 requests (0.4 of 5), buckets of 3: the points are at requests 1, 2 and 4, so the
    measured steps' counters are exactly the measured requests' (what the tier breakdown reads)."""
    result = replay(make_trace(SCENARIO, block_size=1), capacity_blocks=4, window_requests=2, timeline_points=2,
                    warmup_fraction=0.4)
    assert points(result, "hit_blocks") == [(1, 1.0, 2.0), (2, 2.0, 1.0), (4, 4.0, 4.0)]
    assert tier_breakdown(result)["blocks"].to_list() == [5.0, 2.0]
