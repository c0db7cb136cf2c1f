"""A small cluster: pods with vLLM block pools, a router over a global index fed by their KV events.

What a notebook needs to show index staleness (docs/specs/engines.md §9 row 10): every
request is routed by a :class:`~kvlab.index.scorers.Scorer` over an index that only knows
what the pods' KV events told it — through a :class:`~kvlab.index.faults.FaultInjector`
(coalescing, delay, loss ...) — and is then served by the chosen pod's
:class:`~kvlab.engines.KVCacheManager` (looked up, admitted, finished at once, as
:func:`kvlab.engines.replay.replay_requests`), whose events go back to the index.
Every routing decision is checked against the pods' real cache state (their block pools):
a choice is *wrong* when another pod really held a longer prefix of the request.

Without faults the index still under-credits pods under eviction, by two upstream rules
(docs/index_truth.md): vLLM 0.33 publishes a ``BlockRemoved`` for every evicted *copy* of
a block (a fully cached prompt's last block is recomputed into a second copy), so the
index forgets a block the pod still holds; and llm-d then skips every later store that
chains from the forgotten block (its parent is unknown). Both are options, faithful by
default: ``removed_events="last_copy"`` (vLLM's open fix) makes the index equal the pools
after every step; ``unknown_parent="defer"`` holds such stores until the parent is mapped
again. The summary counts what each rule cost.

Requests need token ids (the index hashes tokens, rule L18): :func:`trace_token_ids` makes
them from a trace's block keys (one block key → ``block_size`` tokens, the same
tokens for the same key, so prefix sharing is kept).
"""

from __future__ import annotations

import heapq
import inspect
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.result import RunResult, RunSummary, timeline_frame, to_jsonable
from kvlab.core.validate import check_choice, check_count, check_positive
from kvlab.engines.vllm.block_pool import REMOVED_EVENTS, BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events.types import EventBatch
from kvlab.hashing import get_hasher
from kvlab.index.faults import Delivery, FaultInjector
from kvlab.index.ingest import UNKNOWN_PARENT_MODES, EventIngestor
from kvlab.index.memory import InMemoryIndex
from kvlab.index.scorers import LongestPrefixScorer, Scorer
from kvlab.index.select import PodLoad
from kvlab.traces import Trace

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def _block_tokens(keys: np.ndarray, block_size: int) -> np.ndarray:
    """``uint32[len(keys), block_size]``: each block key's ``block_size`` token ids (< 2**31),
    derived by splitmix64 from ``key + (j + 1) * 0x9E3779B97F4A7C15`` (mod 2**64) for token ``j``.
    ``keys``: ``uint64[n]``."""
    with np.errstate(over="ignore"):
        steps = np.arange(1, block_size + 1, dtype=np.uint64) * np.uint64(_MIX)
        z = keys.astype(np.uint64)[:, None] + steps[None, :]
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return ((z ^ (z >> np.uint64(31))) & np.uint64(0x7FFFFFFF)).astype(np.uint32)


