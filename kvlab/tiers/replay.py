"""Tiered replay: a trace's requests, in arrival order, through a :class:`~kvlab.tiers.store.TieredStore`.

Each request is :meth:`~kvlab.tiers.store.TieredStore.access_request`: look up the
combined contiguous prefix over the tiers (each hit block answered by the fastest tier
holding it), then serve every hit block and store every computed one in ``touch_order``,
per the write policy and ``promote``. Two engines give identical results:

* ``"kernel"``: the numba driver of :mod:`kvlab.tiers.driver`, one policy state per tier
  (every policy that does not read the whole trace, and ``None``; at most
  :data:`~kvlab.tiers.driver.MAX_TIERS` tiers; ``walk="per_block"``);
* ``"reference"``: the readable :class:`~kvlab.tiers.store.TieredStore` itself, request by
  request (any tiers, either walk).

Token hits count full blocks as ``block_size`` tokens and the last block as the input's
remainder (``hit_tokens = min(hit_blocks * block_size, input_tokens)``), as
:func:`kvlab.sim.replay`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import fields
from typing import NamedTuple

import numpy as np
import polars as pl

from kvlab.policies import get_policy
from kvlab.policies.base import has_tier_hooks
from kvlab.tiers.driver import COUNTERS, MAX_TIERS, max_request_blocks, tiered_replay_range
from kvlab.tiers.result import TieredReplayResult, build_result, counters_of, used_log_of
from kvlab.tiers.store import TieredStore
from kvlab.tiers.tier import TierCounters
from kvlab.tiers.types import WRITE_POLICIES, TieredConfig, TierSpec
from kvlab.traces import Trace
from kvlab.traces.flat import FlatTrace, flatten_block_keys


def replay_tiered(trace: Trace, tiers: Sequence[TierSpec | tuple], *, write_policy: str = "write_back",
                  promote: bool = True, touch_order: str = "head_most_recent", selective_hits: int = 2,
                  engine: str = "auto", warmup_fraction: float = 0.0, walk: str = "per_block") -> TieredReplayResult:
    """Replay ``trace`` through tiered storage (GPU / CPU / NVMe / remote ...).

    Models the tiered stores of SGLang HiCache, LMCache, Dynamo KVBM and Opal
    (:class:`~kvlab.tiers.store.TieredStore`).

    Args:
        trace: the workload.
        tiers: :class:`~kvlab.tiers.types.TierSpec` or ``(name, capacity_blocks[, policy])``
            tuples, fastest first, as :class:`~kvlab.tiers.store.TieredStore` takes.
        write_policy: one of :data:`~kvlab.tiers.types.WRITE_POLICIES`.
        promote: copy (move, under write-back) a lower-tier hit up, or serve it in place.
        touch_order: ``"head_most_recent"`` (the tail touched first) or ``"tail_most_recent"``.
        selective_hits: uses of a block before ``write_through_selective`` copies it down.
        engine: ``"kernel"`` (numba), ``"reference"`` (the
            :class:`~kvlab.tiers.store.TieredStore`) or ``"auto"`` (the kernel when it can).
        warmup_fraction: fraction in [0, 1) of the first requests excluded from the
            summary and the counters (they still fill the tiers).
        walk: the lookup walk over the tiers (``"per_block"``, or ``"opal"``: Opal's strict
            walk, reference engine only).

    Returns:
        A :class:`~kvlab.tiers.result.TieredReplayResult`.

    Raises:
        ValueError: a bad argument (the message names it and its value), a trace without
            block identity, or
            ``engine="kernel"`` where the kernel cannot run (a policy without tier hooks,
            more than :data:`~kvlab.tiers.driver.MAX_TIERS` tiers, ``walk="opal"``).

    Example:
        >>> from kvlab.sim import replay
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace("conversation")
        >>> result = replay_tiered(trace, [("GPU", 2_000), ("CPU", 8_000)])
        >>> result.summary.tier_hit_blocks
        {'GPU': 15665, 'CPU': 45381}
        >>> result.summary.hit_blocks == replay(trace, capacity_blocks=10_000).summary.hit_blocks
        True
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    trace.require_block_identity("a tiered cache replay (kvlab.tiers.replay_tiered)")
    config = TieredConfig(tiers, write_policy=write_policy, promote=promote, selective_hits=selective_hits, walk=walk,
                          touch_order=touch_order, warmup_fraction=warmup_fraction, engine=engine)
    why_not = _why_not_kernel(config)
    if config.engine == "kernel" and why_not:
        raise ValueError(f"engine='kernel' {why_not} (use engine='reference')")
    skip = config.warmup_requests(len(trace))
    if config.engine == "reference" or why_not:
        hits, used_log, counters = _run_reference(trace, config, skip)
        return build_result(trace, config, "reference", hits, used_log, counters, skip)
    run = run_tiered(trace.flat, config.tiers, write_policy=config.write_policy, promote=config.promote,
                     touch_order=config.touch_order, selective_hits=config.selective_hits, split=skip)
    counters = counters_of({name: run.counters[:, i] - run.counters_at_split[:, i] for i, name in enumerate(COUNTERS)})
    return build_result(trace, config, "kernel", run.hit_blocks, run.used_log, counters, skip)


