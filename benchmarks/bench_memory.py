"""Peak memory of ``kvlab.replay`` at 1 M, 10 M and 100 M references (issue 17, item 4).

Workload: ``zipf_objects(n, n // 10, alpha=1.0, seed=0)`` — ``n`` one-block requests over
``n / 10`` objects, the issue's 10 M-request stream scaled (the hardest case per reference:
one request per block, so every per-request array is as long as the block references) —
replayed through LRU with 100,000 blocks, ``hit_semantics="independent"``,
``touch_order="tail_most_recent"``, the default bounded timeline. Each size runs in a fresh
child process, which compiles the kernel on a tiny trace first, then builds the trace, its
flat arrays and the result; it reads its peak RSS (``VmHWM``) and its RSS (``VmRSS``) after
each stage and the bytes of what it holds (trace frame, flat arrays, result frames). Targets: peak RSS ≤ 8 GiB at
100 M references, and cost linear in references (peak RSS above the import's, per reference, at
the largest size ≤ 1.25× the smallest of all sizes).

Usage: ``python benchmarks/bench_memory.py [--sizes 1000000 10000000 100000000]
[--out out/bench/bench_memory.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

PEAK_TARGET_BYTES = 8 * 2**30
LINEAR_TARGET = 1.25
CHILD = r"""
import json, sys, time
import numpy as np
import kvlab
from kvlab.traces import zipf_objects

def rss(field):  # VmHWM: this address space's peak (ru_maxrss would carry the parent's across exec)
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

n = int(sys.argv[1])
config = dict(capacity_blocks=100_000, hit_semantics="independent", touch_order="tail_most_recent")
kvlab.replay(zipf_objects(100, 10, seed=0), **config)  # compile before measuring
stages, held = {"imported": rss("VmHWM")}, {"imported": rss("VmRSS")}
cpu = time.process_time()
trace = zipf_objects(n, n // 10, alpha=1.0, seed=0)
stages["trace"], held["trace"] = rss("VmHWM"), rss("VmRSS")
flat = trace.flat
stages["flat"], held["flat"] = rss("VmHWM"), rss("VmRSS")
result = kvlab.replay(trace, **config)
stages["replay"], held["replay"] = rss("VmHWM"), rss("VmRSS")
print(json.dumps({
    "refs": flat.num_refs, "requests": flat.num_requests, "peak_rss_bytes": stages["replay"],
    "peak_rss_after_stage_bytes": stages, "rss_after_stage_bytes": held, "cpu_s": time.process_time() - cpu,
    "held_bytes": {
        "trace_frame": trace.frame.estimated_size(),
        "flat_arrays": sum(getattr(flat, a).nbytes for a in ("offsets", "block_ids", "keys", "input_tokens")),
        "requests_frame": result.requests.estimated_size(),
        "timeline_frame": result.timeline.estimated_size(),
    },
    "timeline_rows": result.timeline.height, "block_hit_ratio": result.summary.block_hit_ratio,
}))
"""


def measure(num_refs: int) -> dict[str, object]:
    """Run one size in a fresh child process; its JSON line as a dict."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(num_refs)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_memory.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs = []
    for size in args.sizes:
        run = measure(size)
        run["peak_rss_bytes_per_ref"] = run["peak_rss_bytes"] / run["refs"]
        base = run["peak_rss_after_stage_bytes"]["imported"]
        run["peak_rss_above_import_bytes_per_ref"] = (run["peak_rss_bytes"] - base) / run["refs"]
        runs.append(run)
        held = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in run["held_bytes"].items())
        stage = next(k for k, v in run["peak_rss_after_stage_bytes"].items() if v == run["peak_rss_bytes"])
        print(f"{run['refs']:>12,} refs: peak RSS {run['peak_rss_bytes'] / 2**30:.2f} GiB, reached by stage {stage!r} "
              f"({run['peak_rss_above_import_bytes_per_ref']:.1f} B/ref above the import), {run['cpu_s']:.1f} s CPU; "
              f"holds {held}", flush=True)
    largest, per_ref = runs[-1], [r["peak_rss_above_import_bytes_per_ref"] for r in runs]
    met = {"peak_rss_le_8GiB_at_largest": largest["peak_rss_bytes"] <= PEAK_TARGET_BYTES,
           "linear_in_refs": per_ref[-1] <= LINEAR_TARGET * min(per_ref)}
    report = {"benchmark": "bench_memory", "workload": "zipf_objects(n, n // 10, alpha=1.0, seed=0), LRU "
              "capacity 100,000, independent hits, tail_most_recent, default timeline_points",
              "runs": runs, "peak_target_bytes": PEAK_TARGET_BYTES, "linear_target": LINEAR_TARGET, "met": met,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "machine": machine_info()}
    write_report(args.out, report)
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
