"""Engine-level block pool speed: kvlab's vLLM BlockPool / KVCacheManager (kvlab.engines.vllm)
beside a plain dict-and-list pool written the way the oMLX design reads
(benchmarks/dictlist_pool.py).

1. Replay of the Mooncake conversation trace one request at a time (10,000-block pool,
   classic free order): block refs/s of kvlab's object model, of the anchor, and of the
   numba replay's ``"vllm"`` mode; all three must give identical per-request hits.
2. Pool operations (allocate 16 blocks, cache them, free them in reverse, look them up
   and touch them, free again) on a 10,000-block pool: operations/s of each.

Times are CPU seconds (``time.process_time``; the machine is shared), the load average is
recorded. No target is set by the issue; the ratios are reported. Usage:
``python benchmarks/bench_blockpool.py --out out/bench/bench_blockpool.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from kvlab.engines.replay import full_block_keys, replay_requests
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.paths import bundled_trace_path
from kvlab.sim import replay
from kvlab.traces import load_trace

sys.path.insert(0, str(Path(__file__).parent))
from dictlist_pool import DictListPool, replay_dictlist  # noqa: E402
from report import cpu_call, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

CAPACITY_BLOCKS = 10_000
OPS_ROUNDS = 3_000
OPS_BLOCKS = 16



def kvlab_pool_ops() -> int:
    """One round = get_new_blocks + cache_full_blocks + free + touch + free; returns op count."""
    pool = BlockPool(CAPACITY_BLOCKS + 1, free_order="classic", block_size=16)
    ops = 0
    for r in range(OPS_ROUNDS):
        keys = [r * OPS_BLOCKS + i for i in range(OPS_BLOCKS)]
        blocks = pool.get_new_blocks(OPS_BLOCKS)
        pool.cache_full_blocks(blocks, keys, 0, OPS_BLOCKS)
        pool.free_blocks(list(reversed(blocks)))
        hits = [pool.get_cached_block(k) for k in keys]
        pool.touch(hits)
        pool.free_blocks(list(reversed(hits)))
        ops += 5 * OPS_BLOCKS
    return ops


def dictlist_pool_ops() -> int:
    pool = DictListPool(CAPACITY_BLOCKS + 1)
    ops = 0
    for r in range(OPS_ROUNDS):
        keys = [r * OPS_BLOCKS + i for i in range(OPS_BLOCKS)]
        blocks = pool.allocate(OPS_BLOCKS)
        pool.cache(blocks, keys)
        pool.free_blocks(list(reversed(blocks)))
        hits = pool.lookup(keys, OPS_BLOCKS)
        pool.touch(hits)
        pool.free_blocks(list(reversed(hits)))
        ops += 5 * OPS_BLOCKS
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_blockpool.json"))
    args = parser.parse_args()

    trace = load_trace(bundled_trace_path("conversation"))
    refs = trace.block_refs
    requests = list(zip(trace.frame["input_tokens"].to_list(), full_block_keys(trace)))
    replay(trace, capacity_blocks=CAPACITY_BLOCKS, mode="vllm", free_order="classic")  # compile
    kvlab_s, engine = cpu_call(lambda: replay_requests(trace, capacity_blocks=CAPACITY_BLOCKS, free_order="classic"))
    anchor_s, anchor_hits = cpu_call(lambda: replay_dictlist(requests, CAPACITY_BLOCKS, trace.block_size))
    kernel_s, kernel = cpu_call(lambda: replay(trace, capacity_blocks=CAPACITY_BLOCKS, mode="vllm",
                                            free_order="classic"))
    kernel_hits = kernel.requests["hit_blocks"].to_numpy()
    engine_hits = engine.requests["hit_blocks"].to_numpy()
    if not (np.array_equal(engine_hits, kernel_hits) and engine_hits.tolist() == anchor_hits):
        raise AssertionError("engine, anchor and kernel disagree on per-request hits")
    ops_kvlab_s, num_ops = cpu_call(kvlab_pool_ops)
    ops_anchor_s, _ = cpu_call(dictlist_pool_ops)
    results = {
        "engine_replay": {
            "trace": "mooncake conversation", "block_refs": refs, "capacity_blocks": CAPACITY_BLOCKS,
            "kvlab_blockpool_block_refs_per_s": refs / kvlab_s, "dictlist_block_refs_per_s": refs / anchor_s,
            "numba_vllm_mode_block_refs_per_s": refs / kernel_s,
            "ratio_kvlab_vs_dictlist": anchor_s / kvlab_s, "ratio_numba_vs_dictlist": anchor_s / kernel_s,
        },
        "pool_ops": {
            "ops": num_ops, "kvlab_ops_per_s": num_ops / ops_kvlab_s, "dictlist_ops_per_s": num_ops / ops_anchor_s,
            "ratio_kvlab_vs_dictlist": ops_anchor_s / ops_kvlab_s,
        },
    }
    report = {"benchmark": "bench_blockpool", "anchor": "plain dict-and-list pool (benchmarks/dictlist_pool.py)",
              "machine": {**machine_info(), "load_average": list(os.getloadavg())}, "timer": "process_time",
              "results": results}
    write_report(args.out, report)
    e, o = results["engine_replay"], results["pool_ops"]
    print(f"engine replay   kvlab {e['kvlab_blockpool_block_refs_per_s'] / 1e6:6.3f} M refs/s  dict-and-list "
          f"{e['dictlist_block_refs_per_s'] / 1e6:6.3f} M/s  ratio {e['ratio_kvlab_vs_dictlist']:5.2f}x  "
          f"(numba vllm mode {e['numba_vllm_mode_block_refs_per_s'] / 1e6:6.1f} M/s, "
          f"{e['ratio_numba_vs_dictlist']:.0f}x)")
    print(f"pool operations kvlab {o['kvlab_ops_per_s'] / 1e6:6.3f} M ops/s  dict-and-list "
          f"{o['dictlist_ops_per_s'] / 1e6:6.3f} M/s  ratio {o['ratio_kvlab_vs_dictlist']:5.2f}x  -> {args.out}")


if __name__ == "__main__":
    main()
