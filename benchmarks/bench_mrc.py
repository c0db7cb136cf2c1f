"""Miss-ratio curve in one pass (kvlab.sim.mrc) vs one simulation per capacity.

Workloads: the two bundled Mooncake traces (conversation: 288,500 block refs;
synthetic: 121,877), each at the same 100 log-spaced capacities (100 blocks … the working
set). Side by side in one run:

* ``kvlab.sim.mrc`` — Mattson stack distances with a Fenwick tree, one pass, every
  capacity (LRU, prefix semantics, head most recent);
* anchor 1: 100 separate libCacheSim LRU runs (PyPI ``libcachesim``, GPL, the ``bench``
  extra) over the trace's block stream written once as an ``oracleGeneral`` file
  (:mod:`lcs_anchor`), timed over ``process_trace`` only. libCacheSim is a plain object
  cache: every block is looked up on its own, so its hit ratios are checked against
  kvlab's ``hit_semantics="independent"``, ``touch_order="tail_most_recent"`` replay
  (they must agree exactly), not against ``mrc``'s prefix semantics — the speed
  comparison is per capacity on the same block stream;
* anchor 2: 100 separate kvlab replays (``kvlab.sim.sweep`` serial, and with its default
  thread pool), whose rows ``mrc`` must equal exactly.

Target: ``mrc`` ≥ 20× faster than the 100 libCacheSim runs on each trace.

Usage: ``python benchmarks/bench_mrc.py --out out/bench/bench_mrc.json`` (``make bench``;
needs the ``bench`` extra: libcachesim).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from polars.testing import assert_frame_equal

from kvlab.paths import bundled_trace_path
from kvlab.sim import sweep
from kvlab.sim.mrc import mrc
from kvlab.traces import Trace, load_trace

sys.path.insert(0, str(Path(__file__).parent))
from lcs_anchor import libcachesim, replay_lcs, write_oracle_general  # noqa: E402  (exits if libcachesim is missing)
from report import best_of, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_RATIO_VS_LIBCACHESIM = 20.0
N_CAPACITIES = 100


def capacity_grid(trace: Trace) -> list[int]:
    """``N_CAPACITIES`` distinct log-spaced capacities from 100 blocks to the working set."""
    grid = np.unique(np.geomspace(100, trace.distinct_blocks, N_CAPACITIES).astype(np.int64)).tolist()
    if len(grid) != N_CAPACITIES:
        raise AssertionError(f"capacity grid has {len(grid)} points, not {N_CAPACITIES}")
    return grid


def bench(name: str, trace: Trace, path: Path, repeats: int) -> dict:
    """Time mrc, 100 kvlab replays and 100 libCacheSim runs on one trace; check agreement."""
    caps = capacity_grid(trace)
    trace.flat  # intern once, outside the timings  # noqa: B018
    curve = mrc(trace, capacities_blocks=caps)  # compile outside the timings
    mrc_s = best_of(lambda: mrc(trace, capacities_blocks=caps), repeats)

    sweep(trace, caps[:2], executor="serial")  # compile
    start = time.perf_counter()
    replays = sweep(trace, caps, executor="serial")
    replays_serial_s = time.perf_counter() - start
    start = time.perf_counter()
    sweep(trace, caps)
    replays_threads_s = time.perf_counter() - start
    assert_frame_equal(curve, replays)  # exact: block hits, token ratio, evictions at every capacity

    independent = sweep(trace, caps, touch_order="tail_most_recent", hit_semantics="independent")
    lcs_hits, lcs_s = [], 0.0
    for cap in caps:
        miss, seconds = replay_lcs(path, "lru", cap)
        lcs_hits.append(1.0 - miss)
        lcs_s += seconds
    gap = np.abs(np.array(lcs_hits) - independent["block_hit_ratio"].to_numpy())
    if gap.max() > 1e-9:
        raise AssertionError(f"{name}: libCacheSim and kvlab independent LRU disagree (max gap {gap.max():.3g})")
    refs = trace.block_refs
    return {
        "workload": name, "block_refs": refs, "distinct_blocks": trace.distinct_blocks, "requests": len(trace),
        "capacities": len(caps), "capacity_min_blocks": caps[0], "capacity_max_blocks": caps[-1],
        "mrc_s": mrc_s, "mrc_block_refs_per_s": refs / mrc_s,
        "kvlab_replays_serial_s": replays_serial_s, "kvlab_replays_threads_s": replays_threads_s,
        "libcachesim_runs_s": lcs_s, "libcachesim_block_refs_per_s": refs * len(caps) / lcs_s,
        "ratio_mrc_vs_libcachesim": lcs_s / mrc_s,
        "ratio_mrc_vs_kvlab_replays_serial": replays_serial_s / mrc_s,
        "ratio_mrc_vs_kvlab_replays_threads": replays_threads_s / mrc_s,
        "mrc_equals_kvlab_replays": True,
        "libcachesim_vs_kvlab_independent_max_gap": float(gap.max()),
        "curve": pl.DataFrame({
            "capacity_blocks": caps,
            "mrc_prefix_block_hit_ratio": curve["block_hit_ratio"],
            "mrc_prefix_token_hit_ratio": curve["token_hit_ratio"],
            "kvlab_independent_block_hit_ratio": independent["block_hit_ratio"],
            "libcachesim_hit_ratio": lcs_hits,
        }).to_dicts(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_mrc.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("conversation", "synthetic"):
            trace = load_trace(bundled_trace_path(name))
            path = write_oracle_general(trace, Path(tmp) / f"{name}.oracleGeneral.bin")
            results.append(bench(f"mooncake_{name}", trace, path, args.repeats))
    report = {
        "benchmark": "bench_mrc",
        "anchor": "100 libCacheSim LRU runs (PyPI libcachesim, oracleGeneral block stream, process_trace only); "
                  "second anchor: 100 kvlab replays (kvlab.sim.sweep)",
        "machine": {**machine_info(), "libcachesim": getattr(libcachesim, "__version__", "?")},
        "targets": {"ratio_mrc_vs_libcachesim": TARGET_RATIO_VS_LIBCACHESIM},
        "met": {"ratio": all(r["ratio_mrc_vs_libcachesim"] >= TARGET_RATIO_VS_LIBCACHESIM for r in results),
                "mrc_equals_replays": all(r["mrc_equals_kvlab_replays"] for r in results),
                "libcachesim_agrees": all(r["libcachesim_vs_kvlab_independent_max_gap"] <= 1e-9 for r in results)},
        "results": results,
    }
    write_report(args.out, report)
    for r in results:
        print(f"{r['workload']:<24} {r['block_refs']:>9,} refs x {r['capacities']} capacities: "
              f"mrc {r['mrc_s'] * 1e3:7.1f} ms | 100 libCacheSim runs {r['libcachesim_runs_s']:6.2f} s "
              f"({r['ratio_mrc_vs_libcachesim']:6.0f}x) | 100 kvlab replays "
              f"{r['kvlab_replays_serial_s']:5.2f} s serial "
              f"({r['ratio_mrc_vs_kvlab_replays_serial']:5.0f}x), {r['kvlab_replays_threads_s']:5.2f} s threads "
              f"({r['ratio_mrc_vs_kvlab_replays_threads']:5.0f}x)")
    exit_unless_met(report["met"], args.out)


if __name__ == "__main__":
    main()