def trace_token_ids(trace: Trace, block_size: int = 16) -> list[np.ndarray]:
    """Token ids for each request of ``trace``: its full blocks, each block key expanded to
    ``block_size`` tokens (``uint32``), the same tokens for the same key.

    A trace of chained keys (Mooncake's hash ids) keeps its prefix sharing exactly; the
    prompt is rescaled to ``block_size`` tokens per trace block.

    Raises:
        ValueError: not a Trace, or ``block_size`` not an integer >= 1.

    Example:
        >>> from kvlab.traces import load_trace
        >>> tokens = trace_token_ids(load_trace("conversation").head(2), 4)
        >>> [len(t) for t in tokens], bool((tokens[0][:4] == tokens[1][:4]).all())  # a shared first block
        ([52, 56], True)
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    block_size = check_positive("block_size", block_size)
    full = trace.frame.select(pl.col("block_keys").list.head(pl.col("input_tokens") // trace.block_size))["block_keys"]
    keys = full.explode().drop_nulls().to_numpy().astype(np.uint64)
    distinct, which = np.unique(keys, return_inverse=True)
    tokens = _block_tokens(distinct, block_size)[which].reshape(-1)  # the same tokens for the same key
    ends = np.cumsum(full.list.len().to_numpy().astype(np.int64)) * block_size
    return [tokens[start:end].copy() for start, end in zip(np.concatenate(([0], ends[:-1])), ends, strict=True)]


def _index_prefix_blocks(keys: list[int], index: InMemoryIndex, pod: str) -> int:
    """The consecutive request keys, from the first, the index says ``pod`` holds (any tier)."""
    hits = index.lookup(keys, [pod]) if keys else {}
    return next((i for i, key in enumerate(keys) if key not in hits), len(keys))


def _cached_prefix_blocks(engine_keys: list[int], manager: KVCacheManager) -> int:
    """The consecutive blocks, from the first, cached in ``manager``'s pool (the truth)."""
    cached = manager.block_pool.cached_block_hash_to_block
    return next((i for i, key in enumerate(engine_keys) if not cached.get(key)), len(engine_keys))


@dataclass(frozen=True, eq=False)
class RouteConfig:
    """The cluster :func:`route_requests` runs.

    Attributes:
        num_pods: pods ``pod-0 .. pod-{n-1}`` (≥ 1).
        capacity_blocks: usable GPU blocks per pod (≥ 1).
        block_size: tokens per block, engine and index alike (≥ 1).
        scorer: the routing rule (``None``: llm-d's :class:`~kvlab.index.scorers.LongestPrefixScorer`).
        faults: what happens to KV events on the way to the index (``None``: delivered at once).
        seed: the router's tie-breaking seed (≥ 0).
        removed_events: the pods' :class:`~kvlab.engines.vllm.block_pool.BlockPool` rule:
            ``"every_copy"`` (vLLM 0.33, default) or ``"last_copy"`` (the upstream fix).
        unknown_parent: the ingestor's rule for a store whose parent it does not know:
            ``"drop"`` (llm-d, default) or ``"defer"`` (:class:`~kvlab.index.EventIngestor`).

    Raises:
        ValueError: a bad count or seed, a scorer that is not a :class:`~kvlab.index.scorers.Scorer`,
            faults that are not a :class:`~kvlab.index.faults.FaultInjector`, an unknown
            ``removed_events`` or ``unknown_parent``.

    Example:
        >>> RouteConfig(num_pods=3).to_dict()["scorer"]
        {'type': 'LongestPrefixScorer', 'tier_weights': {'gpu': 1.0, 'cpu': 0.8}}
    """

    num_pods: int = 2
    capacity_blocks: int = 1_000
    block_size: int = 16
    scorer: Scorer | None = None
    faults: FaultInjector | None = None
    seed: int = 0
    removed_events: str = "every_copy"
    unknown_parent: str = "drop"

    def __post_init__(self) -> None:
        for name in ("num_pods", "capacity_blocks", "block_size"):
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        object.__setattr__(self, "seed", check_count("seed", self.seed))
        check_choice("removed_events", self.removed_events, REMOVED_EVENTS)
        check_choice("unknown_parent", self.unknown_parent, UNKNOWN_PARENT_MODES)
        if self.scorer is None:
            object.__setattr__(self, "scorer", LongestPrefixScorer())
        if not isinstance(self.scorer, Scorer):
            raise ValueError(f"scorer must be a kvlab.index Scorer, got {type(self.scorer).__name__}")
        if self.faults is not None and not isinstance(self.faults, FaultInjector):
            raise ValueError(f"faults must be a FaultInjector or None, got {type(self.faults).__name__}")

    def to_dict(self) -> dict[str, object]:
        """The configuration as JSON types; the scorer and the fault injector as their type and options."""
        return {"num_pods": self.num_pods, "capacity_blocks": self.capacity_blocks,
                "block_size": self.block_size, "scorer": _options(self.scorer),
                "faults": None if self.faults is None else _options(self.faults), "seed": self.seed,
                "removed_events": self.removed_events, "unknown_parent": self.unknown_parent}


