"""The Mooncake FAST'25 experiments on the timed cluster (kvlab.sim.cluster.mooncake_figures):
Figure 10's ratios, §5.3's ordering, the staleness sweep (C20–C22), and their charts."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kvlab.index.faults import FaultInjector
from kvlab.sim.cluster import simulate
from kvlab.sim.cluster.mooncake_figures import (
    PAPER_FIGURE10,
    PAPER_TTFT_MEAN_S,
    MooncakeSetup,
    figure10,
    figure10_ratios,
    ordering_holds,
    scheduler_comparison,
    staleness_sweep,
)
from kvlab.traces import load_trace


@pytest.fixture(scope="module")
def small() -> tuple[MooncakeSetup, object]:
    """4 prefill nodes with a small DRAM cache over the first 300 conversation requests."""
    setup = MooncakeSetup(num_workers=4, cache_tokens=400_000)
    return setup, load_trace("conversation").head(300)


def test_paper_values_are_the_figure_labels() -> None:
    """Read from FAST'25 Figure 10 and Figure 5 (cluster_sim.md P1, P2)."""
    assert PAPER_FIGURE10 == {"conversation": (2.22, 0.76), "tool&agent": (1.38, 0.74), "synthetic": (2.36, 0.52)}
    assert PAPER_TTFT_MEAN_S == {"random": 19.65, "load_balance": 5.27, "local_cache_aware": 3.58,
                                 "conductor": 3.07}


def test_setup_is_the_papers_testbed() -> None:
    cfg = MooncakeSetup().config("global")
    assert (cfg.num_workers, cfg.model_spec.name, cfg.gpu, cfg.tp, cfg.block_size) == (10, "Llama-3-70B", "A800", 8,
                                                                                        256)
    assert cfg.model_spec.kv_bytes_per_token == 320 * 1024  # "320 KB" per token (§5.3.1)
    assert cfg.tiers[0].capacity_blocks * 256 == 2_999_808  # 3 M tokens in 256-token blocks
    assert cfg.cache_scope == "global" and cfg.network.read_bytes_per_s == 100e9  # 4 x 200 Gb/s
    assert cfg.store_high_watermark == 0.9 and cfg.store_eviction_ratio == 0.05  # M2
    assert MooncakeSetup.for_section53().num_workers == 8


def test_workload_cuts_outputs_to_one_token(small) -> None:
    setup, trace = small
    work = setup.workload(trace)
    assert work.frame["output_tokens"].unique().to_list() == [1]
    assert_frame_equal(work.frame.drop("output_tokens"), trace.frame.drop("output_tokens"))
    assert MooncakeSetup(output_tokens=None).workload(trace) is trace


def test_figure10_ratios_arithmetic() -> None:
    frame = pl.DataFrame({"trace": ["conversation", "conversation", "mine", "mine"], "router": ["r"] * 4,
                          "cache_scope": ["local", "global", "local", "global"],
                          "token_hit_ratio": [0.2, 0.444, 0.5, 0.5],
                          "prefill_gpu_s_per_request": [2.0, 1.52, 1.0, 1.0]})
    ratios = figure10_ratios(frame)
    conv = ratios.filter(pl.col("trace") == "conversation")
    assert conv["kvlab"].to_list() == pytest.approx([2.22, 0.76])
    assert conv["error"].to_list() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert conv["within_tolerance"].to_list() == [True, True]
    mine = ratios.filter(pl.col("trace") == "mine")
    assert mine["paper"].to_list() == [None, None] and mine["within_tolerance"].to_list() == [None, None]
    tight = figure10_ratios(frame.with_columns(pl.col("token_hit_ratio") * pl.Series([1.0, 1.2, 1.0, 1.0])))
    assert tight["within_tolerance"][0] is False  # 2.664 / 2.22 − 1 = 20 % > 15 %


def test_figure10_runs_both_scopes_with_one_router(small) -> None:
    setup, trace = small
    frame = figure10({"conversation": trace}, setup, executor="serial")
    assert frame.select("trace", "router", "cache_scope").rows() == [("conversation", "local_cache_aware", "local"),
                                                                     ("conversation", "local_cache_aware", "global")]
    local, glob = frame.iter_rows(named=True)
    assert glob["token_hit_ratio"] >= local["token_hit_ratio"]
    assert local["remote_store_ratio"] == 0.0 and glob["remote_store_ratio"] > 0
    assert figure10_ratios(frame)["paper"].to_list() == [2.22, 0.76]