def _why_not_kernel(config: TieredConfig) -> str:
    """Why the kernel cannot run ``config`` (empty: it can)."""
    if len(config.tiers) > MAX_TIERS:
        return f"takes at most {MAX_TIERS} tiers, got {len(config.tiers)}"
    if config.walk != "per_block":
        return f"implements walk='per_block' only, got walk={config.walk!r}"
    for spec in config.tiers:
        if not has_tier_hooks(get_policy(spec.policy or "lru").make_state(_probe(), 1)):
            return (f"needs every tier's policy to have the tier hooks (kvlab.policies.base): tier {spec.name!r} has "
                    f"policy {spec.policy!r}")
    return ""


@functools.cache
def _probe() -> FlatTrace:
    """A one-block trace, to build a policy's state and see its hooks."""
    return flatten_block_keys(pl.Series([[0]], dtype=pl.List(pl.UInt64)), pl.Series([1]), block_size=1)


class TieredRun(NamedTuple):
    """Raw output of :func:`run_tiered`: ``hit_blocks`` (``[num_requests, T]``, the
    narrowest unsigned type holding the longest request), the resident blocks per tier
    logged where they change (``used_log``: rows of the request, then one column per tier),
    the counters (``int64[T, len(COUNTERS)]``, columns
    :data:`~kvlab.tiers.driver.COUNTERS`) after the whole run and after the first
    ``split`` requests."""

    hit_blocks: np.ndarray
    used_log: np.ndarray
    counters: np.ndarray
    counters_at_split: np.ndarray


def run_tiered(flat: FlatTrace, tiers: Sequence[TierSpec], *, write_policy: str = "write_back",
               promote: bool = True, touch_order: str = "head_most_recent", selective_hits: int = 2,
               split: int = 0) -> TieredRun:
    """The numba replay of a flat trace through fresh tiers (no checks: see
    :func:`replay_tiered`; every tier's policy must have the tier hooks). ``split``: also
    snapshot the counters after that many requests (a warm-up).

    Example:
        >>> import polars as pl
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> flat = flatten_block_keys(pl.Series([[7, 8, 9], [7, 8, 9]]), pl.Series([3, 3]), block_size=1)
        >>> run = run_tiered(flat, [TierSpec("GPU", 2), TierSpec("CPU", 4, "sieve")])  # 9 went down to the CPU
        >>> run.hit_blocks.tolist(), run.used_log.tolist()
        ([[0, 0], [2, 1]], [[0, 2, 1]])
    """
    num_requests, num_tiers, num_keys = flat.num_requests, len(tiers), flat.num_keys
    longest = max_request_blocks(flat.offsets)
    hits = np.zeros((num_requests, num_tiers), dtype=np.min_scalar_type(longest) if longest else np.uint8)
    # the log of the resident blocks: only the rows written are ever touched (np.empty)
    used_log = np.empty((num_requests, num_tiers + 1), dtype=np.int32 if num_requests < 2**31 else np.int64)
    num_logged = np.zeros(1, dtype=np.int64)
    capacity = np.array([num_keys if s.capacity_blocks is None else min(s.capacity_blocks, num_keys) for s in tiers],
                        dtype=np.int64)
    states = tuple(get_policy(s.policy or "lru").make_state(flat, int(c)) for s, c in zip(tiers, capacity))
    evicts = np.array([s.policy is not None for s in tiers], dtype=np.bool_)
    used = np.zeros(num_tiers, dtype=np.int64)
    where, uses = np.zeros(num_keys, dtype=np.uint8), np.zeros(num_keys, dtype=np.int32)
    counters = np.zeros((num_tiers, len(COUNTERS)), dtype=np.int64)
    split = min(max(int(split), 0), num_requests)
    args = (touch_order == "head_most_recent", WRITE_POLICIES.index(write_policy), bool(promote),
            min(int(selective_hits), 2**31 - 1), states, where, capacity, evicts, used, uses, counters, hits,
            used_log, num_logged, np.zeros(num_tiers + 1, dtype=np.int64))
    tiered_replay_range(flat.offsets, flat.block_ids, 0, split, *args)
    at_split = counters.copy()
    tiered_replay_range(flat.offsets, flat.block_ids, split, num_requests, *args)
    return TieredRun(hits, used_log[:num_logged[0]], counters, at_split)


def _run_reference(trace: Trace, config: TieredConfig,
                   skip: int) -> tuple[np.ndarray, np.ndarray, list[TierCounters]]:
    """Request by request through the store: hits per tier, the log of the resident blocks,
    counters over the requests from ``skip`` on."""
    store = TieredStore(config.tiers, write_policy=config.write_policy, promote=config.promote,
                        selective_hits=config.selective_hits, walk=config.walk)
    keys = trace.frame["block_keys"].to_list()
    n, num_tiers = len(keys), len(store.tiers)
    hits = np.zeros((n, num_tiers), dtype=np.int32)
    used = np.zeros((n, num_tiers), dtype=np.int64)
    at_split = store.counters()
    for r, request in enumerate(keys):
        if r == skip:
            at_split = store.counters()
        for t in store.access_request(request, touch_order=config.touch_order).tiers:
            hits[r, t] += 1
        used[r] = [len(tier) for tier in store.tiers]
    end = store.counters()
    if skip >= n:
        at_split = end
    names = [f.name for f in fields(TierCounters)]
    counters = counters_of({c: np.array([end[t.name][c] - at_split[t.name][c] for t in store.tiers]) for c in names})
    return hits, used_log_of(used), counters
