"""Engine chart builders (block pool, radix tree): specs, not pixels."""

from __future__ import annotations

import polars as pl
import pytest


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
    from kvlab.engines.sglang import RadixCache
    from kvlab.viz import radix_tree_chart, tree_layout

    cache = RadixCache(page_size=1)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 9])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 9]).last_node)
    spec = radix_tree_chart(cache).to_dict()
    nodes = pl.DataFrame(max(spec["datasets"].values(), key=len))
    assert sorted(nodes["status"].to_list()) == ["evictable leaf", "locked", "locked", "root"]
    layout = tree_layout(cache.snapshot())
    leaves = layout.filter(pl.col("num_tokens") < 3)
    assert layout.filter(pl.col("parent_id").is_null())["x"].item() == 0.5  # the root sits between its leaves
    assert leaves.height >= 2
    with pytest.raises(ValueError, match="no root"):
        tree_layout(pl.DataFrame({"node_id": [1], "parent_id": [1], "depth": [0]}))
