"""Chart builders: specs, not pixels."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import make_trace
from kvlab.sim import replay, sweep
from kvlab.viz import downsample_timeline, hit_ratio_curve, occupancy_chart


def test_downsample_keeps_envelope_and_sums_evictions(conversation) -> None:
    tl = replay(conversation, capacity_blocks=1_000).timeline
    small = downsample_timeline(tl, max_points=100)
    for metric in ("used_blocks", "evictions", "hit_ratio_rolling", "capacity_blocks"):
        assert small.filter(pl.col("metric") == metric).height <= 100
    used = tl.filter(pl.col("metric") == "used_blocks")["value"]
    assert small.filter(pl.col("metric") == "used_blocks")["value"].max() == used.max() == 1_000
    ev = lambda f: f.filter(pl.col("metric") == "evictions")["value"].sum()  # noqa: E731
    assert ev(small) == ev(tl)


def test_downsample_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="max_points must be >= 1"):
        downsample_timeline(pl.DataFrame(), 0)
    with pytest.raises(ValueError, match="timeline lacks column"):
        downsample_timeline(pl.DataFrame({"step": [0]}), 10)


def test_occupancy_chart_spec() -> None:
    result = replay(make_trace([[1, 2, 3], [1, 2, 4]], block_size=1), capacity_blocks=3)
    spec = occupancy_chart(result.timeline, title="t").to_dict()
    assert spec["title"] == "t" and len(spec["vconcat"]) == 2
    (rows,) = spec["datasets"].values()
    assert {r["metric"] for r in rows} == {"used_blocks", "capacity_blocks", "evictions", "hit_ratio_rolling"}


def test_hit_ratio_curve_draws_unbounded_as_rule() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 4], [1, 2, 3]], block_size=1)
    frame = sweep(trace, [1, 2, 3, None])
    spec = hit_ratio_curve(frame, metric="block_hit_ratio").to_dict()
    marks = [layer["mark"]["type"] for layer in spec["layer"]]
    assert marks == ["line", "rule"]
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    with pytest.raises(ValueError, match="frame lacks column"):
        hit_ratio_curve(frame, color="trace")


def test_block_pool_chart_from_a_real_pool() -> None:
    from kvlab.engines.scenarios import design_doc_example
    from kvlab.viz import block_pool_chart

    scenario = design_doc_example("classic")
    scenario.run_all()
    spec = block_pool_chart(scenario.model.block_pool, columns=11, title="t").to_dict()
    rows = pl.DataFrame(max(spec["datasets"].values(), key=len))
    counts = dict(zip(*rows["state"].value_counts(sort=True).to_dict(as_series=False).values()))
    assert counts == {"in_use": 8, "cached_free": 1, "null": 1, "free": 1}
    queue = rows.filter(pl.col("queue_position").is_not_null()).sort("queue_position")["block_id"].to_list()
    assert queue == [7, 6]  # r1's partial block 7 (unhashed), then its cached block 6
    with pytest.raises(ValueError, match="columns must be an integer >= 1"):
        block_pool_chart(scenario.model.block_pool, columns=0)
    with pytest.raises(ValueError, match="snapshot lacks column"):
        block_pool_chart(pl.DataFrame({"block_id": [0]}))


def test_radix_tree_chart_from_a_real_cache() -> None:
    from kvlab.engines import RadixCache
    from kvlab.viz import radix_tree_chart, tree_layout

    cache = RadixCache(page_size=1)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 9])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 9]).last_node)
    spec = radix_tree_chart(cache).to_dict()
    nodes = pl.DataFrame(max(spec["datasets"].values(), key=len))
    assert sorted(nodes["status"].to_list()) == ["evictable leaf", "locked", "locked", "root"]
    layout = tree_layout(cache.snapshot())
    leaves = layout.filter(pl.col("n_tokens") < 3)
    assert layout.filter(pl.col("parent_id").is_null())["x"].item() == 0.5  # the root sits between its leaves
    assert leaves.height >= 2
    with pytest.raises(ValueError, match="no root"):
        tree_layout(pl.DataFrame({"node_id": [1], "parent_id": [1], "depth": [0]}))
