"""Loading the kv-cache-tester Claude Code sample (19 conversation files, 1,367 requests, 2.2 M
block references): CPU time of ``load_trace(folder)`` beside its anchor, ``json.loads`` of the
same files (the parse every reader of the format pays, nothing checked or built).

The sides interleave round by round in one process, after one warm-up load (kernels compiled or
read from the cache). Best and median CPU time (``time.process_time``) per side, the ratio of
the medians, the load average before and after. Target: the load ≤ 3 × the bare parse.

Usage: ``python benchmarks/bench_traces_kv_cache_tester.py --out out/bench/bench_traces_kv_cache_tester.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
from pathlib import Path

from kvlab.paths import bundled_trace_path
from kvlab.traces import load_trace
from report import cpu_call, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_RATIO = 3.0
SAMPLE = "shared/data/traces/kv-cache-tester-weka-claude-code-sample"


def sample_folder() -> Path:
    """The plain sample beside the checkout (``/work/main`` or a worktree under ``/work/wt``),
    else the bundled gzip copy (``claude-code``)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / SAMPLE).is_dir():
            return parent / SAMPLE
    return bundled_trace_path("claude-code")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_traces_kv_cache_tester.json"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = sample_folder()
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    trace = load_trace(folder)  # warm-up: kernels compiled or loaded from the cache

    def parse() -> None:
        for path in files:
            raw = path.read_bytes()
            json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)

    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"load_trace": [], "json_loads": []}
    for _ in range(args.rounds):
        times["load_trace"].append(cpu_call(lambda: load_trace(folder))[0])
        times["json_loads"].append(cpu_call(parse)[0])
    load_after = os.getloadavg()
    load, anchor = statistics.median(times["load_trace"]), statistics.median(times["json_loads"])
    met = load / anchor <= TARGET_RATIO
    print(f"load_trace {load * 1e3:7.1f} ms CPU  json.loads {anchor * 1e3:7.1f} ms CPU  ratio {load / anchor:.2f}")
    print(f"{len(trace):,} requests, {trace.block_refs:,} block refs; load average before {load_before}, "
          f"after {load_after}")
    write_report(args.out, {
        "benchmark": "bench_traces_kv_cache_tester", "machine": machine_info(), "rounds": args.rounds,
        "sample": str(folder), "requests": len(trace), "block_refs": trace.block_refs,
        "anchor": "json.loads of the same files", "load_average_before": load_before,
        "load_average_after": load_after, "target_ratio": TARGET_RATIO, "met": met,
        "measured": {"ratio": load / anchor},
        "results": {"load_trace_best_cpu_s": min(times["load_trace"]), "load_trace_median_cpu_s": load,
                    "json_loads_best_cpu_s": min(times["json_loads"]), "json_loads_median_cpu_s": anchor,
                    "cpu_s": times},
    })
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
