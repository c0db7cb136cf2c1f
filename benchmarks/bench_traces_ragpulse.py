"""Loading RAGPulse: kvlab's ``load_ragpulse`` vs a plain-Python ``json`` reader of the same files.

kvlab: the polars reader, vectorised checks, segment lists, chained block keys (16-token blocks),
the Trace. Anchor: ``json.loads`` of every line of the six files, segment lists and lengths
looked up in a dict, rows sorted by timestamp — no block keys, no checks, so the anchor does
less. Also ``replay_segments`` (prefix vs segment reuse, unbounded) on the loaded trace. CPU time
(``time.process_time``), the two loaders interleaved, best of 3, after one warm-up load
(numba compiled or cached). No target (report).

Usage: ``python benchmarks/bench_traces_ragpulse.py --out out/bench/bench_traces_ragpulse.json``
(``--path`` the RAGPulse folder; default the bundled copy).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from kvlab.blend import replay_segments
from kvlab.paths import bundled_trace_path  # noqa: E402
from kvlab.traces import load_ragpulse

sys.path.insert(0, str(Path(__file__).parent))
from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

REPEATS = 3
SAMPLE = bundled_trace_path("ragpulse")  # the upstream files, gzip-compressed


def _open(path: Path) -> object:
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def plain_python(folder: Path) -> list[tuple[float, list[int], list[int]]]:
    """The anchor: every line parsed with ``json``; (ms, segment ids, segment tokens) per request in arrival order."""
    lengths = {}
    for path in sorted(folder.glob("[1-5]_*.jsonl*")):  # plain or .gz, as the loader reads them
        for line in _open(path):
            if line.strip():
                rec = json.loads(line)
                lengths[next(v for k, v in rec.items() if k.endswith("_id"))] = rec["token_length"]
    rows = []
    for line in _open(next(folder.glob("0_trace.jsonl*"))):
        if line.strip():
            rec = json.loads(line)
            ids = [i for seg in rec["hash_ids"].values() for i in seg]
            rows.append((float(rec["timestamp"]), ids, [lengths[i] for i in ids]))
    return sorted(rows, key=lambda r: r[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_traces_ragpulse.json"))
    parser.add_argument("--path", type=Path, default=SAMPLE)
    args = parser.parse_args()
    trace = load_ragpulse(args.path)  # warm-up: compile or load the kernels
    assert len(plain_python(args.path)) == len(trace)
    times: dict[str, list[float]] = {"kvlab": [], "plain_python": []}
    for _ in range(REPEATS):
        for name, fn in (("kvlab", lambda: load_ragpulse(args.path)),
                         ("plain_python", lambda: plain_python(args.path))):
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    replay_segments(trace)
    start = time.process_time()
    result = replay_segments(trace)
    replay_s = time.process_time() - start
    best = {k: min(v) for k, v in times.items()}
    report = {"benchmark": "bench_traces_ragpulse", "path": str(args.path), "requests": len(trace),
              "block_refs": trace.block_refs, "load_cpu_s": best, "ratio_anchor_over_kvlab":
              best["plain_python"] / best["kvlab"], "replay_segments_cpu_s": replay_s,
              "prefix_hit_ratio": result.summary.prefix_hit_ratio, "blend_hit_ratio": result.summary.blend_hit_ratio,
              "met": True, "machine": machine_info()}
    print(f"load_ragpulse {best['kvlab']:.3f} s CPU, plain json {best['plain_python']:.3f} s "
          f"({report['ratio_anchor_over_kvlab']:.2f}×); replay_segments {replay_s * 1e3:.1f} ms")
    out = args.out
    write_report(out, report)
    exit_unless_met(True, out)


if __name__ == "__main__":
    main()
