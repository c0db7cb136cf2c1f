"""One simulated worker: a vLLM v1 engine's KV cache and scheduling step (cluster_sim.md §6.4).

The cache is kvlab's engine-faithful :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`;
the step follows vLLM v1 ``Scheduler.schedule``: a token budget ``max_num_batched_tokens`` and
``max_num_seqs``; running requests first, in admission order, each ``min(remaining,
long_prefill_token_threshold, budget)`` tokens (chunked prefill) or one decode token; when a
running request cannot get blocks, ``running.pop()`` is preempted (recompute: its blocks are
freed and stay cached, C5, C19) until it fits or the victim is itself; waiting requests only in a
step without preemption (C6), stopping at the first that does not fit. A waiting request whose
prompt a lower tier holds beyond the GPU hit (C7) loads it first: blocks reserved, state
``FETCH_KVC`` behind Opal's ``max_kvc_ready_requests`` gate (C8; a request the gate or the pool
refuses is skipped, Opal O22), ``READY`` when the load is done. With ``engine="sglang"`` the cache is
SGLang's radix cache instead (:class:`~kvlab.sim.cluster.radix_manager.RadixManager`, same calls).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.sim.cluster.blend import WorkerBlend, computed_in_chunk
from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.links import Link
from kvlab.sim.cluster.prompts import output_block_key
from kvlab.sim.cluster.radix_manager import RadixManager
from kvlab.sim.cluster.routers import WorkerLoad
from kvlab.sim.cluster.state import SimRequest
from kvlab.sim.cluster.tier_store import ClusterStore
from kvlab.tiers.cost import fetch_time_s, tokens_to_load


def _nothing() -> None:
    """vLLM has nothing to do before a step is scheduled (it caches blocks at allocation)."""


@dataclass
class Plan:
    """One scheduled step: ``prefill`` chunks ``(request, new tokens, context tokens, computed tokens)``
    (computed < new when CacheBlend reuses some of the chunk's KV), ``decode``
    requests, the requests it ``preempted`` and whether any waiting request was admitted."""

    prefill: list[tuple[SimRequest, int, int, int]] = field(default_factory=list)
    decode: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    num_prefill_tokens: int = 0
    decode_context_sum: int = 0

    @property
    def empty(self) -> bool:
        """Nothing to compute (no step)."""
        return not self.prefill and not self.decode


class Worker:
    """A worker's cache, queues, links and counters; the cluster loop drives it.

    Args:
        index: its position (``w{index}``; the C2 tie order).
        role: ``"mixed"``, ``"prefill"`` or ``"decode"``.
        config: the :class:`~kvlab.sim.cluster.config.ClusterConfig`.
        kv_events: the pool publishes KV events (only an index needs them).
        store: the tiers under its GPU cache (its own, or the cluster's shared pool), or ``None``.

    Example:
        >>> w = Worker(0, "mixed", ClusterConfig(capacity_blocks=64))
        >>> w.name, w.free_blocks, w.idle
        ('w0', 64, True)
    """

    def __init__(self, index: int, role: str, config: ClusterConfig, *, kv_events: bool = True,
                 store: ClusterStore | None = None) -> None:
        self.index, self.role, self.config = index, role, config
        self.name = f"w{index}"
        self.block_size = config.block_size
        if config.engine == "sglang":
            manager = RadixManager(config.capacity_blocks, block_size=config.block_size,
                                   enable_caching=config.enable_prefix_caching, enable_kv_cache_events=kv_events)
            self._free_blocks, self._cached_blocks = manager.num_free_blocks, manager.num_cached_blocks
            self._cached_prefix, self._begin_schedule = manager.cached_prefix_blocks, manager.begin_schedule
        else:
            pool = BlockPool(config.capacity_blocks + 1, block_size=config.block_size,
                             enable_caching=config.enable_prefix_caching, enable_kv_cache_events=kv_events)
            manager = KVCacheManager(pool, block_size=config.block_size, enable_caching=config.enable_prefix_caching)
            cached = pool.cached_block_hash_to_block
            self._free_blocks, self._cached_blocks = pool.get_num_free_blocks, cached.__len__
            self._cached_prefix = lambda keys: next((i for i, k in enumerate(keys) if not cached.get(k)), len(keys))
            self._begin_schedule = _nothing
        self.manager = manager
        self.store = store
        self.fetch_remote = False  # the last fetch read another worker's segment (global scope)
        self.blend = WorkerBlend(config.blend) if config.blend is not None else None
        self.h2d = Link(f"{self.name}.h2d", config.link_sharing)
        self.d2h = Link(f"{self.name}.d2h", config.link_sharing)
        self.nic = Link(f"{self.name}.nic", config.link_sharing)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.num_fetching = 0
        self.num_incoming = 0  # routed here, not yet queued (arrival overhead, transfer, handoff)
        self.prefill_pending: dict[int, float] = {}  # request index -> predicted prefill s, until its first token
        self.num_ready_fetched = 0  # READY after a fetch, still holding its reserved blocks (the gate)
        self.busy = False  # a step in flight
        self.wake_pending = False  # a step-start event is queued (C3)
        self.step_seq = 0
        self.kv_event_seq = 0
        self.busy_s = self.prefill_gpu_s = self.decode_gpu_s = 0.0
        self.preemptions = 0

    @property
    def idle(self) -> bool:
        """No step in flight."""
        return not self.busy

    @property
    def free_blocks(self) -> int:
        """Blocks the cache can hand out now (vLLM: the free queue, cached ones included; SGLang:
        free slots plus evictable ones)."""
        return self._free_blocks()

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a cached prefix (vLLM: a hash in the pool's map; SGLang: the tree's)."""
        return self._cached_blocks()

    def cached_prefix_blocks(self, engine_keys: list[int]) -> int:
        """The leading blocks of ``engine_keys`` cached on the worker now (the truth an index is checked against)."""
        return self._cached_prefix(engine_keys)

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests (``capacity − free``)."""
        return self.config.capacity_blocks - self.free_blocks

    def load(self, now: float) -> WorkerLoad:
        """Its load signal now (what a router reads, live or in a snapshot)."""
        queued = sum(r.engine.num_tokens - r.engine.num_computed_tokens for r in self.waiting)
        return WorkerLoad(now, waiting=len(self.waiting) - self.num_fetching, running=len(self.running),
                          fetching=self.num_fetching, free_blocks=self.free_blocks, used_blocks=self.used_blocks,
                          cached_blocks=self.cached_blocks, queued_prefill_tokens=queued,
                          queued_prefill_s=sum(self.prefill_pending.values()), incoming=self.num_incoming)

    def has_work(self) -> bool:
        """Whether a step could run now (C3): running or waiting requests that are not loading."""
        return bool(self.running) or any(r.state != "FETCH_KVC" for r in self.waiting)

    # ------------------------------------------------------------------ scheduling
    def schedule(self, now: float, fetches: list[tuple[SimRequest, float]]) -> Plan:
        """vLLM v1's step (module docstring); tier loads started go to ``fetches`` as
        ``(request, service seconds, whether it reads another worker's segment)``."""
        self._begin_schedule()
        cfg = self.config
        plan = Plan()
        budget = cfg.max_num_batched_tokens
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = self._chunk(req.engine, budget)
            scheduled = True
            while not self._allocate(req, n):
                victim = running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            self._add(plan, req, n)
            budget -= n
            i += 1
        if plan.preempted:
            for victim in plan.preempted:  # each prepended: the last preempted ends first
                self.waiting.appendleft(victim)
            return plan
        if self.waiting:
            self._schedule_waiting(now, plan, budget, fetches)
            if plan.empty and not self.running and not fetches:
                self._release_ready(plan)
        return plan

    def _release_ready(self, plan: Plan) -> None:
        """Nothing runs, and nothing waiting fits because loaded requests (``READY``) hold the
        blocks: release the newest such request's blocks (they stay cached, so its restart hits
        them) as a preemption — else the worker would wait forever. vLLM reserves a remote
        load's blocks the same way and has no such rule; kvlab adds it rather than deadlock."""
        for req in reversed(self.waiting):
            if req.state == "READY":
                if req.kv_ready_tokens == 0:
                    self.num_ready_fetched -= 1
                self.waiting.remove(req)
                self._preempt(req)
                self.waiting.appendleft(req)
                plan.preempted.append(req)
                return

    def _schedule_waiting(self, now: float, plan: Plan, budget: int, fetches: list) -> None:
        cfg = self.config
        keep: deque[SimRequest] = deque()
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting.popleft()
            if req.state == "FETCH_KVC":
                keep.append(req)
                continue
            er = req.engine
            if req.state != "READY":
                blocks, hit = self.manager.get_computed_blocks(er)
                external = max(req.kv_ready_tokens - hit, 0)
                if external:  # a handoff or cache transfer delivered this KV: load it, no compute
                    if self.manager.allocate_slots(er, external, hit, blocks) is None:
                        keep.append(req)
                        break
                    self._admitted(req, now, hit)
                    if not req.handoff:
                        req.remote_hit_tokens = external
                    req.state = "READY"
                else:
                    need = self._tier_load(req, hit)
                    if need:
                        gate = self.num_fetching + self.num_ready_fetched < cfg.max_kvc_ready_requests
                        if not gate or self.manager.allocate_slots(er, need, hit, blocks) is None:
                            keep.append(req)  # Opal O22: skip, try the next waiting request
                            continue
                        self._admitted(req, now, hit, hit + need)
                        req.state = "FETCH_KVC"
                        self.num_fetching += 1
                        fetches.append((req, self._fetch_service_s(req, hit, need), self.fetch_remote))
                        keep.append(req)
                        continue
                    n = self._chunk(er, budget, computed=hit)
                    if self.manager.allocate_slots(er, n, hit, blocks) is None:
                        keep.append(req)
                        break
                    self._admitted(req, now, hit)
                    self._start(req, plan, n)
                    budget -= n
                    continue
            n = self._chunk(er, budget)
            if not self._allocate(req, n):
                keep.append(req)
                break
            if req.state == "READY" and req.kv_ready_tokens == 0:
                self.num_ready_fetched -= 1
            self._start(req, plan, n)
            budget -= n
        keep.extend(waiting)
        self.waiting = keep

    def _chunk(self, er: Request, budget: int, computed: int | None = None) -> int:
        """Tokens to compute for a request this step: remaining, capped by the threshold and budget."""
        n = er.num_tokens - (er.num_computed_tokens if computed is None else computed)
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def _allocate(self, req: SimRequest, n: int) -> bool:
        """``allocate_slots(request, n)`` for a request holding blocks. A decode token that
        neither needs a new block nor fills one only advances ``num_computed_tokens`` — what
        :meth:`KVCacheManager.allocate_slots` does then, without its per-call checks."""
        er = req.engine
        c = er.num_computed_tokens
        bs = self.block_size
        if n == 1 and c % bs and (c + 1) % bs and c < er.num_tokens:
            er.num_computed_tokens = c + 1
            return True
        return self.manager.allocate_slots(er, n) is not None

    def _add(self, plan: Plan, req: SimRequest, n: int) -> None:
        er = req.engine
        context = er.num_computed_tokens - n
        if req.num_output and n == 1 and er.num_computed_tokens == er.num_tokens:
            plan.decode.append(req)
            plan.decode_context_sum += context
        else:
            computed = (n if req.blend is None
                        else computed_in_chunk(req.blend, context, n, self.blend.spec.recompute_ratio))
            plan.prefill.append((req, n, context, computed))
            plan.num_prefill_tokens += n

    def _start(self, req: SimRequest, plan: Plan, n: int) -> None:
        req.state = "RUNNING"
        self.running.append(req)
        self._add(plan, req, n)

    def _admitted(self, req: SimRequest, now: float, hit_tokens: int, prefix_tokens: int | None = None) -> None:
        """Stats at admission (V11): the first admission's hits are the request's. With CacheBlend,
        the prompt past ``prefix_tokens`` (GPU and tier hits) is split into blended and fresh tokens."""
        if req.first_scheduled_s is None:
            req.first_scheduled_s = now
        if not req.admitted:
            req.admitted = True
            req.gpu_hit_tokens = hit_tokens
        if self.blend is not None and req.token_ids is not None and not req.handoff:
            req.blend = self.blend.split(req.token_ids, hit_tokens if prefix_tokens is None else prefix_tokens)
            req.blend_tokens = req.blend.blended_tokens
            req.blend_recomputed_tokens = req.blend.recomputed_blend_tokens

    def _preempt(self, req: SimRequest) -> None:
        """Recompute preemption (C5, C19): blocks freed (they stay cached), progress reset."""
        req.computed_at_preemption = max(req.computed_at_preemption, req.engine.num_computed_tokens)
        self.manager.preempt(req.engine)
        req.state = "WAITING"
        req.preemptions += 1
        req.tier_hit_blocks = None  # look the tiers up again (Opal's reuse is a quirk)
        req.blend = None  # split again at re-admission
        if not req.handoff:  # a handoff's KV stays delivered; a transfer's is cached (or recomputed)
            req.kv_ready_tokens = 0
        self.preemptions += 1

    # ------------------------------------------------------------------ tiers
    def _tier_load(self, req: SimRequest, hit_tokens: int) -> int:
        """Tokens to load from the tiers beyond the GPU hit (C7), 0 without tiers."""
        if self.store is None or not self.config.enable_prefix_caching:
            return 0
        er = req.engine
        if req.tier_hit_blocks is None:  # the tier of each prefix block (Opal O15 walk; cached, O21)
            req.tier_hit_blocks = list(self.store.lookup(er.block_hashes[: er.num_tokens // self.block_size]))
        tier_tokens = min(len(req.tier_hit_blocks) * self.block_size, er.num_tokens)
        return tokens_to_load(hit_tokens, tier_tokens, er.num_tokens)

    def _fetch_service_s(self, req: SimRequest, hit_tokens: int, need_tokens: int) -> float:
        """Seconds to load tokens ``[hit, hit + need)``: per tier, its device then the host link —
        or the network for blocks in another worker's segment of the global pool (C14, C20)."""
        bs = self.block_size
        end = hit_tokens + need_tokens
        first, last = hit_tokens // bs, -(-end // bs)
        tokens = [0] * len(self.store.tiers)
        blocks = [0] * len(self.store.tiers)
        remote = [0] * len(self.store.tiers)
        keys = req.engine.block_hashes
        remote_tokens = 0
        for p in range(first, last):
            t = req.tier_hit_blocks[p]
            n = min(bs, end - p * bs)
            far = self.store.remote_blocks((keys[p],), self.index)
            blocks[t] += 1
            tokens[t] += n
            remote[t] += far
            remote_tokens += far * n
        req.tier_hit_tokens = tokens
        req.remote_store_tokens = remote_tokens
        cfg = self.config
        seconds = 0.0
        for t, n in enumerate(blocks):
            if n - remote[t]:
                seconds += fetch_time_s(n - remote[t], cfg.block_bytes, cfg.tiers[t].device, cfg.host_link)
            if remote[t]:
                seconds += fetch_time_s(remote[t], cfg.block_bytes, cfg.tiers[t].device, cfg.network)
        self.fetch_remote = any(remote)
        self.store.get(keys[:last], request_id=req.index)
        return seconds

    def fetch_done(self, req: SimRequest) -> None:
        """The load finished (Opal O23): the request is READY, first in the queue."""
        self.store.release(req.index)
        self.num_fetching -= 1
        self.num_ready_fetched += 1
        self.waiting.remove(req)
        req.state = "READY"
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ step end
    def append_output(self, req: SimRequest) -> None:
        """The token just sampled joins the request (its block key when it fills a block)."""
        er = req.engine
        full = (er.num_tokens + 1) // self.block_size
        key = [output_block_key(req.index, full - 1)] if full > len(er.block_hashes) else []
        er.append_block_keys(1, key)

    def finish(self, req: SimRequest) -> list[int]:
        """Free a finished request's blocks (they stay cached, V4); its prompt keys to offload."""
        self.manager.free(req.engine)
        if req in self.running:
            self.running.remove(req)
        if self.blend is not None and req.token_ids is not None:
            self.blend.store(req.token_ids, req.index)
        if self.store is None:
            return []
        keys = req.engine_keys
        top = self.store.tiers[0]
        new = [k for k in keys if k not in top]
        self.store.put(keys, self.index)
        return new
