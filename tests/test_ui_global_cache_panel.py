"""The global-cache panel, driven headlessly: set the controls, press Run, read the frame, the runs
and the labels (FAST'25 Figure 10 and §5.3 on the timed cluster; cluster_sim.md C18, C20–C22)."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import make_trace
from kvlab.sim.cluster.mooncake_figures import MooncakeSetup, figure10
from kvlab.traces import Trace
from kvlab.ui import GlobalCachePanel, GlobalCacheSettings, global_cache_panel
from kvlab.ui.global_cache_panel import TABLE_HEADERS

SMALL = MooncakeSetup(num_workers=2, cache_tokens=200_000)
METRICS = ["requests", "token_hit_ratio", "gpu_hit_ratio", "remote_store_ratio", "prefill_gpu_s_per_request",
           "ttft_mean_s", "ttft_p99_s", "rejected_requests"]

# Four requests on 256-token blocks (the setup's block size), 2 workers, Conductor:
# r0 (A = 8 blocks + 2) and r1 (A's first 4 + 2) arrive together: r0 -> w0, r1 -> w1 (w0 has a queue).
# r2, a 240-block prompt of its own at 2.9 s, goes to w0 (both idle, lowest index): ~12 s of prefill.
# r3 (A + 4) at 3.0 s: w0 holds 8 of its blocks but is busy, w1 holds 4 and is idle; the index's
# ratio 8 / 4 = 2 decides whether w1 first copies w0's prefix (threshold < 2) or computes it.
A = list(range(1, 9))
SCENARIO = [A + [100, 101], A[:4] + [200, 201], list(range(1000, 1240)), A + [300, 301, 302, 303]]
ARRIVALS = [0.0, 0.0, 2.9, 3.0]


@pytest.fixture(scope="module")
def head60(synthetic: Trace) -> Trace:
    return synthetic.head(60)


@pytest.fixture
def scenario_panel() -> GlobalCachePanel:
    trace = make_trace(SCENARIO, block_size=256, arrival_s=ARRIVALS, source="copy or compute")
    return GlobalCachePanel(trace, MooncakeSetup(num_workers=2, cache_tokens=200_000, router="conductor"))


def run(panel: GlobalCachePanel, **values: object) -> pl.DataFrame:
    """Set controls by name, as a user would, then press Run."""
    for name, value in values.items():
        getattr(panel, name).value = value
    panel.run_button.click()
    return panel.frame


def request3(panel: GlobalCachePanel, scope: str) -> dict:
    return panel.results[scope].requests.filter(pl.col("request_id") == 3).row(0, named=True)


def copies(panel: GlobalCachePanel, scope: str) -> list[tuple]:
    return panel.results[scope].transfers.filter(kind="transfer").select("src", "dst", "request_id", "bytes").rows()


def test_first_run_is_figure10_on_the_same_setup(head60: Trace) -> None:
    panel = global_cache_panel(head60, SMALL)
    assert (panel.router.value, panel.workers.value, panel.cache_tokens.value) == ("local_cache_aware", 2, 200_000)
    ours = panel.frame
    assert ours["cache_scope"].to_list() == ["local", "global"]
    assert ours["kvcache_balancing_threshold"].to_list() == [None, None]  # local cache-aware never copies
    reference = figure10({"synthetic": head60}, SMALL)
    assert ours.select(METRICS).equals(reference.select(METRICS))
    assert ours["token_hit_ratio"][1] > ours["token_hit_ratio"][0]  # the pool finds what another worker stored
    local, glob = ours.row(0, named=True), ours.row(1, named=True)
    assert panel.summary.value.startswith(
        f"global / local: hit rate <b>×{glob['token_hit_ratio'] / local['token_hit_ratio']:.2f}</b>")


def test_more_cache_never_lowers_the_hit_rate_and_global_stays_ahead(head60: Trace) -> None:
    panel = GlobalCachePanel(head60, SMALL)
    hits = {}
    for tokens in (20_000, 200_000, 1_000_000):
        frame = run(panel, cache_tokens=tokens)
        assert frame["cache_tokens"].to_list() == [tokens, tokens]
        assert panel.results["global"].config.tiers[0].capacity_blocks == tokens // 256
        hits[tokens] = dict(zip(frame["cache_scope"], frame["token_hit_ratio"]))
        assert hits[tokens]["global"] >= hits[tokens]["local"]
    for scope in ("local", "global"):
        assert hits[20_000][scope] <= hits[200_000][scope] <= hits[1_000_000][scope]
    assert hits[20_000]["global"] < hits[200_000]["global"]  # 2 x 20 k tokens cannot keep the shared prefixes


def test_one_worker_local_and_global_are_the_same_cache(head60: Trace) -> None:
    panel = GlobalCachePanel(head60, SMALL)
    frame = run(panel, workers=1)
    assert frame["num_workers"].to_list() == [1, 1]
    assert frame.filter(cache_scope="local").select(METRICS).equals(frame.filter(cache_scope="global").select(METRICS))
    assert panel.results["global"].requests["worker"].unique().to_list() == ["w0"]


def test_threshold_decides_the_copy(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    assert panel.threshold.disabled is False
    frame = run(panel, threshold=1.9)  # 8 / 4 = 2 > 1.9: w1 copies w0's 4 missing blocks, then hits all 8
    four_blocks = 4 * panel.results["local"].config.block_bytes
    for scope in ("local", "global"):
        router = panel.results[scope].config.router
        assert (router.name, router.kvcache_balancing_threshold) == ("conductor", 1.9)
        assert copies(panel, scope) == [("w0", "w1", 3, four_blocks)]
        assert (request3(panel, scope)["worker"], request3(panel, scope)["hit_tokens"]) == ("w1", 8 * 256)
    assert frame["kvcache_balancing_threshold"].to_list() == [1.9, 1.9]
    title = panel.chart.chart.to_dict()["title"]  # the settings: title, then workers, cache, delays as subtitle
    assert title["text"] == "global cache-aware (Conductor), threshold 1.9" and "workers ×" in title["subtitle"][0]
    run(panel, threshold=2.0)  # the ratio must exceed the threshold: no copy
    assert copies(panel, "local") == copies(panel, "global") == []
    assert request3(panel, "local")["hit_tokens"] == 4 * 256  # w1's own blocks
    assert request3(panel, "global")["hit_tokens"] == 8 * 256  # the rest read from w0's segment of the pool


def test_local_cache_aware_ignores_the_threshold(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    frame = run(panel, router="local_cache_aware", threshold=1.1)
    assert panel.threshold.disabled is True
    assert frame["kvcache_balancing_threshold"].to_list() == [None, None]
    router = panel.results["local"].config.to_dict()["router"]  # what ran, the name resolved
    assert (router["name"], router["allow_transfer"]) == ("local_cache_aware", False)
    assert copies(panel, "local") == []
    frame = run(panel, router="random")
    assert panel.results["local"].config.to_dict()["router"]["type"] == "RandomRouter"
    assert frame["router"].to_list() == ["random"] * 2


def test_event_delay_hides_the_prefix_from_conductor(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    run(panel, event_delay=1.0)  # r0's blocks are stored by ~0.4 s: their events arrive by ~1.4 s < 3.0 s
    assert panel.results["local"].config.faults.delay_s == 1.0
    assert copies(panel, "local") == [("w0", "w1", 3, 4 * panel.results["local"].config.block_bytes)]
    frame = run(panel, event_delay=5.0)  # ... by ~5.4 s: at 3.0 s the index knows no worker's prefix
    assert frame["event_delay_s"].to_list() == [5.0, 5.0]
    assert copies(panel, "local") == []
    r3 = request3(panel, "local")
    assert (r3["worker"], r3["hit_tokens"]) == ("w1", 4 * 256)
    assert r3["predicted_ttft_s"] > r3["ttft_s"]  # predicted without the prefix it then hit
    run(panel, event_delay=0.0)
    assert panel.results["local"].config.faults is None


def test_stale_load_snapshots_queue_behind_the_long_prompt(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    live = request3(panel, "local")
    assert live["worker"] == "w1" and live["ttft_s"] < 1.0
    frame = run(panel, snapshot_interval=1.0)  # at 3.0 s the 2.0 s snapshot shows w0 idle: r3 joins r2 there
    assert panel.results["local"].config.snapshot_interval_s == 1.0
    assert frame["snapshot_interval_s"].to_list() == [1.0, 1.0]
    stale = request3(panel, "local")
    r2 = panel.results["local"].requests.filter(pl.col("request_id") == 2).row(0, named=True)
    assert stale["worker"] == r2["worker"] == "w0"
    assert stale["first_token_s"] >= r2["first_token_s"] > 12.0  # not before r2's 240-block prefill is done


def test_controls_only_mark_the_display_stale_until_run(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    shown, frame = panel.shown, panel.frame
    assert panel.status.value == ""
    panel.threshold.value = 2.5
    assert panel.frame is frame and panel.shown is shown
    assert "press Run" in panel.status.value
    headless = panel.compute()  # the controls' values, no widget changed
    assert headless["kvcache_balancing_threshold"].to_list() == [2.5, 2.5]
    assert panel.frame is frame and "press Run" in panel.status.value
    panel.run_button.click()
    assert panel.status.value == "" and panel.shown == panel.settings()
    assert panel.frame.drop("wall_s").equals(headless.drop("wall_s"))


def test_table_and_chart_show_the_frame(scenario_panel: GlobalCachePanel) -> None:
    panel = scenario_panel
    datasets = [rows for rows in panel.chart.chart.to_dict()["datasets"].values() if rows and "cache_scope" in rows[0]]
    assert datasets
    for rows in datasets:
        assert [(r["cache_scope"], r["token_hit_ratio"]) for r in rows] == list(
            zip(panel.frame["cache_scope"], panel.frame["token_hit_ratio"]))
    assert all(f">{header}</th>" in panel.table.value for header in TABLE_HEADERS.values())  # human headers
    assert "shape:" not in panel.table.value and "dtype" not in panel.table.value
    for scope, ratio in zip(panel.frame["cache_scope"], panel.frame["token_hit_ratio"]):
        assert f">{scope}</td>" in panel.table.value and f">{ratio:.4g}</td>" in panel.table.value


def test_controls_start_at_the_setup() -> None:
    trace = make_trace(SCENARIO[:1], block_size=256)
    setup = MooncakeSetup(num_workers=3, cache_tokens=300_000, router="conductor", kvcache_balancing_threshold=2.5)
    panel = GlobalCachePanel(trace, setup)
    assert (panel.workers.value, panel.router.value, panel.threshold.value) == (3, "conductor", 2.5)
    assert panel.results["local"].config.router.kvcache_balancing_threshold == 2.5
    values = [v for _, v in panel.cache_tokens.options]
    assert panel.cache_tokens.value == 300_000 and values == sorted(values)
    assert values[0] == 10_000 and values[-1] == 10_000_000 and 3_000_000 in values  # Figure 10's size
    assert values.count(300_000) == 1 and 4_000_000 not in values


def test_bad_arguments(head60: Trace) -> None:
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        GlobalCachePanel("conversation")
    with pytest.raises(ValueError, match="setup must be a MooncakeSetup or None, got dict"):
        GlobalCachePanel(head60, {"num_workers": 2})
    with pytest.raises(ValueError, match="setup.router"):
        GlobalCachePanel(head60, MooncakeSetup(router="least_loaded"))
    with pytest.raises(ValueError, match="router"):
        GlobalCacheSettings(2, 200_000, "round_robin", 1.5, 0.0, 0.0)
