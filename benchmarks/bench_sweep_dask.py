"""Sweeps on Dask: a 16-point cluster-simulation grid on a 2-worker Dask ``LocalCluster`` beside
the local process pool (2 processes) — what running a sweep through Dask costs per task.

The grid: ``kvlab.sim.cluster.sweep`` over the first ``--requests`` (300) requests of the
Mooncake conversation trace, ``num_workers`` ∈ {4, 8} × ``capacity_blocks`` ∈ {20,000,
40,000} × ``router`` ∈ {random, round_robin, least_loaded, load_balance} (16 points, ~1–2 CPU
s each). Two sides, interleaved (pool, Dask, Dask, pool, ... so that a load change on the
shared machine hits both):

* **pool** (the anchor): ``executor="processes"`` with 2 CPUs — a fresh ``spawn`` pool per
  sweep, the trace sent once per process through the initializer (what a sweep on this
  machine costs, start-up included);
* **dask**: ``executor=client`` on a ``LocalCluster(n_workers=2, threads_per_worker=1,
  processes=True)`` started once before (its start-up reported apart, as a cluster one points a
  sweep at is already running): one broadcast scatter of the trace, 16 tasks holding its future.

Reported per side: wall seconds of every round, best and median; CPU seconds of the workers
(pool: ``RUSAGE_CHILDREN`` of the reaped pool processes; Dask: ``time.process_time()`` in each
worker, before and after) and of this process; the ratio dask/pool (median wall) and the
overhead per task ``(dask wall − pool wall) / 16`` (median; negative when Dask's warm workers
beat the pool's start-up). The same grid again with pools of 1,000 and 2,000 blocks on the
first ``--tiny-requests`` (5) requests (``tiny_*`` keys): points of ~30 ms, so the walls are the
fixed costs alone — the pool's start-up, Dask's scatter and round trips. Load average before and after; ``busy`` when
either 1-minute value exceeds 1.5 (two cores). Target: the frames are identical (``wall_s``
and ``simulated_requests_per_s`` apart).

Usage: ``python benchmarks/bench_sweep_dask.py --out out/bench/bench_sweep_dask.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from distributed import Client, LocalCluster

from kvlab.sim.cluster import sweep
from kvlab.traces import load_trace
from report import exit_unless_met, machine_info, write_report  # benchmarks/ is on sys.path (the script's folder)

GRID = {"num_workers": [4, 8], "capacity_blocks": [20_000, 40_000],
        "router": ["random", "round_robin", "least_loaded", "load_balance"]}
#: The fixed costs alone: the same shape on a few requests and small pools (~30 ms a point).
TINY_GRID = GRID | {"capacity_blocks": [1_000, 2_000]}
POINTS = 16
WORKERS = 2
WALL_COLUMNS = ["wall_s", "simulated_requests_per_s"]


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def worker_cpu_s(client: Client) -> float:
    return sum(client.run(time.process_time).values())


def run_pool(trace: object, grid: dict) -> tuple[object, dict[str, float]]:
    wall, cpu, children = time.perf_counter(), time.process_time(), children_cpu_s()
    frame = sweep(trace, grid, executor="processes")
    return frame, {"wall_s": time.perf_counter() - wall, "workers_cpu_s": children_cpu_s() - children,
                   "parent_cpu_s": time.process_time() - cpu}


def run_dask(trace: object, grid: dict, client: Client) -> tuple[object, dict[str, float]]:
    workers = worker_cpu_s(client)
    wall, cpu = time.perf_counter(), time.process_time()
    frame = sweep(trace, grid, executor=client)
    out = {"wall_s": time.perf_counter() - wall, "parent_cpu_s": time.process_time() - cpu}
    out["workers_cpu_s"] = worker_cpu_s(client) - workers
    return frame, out


def side(runs: list[dict[str, float]]) -> dict[str, object]:
    walls = [r["wall_s"] for r in runs]
    return {"runs": runs, "best_wall_s": min(walls), "median_wall_s": statistics.median(walls),
            "median_workers_cpu_s": statistics.median(r["workers_cpu_s"] for r in runs)}


def measure(report: dict[str, object], prefix: str, trace: object, grid: dict, client: Client, rounds: int) -> list:
    """``rounds`` interleaved runs of each side into ``report`` (keys ``{prefix}pool``,
    ``{prefix}dask``, the ratio and the overhead per task); the frames, wall columns dropped."""
    runs: dict[str, list] = {"pool": [], "dask": []}
    frames = []
    for i in range(rounds):
        for name in ("pool", "dask") if i % 2 == 0 else ("dask", "pool"):
            frame, run = run_pool(trace, grid) if name == "pool" else run_dask(trace, grid, client)
            runs[name].append(run)
            frames.append(frame.drop(WALL_COLUMNS))
            print(f"{prefix}round {i + 1} {name}: {run['wall_s']:.2f} s wall, {run['workers_cpu_s']:.2f} worker CPU s",
                  flush=True)
    pool, dask = side(runs["pool"]), side(runs["dask"])
    report[f"{prefix}requests"] = trace.frame.height
    report[f"{prefix}pool"], report[f"{prefix}dask"] = pool, dask
    report[f"{prefix}ratio_dask_vs_pool_wall"] = dask["median_wall_s"] / pool["median_wall_s"]
    report[f"{prefix}overhead_per_task_s"] = (dask["median_wall_s"] - pool["median_wall_s"]) / POINTS
    report[f"{prefix}overhead_per_task_best_s"] = (dask["best_wall_s"] - pool["best_wall_s"]) / POINTS
    return frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_sweep_dask.json"))
    parser.add_argument("--requests", type=int, default=300, help="first requests of the conversation trace")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (interleaved)")
    parser.add_argument("--tiny-requests", type=int, default=5,
                        help="the same grid on this many requests: points of milliseconds, the fixed costs alone")
    args = parser.parse_args()
    trace = load_trace("conversation").head(args.requests)
    report: dict[str, object] = {"benchmark": "bench_sweep_dask", "machine": machine_info(),
                                 "load_average_before": load(), "points": POINTS,
                                 "grid": GRID, "tiny_grid": TINY_GRID, "workers": WORKERS,
                                 "anchor": "local process pool (2 processes)"}
    start = time.perf_counter()
    with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster, set_as_default=False) as client:
        report["dask_cluster_start_s"] = time.perf_counter() - start
        frames = measure(report, "", trace, GRID, client, args.rounds)
        tiny = load_trace("conversation").head(args.tiny_requests)
        tiny_frames = measure(report, "tiny_", tiny, TINY_GRID, client, args.rounds)
    pool_wall, dask_wall = report["pool"]["median_wall_s"], report["dask"]["median_wall_s"]
    report["load_average_after"] = load()
    report["busy"] = max(report["load_average_before"][0], report["load_average_after"][0]) > 1.5
    report["pid"] = os.getpid()
    met = {"identical frames on both executors": all(f.equals(frames[0]) for f in frames)
           and all(f.equals(tiny_frames[0]) for f in tiny_frames)}
    report["met"] = met
    write_report(args.out, report)
    print(f"{POINTS} points, {trace.frame.height} requests: pool {pool_wall:.1f} s, dask {dask_wall:.1f} s "
          f"(median wall; x{report['ratio_dask_vs_pool_wall']:.2f}), overhead per task "
          f"{report['overhead_per_task_s'] * 1000:+.0f} ms; dask cluster start {report['dask_cluster_start_s']:.1f} s")
    print(f"tiny grid ({args.tiny_requests} requests): pool {report['tiny_pool']['median_wall_s']:.2f} s, dask "
          f"{report['tiny_dask']['median_wall_s']:.2f} s, overhead per task "
          f"{report['tiny_overhead_per_task_s'] * 1000:+.0f} ms")
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
