"""Cluster simulation speed: ``kvlab.sim.cluster.simulate`` on real traces, and beside vidur.

1. **conversation** — the whole Mooncake conversation trace (12,031 requests, ~12 k-token
   prompts, ~343 output tokens) on 16 workers (Llama-3.1-8B, H100, least-loaded router, prefix
   caching on, decode coalescing on). Target (issue 15): ≤ 60 s on this 2-core machine. Reported:
   CPU and wall seconds, simulated requests/s, events/s, engine steps/s; and the same run with
   coalescing off on the first ``--off-requests`` requests (the speed coalescing buys, frames
   identical: tests/test_sim_cluster.py).
2. **vidur** — the Azure conversation trace of ``vidur-splitwise`` (arrivals and lengths; prompts
   cut as vidur cuts them so prompt + output ≤ 4,096 tokens) through vidur 0.0.26 and kvlab side
   by side: 16 replicas/workers, round robin, prefix caching off, Llama-3-8B on A100, vidur's
   batch limits (4,096 tokens, 128 requests). vidur runs in its own venv in a child process
   (``benchmarks/vidur_anchor.py``; its profiles are partly synthesised offline — see
   ``benchmarks/README.md``); the two alternate, kvlab first, CPU time each. Reported: the ratio
   of simulated requests per CPU second (kvlab / vidur), and both sides' TTFT for orientation
   (the step-time models differ: the speed is comparable, the seconds are not).

Usage: ``python benchmarks/bench_cluster.py --out out/bench/bench_cluster.json`` (``--vidur-requests
0`` for vidur's whole trace: ~10 CPU minutes; ``--skip-vidur`` when it cannot be installed).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.sim.cluster import simulate
from kvlab.traces import Trace, load_trace

sys.path.insert(0, str(Path(__file__).parent))
from vidur_anchor import TRACE as VIDUR_TRACE  # noqa: E402
from vidur_anchor import ensure_vidur_venv, run_vidur  # noqa: E402

from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_CONVERSATION_S = 60.0
VIDUR_MAX_TOKENS = 4096


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def vidur_lengths_trace(path: Path, num_requests: int | None) -> Trace:
    """The CSV's arrivals and lengths as a Trace, prompts cut as vidur's trace generator cuts them
    (``prompt -= max(0, prompt + output − max_tokens)``, both ≥ 1), one unique key per block
    (no sharing: prefix caching is off anyway)."""
    rows = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if num_requests is not None and i >= num_requests:
                break
            prompt, output = max(1, int(row["num_prefill_tokens"])), max(1, int(row["num_decode_tokens"]))
            prompt -= max(0, prompt + output - VIDUR_MAX_TOKENS)
            rows.append((i, float(row["arrived_at"]), prompt, output))
    ids = np.array([r[0] for r in rows], dtype=np.uint64)
    keys = [list(range(i * 4096 + 1, i * 4096 + 1 - (-p // 16))) for i, _, p, _ in rows]
    frame = pl.DataFrame({"request_id": ids, "arrival_s": [r[1] for r in rows],
                          "input_tokens": pl.Series([r[2] for r in rows], dtype=pl.UInt32),
                          "output_tokens": pl.Series([r[3] for r in rows], dtype=pl.UInt32),
                          "block_keys": pl.Series(keys, dtype=pl.List(pl.UInt64))})
    return Trace(frame, block_size=16, source=f"{path}[:{len(rows)}]")


def timed(fn: object) -> tuple[object, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def conversation(off_requests: int) -> dict:
    trace = load_trace("conversation")
    result, cpu, wall = timed(lambda: simulate(trace, num_workers=16, router="least_loaded"))
    s = result.summary
    out = {"requests": s.requests, "workers": 16, "cpu_s": cpu, "wall_s": wall,
           "requests_per_cpu_s": s.requests / cpu, "events": s.events, "events_per_cpu_s": s.events / cpu,
           "steps": s.steps, "steps_per_cpu_s": s.steps / cpu, "ttft_mean_s": s.ttft_mean_s,
           "ttft_p99_s": s.ttft_p99_s, "tbt_mean_s": s.tbt_mean_s, "token_hit_ratio": s.token_hit_ratio}
    head = trace.head(off_requests)
    for coalesce in (True, False):
        _, cpu, _ = timed(lambda c=coalesce: simulate(head, num_workers=16, router="least_loaded", coalesce_decode=c))
        out[f"head_{off_requests}_cpu_s_coalesce_{'on' if coalesce else 'off'}"] = cpu
    return out


def kvlab_vidur_side(trace: Trace) -> dict:
    result, cpu, wall = timed(lambda: simulate(
        trace, num_workers=16, router="round_robin", model="Llama-3-8B", gpu="A100", enable_prefix_caching=False,
        max_num_batched_tokens=VIDUR_MAX_TOKENS, max_num_seqs=128))
    s = result.summary
    return {"requests": s.requests, "cpu_s": cpu, "wall_s": wall, "requests_per_cpu_s": s.requests / cpu,
            "steps": s.steps, "ttft_mean_s": s.ttft_mean_s, "ttft_p50_s": s.ttft_p50_s, "ttft_p99_s": s.ttft_p99_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_cluster.json"))
    parser.add_argument("--vidur-requests", type=int, default=2000, help="first rows of the vidur trace (0: all)")
    parser.add_argument("--off-requests", type=int, default=1000)
    parser.add_argument("--skip-vidur", action="store_true")
    args = parser.parse_args()
    report: dict[str, object] = {"machine": machine_info(), "loadavg_start": load()}
    report["conversation"] = conversation(args.off_requests)
    met = {"conversation_16_workers_le_60_s": report["conversation"]["cpu_s"] <= TARGET_CONVERSATION_S}
    if not args.skip_vidur:
        n = args.vidur_requests or None
        trace = vidur_lengths_trace(VIDUR_TRACE, n)
        ensure_vidur_venv()
        run_vidur(VIDUR_TRACE, num_replicas=16, num_requests=200)  # fits vidur's step-time models once (cached)
        kv = kvlab_vidur_side(trace)
        vd = run_vidur(VIDUR_TRACE, num_replicas=16, num_requests=n)
        report["vidur"] = {"kvlab": kv, "vidur": vd,
                           "ratio_requests_per_cpu_s": kv["requests_per_cpu_s"] / vd["requests_per_cpu_s"],
                           "ratio_requests_per_loop_cpu_s": kv["requests_per_cpu_s"] / vd["requests_per_loop_cpu_s"]}
    report["loadavg_end"] = load()
    report["busy"] = max(report["loadavg_start"][0], report["loadavg_end"][0]) > 1.5
    report["pid"] = os.getpid()
    write_report(args.out, report)
    conv = report["conversation"]
    print(f"conversation: {conv['requests']} requests, 16 workers: {conv['cpu_s']:.1f} CPU s "
          f"({conv['requests_per_cpu_s']:.0f} req/s, {conv['steps_per_cpu_s']:.0f} steps/s)")
    if "vidur" in report:
        v = report["vidur"]
        print(f"vidur side by side: kvlab {v['kvlab']['requests_per_cpu_s']:.0f} req/CPU s, vidur "
              f"{v['vidur']['requests_per_cpu_s']:.1f} req/CPU s: ratio {v['ratio_requests_per_cpu_s']:.1f}x")
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
