"""Replay speed: the numba LRU kernel vs the plain-Python OrderedDict reference, side by side.

Workloads: the bundled Mooncake conversation trace (288,500 block refs) and a synthetic
chat trace of ≥ 10 M block refs. Both implementations replay the same trace at the same
capacity in one run; their per-request hits must agree, then speed is reported as block
refs/s and as a ratio. Targets (issue #2): kernel ≥ 50× the reference and ≥ 50 M block
refs/s on the 10 M trace.

Usage: ``python benchmarks/bench_replay.py --out out/bench/bench_replay.json`` (``make bench``)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kvlab.paths import bundled_trace_path
from kvlab.sim import ReplayConfig, replay, replay_reference
from kvlab.sim.replay import run_kernel
from kvlab.traces import ChatWorkload, Trace, chat_sessions, load_trace
from report import best_of, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_RATIO = 50.0
TARGET_REFS_PER_S = 50e6
BIG_WORKLOAD = ChatWorkload(num_sessions=11_000, mean_turns=8, system_prompt_tokens=2048, user_tokens_mean=400,
                            output_tokens_mean=300, block_size=64, session_rate_per_s=5, think_time_mean_s=60)


def bench(name: str, trace: Trace, capacity_blocks: int, repeats: int) -> dict:
    """Time kernel, full replay and reference on one trace; check they agree."""
    config = ReplayConfig(capacity_blocks=capacity_blocks)
    trace.flat  # intern once, outside the timings  # noqa: B018
    run_kernel(trace, config)  # compile outside the timings
    kernel_s = best_of(lambda: run_kernel(trace, config), repeats)
    replay_s = best_of(lambda: replay(trace, config), repeats)
    start = time.perf_counter()
    ref = replay_reference(trace, capacity_blocks=capacity_blocks)
    reference_s = time.perf_counter() - start
    if not np.array_equal(run_kernel(trace, config).hit_blocks, ref.requests["hit_blocks"].to_numpy()):
        raise AssertionError(f"{name}: kernel and reference disagree")
    refs = trace.block_refs
    return {
        "workload": name, "block_refs": refs, "distinct_blocks": trace.distinct_blocks,
        "requests": len(trace), "capacity_blocks": capacity_blocks,
        "kernel_s": kernel_s, "kernel_block_refs_per_s": refs / kernel_s,
        "replay_s": replay_s, "replay_block_refs_per_s": refs / replay_s,
        "reference_s": reference_s, "reference_block_refs_per_s": refs / reference_s,
        "ratio_kernel_vs_reference": reference_s / kernel_s,
        "ratio_replay_vs_reference": reference_s / replay_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_replay.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    conversation = load_trace(bundled_trace_path("conversation"))
    big = chat_sessions(BIG_WORKLOAD, seed=0)
    results = [
        bench("mooncake_conversation", conversation, 10_000, args.repeats),
        bench("chat_sessions_10M", big, big.distinct_blocks // 8, args.repeats),
    ]
    big_row = results[1]
    report = {
        "benchmark": "bench_replay",
        "anchor": "plain-Python OrderedDict LRU reference (kvlab.sim.replay_reference)",
        "machine": machine_info(),
        "targets": {"ratio_kernel_vs_reference": TARGET_RATIO, "kernel_block_refs_per_s_10M": TARGET_REFS_PER_S},
        "met": {
            "ratio": all(r["ratio_kernel_vs_reference"] >= TARGET_RATIO for r in results),
            "throughput_10M": big_row["block_refs"] >= 10_000_000
            and big_row["kernel_block_refs_per_s"] >= TARGET_REFS_PER_S,
        },
        "results": results,
    }
    write_report(args.out, report)
    for r in results:
        print(f"{r['workload']:<24} {r['block_refs']:>11,} refs  kernel {r['kernel_block_refs_per_s'] / 1e6:7.1f} M/s"
              f"  replay {r['replay_block_refs_per_s'] / 1e6:6.1f} M/s  reference "
              f"{r['reference_block_refs_per_s'] / 1e6:5.2f} M/s  ratio {r['ratio_kernel_vs_reference']:6.0f}x")
    exit_unless_met(report["met"], args.out)


if __name__ == "__main__":
    main()
