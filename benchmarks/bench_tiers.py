"""Tiered replay speed: the numba three-tier LRU kernel vs the reference TieredStore.

Workloads: the 10 M-reference Zipf object stream (1 M objects, alpha 1.0; tiers
GPU/CPU/NVMe of 20,000/80,000/300,000 blocks) and the bundled Mooncake conversation
trace (288,500 block refs; tiers of 2,000/8,000/30,000 blocks), each under write_back
with promotion and write_through with promotion. The reference store is plain Python,
request by request: it runs on the whole conversation trace and on a prefix of the Zipf
stream (``--reference-refs``, default 200,000 refs), where the kernel must agree with it
exactly (per-request hits and resident blocks per tier, every counter). Speed is block
refs/s: ``kernel`` is :func:`kvlab.tiers.replay.run_tiered`, the numba replay with its
outputs (the hit blocks per request and tier; the resident blocks per tier logged where
they change, expanded per request by the frame), ``replay`` the whole
:func:`kvlab.tiers.replay.replay_tiered` (polars frames included); the ratio is kernel
refs/s over reference refs/s. For scale (a shared machine's pace varies), the one-LRU
kernel of :func:`kvlab.sim.replay` at the summed capacity is timed on the same trace.
Target: kernel >= 30 M block refs/s for three LRU tiers on the Zipf stream, under each
write policy.

Usage: ``python benchmarks/bench_tiers.py --out out/bench/bench_tiers.json``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kvlab.sim import ReplayConfig
from kvlab.sim.replay import run_kernel
from kvlab.tiers.replay import replay_tiered, run_tiered
from kvlab.traces import Trace, load_trace, zipf_objects
from report import best_of, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_REFS_PER_S = 30e6
NAMES = ("GPU", "CPU", "NVMe")
WRITE_POLICIES = ("write_back", "write_through")


def prefix(trace: Trace, refs: int) -> Trace:
    """The first requests of ``trace`` holding at most ``refs`` block refs (the whole trace if it is shorter)."""
    n = int(np.searchsorted(trace.flat.offsets, refs, side="right")) - 1
    return trace if n >= len(trace) else trace.head(max(n, 1))


def bench(name: str, trace: Trace, capacities: list[int], write_policy: str, reference_refs: int,
          repeats: int) -> dict:
    """Time kernel, full replay and reference (on a prefix) for one configuration; check they agree."""
    flat = trace.flat  # intern once, outside the timings
    tiers = list(zip(NAMES, capacities))
    options = {"write_policy": write_policy, "promote": True}

    def kernel() -> None:
        run_tiered(flat, capacities, write_policy=write_policy)

    kernel()  # compile outside the timings
    kernel_s = best_of(kernel, repeats)
    one_lru = ReplayConfig(capacity_blocks=sum(capacities))  # the machine's pace: kvlab.sim's one-LRU kernel
    run_kernel(trace, one_lru)
    one_lru_s = best_of(lambda: run_kernel(trace, one_lru), repeats)
    replay_s = best_of(lambda: replay_tiered(trace, tiers, **options), repeats)
    result = replay_tiered(trace, tiers, **options)
    head = prefix(trace, reference_refs)
    fast = replay_tiered(head, tiers, engine="kernel", **options)
    start = time.perf_counter()
    ref = replay_tiered(head, tiers, engine="reference", **options)
    reference_s = time.perf_counter() - start
    if not (fast.requests.equals(ref.requests) and fast.tier_counters.equals(ref.tier_counters)):
        raise AssertionError(f"{name} {write_policy}: kernel and reference disagree")
    refs, ref_refs = trace.block_refs, head.block_refs
    summary = result.summary
    return {
        "workload": name, "write_policy": write_policy, "promote": True, "block_refs": refs,
        "distinct_blocks": trace.distinct_blocks, "requests": len(trace),
        "capacities_blocks": dict(zip(NAMES, capacities)),
        "block_hit_ratio": summary["block_hit_ratio"],
        "tier_hit_ratio": {t: h / refs for t, h in summary["tier_hit_blocks"].items()},
        "kernel_s": kernel_s, "kernel_block_refs_per_s": refs / kernel_s,
        "one_lru_kernel_s": one_lru_s, "one_lru_kernel_block_refs_per_s": refs / one_lru_s,
        "replay_s": replay_s, "replay_block_refs_per_s": refs / replay_s,
        "reference_block_refs": ref_refs, "reference_s": reference_s,
        "reference_block_refs_per_s": ref_refs / reference_s,
        "ratio_kernel_vs_reference": (refs / kernel_s) / (ref_refs / reference_s),
        "ratio_replay_vs_reference": (refs / replay_s) / (ref_refs / reference_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_tiers.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-refs", type=int, default=200_000)
    args = parser.parse_args()

    workloads = [
        ("zipf_1.0_10M", zipf_objects(10_000_000, 1_000_000, alpha=1.0, seed=0), [20_000, 80_000, 300_000]),
        ("mooncake_conversation", load_trace("conversation"), [2_000, 8_000, 30_000]),
    ]
    results = [bench(name, trace, caps, policy, args.reference_refs, args.repeats)
               for name, trace, caps in workloads for policy in WRITE_POLICIES]
    zipf = [r for r in results if r["workload"].startswith("zipf")]
    report = {
        "benchmark": "bench_tiers",
        "anchor": "plain-Python reference store (kvlab.tiers.store.TieredStore, replay_tiered engine='reference')",
        "machine": machine_info(),
        "targets": {"kernel_block_refs_per_s_zipf_10M_three_lru_tiers": TARGET_REFS_PER_S},
        "met": {f"throughput_zipf_{r['write_policy']}": r["block_refs"] >= 10_000_000
                and r["kernel_block_refs_per_s"] >= TARGET_REFS_PER_S for r in zipf},
        "results": results,
    }
    write_report(args.out, report)
    for r in results:
        print(f"{r['workload']:<22} {r['write_policy']:<14} {r['block_refs']:>11,} refs  kernel "
              f"{r['kernel_block_refs_per_s'] / 1e6:6.1f} M/s  replay {r['replay_block_refs_per_s'] / 1e6:6.1f} M/s  "
              f"reference {r['reference_block_refs_per_s'] / 1e6:5.3f} M/s  ratio {r['ratio_kernel_vs_reference']:6.0f}x"
              f"  (one LRU {r['one_lru_kernel_block_refs_per_s'] / 1e6:5.1f} M/s)  hit {r['block_hit_ratio']:.3f}")
    exit_unless_met(report["met"], args.out)


if __name__ == "__main__":
    main()
