"""Sweeps on every executor (issue 16, "Sweeps beyond one machine"): ``kvlab.sim.sweep`` and
``kvlab.sim.cluster.sweep`` give the same frame on this process, local processes, threads and a
two-worker Dask ``LocalCluster`` (by client and by address); the trace is scattered once; bad
grids and executors fail before any run."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

import distributed
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kvlab.cli import main
from kvlab.core.validate import config_with
from kvlab.sim import sweep
from kvlab.sim.cluster import BlendSpec, ClusterConfig, ClusterSummary, ClusterTier, simulate
from kvlab.sim.cluster import sweep as cluster_sweep
from kvlab.sim.cluster.sweep import SWEEP_METRICS, grid_points
from kvlab.traces import Trace

#: The simulator's own speed: the only columns two runs of one point may differ in.
WALL_COLUMNS = ["wall_s", "simulated_requests_per_s"]
#: 4 points, ~0.2 s each on 50 requests (no preemption at 20,000 blocks per worker).
GRID = {"num_workers": [1, 2], "router": ["random", "least_loaded"], "capacity_blocks": [20_000]}
CAPS = [100, 1_000, None]


@pytest.fixture(scope="module")
def cluster():
    """A two-worker Dask cluster of processes on this machine (no dashboard: no port to clash)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def small(conversation) -> Trace:
    return conversation.head(50)


@pytest.fixture(scope="module")
def serial_frame(small) -> pl.DataFrame:
    return cluster_sweep(small, GRID, executor="serial")


