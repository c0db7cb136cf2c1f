"""Peak memory of a 10 M-reference replay, against the size of its input arrays.

A child process loads only the flat trace arrays (offsets, block ids, input lengths) of a
10 M-request Zipf trace from ``.npy`` files, compiles the LRU kernel on a tiny trace,
then replays the full trace; the growth of its peak RSS (``VmHWM``) during the replay is
compared with the input arrays' bytes. Target (issue #5): ≤ 2×.

Usage: ``python benchmarks/bench_memory.py --out out/bench/bench_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvlab.traces import zipf_objects
from report import machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET = 2.0
CHILD = r"""
import json, sys
import numpy as np
from kvlab.sim.replay import ReplayConfig, run_flat
from kvlab.traces.flat import FlatTrace

def peak_rss():  # VmHWM: this address space's peak (ru_maxrss would carry the parent's across exec)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

d = sys.argv[1]
offsets, block_ids, input_tokens = (np.load(f"{d}/{n}.npy") for n in ("offsets", "block_ids", "input_tokens"))
num_keys = int(block_ids.max()) + 1
flat = FlatTrace(offsets, block_ids, np.arange(num_keys, dtype=np.uint64), input_tokens, 1)
tiny = FlatTrace(offsets[:3] - offsets[0], block_ids[:2], flat.keys, input_tokens[:2], 1)
config = ReplayConfig(capacity_blocks=100_000)
run_flat(tiny, config)  # compile before measuring
before = peak_rss()
run = run_flat(flat, config)
after = peak_rss()
print(json.dumps({"rss_growth_bytes": after - before, "hits": int(run.hit_blocks.sum())}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_memory.json"))
    args = parser.parse_args()
    flat = zipf_objects(10_000_000, 1_000_000, alpha=1.0, seed=0).flat
    arrays = {"offsets": flat.offsets, "block_ids": flat.block_ids, "input_tokens": flat.input_tokens}
    input_bytes = sum(a.nbytes for a in arrays.values())
    with tempfile.TemporaryDirectory() as tmp:
        for name, array in arrays.items():
            np.save(Path(tmp) / f"{name}.npy", array)
        out = subprocess.run([sys.executable, "-c", CHILD, tmp], capture_output=True, text=True, check=True)
    child = json.loads(out.stdout)
    ratio = child["rss_growth_bytes"] / input_bytes
    report = {"benchmark": "bench_memory", "refs": flat.num_refs, "input_array_bytes": input_bytes,
              "replay_peak_rss_growth_bytes": child["rss_growth_bytes"], "ratio": ratio, "target": TARGET,
              "met": ratio <= TARGET, "machine": machine_info()}
    write_report(args.out, report)
    print(f"10M-reference LRU replay: peak RSS grew {child['rss_growth_bytes'] / 2**20:.0f} MiB for "
          f"{input_bytes / 2**20:.0f} MiB of input arrays: {ratio:.2f}x (target <= {TARGET}x) -> {args.out}")
    if not report["met"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