def _options(obj: object) -> dict[str, object]:
    """``obj``'s type and the constructor options it keeps as attributes (its configuration)."""
    names = [n for n in inspect.signature(type(obj).__init__).parameters if n != "self"]
    return {"type": type(obj).__name__, **{n: to_jsonable(getattr(obj, n)) for n in names if hasattr(obj, n)}}


@dataclass(frozen=True)
class RouteSummary(RunSummary):
    """Totals of one :func:`route_requests` over every request.

    ``input_tokens``, ``hit_blocks``, ``hit_tokens`` (served from the chosen pods' caches) and
    ``token_hit_ratio``; ``rejected_requests`` (prompts larger than a pod); the shares of
    requests whose choice was ``wrong`` and whose pick the index ``under-`` or
    ``over_credited``; ``missed_blocks`` (prefix blocks the best pod held beyond the pick's);
    ``messages`` (KV-event messages the pods sent). What the two upstream rules cost
    (docs/index_truth.md): ``copy_evictions`` (evicted copies of a block another copy of
    which stayed cached: each published a ``BlockRemoved`` under ``removed_events=
    "every_copy"``), ``dropped_stores`` and ``dropped_blocks`` (stores, and their
    canonical blocks, an unknown parent kept out of the index for good: dropped, overflowed,
    cleared, or still held at the end), ``deferred_stores`` (held under ``unknown_parent=
    "defer"``; ``resolved_stores`` of them applied later). Shares are 0.0 for an empty trace.

    Example:
        >>> RouteSummary.driver
        'route_requests'
    """

    driver: ClassVar[str] = "route_requests"
    source: str
    config: RouteConfig
    requests: int
    input_tokens: int
    hit_blocks: int
    hit_tokens: int
    token_hit_ratio: float
    rejected_requests: int
    wrong_share: float
    under_credited_share: float
    over_credited_share: float
    missed_blocks: int
    messages: int
    copy_evictions: int
    dropped_stores: int
    dropped_blocks: int
    deferred_stores: int
    resolved_stores: int


