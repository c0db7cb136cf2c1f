"""Load CPU time of the Bailian / Qwen and ServeGen offline readers on files of the published
traces' size (the real files are not obtainable here: Git-LFS objects, and ServeGen's offline
files are above the snapshot size limit), written by a seeded generator of the same shape:

* Bailian: 43,058 requests (trace A's count), sessions of 1–6 turns that extend their parent's
  ids, four shared system prompts, ~1 % of ids repeated under another prefix (the per-block
  hashing §2.2 describes), 16-token blocks;
* ServeGen: 50,954 requests (trace_c's count), a 23-block shared prefix and 3–6 own blocks.

Each file is read by both paths of :mod:`kvlab.traces.jsonl_fields`, interleaved: the columnar
fast path (a plain file) and the line-by-line path (the same records after one blank line),
CPU time by ``time.process_time``, best of ``--repeats``.

    PYTHONPATH=$PWD python benchmarks/bench_trace_loaders.py [--scale 0.1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from kvlab.traces import load_trace  # noqa: E402
from report import machine_info, write_report  # noqa: E402

OUT = Path(__file__).parent / "results" / "bench_trace_loaders.json"


def write_bailian(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    systems = [list(range(s * 100, s * 100 + int(rng.integers(5, 60)))) for s in range(4)]
    next_id = 10_000
    open_chats: list[tuple[int, list[int], int]] = []  # (chat_id, ids, turn)
    t = 0.0
    with open(path, "w") as fh:
        for chat in range(n):
            t += float(rng.exponential(1 / 6.0))
            if open_chats and rng.random() < 0.45:
                parent, ids, turn = open_chats.pop(int(rng.integers(len(open_chats))))
                ids, turn = list(ids), turn + 1
            else:
                parent, ids, turn = -1, list(systems[int(rng.integers(4))]), 1
            new = int(rng.integers(5, 130))
            fresh = list(range(next_id, next_id + new))
            next_id += new
            if rng.random() < 0.3:  # a block whose content recurs under another prefix
                fresh[0] = int(rng.integers(10_000, next_id))
            ids += fresh
            n_in = 16 * len(ids) - int(rng.integers(0, 16))
            fh.write(json.dumps({"chat_id": chat, "parent_chat_id": parent, "timestamp": round(t, 3),
                                 "input_length": n_in, "output_length": int(rng.integers(1, 800)),
                                 "type": "text", "turn": turn, "hash_ids": ids}) + "\n")
            if turn < 6:
                open_chats.append((chat, ids, turn))
            if len(open_chats) > 2000:
                open_chats.pop(0)


def write_servegen(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    prefix = list(range(655296, 655319))
    fresh = 655319
    with open(path, "w") as fh:
        for r in range(n):
            own = int(rng.integers(3, 7))
            ids = prefix + list(range(fresh, fresh + own))
            fresh += own
            n_in = 16 * len(ids) - int(rng.integers(0, 16))
            fh.write(json.dumps({"request_id": r, "type": "multimodal", "input_length": n_in, "hash_ids": ids,
                                 "img_ids": [f"img_{r + 1:05d}"]}) + "\n")


def cpu_seconds(path: Path, **options: object) -> tuple[float, object]:
    start = time.process_time()
    trace = load_trace(path, **options)
    return time.process_time() - start, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help=f"the JSON report (default {OUT})")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, writer, n, options in (("bailian", write_bailian, 43_058, {}),
                                         ("servegen", write_servegen, 50_954, {"rate_per_s": 10.0})):
            plain = Path(tmp) / f"{name}.jsonl"
            writer(plain, max(1, math.ceil(n * args.scale)))
            blank = Path(tmp) / f"{name}_blank.jsonl"
            blank.write_bytes(b"\n" + plain.read_bytes())  # a blank first line: the line-by-line path
            cpu_seconds(plain, **options)  # compile the chaining kernels once
            fast, slow = [], []
            for _ in range(args.repeats):  # interleaved
                t, trace = cpu_seconds(plain, **options)
                fast.append(t)
                t, again = cpu_seconds(blank, **options)
                slow.append(t)
                assert again.frame.equals(trace.frame)
            results[name] = {"requests": len(trace), "block_refs": trace.block_refs,
                             "distinct_blocks": trace.distinct_blocks, "file_bytes": plain.stat().st_size,
                             "columnar_cpu_s": min(fast), "by_line_cpu_s": min(slow),
                             "provenance": {k: v for k, v in trace.provenance.items() if k not in ("path", "notes")}}
            print(f"{name}: {len(trace):,} requests, {trace.block_refs:,} refs, {plain.stat().st_size / 1e6:.1f} MB: "
                  f"columnar {min(fast):.2f} s CPU, line by line {min(slow):.2f} s CPU")
    write_report(args.out, {"benchmark": "trace_loaders", "scale": args.scale, "machine": machine_info(),
                            "results": results})
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()
