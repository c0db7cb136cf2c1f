"""Token-count traces (issue 19, loader 3): load CPU time of the real Azure and Vidur CSVs, and the
cluster simulation on the first 2,000 Azure requests.

1. **load** — ``load_trace`` on ``azure-llm-2023/AzureLLMInferenceTrace_conv.csv`` and
   ``vidur-splitwise/splitwise_conv.csv`` (19,366 requests each: CSV read, every cell checked,
   exact ns times for Azure, placeholder keys, the flat form), interleaved with the anchor: polars'
   bare ``read_csv`` of the same file with the columns' dtypes (no checks, no trace). Best CPU
   time of ``--repeats`` each. Target: each load ≤ 1 CPU second (a loader fast enough that the
   file, not kvlab, is what a user waits for; 19 k rows).
2. **simulate** — ``kvlab.sim.cluster.simulate`` on the first ``--requests`` Azure requests with
   the default ``ClusterConfig`` (one Llama-3.1-8B worker on an H100, vLLM v1 scheduling, prefix
   caching on: nothing can hit), CPU time of one run; reported beside it: TTFT p50/p99 and the
   hit ratio (0: no block identity). Target: ≤ 30 CPU s.

Usage: ``python benchmarks/bench_token_counts.py --out out/bench/bench_token_counts.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from kvlab.paths import bundled_trace_path  # noqa: E402
from kvlab.sim.cluster import simulate  # noqa: E402
from kvlab.traces import load_trace  # noqa: E402
from report import cpu_call, exit_unless_met, machine_info, write_report  # noqa: E402

FILES = {"azure": (bundled_trace_path("azure-conv"),  # the bundled gzip copies: both sides decompress
                   {"TIMESTAMP": pl.String, "ContextTokens": pl.Int64, "GeneratedTokens": pl.Int64}),
         "vidur": (bundled_trace_path("splitwise-conv"),
                   {"arrived_at": pl.Float64, "num_prefill_tokens": pl.Int64, "num_decode_tokens": pl.Int64})}
LOAD_TARGET_CPU_S = 1.0
SIMULATE_TARGET_CPU_S = 30.0



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_token_counts.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2_000)
    args = parser.parse_args()
    load_trace(FILES["vidur"][0]).flat  # noqa: B018 - numba kernels compiled or read from cache first
    loads: dict[str, dict[str, object]] = {}
    for name, (path, schema) in FILES.items():
        ours, anchor = [], []
        for _ in range(args.repeats):  # interleaved: kvlab, then the anchor
            ours.append(cpu_call(lambda p=path: load_trace(p).flat)[0])
            anchor.append(cpu_call(lambda p=path, s=schema: pl.read_csv(p, schema=s))[0])
        trace = load_trace(path)
        loads[name] = {"path": str(path), "requests": len(trace), "block_refs": trace.block_refs,
                       "load_cpu_s": min(ours), "polars_read_csv_cpu_s": min(anchor),
                       "ratio_to_polars": min(ours) / min(anchor) if min(anchor) > 0 else None}
    head = load_trace(FILES["azure"][0]).head(args.requests)
    sim_cpu, result = cpu_call(lambda: simulate(head))
    s = result.summary
    simulated = {"requests": s.requests, "completed": s.completed_requests, "cpu_s": sim_cpu,
                 "wall_s": s.wall_s, "ttft_p50_s": s.ttft_p50_s, "ttft_p99_s": s.ttft_p99_s,
                 "token_hit_ratio": s.token_hit_ratio, "block_identity": s.block_identity, "steps": s.steps}
    met = {f"load_{name}_le_{LOAD_TARGET_CPU_S}s": r["load_cpu_s"] <= LOAD_TARGET_CPU_S for name, r in loads.items()}
    met[f"simulate_{args.requests}_le_{SIMULATE_TARGET_CPU_S}s"] = sim_cpu <= SIMULATE_TARGET_CPU_S
    for name, r in loads.items():
        print(f"{name}: load {r['load_cpu_s']:.3f} CPU s (polars read_csv {r['polars_read_csv_cpu_s']:.3f} s)")
    print(f"simulate {args.requests} Azure requests: {sim_cpu:.2f} CPU s, TTFT p50 {s.ttft_p50_s:.4f} s")
    write_report(args.out, {"machine": machine_info(), "repeats": args.repeats, "loads": loads,
                            "simulate": simulated, "met": met})
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
