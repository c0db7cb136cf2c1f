"""Helpers of the kvlab.sim.cluster tests: small traces, and one vLLM v1 worker driven by hand.

:class:`VllmReference` is an independent re-statement of vLLM v1 ``Scheduler.schedule`` (token
budget, running first, ``running.pop()`` preemption until the request fits or is the victim,
no waiting admission in a step that preempted, waiting stops at the first that does not fit;
cluster_sim.md §6.4, rules C5, C6, C19) over kvlab's KVCacheManager + BlockPool, with the
step times of the roofline called on the batch it builds. The cluster simulation must agree
with it step by step (block tables, batches, times) on a single mixed worker without tiers.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import polars as pl

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.sim.cluster.prompts import PromptSource, output_block_key
from kvlab.sim.cluster.timing import Roofline, StepBatch
from kvlab.traces import Trace

_GOLDEN = 0x9E3779B97F4A7C15


def cluster_trace(rows: list[tuple[float, int, int, int]], *, block_size: int = 16,
                  source: str = "cluster-test") -> Trace:
    """A trace from ``(arrival_s, input_tokens, output_tokens, prompt)`` rows.

    Rows with the same ``prompt`` id share their keys block by block (the shorter one is a
    prefix of the longer one); different ids share nothing. Request ids are 0, 1, 2, ...
    """
    keys = [[(prompt * 1_000_003 + j + 1) * _GOLDEN % 2**64 for j in range(-(-n // block_size))]
            for _, n, _, prompt in rows]
    frame = pl.DataFrame({
        "request_id": pl.Series(range(len(rows)), dtype=pl.UInt64),
        "arrival_s": [float(r[0]) for r in rows],
        "input_tokens": [r[1] for r in rows],
        "output_tokens": [r[2] for r in rows],
        "block_keys": pl.Series(keys, dtype=pl.List(pl.UInt64)),
    })
    return Trace(frame, block_size=block_size, source=source)


def busy_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of half-open intervals ``[start, end)`` covering one instant."""
    points = sorted([(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s])
    depth = best = 0
    for _, d in points:  # at equal times an end (-1) sorts before a start (+1)
        depth += d
        best = max(best, depth)
    return best


class VllmReference:
    """One mixed vLLM v1 worker without tiers, driven by hand over the trace (module docstring).

    After :meth:`run`: ``steps`` (one dict per step: ``t_start_s``, ``dt_s``, batch counts,
    ``free_blocks`` after scheduling, ``num_preempted``), ``tables`` (after each scheduling
    call: request id → block ids), per request ``first_token_s``, ``finish_s``, ``preemptions``,
    ``recomputed_tokens``, ``computed_prefill_tokens``, ``tokens_at_preemption`` (the tokens a
    request held when first preempted), and ``pool``.
    """

    def __init__(self, trace: Trace, *, capacity_blocks: int, block_size: int = 16,
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, enable_caching: bool = True,
                 time_model: object = None) -> None:
        self.bs, self.budget, self.max_seqs = block_size, max_num_batched_tokens, max_num_seqs
        self.time_model = time_model or Roofline()
        self.pool = BlockPool(capacity_blocks + 1, block_size=block_size, enable_caching=enable_caching)
        self.mgr = KVCacheManager(self.pool, block_size=block_size, enable_caching=enable_caching)
        prompts = PromptSource(trace, block_size)
        f = trace.frame
        self.arrivals = f["arrival_s"].to_list()
        self.outputs = f["output_tokens"].to_list()
        self.reqs = [Request.from_block_keys(f"r{i}", n, prompts.engine_keys(i))
                     for i, n in enumerate(f["input_tokens"].to_list())]
        n = len(self.reqs)
        self.num_output = [0] * n
        self.first_token_s: list[float | None] = [None] * n
        self.finish_s: list[float | None] = [None] * n
        self.preemptions = [0] * n
        self.recomputed_tokens = [0] * n
        self.computed_prefill_tokens = [0] * n
        self.tokens_at_preemption: list[int | None] = [None] * n
        self.computed_at_preemption = [0] * n  # the furthest a request had computed when preempted
        self.steps: list[dict] = []
        self.tables: list[dict[str, list[int]]] = []

    def _schedule(self, running: list[int], waiting: deque[int]) -> tuple[list, list, list]:
        prefill, decode, preempted = [], [], []
        budget = self.budget
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            req = self.reqs[r]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            context = req.num_computed_tokens
            fits = True
            while self.mgr.allocate_slots(req, n) is None:
                victim = running.pop()  # vLLM: the last admitted goes (C5)
                vr = self.reqs[victim]
                if self.tokens_at_preemption[victim] is None:
                    self.tokens_at_preemption[victim] = vr.num_tokens
                self.computed_at_preemption[victim] = max(self.computed_at_preemption[victim], vr.num_computed_tokens)
                self.mgr.preempt(vr)  # blocks freed, they stay cached (C19)
                self.preemptions[victim] += 1
                preempted.append(victim)
                if victim == r:
                    fits = False
                    break
            if not fits:
                break
            self._add(prefill, decode, r, n, context)
            budget -= n
            i += 1
        for victim in preempted:
            waiting.appendleft(victim)
        if preempted:
            return prefill, decode, preempted  # C6
        while waiting and budget > 0 and len(running) < self.max_seqs:
            r = waiting[0]
            req = self.reqs[r]
            blocks, hit = self.mgr.get_computed_blocks(req)
            n = min(req.num_tokens - hit, budget)
            if self.mgr.allocate_slots(req, n, hit, blocks) is None:
                break
            waiting.popleft()
            running.append(r)
            self._add(prefill, decode, r, n, hit)
            budget -= n
        return prefill, decode, preempted

    def _add(self, prefill: list, decode: list, r: int, n: int, context: int) -> None:
        req = self.reqs[r]
        if self.num_output[r] and n == 1 and req.num_computed_tokens == req.num_tokens:
            decode.append((r, context))
        else:
            prefill.append((r, n, context))

    def run(self) -> VllmReference:
        """Serve every request; returns ``self``."""
        n = len(self.reqs)
        running: list[int] = []
        waiting: deque[int] = deque()
        nxt, t, done = 0, 0.0, 0
        while done < n:
            while nxt < n and self.arrivals[nxt] <= t:
                waiting.append(nxt)
                nxt += 1
            if not running and not waiting:
                t = self.arrivals[nxt]
                continue
            prefill, decode, preempted = self._schedule(running, waiting)
            self.tables.append({f"r{i}": self.mgr.get_block_ids(f"r{i}") for i in range(n)})
            num_preempted = len(preempted)
            if not prefill and not decode:
                assert preempted, "stuck: nothing runs"
                prefill, decode, preempted = self._schedule(running, waiting)
                self.tables.append({f"r{i}": self.mgr.get_block_ids(f"r{i}") for i in range(n)})
                num_preempted = len(preempted)
            batch = StepBatch(prefill=[(k, c) for _, k, c in prefill], decode=[c for _, c in decode])
            dt = self.time_model.step_time(batch).step_s
            self.steps.append({"t_start_s": t, "dt_s": dt, "num_prefill_requests": len(prefill),
                               "num_prefill_tokens": sum(k for _, k, _ in prefill), "num_decode": len(decode),
                               "num_running": len(running), "num_waiting": len(waiting),
                               "free_blocks": self.pool.get_num_free_blocks(), "num_preempted": num_preempted})
            t += dt
            for r, k, context in prefill:
                self.computed_prefill_tokens[r] += k  # recomputed: positions computed before a preemption
                self.recomputed_tokens[r] += max(0, min(context + k, self.computed_at_preemption[r]) - context)
            for r in [p[0] for p in prefill] + [d[0] for d in decode]:
                req = self.reqs[r]
                if req.num_computed_tokens != req.num_tokens:
                    continue
                self.num_output[r] += 1
                if self.first_token_s[r] is None:
                    self.first_token_s[r] = t
                if self.num_output[r] >= self.outputs[r]:
                    self.mgr.free(req)
                    running.remove(r)
                    self.finish_s[r] = t
                    done += 1
                else:
                    full = (req.num_tokens + 1) // self.bs
                    req.append_block_keys(1, [output_block_key(r, full - 1)] if full > len(req.block_hashes) else [])
        return self

    def cached_map(self) -> dict[int, list[int]]:
        """Block key → ids of the blocks caching it (the prefix cache's content)."""
        return cache_map(self.pool)


def cache_map(pool: BlockPool) -> dict[int, list[int]]:
    """A pool's block key → sorted ids of the blocks caching it."""
    return {int(k): sorted(v) for k, v in pool.cached_block_hash_to_block.items() if v}


def free_order(pool: BlockPool) -> list[int]:
    """A pool's free queue, head (next evicted) to tail, as block ids."""
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def record_tables(worker: object, num_requests: int) -> list[dict[str, list[int]]]:
    """Wrap ``worker.schedule`` (instance attribute) to record every block table after each call."""
    tables: list[dict[str, list[int]]] = []
    schedule = worker.schedule

    def recorded(now: float, fetches: list) -> object:
        plan = schedule(now, fetches)
        tables.append({f"r{i}": worker.manager.get_block_ids(f"r{i}") for i in range(num_requests)})
        return plan

    worker.schedule = recorded
    return tables


def as_array(values: list[float | None]) -> np.ndarray:
    """Floats with ``None`` as NaN."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
