"""Decode coalescing (C9, cluster_sim.md §6.4): a worker's decode-only steps run as one window.

Called by the event loop after a step ends and the caller has checked that no KV events are
needed (no index) and the time model has ``decode_step_times``. Exact: the window's frames equal
those of the steps run one by one (tests/test_sim_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.prompts import output_block_key
from kvlab.sim.cluster.worker import Worker


def decode_window(worker: Worker, now: float, due: float, decode_times: Callable[[int, np.ndarray], np.ndarray],
                  config: ClusterConfig, step_chunks: list[tuple]) -> float:
        """C9: run the next decode-only steps at once while nothing can differ from running them
        one by one — every running request decoding, nothing waiting or loading, no KV events
        (no index), enough free blocks for every request's next tokens, each step ending before
        the next event due and before any request's last token. Step times are the time model's
        ``decode_step_times`` (the function the one-by-one path calls), times accumulated in order
        (``np.cumsum`` adds sequentially); each request allocates its tokens in one call (the same
        blocks leave the free queue, so hits and evictions are unchanged; only block ids may
        differ). Returns the time the window ends (``now`` if no step ran).

    Args:
        worker: the worker whose step just ended at ``now``.
        due: the earliest event that could change or observe the worker.
        decode_times: the time model's ``decode_step_times``.
        config: the cluster's configuration (block size, step sampling, α2).
        step_chunks: where the window's sampled steps go, as
            ``(worker, batch size, step numbers, start times, durations, free blocks)``.
    """
        running = worker.running
        if worker.role != "mixed" or worker.waiting or worker.num_fetching or not running:
            return now
        bs = config.block_size
        starts = np.zeros(bs, dtype=np.int64)  # starts[j]: requests taking a new block at steps k ≡ j (mod bs)
        context = 0
        for r in running:
            er = r.engine
            if not r.num_output or er.num_computed_tokens != er.num_tokens - 1:
                return now
            context += er.num_computed_tokens
            starts[-er.num_computed_tokens % bs] += 1
        limit = min(r.output_tokens - r.num_output for r in running) - 1
        if limit < 1:
            return now
        num = len(running)
        steps = np.arange(limit, dtype=np.int64)
        dts = decode_times(num, context + steps * num)
        ends = np.cumsum(np.concatenate(([now], dts)))[1:]
        taken = np.cumsum(starts[steps % bs])
        free = worker.free_blocks
        ok = (ends < due) & (taken <= free)
        k = limit if ok.all() else int(np.argmin(ok))
        if k == 0:
            return now
        dts, ends = dts[:k], ends[:k]
        seq0 = worker.step_seq
        worker.step_seq += k
        worker.busy_s = float(np.cumsum(np.concatenate(([worker.busy_s], dts)))[-1])
        worker.decode_gpu_s = float(np.cumsum(np.concatenate(([worker.decode_gpu_s], dts)))[-1])
        keep = (seq0 + 1 + np.arange(k)) % config.step_sample == 0
        if keep.any():
            t_start = np.concatenate(([now], ends[:-1]))
            step_chunks.append((worker.index, num, (seq0 + 1 + np.arange(k))[keep], t_start[keep], dts[keep],
                                     free - taken[:k][keep]))
        token_s = ends + config.output_token_overhead_s
        for r in running:
            er = r.engine
            full = (er.num_tokens + k) // bs
            er.append_block_keys(k, [output_block_key(r.index, b) for b in range(len(er.block_hashes), full)])
            worker.manager.allocate_slots(er, k)
            r.tbt.extend(np.diff(np.concatenate(([r.last_token_s], token_s))).tolist())
            r.last_token_s = float(token_s[-1])
            r.num_output += k
        return float(ends[-1])