def route_requests(trace: Trace, *, num_pods: int = 2, capacity_blocks: int = 1_000, block_size: int = 16,
                   scorer: Scorer | None = None, faults: FaultInjector | None = None, seed: int = 0,
                   removed_events: str = "every_copy", unknown_parent: str = "drop",
                   progress: bool = False) -> RunResult:
    """Route ``trace``'s requests over ``num_pods`` pods by a global index fed through ``faults``.

    Per request, in arrival order: deliver the events due by its arrival to the index;
    the scorer picks a pod over the index (loads: each pod's cached blocks as its tree
    size); the pod serves it (vLLM prefix lookup, allocation, free at once); its KV
    events go to the fault injector (one message per request, seq per pod). The truth
    is read from the pods' block pools. Engine block size = the index's canonical block
    size. A request's prompt is the trace's ``token_ids`` when it has them, else
    :func:`trace_token_ids` (each trace block → ``block_size`` tokens).

    Args:
        trace: the requests (``request_id``, ``arrival_s`` and the prompts).
        num_pods, capacity_blocks, block_size, scorer, faults, seed, removed_events, unknown_parent:
            as :class:`RouteConfig`. ``faults`` is called once per message, so its ``swap_p``
            (pairs of deliveries) has no effect here.
        progress: a tqdm bar (``tqdm.auto``: a widget in a notebook) over the requests routed.

    Returns:
        A :class:`~kvlab.core.RunResult`:

        * ``requests``: ``request_id`` (u64), ``arrival_s`` (f64), ``input_tokens`` (the prompt
          served), ``hit_blocks`` (served from cache) and ``hit_tokens`` (i64), ``rejected``
          (the prompt does not fit the pod), ``pod`` (chosen), ``index_prefix_blocks`` (what
          the index credited the chosen pod), ``true_prefix_blocks`` (what it really held),
          ``best_true_prefix_blocks`` (the best pod's), ``wrong`` (``true < best``),
          ``prompt_blocks`` (full blocks);
        * ``timeline``: one tier per pod, per request: ``used_blocks`` (cached blocks in its
          pool), ``capacity_blocks``, ``hit_blocks`` and ``miss_blocks`` (of the request, on
          the chosen pod; 0 elsewhere);
        * ``summary``: a :class:`RouteSummary`; ``config``: the :class:`RouteConfig`.

    Raises:
        ValueError: not a :class:`~kvlab.traces.Trace` or one without block identity, or a bad
            :class:`RouteConfig` field.

    Example:
        >>> from kvlab.traces import load_trace
        >>> result = route_requests(load_trace("conversation").head(40), block_size=4)
        >>> result.requests.height, int(result.requests["wrong"].sum()), result.summary.wrong_share
        (40, 0, 0.0)
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    trace.require_block_identity("routing over a global block index (kvlab.index.route_requests)")
    config = RouteConfig(num_pods=num_pods, capacity_blocks=capacity_blocks, block_size=block_size,
                         scorer=scorer, faults=faults, seed=seed, removed_events=removed_events,
                         unknown_parent=unknown_parent)
    size = config.block_size
    token_ids = ([np.asarray(t, dtype=np.uint32) for t in trace.frame["token_ids"].to_list()]
                 if "token_ids" in trace.frame.columns else trace_token_ids(trace, size))
    pods = [f"pod-{i}" for i in range(config.num_pods)]
    engine_hasher = get_hasher("vllm", block_size=size)
    managers = {}
    for pod in pods:
        pool = BlockPool(config.capacity_blocks + 1, block_size=size, enable_kv_cache_events=True,
                         removed_events=config.removed_events)
        managers[pod] = KVCacheManager(pool, block_size=size)
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=size, unknown_parent=config.unknown_parent)
    pending: list[tuple[float, int, Delivery]] = []
    seqs = dict.fromkeys(pods, 0)
    rng = np.random.default_rng(config.seed)
    rows = []
    used = {pod: [] for pod in pods}
    arrivals = zip(trace.frame["arrival_s"].to_list(), token_ids)
    if progress:
        from tqdm.auto import tqdm

        arrivals = tqdm(arrivals, total=len(token_ids), unit="req", desc="route", leave=False)
    for r, (t, tokens) in enumerate(arrivals):
        while pending and pending[0][0] <= t:
            d = heapq.heappop(pending)[2]
            ingestor.ingest_batch(d.pod, d.seq, d.batch)
        keys = [int(k) for k in ingestor.hasher.block_keys(tokens)] if len(tokens) else []
        engine_keys = [int(k) for k in engine_hasher.block_keys(tokens)] if len(tokens) else []
        loads = {pod: PodLoad(tree_size_blocks=len(managers[pod].block_pool.cached_block_hash_to_block))
                 for pod in pods}
        pod = config.scorer.select(keys, index, pods, loads=loads, rng=rng)
        credited = _index_prefix_blocks(keys, index, pod)
        true = {p: _cached_prefix_blocks(engine_keys, managers[p]) for p in pods}
        hit_blocks = 0
        admitted = True
        if len(tokens):
            manager = managers[pod]
            request = Request.from_tokens(f"r{r}", tokens, engine_hasher)
            blocks, num_hit = manager.get_computed_blocks(request)
            admitted = manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, blocks) is not None
            if admitted:
                hit_blocks = len(blocks)
                manager.free(request)
            events = manager.take_events()
            if events:
                message = (t, pod, seqs[pod], EventBatch(t, events))
                seqs[pod] += 1
                deliveries = ([Delivery(t, t, pod, message[2], message[3])] if config.faults is None
                              else config.faults.inject([message]))
                for d in deliveries:
                    heapq.heappush(pending, (d.delivered_s, len(rows) * 4 + int(d.copy), d))
        for p in pods:
            used[p].append(len(managers[p].block_pool.cached_block_hash_to_block))
        rows.append({"input_tokens": len(tokens), "hit_blocks": hit_blocks, "hit_tokens": hit_blocks * size,
                     "rejected": not admitted, "pod": pod, "index_prefix_blocks": credited,
                     "true_prefix_blocks": true[pod], "best_true_prefix_blocks": max(true.values()),
                     "wrong": true[pod] < max(true.values()), "prompt_blocks": len(keys)})
    requests = pl.concat([trace.frame.select("request_id", "arrival_s"), pl.DataFrame(rows, schema=_ROW_SCHEMA)],
                         how="horizontal")
    costs = _rule_costs(ingestor, sum(managers[p].block_pool.num_copy_evictions for p in pods))
    return RunResult(requests, _timeline(requests, pods, used, config),
                     _summary(trace.source, config, requests, sum(seqs.values()), costs), config)


_ROW_SCHEMA = {"input_tokens": pl.Int64, "hit_blocks": pl.Int64, "hit_tokens": pl.Int64, "rejected": pl.Boolean,
               "pod": pl.String, "index_prefix_blocks": pl.Int64, "true_prefix_blocks": pl.Int64,
               "best_true_prefix_blocks": pl.Int64, "wrong": pl.Boolean, "prompt_blocks": pl.Int64}


def _timeline(requests: pl.DataFrame, pods: list[str], used: dict[str, list[int]],
              config: RouteConfig) -> pl.DataFrame:
    """One tier per pod: its cached blocks, capacity, and the hits and misses it served."""
    step, time_s = np.arange(requests.height), requests["arrival_s"].to_numpy()
    hits = requests["hit_blocks"].to_numpy()
    misses = -(-requests["input_tokens"].to_numpy() // config.block_size) - hits
    chosen = requests["pod"].to_numpy()
    return pl.concat([timeline_frame(step, time_s, pod, {
        "used_blocks": used[pod], "capacity_blocks": np.full(requests.height, config.capacity_blocks),
        "hit_blocks": np.where(chosen == pod, hits, 0), "miss_blocks": np.where(chosen == pod, misses, 0),
    }) for pod in pods])


def _rule_costs(ingestor: EventIngestor, copy_evictions: int) -> dict[str, int]:
    """The :class:`RouteSummary` counters of the two upstream rules (see its docstring)."""
    stats, pending = ingestor.stats, ingestor.pending_stores
    return {"copy_evictions": copy_evictions,
            "dropped_stores": (stats.skipped["unknown_parent"] + stats.deferred["overflow"]
                               + stats.deferred["cleared"] + len(pending)),
            "dropped_blocks": (sum(stats.dropped_blocks.values())
                               + sum(len(h.event.token_ids) // ingestor.block_size for h in pending)),
            "deferred_stores": stats.skipped["deferred"], "resolved_stores": stats.deferred["resolved"]}


def _summary(source: str, config: RouteConfig, requests: pl.DataFrame, messages: int,
             costs: dict[str, int]) -> RouteSummary:
    n = requests.height
    inputs, hit_tokens = int(requests["input_tokens"].sum()), int(requests["hit_tokens"].sum())
    credited, true = requests["index_prefix_blocks"], requests["true_prefix_blocks"]
    return RouteSummary(
        source=source, config=config, requests=n, input_tokens=inputs, hit_blocks=int(requests["hit_blocks"].sum()),
        hit_tokens=hit_tokens, token_hit_ratio=hit_tokens / inputs if inputs else 0.0,
        rejected_requests=int(requests["rejected"].sum()),
        wrong_share=float(requests["wrong"].mean()) if n else 0.0,
        under_credited_share=float((credited < true).mean()) if n else 0.0,
        over_credited_share=float((credited > true).mean()) if n else 0.0,
        missed_blocks=int((requests["best_true_prefix_blocks"] - true).sum()), messages=messages, **costs)