def without_wall(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop(WALL_COLUMNS)


def test_cluster_sweep_rows_are_simulate_summaries_in_product_order(small, serial_frame) -> None:
    assert serial_frame.select("num_workers", "router").rows() == [(1, "random"), (1, "least_loaded"),
                                                                   (2, "random"), (2, "least_loaded")]
    assert serial_frame.columns == ["num_workers", "router", "capacity_blocks", *SWEEP_METRICS, "source"]
    scalar = {f.name for f in fields(ClusterSummary)} - {"source", "config", "time_scale", "rate", "busy_share",
                                                         "tier_hit_ratio"}
    assert set(SWEEP_METRICS) == scalar  # every scalar of the summary is a column
    s = simulate(small, num_workers=2, router="least_loaded", capacity_blocks=20_000).summary
    row = serial_frame.row(3, named=True)
    assert {k: row[k] for k in SWEEP_METRICS if k not in WALL_COLUMNS} == {
        k: getattr(s, k) for k in SWEEP_METRICS if k not in WALL_COLUMNS}
    assert row["source"] == small.source and row["completed_requests"] == 50
    # the router matters on 2 workers, not on 1 (one choice): the grid really varies it
    assert serial_frame["ttft_mean_s"][0] == serial_frame["ttft_mean_s"][1]
    assert serial_frame["ttft_mean_s"][2] != serial_frame["ttft_mean_s"][3]


def test_cluster_sweep_same_frame_on_processes_threads_and_dask(small, serial_frame, client, cluster) -> None:
    expected = without_wall(serial_frame)
    assert_frame_equal(without_wall(cluster_sweep(small, GRID)), expected)  # default: spawn processes
    with ThreadPoolExecutor(2) as pool:
        assert_frame_equal(without_wall(cluster_sweep(small, GRID, executor=pool)), expected)
    assert_frame_equal(without_wall(cluster_sweep(small, GRID, executor=client)), expected)
    assert_frame_equal(without_wall(cluster_sweep(small, GRID, executor=cluster.scheduler_address)), expected)


def test_replay_sweep_same_frame_on_dask(conversation, client, cluster) -> None:
    trace = conversation.head(200)
    expected = sweep(trace, CAPS, executor="serial")  # one policy: one kernel compiled on each Dask worker
    assert expected["capacity_blocks"].to_list() == CAPS
    assert_frame_equal(sweep(trace, CAPS, executor=client), expected)
    assert_frame_equal(sweep(trace, CAPS, executor=cluster.scheduler_address), expected)


def test_trace_is_scattered_once_and_every_task_takes_its_future(small, client, monkeypatch, capsys) -> None:
    scattered, submitted, holders = [], [], []
    scatter, submit = client.scatter, client.submit

    def counting_scatter(data, **kwargs):
        future = scatter(data, **kwargs)
        scattered.append((data, kwargs, future))
        holders.append(len(client.who_has(future)[future.key]))  # on how many workers, before any task
        return future

    def recording_submit(fn, *args, **kwargs):
        submitted.append(args)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", counting_scatter)
    monkeypatch.setattr(client, "submit", recording_submit)
    frame = cluster_sweep(small, GRID, executor=client, progress=True)
    assert frame.height == 4
    assert len(scattered) == 1 and scattered[0][0] is small and scattered[0][1]["broadcast"] is True
    assert holders == [2]  # broadcast: both workers hold it
    assert len(submitted) == 4
    for args in submitted:
        assert any(isinstance(a, distributed.Future) for a in args)
        assert not any(isinstance(a, Trace) for a in args)
        assert args[1] is scattered[0][2]
    assert "4/4" in capsys.readouterr().err  # the bar moved as the tasks finished
    assert scattered[0][2].cancelled()  # the sweep released the trace on the workers


def wait_for(predicate, seconds: float = 10.0) -> bool:
    """Whether ``predicate()`` holds within ``seconds`` (the scheduler forgets and closes asynchronously)."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_an_address_sweep_closes_its_client(small, cluster, client) -> None:
    def count_clients(dask_scheduler) -> int:
        return len(dask_scheduler.clients)

    before = client.run_on_scheduler(count_clients)
    cluster_sweep(small, {"num_workers": [1]}, executor=cluster.scheduler_address)
    assert wait_for(lambda: client.run_on_scheduler(count_clients) == before)


def test_a_failing_point_raises_its_error_from_a_dask_worker(small, client) -> None:
    with pytest.raises(ValueError, match="blend needs prompt tokens"):
        cluster_sweep(small, {"blend": [None, BlendSpec()]}, executor=client)


def test_cli_sweep_on_a_scheduler(capsys, cluster) -> None:
    argv = ["sweep", "synthetic", "--capacities", "1000,unbounded", "--json"]
    assert main([*argv, "--serial"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main([*argv, "--scheduler", cluster.scheduler_address]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    for bad in (["--scheduler", "localhost:8786"], ["--serial", "--scheduler", cluster.scheduler_address]):
        with pytest.raises(SystemExit):
            main([*argv, *bad])


def test_tiers_become_columns(synthetic) -> None:
    frame = cluster_sweep(synthetic.head(60), [{"tiers": ()}, {"tiers": (ClusterTier("CPU", 20_000),)}],
                          config=ClusterConfig(capacity_blocks=1_000), executor="serial")
    assert frame.columns[:1] == ["tiers"] and "tier_hit_ratio_CPU" in frame.columns
    assert frame.columns.index("tier_hit_ratio_CPU") == frame.columns.index("gpu_hit_ratio") + 1
    cpu_tier = {"capacity_blocks": 20000, "device": "host_dram_ddr5_4800_8ch", "name": "CPU", "policy": "lru"}
    assert frame["tiers"].to_list() == ["[]", json.dumps([cpu_tier])]
    cpu = frame["tier_hit_ratio_CPU"].to_list()
    assert cpu[0] is None and cpu[1] > 0
    assert frame["token_hit_ratio"][1] > frame["token_hit_ratio"][0]


@pytest.mark.parametrize(("grid", "message"), [
    ({"num_workerz": [1]}, "grid names 'num_workerz', not a ClusterConfig field"),
    ({"num_workers": []}, r"grid\['num_workers'\] is empty"),
    ({"num_workers": 4}, r"grid\['num_workers'\] must be a list, got 4"),
    ({"router": "random"}, r"grid\['router'\] must be a list, got 'random'"),
    ({}, "grid is empty"),
    ([], "grid is empty"),
    ("num_workers", "grid must be a dict"),
    ([{"num_workers": 1}, 3], r"grid\[1\] must be a dict"),
    ([{"num_workers": 1}, {"model_spec": 1}], r"grid\[1\] names 'model_spec', not a ClusterConfig field"),
    ({"num_workers": [1, 0]}, "num_workers must be an integer >= 1, got 0"),
])
def test_bad_grids_fail_before_any_run(small, monkeypatch, grid, message) -> None:
    monkeypatch.setattr(sys.modules["kvlab.sim.cluster.sweep"], "simulate", pytest.fail)
    with pytest.raises(ValueError, match=message):
        cluster_sweep(small, grid, executor="serial")


def test_bad_arguments_fail_before_any_run(small, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules["kvlab.sim.cluster.sweep"], "simulate", pytest.fail)
    for executor in ("gpu", "threads", 3, "localhost:8786"):
        with pytest.raises(ValueError, match="executor must be None, 'serial', 'processes'"):
            cluster_sweep(small, GRID, executor=executor)
    with pytest.raises(ValueError, match="executor must be None, 'serial', 'processes'"):
        sweep(small, CAPS, executor="gpu")
    with pytest.raises(ValueError, match="give rate .* or time_scale"):
        cluster_sweep(small, GRID, time_scale=0.5, rate=2.0)
    with pytest.raises(ValueError, match="config must be a ClusterConfig"):
        cluster_sweep(small, GRID, config={"num_workers": 2})
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        cluster_sweep("conversation", GRID)


def test_grid_points_orders() -> None:
    varied, points = grid_points({"num_workers": [1, 2], "router": ["random", "round_robin"]})
    assert varied == ["num_workers", "router"]
    assert [tuple(p.values()) for p in points] == [(1, "random"), (1, "round_robin"), (2, "random"),
                                                   (2, "round_robin")]
    assert grid_points([{"router": "random"}, {"num_workers": 2}, {}]) == (
        ["router", "num_workers"], [{"router": "random"}, {"num_workers": 2}, {}])


def test_a_base_config_takes_a_new_worker_count() -> None:
    assert config_with(ClusterConfig, ClusterConfig(capacity_blocks=20_000), {"num_workers": 2}).roles == (
        "mixed", "mixed")


def test_a_base_config_derives_its_capacity_again() -> None:
    replaced = config_with(ClusterConfig, ClusterConfig(), {"model": "Llama-3.1-70B", "tp": 4})
    assert replaced.capacity_blocks == ClusterConfig(model="Llama-3.1-70B", tp=4).capacity_blocks


def test_an_address_of_another_scheme_fails_at_once() -> None:
    """Fresh-user report: ``http://x`` was taken for a Dask address and timed out after 60 s."""
    from kvlab.cli import build_parser
    from kvlab.sim.executors import check_executor

    with pytest.raises(ValueError, match=r"starts with one of \['tcp://'"):
        check_executor("http://x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "synthetic", "--scheduler", "http://x"])
