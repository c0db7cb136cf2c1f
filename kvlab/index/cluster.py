"""A small cluster: pods with vLLM block pools, a router over a global index fed by their KV events.

What a notebook needs to show index staleness (docs/specs/engines.md §9 row 10): every
request is routed by a :class:`~kvlab.index.scorers.Scorer` over an index that only knows
what the pods' KV events told it — through a :class:`~kvlab.index.faults.FaultInjector`
(coalescing, delay, loss ...) — and is then served by the chosen pod's
:class:`~kvlab.engines.KVCacheManager` (looked up, admitted, finished at once, as
:func:`kvlab.engines.replay.replay_requests`), whose events go back to the index.
Every routing decision is checked against the pods' real cache state (their block pools):
a choice is *wrong* when another pod really held a longer prefix of the request.

Requests need token ids (the index hashes tokens, rule L18): :func:`trace_token_ids` makes
them from a trace's block keys (one block key → ``block_size_tokens`` tokens, the same
tokens for the same key, so prefix sharing is kept).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import polars as pl

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events.types import EventBatch
from kvlab.hashing import get_hasher
from kvlab.index.faults import Delivery, FaultInjector
from kvlab.index.ingest import EventIngestor
from kvlab.index.memory import InMemoryIndex
from kvlab.index.scorers import LongestPrefixScorer, Scorer
from kvlab.index.select import PodLoad
from kvlab.traces import Trace

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def _block_tokens(key: int, block_size_tokens: int) -> np.ndarray:
    """``block_size_tokens`` token ids (< 2**31) derived from a block key by splitmix64."""
    out = np.empty(block_size_tokens, dtype=np.uint32)
    for j in range(block_size_tokens):
        z = (key + (j + 1) * _MIX) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        out[j] = (z ^ (z >> 31)) & 0x7FFFFFFF
    return out


def trace_token_ids(trace: Trace, block_size_tokens: int = 16) -> list[np.ndarray]:
    """Token ids for each request of ``trace``: its full blocks, each block key expanded to
    ``block_size_tokens`` tokens (``uint32``), the same tokens for the same key.

    A trace of chained keys (Mooncake's hash ids) keeps its prefix sharing exactly; the
    prompt is rescaled to ``block_size_tokens`` tokens per trace block.

    Raises:
        ValueError: not a Trace, or ``block_size_tokens`` not an integer >= 1.

    Example:
        >>> from kvlab.traces import load_trace
        >>> tokens = trace_token_ids(load_trace("conversation").head(2), 4)
        >>> [len(t) for t in tokens], bool((tokens[0][:4] == tokens[1][:4]).all())  # a shared first block
        ([52, 56], True)
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    if isinstance(block_size_tokens, bool) or not isinstance(block_size_tokens, (int, np.integer)) \
            or block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be an integer >= 1, got {block_size_tokens!r}")
    cache: dict[int, np.ndarray] = {}
    out = []
    size = trace.block_size
    for keys, n in zip(trace.frame["block_keys"].to_list(), trace.frame["input_tokens"].to_list()):
        blocks = [cache.setdefault(k, _block_tokens(k, int(block_size_tokens))) for k in keys[: n // size]]
        out.append(np.concatenate(blocks) if blocks else np.empty(0, dtype=np.uint32))
    return out


def _index_prefix_blocks(keys: list[int], index: InMemoryIndex, pod: str) -> int:
    """The consecutive request keys, from the first, the index says ``pod`` holds (any tier)."""
    hits = index.lookup(keys, [pod]) if keys else {}
    return next((i for i, key in enumerate(keys) if key not in hits), len(keys))


def _cached_prefix_blocks(engine_keys: list[int], manager: KVCacheManager) -> int:
    """The consecutive blocks, from the first, cached in ``manager``'s pool (the truth)."""
    cached = manager.block_pool.cached_block_hash_to_block
    return next((i for i, key in enumerate(engine_keys) if not cached.get(key)), len(engine_keys))


def route_requests(arrival_s: Sequence[float], token_ids: Sequence[np.ndarray], *, n_pods: int = 2,
                   capacity_blocks: int = 1_000, block_size_tokens: int = 16, scorer: Scorer | None = None,
                   faults: FaultInjector | None = None, seed: int = 0) -> pl.DataFrame:
    """Route requests over ``n_pods`` pods by a global index fed through ``faults``.

    Per request, in arrival order: deliver the events due by its arrival to the index;
    the scorer picks a pod over the index (loads: each pod's cached blocks as its tree
    size); the pod serves it (vLLM prefix lookup, allocation, free at once); its KV
    events go to the fault injector (one message per request, seq per pod). The truth
    is read from the pods' block pools. Engine block size = the index's canonical block
    size.

    Args:
        arrival_s: arrival time of each request, seconds, non-decreasing.
        token_ids: each request's prompt tokens.
        n_pods: pods ``pod-0 .. pod-{n-1}`` (>= 1).
        capacity_blocks: usable GPU blocks per pod (>= 1).
        block_size_tokens: tokens per block, engine and index alike.
        scorer: the routing rule (default llm-d longest prefix).
        faults: what happens to events on the way (``None``: delivered at once). Called
            once per message, so its ``swap_p`` (pairs of deliveries) has no effect here.
        seed: the router's tie-breaking seed.

    Returns:
        One row per request: ``arrival_s``, ``pod`` (chosen), ``index_prefix_blocks``
        (what the index credited the chosen pod), ``true_prefix_blocks`` (what it
        really held), ``best_true_prefix_blocks`` (the best pod's), ``hit_blocks``
        (served from cache), ``wrong`` (``true < best``), ``prompt_blocks``.

    Raises:
        ValueError: mismatched lengths, an arrival time that is not a finite number >= 0 or
            goes back, a bad count, scorer, fault injector or seed.

    Example:
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace("conversation").head(40)
        >>> frame = route_requests(trace.frame["arrival_s"].to_list(), trace_token_ids(trace, 4), block_size_tokens=4)
        >>> frame.height, int(frame["wrong"].sum())
        (40, 0)
    """
    if len(arrival_s) != len(token_ids):
        raise ValueError(f"arrival_s has {len(arrival_s)} times but token_ids {len(token_ids)} prompts")
    for name, value in (("n_pods", n_pods), ("capacity_blocks", capacity_blocks),
                        ("block_size_tokens", block_size_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    scorer = LongestPrefixScorer() if scorer is None else scorer
    if not isinstance(scorer, Scorer):
        raise ValueError(f"scorer must be a kvlab.index Scorer, got {type(scorer).__name__}")
    if faults is not None and not isinstance(faults, FaultInjector):
        raise ValueError(f"faults must be a FaultInjector or None, got {type(faults).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    pods = [f"pod-{i}" for i in range(int(n_pods))]
    engine_hasher = get_hasher("vllm", block_size=int(block_size_tokens))
    managers = {}
    for pod in pods:
        pool = BlockPool(int(capacity_blocks) + 1, block_size=int(block_size_tokens), enable_kv_cache_events=True)
        managers[pod] = KVCacheManager(pool, block_size=int(block_size_tokens))
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size_tokens=int(block_size_tokens))
    pending: list[tuple[float, int, Delivery]] = []
    seqs = dict.fromkeys(pods, 0)
    rng = np.random.default_rng(seed)
    rows = []
    last_s = -np.inf
    for r, (t, tokens) in enumerate(zip(arrival_s, token_ids)):
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not 0 <= t < np.inf:
            raise ValueError(f"arrival_s[{r}] must be a finite number >= 0 (seconds), got {t!r}")
        t = float(t)
        if t < last_s:
            raise ValueError(f"arrival_s[{r}] = {t} is before arrival_s[{r - 1}] = {last_s}")
        last_s = t
        while pending and pending[0][0] <= t:
            d = heapq.heappop(pending)[2]
            ingestor.ingest_batch(d.pod, d.seq, d.batch)
        keys = [int(k) for k in ingestor.hasher.block_keys(tokens)] if len(tokens) else []
        engine_keys = [int(k) for k in engine_hasher.block_keys(tokens)] if len(tokens) else []
        loads = {pod: PodLoad(tree_size_blocks=len(managers[pod].block_pool.cached_block_hash_to_block)) for pod in pods}
        pod = scorer.select(keys, index, pods, loads=loads, rng=rng)
        credited = _index_prefix_blocks(keys, index, pod)
        true = {p: _cached_prefix_blocks(engine_keys, managers[p]) for p in pods}
        hit_blocks = 0
        admitted = True
        if len(tokens):
            manager = managers[pod]
            request = Request.from_tokens(f"r{r}", tokens, engine_hasher)
            blocks, n_hit = manager.get_computed_blocks(request)
            admitted = manager.allocate_slots(request, request.num_tokens - n_hit, n_hit, blocks) is not None
            if admitted:
                hit_blocks = len(blocks)
                manager.free(request)
            events = manager.take_events()
            if events:
                message = (t, pod, seqs[pod], EventBatch(t, events))
                seqs[pod] += 1
                deliveries = [Delivery(t, t, pod, message[2], message[3])] if faults is None else faults.inject([message])
                for d in deliveries:
                    heapq.heappush(pending, (d.delivered_s, len(rows) * 4 + int(d.copy), d))
        rows.append({"arrival_s": t, "pod": pod, "index_prefix_blocks": credited, "true_prefix_blocks": true[pod],
                     "best_true_prefix_blocks": max(true.values()), "hit_blocks": hit_blocks,
                     "wrong": true[pod] < max(true.values()), "prompt_blocks": len(keys), "admitted": admitted})
    return pl.DataFrame(rows, schema={"arrival_s": pl.Float64, "pod": pl.Utf8, "index_prefix_blocks": pl.Int64,
                                      "true_prefix_blocks": pl.Int64, "best_true_prefix_blocks": pl.Int64,
                                      "hit_blocks": pl.Int64, "wrong": pl.Boolean, "prompt_blocks": pl.Int64,
                                      "admitted": pl.Boolean})
