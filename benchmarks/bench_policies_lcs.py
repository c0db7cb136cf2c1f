"""Policy kernels vs libCacheSim over a grid of working-set sizes (issue 17, items 1–2).

Workload: Zipf(α=1.0) object streams (``kvlab.traces.zipf_objects``, seed 0) of 10 M
requests over 1 k, 10 k, 100 k and 500 k objects, capacity 10 % of the objects. Both
simulators replay the same stream with independent per-block lookups in forward order
(kvlab: ``hit_semantics="independent"``, ``touch_order="tail_most_recent"``; libCacheSim:
default settings, the stream as an oracleGeneral file, via ``lcs_anchor.py``). For each
(size, policy): CPU time (``time.process_time``) of kvlab's kernel alone (``run_kernel``:
the trace's flat arrays built beforehand, compiled beforehand), of ``kvlab.replay`` (the
user's call: result frames included), and of libCacheSim's ``process_trace`` (the reader's
set-up included, so libCacheSim's time is if anything over-stated by a few µs); the three
sides interleaved, best of 3 each. Hit ratios of each side are reported; they must be
identical where the definitions match (LRU, FIFO, SIEVE, ARC, Belady — see the policies'
module docstrings). Load average is recorded before and after.

Targets (``met``): LRU ≥ 10×, ARC and Belady ≥ 3× libCacheSim at every size through
``kvlab.replay`` (the kernel alone with ``--no-replay``);
identical hits where the definitions match; with ``--baseline`` (an earlier report of this
benchmark), FIFO, S3-FIFO, SIEVE and LFU kernels no slower than there (10 % noise allowed).

Usage: ``python benchmarks/bench_policies_lcs.py --out out/bench/bench_policies_lcs.json``
(needs the ``bench`` extra: libcachesim). ``--sizes``, ``--policies``, ``--repeats``,
``--requests`` and ``--no-replay`` shorten a development run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import kvlab
from kvlab.sim import ReplayConfig
from kvlab.sim.replay import run_kernel, summarize
from kvlab.traces import zipf_objects

sys.path.insert(0, str(Path(__file__).parent))
from lcs_anchor import replay_lcs, write_oracle_general  # noqa: E402
from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

POLICIES = ("lru", "arc", "belady", "fifo", "s3fifo", "sieve", "lfu")
SIZES = (1_000, 10_000, 100_000, 500_000)
TARGETS = {"lru": 10.0, "arc": 3.0, "belady": 3.0}
NO_REGRESSION = ("fifo", "s3fifo", "sieve", "lfu")
EXACT = {"lru", "fifo", "sieve", "arc", "belady"}  # definitions that match libCacheSim's
#: a kernel counts as "no lower" than the baseline within this factor (run-to-run noise)
NOISE = 0.9


def cpu_seconds(fn) -> tuple[object, float]:  # noqa: ANN001
    """``fn()``'s result and the CPU seconds it took."""
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_policies_lcs.json"))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-replay", action="store_true", help="skip the kvlab.replay column")
    parser.add_argument("--baseline", type=Path, help="an earlier report: FIFO/S3-FIFO/SIEVE/LFU must not regress")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for num_objects in args.sizes:
            trace = zipf_objects(args.requests, num_objects, alpha=1.0, seed=0)
            capacity = max(num_objects // 10, 1)
            path = write_oracle_general(trace, Path(tmp) / f"zipf_{num_objects}.bin")
            refs = trace.block_refs
            for policy in args.policies:
                config = ReplayConfig(policy=policy, capacity_blocks=capacity, touch_order="tail_most_recent",
                                      hit_semantics="independent")
                run_kernel(trace.head(1000), config)  # compile outside the timing
                if not args.no_replay:
                    kvlab.replay(trace.head(1000), config)
                kernel_s, replay_s, lcs_s = [], [], []
                for _ in range(args.repeats):  # interleaved: kernel, replay, libCacheSim
                    run, s = cpu_seconds(lambda: run_kernel(trace, config))  # noqa: B023
                    kernel_s.append(s)
                    if not args.no_replay:
                        result, s = cpu_seconds(lambda: kvlab.replay(trace, config))  # noqa: B023
                        replay_s.append(s)
                        del result
                    (miss, _), s = cpu_seconds(lambda: replay_lcs(path, policy, capacity))  # noqa: B023
                    lcs_s.append(s)
                k_hit = summarize(trace, config, run).block_hit_ratio
                row = {"num_objects": num_objects, "policy": policy, "capacity_blocks": capacity, "refs": refs,
                       "kernel_cpu_s": min(kernel_s), "libcachesim_cpu_s": min(lcs_s),
                       "kernel_refs_per_s": refs / min(kernel_s), "libcachesim_refs_per_s": refs / min(lcs_s),
                       "kernel_ratio": min(lcs_s) / min(kernel_s),
                       "kvlab_hit_ratio": k_hit, "libcachesim_hit_ratio": 1.0 - miss,
                       "hit_ratio_gap": k_hit - (1.0 - miss), "definitions_match": policy in EXACT}
                if replay_s:
                    row |= {"replay_cpu_s": min(replay_s), "replay_refs_per_s": refs / min(replay_s),
                            "replay_ratio": min(lcs_s) / min(replay_s)}
                results.append(row)
                print(f"{num_objects:>7} {policy:<7} kernel {row['kernel_refs_per_s'] / 1e6:7.1f} M/s "
                      f"({row['kernel_ratio']:5.1f}x)  replay "
                      + (f"{row['replay_refs_per_s'] / 1e6:6.1f} M/s ({row['replay_ratio']:5.1f}x)" if replay_s
                         else "  -  ")
                      + f"  libCacheSim {row['libcachesim_refs_per_s'] / 1e6:6.2f} M/s  hit {k_hit:.5f} vs "
                      f"{1.0 - miss:.5f}", flush=True)
    column = "kernel_ratio" if args.no_replay else "replay_ratio"  # the target is the user's call
    met = {f"{r['policy']}_{column.removesuffix('_ratio')}_{r['num_objects']}": r[column] >= TARGETS[r["policy"]]
           for r in results if r["policy"] in TARGETS}
    met["exact_policies_agree"] = all(abs(r["hit_ratio_gap"]) < 1e-9 for r in results if r["definitions_match"])
    if args.baseline:
        before = {(r["num_objects"], r["policy"]): r for r in json.loads(args.baseline.read_text())["results"]}
        for r in results:
            old = before.get((r["num_objects"], r["policy"]))
            if r["policy"] in NO_REGRESSION and old is not None:
                met[f"{r['policy']}_no_regression_{r['num_objects']}"] = \
                    r["kernel_refs_per_s"] >= NOISE * old["kernel_refs_per_s"]
    report = {"benchmark": "bench_policies_lcs", "anchor": "libCacheSim (PyPI libcachesim, default settings)",
              "workload": f"Zipf(1.0), {args.requests} requests, capacity 10 % of the objects, independent lookups",
              "clock": "time.process_time, best of repeats, sides interleaved", "repeats": args.repeats,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "machine": machine_info(), "targets": TARGETS, "met": met, "results": results}
    write_report(args.out, report)
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
