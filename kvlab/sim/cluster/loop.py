"""The cluster's one event loop (cluster_sim.md §6.1, §6.3; rules C1–C4, C9, C18, C24).

A ``heapq`` of ``(time_s, prio, worker, seq, kind, payload)`` — no SimPy (C1). At equal time:
KV deliveries (0) → arrivals and routing (1) → link completions: tier fetches, cache transfers,
P/D handoffs (2) → step ends (3) → load snapshots (4); then the lower worker index (cluster
events carry -1), then push order (C2). A worker given work while idle gets a step at the same
instant, after every arrival of that instant (C3). Decode coalescing (C9): a step that would end
before any event that could change or observe its worker (the next arrival or snapshot, a link
completion of its own) is ended inline instead of through the heap — the same operations in the
same order, so the frames are identical on and off.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from collections import deque

import numpy as np

from kvlab.engines.vllm.request import Request
from kvlab.sim.cluster.coalesce import decode_window
from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.estimates import CostEstimates
from kvlab.sim.cluster.kv_events import KvEventPath
from kvlab.sim.cluster.links import Link
from kvlab.sim.cluster.prompts import PromptSource
from kvlab.sim.cluster.routers import ClusterView, Decision, LeastLoaded, RequestView, Router, WorkerLoad, get_router
from kvlab.sim.cluster.state import SimRequest
from kvlab.sim.cluster.tier_store import STORE_POD, build_stores
from kvlab.sim.cluster.timing import StepBatch, StepTime
from kvlab.sim.cluster.worker import Plan, Worker
from kvlab.tiers.cost import offload_time_s

KV_DELIVER, ARRIVAL, LINK_DONE, STEP_END, SNAPSHOT = range(5)
_CLUSTER = -1


class ClusterLoop:
    """The simulation state and its event loop; :func:`~kvlab.sim.cluster.simulate` runs it.

    Args:
        trace_frame_rows: ``(request_id, arrival_s, input_tokens, output_tokens)`` per request, in
            arrival order.
        prompts: the trace's :class:`~kvlab.sim.cluster.prompts.PromptSource`.
        config: the :class:`~kvlab.sim.cluster.config.ClusterConfig`.
    """

    def __init__(self, rows: list[tuple[int, float, int, int]], prompts: PromptSource, config: ClusterConfig,
                 progress: object = None) -> None:
        self.config = config
        self.prompts = prompts
        self.progress = progress
        self.estimates = CostEstimates(config)
        self.time_model = self.estimates.time_model
        self._decode_times = self.estimates.decode_times
        router = config.router if config.router is not None else LeastLoaded()
        self.router: Router = copy.deepcopy(get_router(router) if isinstance(router, str) else router)
        if not isinstance(self.router, Router):
            raise ValueError(f"router must be a kvlab.sim.cluster Router or a router name, got {router!r}")
        stores = build_stores(config, publish=self.router.uses_index)
        self.workers = [Worker(i, role, config, kv_events=self.router.uses_index, store=stores[i])
                        for i, role in enumerate(config.roles)]
        self.requests = [SimRequest(i, rid, t, n, m) for i, (rid, t, n, m) in enumerate(rows)]
        self.heap: list[tuple] = []
        self.seq = 0
        self.now = 0.0
        self.events = 0
        self.step_rows: list[tuple] = []
        self.step_chunks: list[tuple] = []  # decode windows: (worker, size, steps, starts, dts, free blocks)
        self.transfer_rows: list[tuple] = []
        self.link_due: dict[str, tuple[float, int]] = {}
        self.pending_enqueues: deque[float] = deque()  # times of queued α0-delayed enqueues
        self.next_arrival = 0
        self.next_snapshot = math.inf
        self.snapshot: dict[str, WorkerLoad] | None = None
        faults = config.faults
        random_faults = faults is not None and (faults.jitter_s or faults.loss_p or faults.duplicate_p or faults.swap_p)
        self.coalesce = config.coalesce_decode and not random_faults
        self.kv_events = KvEventPath(config, prompts, self.router.uses_index,
                                     lambda t, worker, d: self.push(t, KV_DELIVER, worker, "kv", d))
        self.index, self.ingestor = self.kv_events.index, self.kv_events.ingestor
        routable = [w.name for w in self.workers if w.role != "decode"]
        decoders = [w.name for w in self.workers if w.role == "decode"]
        self.by_name = {w.name: w for w in self.workers}
        request_keys = self.kv_events.request_keys if self.index is not None else None
        self.view = ClusterView(routable, decoders, self._loads, self.index, request_keys, self.estimates.prefill_s,
                                np.random.default_rng(config.seed), config.block_size,
                                self.estimates.transfer_s, self.estimates.decode_s,
                                shared_pods=[STORE_POD] if config.cache_scope == "global" else [])
        self.done = self.rejected = 0
        self.wall_s = 0.0

    # ------------------------------------------------------------------ heap
    def push(self, t: float, prio: int, worker: int, kind: str, payload: object) -> None:
        """Schedule an event (C2 key: time, prio, worker index, push order)."""
        self.seq += 1
        heapq.heappush(self.heap, (t, prio, worker, self.seq, kind, payload))

    def run(self) -> None:
        """Process every event; conservation (C4) is checked at the end."""
        start = time.perf_counter()
        if self.requests:
            self.push(self.requests[0].arrival_s, ARRIVAL, _CLUSTER, "arrival", 0)
        if self.config.snapshot_interval_s > 0 and self.requests:
            self.snapshot = {w.name: w.load(self.now) for w in self.workers}  # all idle, before any arrival
            self.next_snapshot = self.requests[0].arrival_s
            self.push(self.next_snapshot, SNAPSHOT, _CLUSTER, "snapshot", None)
        handlers = {"arrival": self._arrival, "kv": self.kv_events.deliver, "link": self._link, "step": self._step_end,
                    "snapshot": self._snapshot, "enqueue": self._enqueue_event}
        heap = self.heap
        while heap:
            t, _, _, _, kind, payload = heapq.heappop(heap)
            self.now = t
            self.events += 1
            handlers[kind](t, payload)
        self.wall_s = time.perf_counter() - start
        self.check_conservation()

    def check_conservation(self) -> None:
        """C4: every request done or rejected; every worker's blocks all free (none leaked)."""
        states = [r.state for r in self.requests]
        unfinished = [s for s in states if s not in ("DONE", "REJECTED")]
        if unfinished:
            raise RuntimeError(f"conservation (C4): {len(unfinished)} request(s) unfinished, e.g. {unfinished[0]}")
        if self.ingestor is not None and self.ingestor.stats.errors:
            raise RuntimeError(f"the index rejected {len(self.ingestor.stats.errors)} KV event(s), e.g. "
                               f"{self.ingestor.stats.errors[0]}")
        for w in self.workers:
            if w.free_blocks != self.config.capacity_blocks or w.running or w.waiting:
                raise RuntimeError(f"conservation (C4): {w.name} ends with {w.free_blocks} of "
                                   f"{self.config.capacity_blocks} blocks free, {len(w.running)} running")

    # ------------------------------------------------------------------ routing
    def _arrival(self, now: float, i: int) -> None:
        if i + 1 < len(self.requests):
            self.push(self.requests[i + 1].arrival_s, ARRIVAL, _CLUSTER, "arrival", i + 1)
            self.next_arrival = i + 1
        else:
            self.next_arrival = len(self.requests)
        req = self.requests[i]
        keys = self.prompts.engine_keys(i)
        req.engine_keys = keys
        req.engine = Request.from_block_keys(f"r{i}", max(req.input_tokens, 1), keys)
        if self.config.blend is not None:
            req.token_ids = self.prompts.token_ids(i)
        view_req = RequestView(i, req.request_id, req.arrival_s, req.input_tokens, req.output_tokens, keys)
        decision = self.router.select(view_req, self.view, now)
        self._check_decision(decision)
        worker = self.by_name[decision.worker]
        req.worker = worker.index
        req.predicted_ttft_s = decision.predicted_ttft_s
        if self.index is not None:
            req.index_columns = self._index_columns(view_req, worker)
        need = -(-(req.input_tokens + req.output_tokens) // self.config.block_size)
        if decision.reject or need > self.config.capacity_blocks or req.input_tokens == 0:
            req.state, req.rejected = "REJECTED", True
            req.reject_reason = ("router" if decision.reject else "empty_prompt" if req.input_tokens == 0
                                 else "does_not_fit")
            self.rejected += 1
            self._tick()
            return
        if worker.role == "prefill" and req.output_tokens > 1:
            name = decision.decode_worker or min(self.view.decode_workers,
                                                 key=lambda w: self.by_name[w].load(self.now).requests)
            req.decode_worker = self.by_name[name].index
            self.workers[req.decode_worker].num_incoming += 1  # until its handoff arrives
        bs = self.config.block_size
        held = worker.cached_prefix_blocks(keys)
        blocks = min(decision.transfer_blocks, (req.input_tokens - 1) // bs)  # the last token is computed
        worker.prefill_pending[i] = self.estimates.prefill_s(req.input_tokens,
                                                             min(max(held, blocks), (req.input_tokens - 1) // bs) * bs)
        if blocks > held:  # the copy sends the blocks the target lacks now
            req.kv_ready_tokens = blocks * bs
            size = (blocks - held) * self.config.block_bytes
            worker.num_incoming += 1
            self._submit(worker, worker.nic, now, self.estimates.transfer_s(blocks - held),
                         ("transfer", req, now, size, decision.transfer_from))
            return
        self._enqueue_at(worker, req, now + self.config.arrival_overhead_s)

    def _check_decision(self, decision: object) -> None:
        if not isinstance(decision, Decision):
            raise ValueError(f"router {self.router.name!r} returned {decision!r}, not a Decision")
        if decision.worker not in self.view.workers:
            raise ValueError(f"router {self.router.name!r} chose {decision.worker!r}, not a routable worker "
                             f"{self.view.workers}")
        if decision.decode_worker is not None and decision.decode_worker not in self.view.decode_workers:
            raise ValueError(f"router {self.router.name!r} chose decode worker {decision.decode_worker!r}, not one "
                             f"of {self.view.decode_workers}")
        if decision.transfer_from is not None and decision.transfer_from not in self.by_name:
            raise ValueError(f"router {self.router.name!r} transfers from {decision.transfer_from!r}, no such worker")

    def _enqueue_at(self, worker: Worker, req: SimRequest, t: float) -> None:
        if t > self.now:
            worker.num_incoming += 1
            self.pending_enqueues.append(t)
            self.push(t, ARRIVAL, worker.index, "enqueue", req)
        else:
            self._enqueue(worker, req, t)

    def _enqueue_event(self, now: float, req: SimRequest) -> None:
        self.pending_enqueues.popleft()
        self.workers[req.worker].num_incoming -= 1
        self._enqueue(self.workers[req.worker], req, now)

    def _enqueue(self, worker: Worker, req: SimRequest, now: float) -> None:
        req.state = "WAITING"
        if req.enqueue_s is None:
            req.enqueue_s = now
        worker.waiting.append(req)
        self._wake(worker, now)

    def _wake(self, worker: Worker, now: float) -> None:
        """C3: an idle worker with work gets a step at ``now``, after this instant's arrivals."""
        if not worker.busy and not worker.wake_pending:
            worker.wake_pending = True
            self.push(now, STEP_END, worker.index, "step", (worker, None))

    def _loads(self) -> dict[str, WorkerLoad]:
        if self.snapshot is not None:
            return self.snapshot
        return {w.name: w.load(self.now) for w in self.workers}

    def _snapshot(self, now: float, _payload: object) -> None:
        self.snapshot = {w.name: w.load(self.now) for w in self.workers}
        if self.next_arrival < len(self.requests) or any(r.state not in ("DONE", "REJECTED") for r in self.requests):
            self.next_snapshot = now + self.config.snapshot_interval_s
            self.push(self.next_snapshot, SNAPSHOT, _CLUSTER, "snapshot", None)
        else:
            self.next_snapshot = math.inf

    def _index_columns(self, request: RequestView, chosen: Worker) -> tuple[int, int, int]:
        """What the index credited the chosen worker, what it really held, the best worker's hold."""
        credited = self.view.prefix_blocks(request, chosen.name)
        keys = request.engine_keys
        true = {w.name: w.cached_prefix_blocks(keys) for w in self.workers}
        return credited, true[chosen.name], max(true.values())

    # ------------------------------------------------------------------ links
    def _submit(self, worker: Worker, link: Link, now: float, service_s: float, job: tuple) -> None:
        link.submit(now, service_s, job)
        self._arm(worker, link)

    def _arm(self, worker: Worker, link: Link) -> None:
        due = link.next_completion()
        if due is None:
            return
        armed = self.link_due.get(link.name)
        if armed is not None and armed[0] == due:
            return
        version = (armed[1] + 1) if armed else 1
        due = max(due, self.now)  # a PS transfer may have ended during the submit that revealed it
        self.link_due[link.name] = (due, version)
        self.push(due, LINK_DONE, worker.index, "link", (worker, link, version))

    def _link(self, now: float, payload: tuple) -> None:
        worker, link, version = payload
        if self.link_due.get(link.name, (None, -1))[1] != version:
            return  # superseded (processor sharing moved the completion)
        del self.link_due[link.name]
        for end, job in link.advance(now):
            self._job_done(worker, end, job)
        self._arm(worker, link)

    def _job_done(self, worker: Worker, end: float, job: tuple) -> None:
        kind, req, start, size, src = job
        self.transfer_rows.append((kind, worker.index, src, worker.name, -1 if req is None else req.request_id,
                                   size, start, end))
        if kind == "fetch":
            req.fetch_s = end - start
            worker.fetch_done(req)
            self._wake(worker, end)
        elif kind == "transfer":
            req.transfer_s = end - start
            worker.num_incoming -= 1
            self._enqueue(worker, req, end)
        elif kind == "handoff":
            req.transfer_s = end - start
            prefill = self.workers[req.worker]
            prefill.manager.free(req.handoff_request)
            self.kv_events.publish(prefill, end)
            self._wake(prefill, end)
            worker.num_incoming -= 1
            self._enqueue(worker, req, end)

    # ------------------------------------------------------------------ steps
    def _step_end(self, now: float, payload: tuple) -> None:
        worker, plan = payload
        while True:
            if plan is None:
                worker.wake_pending = False
            else:
                self._apply(worker, plan, now)
                worker.busy = False
                if self.coalesce and self.index is None and self._decode_times is not None:
                    now = self.now = decode_window(worker, now, self._next_due(worker), self._decode_times,
                                                   self.config, self.step_chunks)
            plan, end = self._start_step(worker, now)
            if plan is None:
                return
            if not self.coalesce or worker.role != "mixed" or plan.prefill or end >= self._next_due(worker):
                self.push(end, STEP_END, worker.index, "step", (worker, plan))
                return
            now = self.now = end  # C9: end the decode step inline, nothing can see it before

    def _next_due(self, worker: Worker) -> float:
        """The earliest event that could change or observe ``worker``: the next arrival, the next
        snapshot, a completion on one of its links, a pending wake."""
        due = self.next_snapshot
        if self.pending_enqueues:
            due = min(due, self.pending_enqueues[0])
        if self.next_arrival < len(self.requests):
            due = min(due, self.requests[self.next_arrival].arrival_s)
        for link in (worker.h2d, worker.d2h, worker.nic):
            armed = self.link_due.get(link.name)
            if armed is not None:
                due = min(due, armed[0])
        return due

    def _start_step(self, worker: Worker, now: float) -> tuple[Plan | None, float]:
        if worker.busy or not worker.has_work():
            return None, now
        fetches: list[tuple[SimRequest, float, bool]] = []
        plan = worker.schedule(now, fetches)
        while plan.empty and plan.preempted:
            plan = worker.schedule(now, fetches)
        for req, service, remote in fetches:  # a read from another worker's segment: the NIC
            size = sum(req.tier_hit_tokens) * self.config.model_spec.kv_bytes_per_token
            self._submit(worker, worker.nic if remote else worker.h2d, now, service,
                         ("fetch", req, now, size, STORE_POD if remote else "tiers"))
        if plan.empty:
            return None, now
        if plan.prefill or self._decode_times is None:
            batch = StepBatch(prefill=[(e, c) for _, _, c, e in plan.prefill if e],
                              decode=[r.engine.num_computed_tokens - 1 for r in plan.decode])
            step = self.time_model.step_time(batch)
        else:
            dt = float(self._decode_times(len(plan.decode), np.array([plan.decode_context_sum]))[0])
            step = StepTime(dt, 0.0)
        worker.busy = True
        worker.step_seq += 1
        worker.busy_s += step.step_s
        worker.prefill_gpu_s += step.prefill_s
        worker.decode_gpu_s += step.step_s - step.prefill_s
        if worker.step_seq % self.config.step_sample == 0:
            self.step_rows.append((worker.index, worker.step_seq, now, step.step_s, step.prefill_s, len(plan.prefill),
                                   plan.num_prefill_tokens, len(plan.decode), len(worker.running),
                                   len(worker.waiting) - worker.num_fetching, worker.num_fetching,
                                   worker.free_blocks, len(plan.preempted)))
        return plan, now + step.step_s

    def _apply(self, worker: Worker, plan: Plan, now: float) -> None:
        """A step ended at ``now``: prefill progress, sampled tokens, finished requests, KV events."""
        alpha2 = self.config.output_token_overhead_s
        for req, n, context, computed in plan.prefill:
            req.computed_prefill_tokens += computed
            again = min(context + n, req.computed_at_preemption) - context  # positions computed before
            if again > 0:
                req.recomputed_tokens += min(again, computed)
        for req in [p[0] for p in plan.prefill] + plan.decode:
            er = req.engine
            if er.num_computed_tokens != er.num_tokens:
                continue  # a chunk of a longer prefill: no token yet
            token_s = now + alpha2
            req.num_output += 1
            if req.first_token_s is None:
                req.first_token_s = token_s
                worker.prefill_pending.pop(req.index, None)
            else:
                gap = token_s - req.last_token_s
                req.tbt.append(gap)
            req.last_token_s = token_s
            if req.num_output >= req.output_tokens:
                self._finish(worker, req, now)
            elif worker.role == "prefill":
                self._handoff(worker, req, now)
            else:
                worker.append_output(req)
        self.kv_events.publish(worker, now)

    def _finish(self, worker: Worker, req: SimRequest, now: float) -> None:
        new = worker.finish(req)
        req.state, req.finish_s = "DONE", req.last_token_s
        if new:
            size = len(new) * self.config.block_bytes
            service = offload_time_s(len(new), self.config.block_bytes, self.config.tiers[0].device,
                                     self.config.host_link)
            self._submit(worker, worker.d2h, now, service, ("offload", None, now, size, worker.name))
        self._tick()

    def _handoff(self, worker: Worker, req: SimRequest, now: float) -> None:
        """P/D: the prompt's KV goes to the decode worker over its NIC; the prefill worker
        keeps the blocks until the copy is done."""
        worker.running.remove(req)
        er = req.engine
        req.handoff_request = er
        size = er.num_computed_tokens * self.config.model_spec.kv_bytes_per_token
        decode = self.workers[req.decode_worker]
        fresh = Request.from_block_keys(f"r{req.index}", er.num_tokens, er.block_hashes)
        req.engine = fresh
        worker.append_output(req)
        req.kv_ready_tokens = er.num_computed_tokens
        req.handoff = True
        service = self.config.network.read_time_s(size, num_ops=1 if size else 0)
        self._submit(decode, decode.nic, now, service, ("handoff", req, now, size, worker.name))

    def _tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress.update(1)