def test_ordering_holds_reads_the_papers_order() -> None:
    frame = pl.DataFrame({"router": ["random", "load_balance", "local_cache_aware", "conductor"],
                          "ttft_mean_s": [19.65, 5.27, 3.58, 3.07]})
    assert ordering_holds(frame)
    assert not ordering_holds(frame.with_columns(pl.Series("ttft_mean_s", [19.65, 5.27, 3.0, 3.07])))
    assert ordering_holds(frame.filter(pl.col("router") != "load_balance"))


def test_scheduler_comparison_keeps_every_router_row(small) -> None:
    setup, trace = small
    frame = scheduler_comparison(trace.head(120), MooncakeSetup.for_section53(num_workers=3),
                                 ["random", "local_cache_aware"], executor="serial")
    assert frame["router"].to_list() == ["random", "local_cache_aware"]
    assert frame["paper_ttft_mean_s"].to_list() == [19.65, 3.58]
    assert (frame["requests"] == 120).all()
    with pytest.raises(ValueError, match="schedulers is empty"):
        scheduler_comparison(trace, setup, [])


def test_zero_staleness_is_the_fresh_index_exactly(small) -> None:
    """C18: a fault injector with no delay delivers every batch at once, as no injector does."""
    setup, trace = small
    work = setup.workload(trace.head(150))
    cfg = setup.config("local", router="conductor")
    fresh = simulate(work, cfg)
    zero = simulate(work, replace(cfg, faults=FaultInjector(delay_s=0.0)))
    assert_frame_equal(fresh.requests, zero.requests)


def test_staleness_sweep_grid_order(small) -> None:
    setup, trace = small
    work = setup.workload(trace.head(100))
    frame = staleness_sweep(work, setup.config("local", router="conductor"), (0.0, 0.5), (0.0, 2.0),
                            executor="serial")
    assert frame.select("event_delay_s", "snapshot_interval_s").rows() == [(0.0, 0.0), (0.0, 0.5), (2.0, 0.0),
                                                                           (2.0, 0.5)]
    with pytest.raises(ValueError, match="snapshot_intervals_s"):
        staleness_sweep(work, setup.config("local"), (-1.0,))
    with pytest.raises(ValueError, match="ClusterConfig"):
        staleness_sweep(work, {"num_workers": 2})


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_workers": 0}, "num_workers"), ({"cache_tokens": 100}, "cache_tokens"),
    ({"time_scale": 0.0}, "time_scale"), ({"output_tokens": 0}, "output_tokens"),
])
def test_bad_setup_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MooncakeSetup(**changes)


def test_figure10_rejects_bad_traces() -> None:
    with pytest.raises(ValueError, match="non-empty mapping"):
        figure10({})
    with pytest.raises(ValueError, match=r"traces\['x'\] must be a kvlab Trace"):
        figure10({"x": [1, 2]})
    with pytest.raises(ValueError, match="routers is empty"):
        figure10({"x": load_trace("conversation").head(5)}, routers=[])


def test_charts_take_the_frames() -> None:
    from kvlab.viz.global_cache_charts import figure10_chart, scheduler_chart, staleness_chart

    frame = pl.DataFrame({"trace": ["conversation"] * 2, "router": ["r"] * 2, "cache_scope": ["local", "global"],
                          "token_hit_ratio": [0.2, 0.44], "prefill_gpu_s_per_request": [2.0, 1.5]})
    spec = figure10_chart(frame, figure10_ratios(frame), ["an assumption"]).to_dict()
    assert spec["title"]["subtitle"] == ["an assumption"] and len(spec["vconcat"][0]["hconcat"]) == 2
    comp = pl.DataFrame({"router": ["random", "conductor"], "ttft_mean_s": [9.0, 2.0],
                         "paper_ttft_mean_s": [19.65, 3.07]})
    assert scheduler_chart(comp).to_dict()["layer"][0]["mark"]["type"] == "bar"
    stale = pl.DataFrame({"snapshot_interval_s": [0.0, 0.1], "event_delay_s": [0.0, 0.0], "ttft_p99_s": [1.0, 2.0]})
    assert staleness_chart(stale).to_dict()["encoding"]["y"]["field"] == "ttft_p99_s"
    with pytest.raises(ValueError, match="lacks column"):
        staleness_chart(stale.drop("ttft_p99_s"))
