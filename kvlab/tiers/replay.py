"""Tiered replay: a trace's requests, in arrival order, through a :class:`~kvlab.tiers.store.TieredStore`.

Each request is :meth:`~kvlab.tiers.store.TieredStore.access_request`: look up the
combined contiguous prefix over the tiers (each hit block answered by the fastest tier
holding it), then serve every hit block and store every computed one in ``touch_order``,
per the write policy and ``promote``. Two engines give identical results:

* ``"kernel"``: the numba replay of :mod:`kvlab.tiers.kernel` (every tier LRU, at most
  :data:`~kvlab.tiers.kernel.MAX_TIERS` tiers), tens of millions of block refs/s;
* ``"reference"``: the readable :class:`~kvlab.tiers.store.TieredStore` itself, for any
  policies (``None`` included), request by request.

Token hits count full blocks as ``block_size`` tokens and the last block as the input's
remainder (``hit_tokens = min(hit_blocks * block_size, input_tokens)``), as
:func:`kvlab.sim.replay`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np
import polars as pl

from kvlab.policies import get_policy
from kvlab.core.semantics import TOUCH_ORDERS
from kvlab.tiers.kernel import (
    COUNTERS,
    MAX_TIERS,
    WRITE_BACK,
    expand_used,
    make_tiered_state,
    max_request_blocks,
    request_columns,
    tiered_replay_range,
)
from kvlab.tiers.kernel_exclusive import exclusive_replay_range, make_exclusive_state
from kvlab.tiers.store import WRITE_POLICIES, TieredStore, TierSpec, tier_specs
from kvlab.tiers.tier import TierCounters
from kvlab.traces import Trace
from kvlab.traces.flat import FlatTrace

#: Engines of :func:`replay_tiered`.
ENGINES = ("auto", "kernel", "reference")


@dataclass(frozen=True, eq=False)
class TieredReplayResult:
    """Output of :func:`replay_tiered`.

    Attributes:
        requests: one row per request: ``request_id`` (u64), ``arrival_s`` (f64),
            ``input_tokens`` (u32), ``hit_blocks`` and ``computed_blocks`` (u32: the
            combined prefix found over the tiers, and the rest), then per tier
            ``hit_blocks_<tier>`` (u32, hit blocks that tier answered) and
            ``used_blocks_<tier>`` (u32, resident blocks after the request), and
            ``measured`` (bool, false during warm-up).
        tier_counters: one row per tier: ``tier``, ``capacity_blocks`` (null =
            unbounded), ``policy``, then the :class:`~kvlab.tiers.tier.TierCounters`
            (i64 blocks, over the measured requests).
        summary: totals over the measured requests: ``requests``, ``warmup_requests``,
            ``block_refs``, ``hit_blocks``, ``block_hit_ratio``, ``input_tokens``,
            ``hit_tokens``, ``token_hit_ratio``, ``tier_hit_blocks`` (tier name → hit
            blocks), and ``engine``, ``write_policy``, ``promote``, ``touch_order``.
        engine: the engine that ran (``"kernel"`` or ``"reference"``).
    """

    requests: pl.DataFrame
    tier_counters: pl.DataFrame
    summary: dict
    engine: str

    @property
    def tier_names(self) -> list[str]:
        """The tiers' names, fastest first."""
        return self.tier_counters["tier"].to_list()

    def timeline(self, max_points: int = 1000) -> pl.DataFrame:
        """Resident blocks per tier over the run, long format for charts: ``step`` (i64,
        request index), ``time_s`` (f64, arrival), ``tier`` (str), ``metric`` (str:
        ``"used_blocks"``), ``value`` (f64); at most ``max_points`` evenly spaced requests
        (the first and the last included) per tier.

        Raises:
            ValueError: ``max_points`` is not an integer >= 1.
        """
        if isinstance(max_points, bool) or not isinstance(max_points, (int, np.integer)) or max_points < 1:
            raise ValueError(f"max_points must be an integer >= 1, got {max_points!r}")
        n = self.requests.height
        step = np.arange(n, dtype=np.int64) if n <= max_points \
            else np.unique(np.linspace(0, n - 1, int(max_points)).round().astype(np.int64))
        time_s = self.requests["arrival_s"].to_numpy()[step]
        return pl.concat([
            pl.DataFrame({"step": step, "time_s": time_s, "tier": name, "metric": "used_blocks",
                          "value": self.requests[f"used_blocks_{name}"].to_numpy()[step].astype(np.float64)})
            for name in self.tier_names
        ])


def replay_tiered(trace: Trace, tiers: Sequence[TierSpec | tuple], *, write_policy: str = "write_back",
                  promote: bool = True, touch_order: str = "head_most_recent", selective_hits: int = 2,
                  engine: str = "auto", warmup_fraction: float = 0.0,
                  walk: str = "per_block") -> TieredReplayResult:
    """Replay ``trace`` through tiered storage (GPU / CPU / NVMe / remote ...).

    Args:
        trace: the workload.
        tiers: :class:`~kvlab.tiers.store.TierSpec` or ``(name, capacity_blocks[, policy])``
            tuples, fastest first, as :class:`~kvlab.tiers.store.TieredStore` takes.
        write_policy: one of :data:`~kvlab.tiers.store.WRITE_POLICIES`.
        promote: copy (move, under write-back) a lower-tier hit up, or serve it in place.
        touch_order: ``"head_most_recent"`` (the tail touched first) or ``"tail_most_recent"``.
        selective_hits: uses of a block before ``write_through_selective`` copies it down.
        engine: ``"kernel"`` (numba; every tier's policy ``"lru"``), ``"reference"``
            (the :class:`~kvlab.tiers.store.TieredStore`, any policies) or ``"auto"``
            (the kernel when it can).
        warmup_fraction: fraction in [0, 1) of the first requests excluded from the
            summary and the counters (they still fill the tiers).
        walk: the lookup walk over the tiers (``"per_block"``, or ``"opal"``: Opal's strict
            walk, reference engine only).

    Returns:
        A :class:`TieredReplayResult`.

    Raises:
        ValueError: a bad argument (the message names it and its value), or
            ``engine="kernel"`` with a tier whose policy is not ``"lru"``.

    Example:
        >>> from kvlab.sim import replay
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace("conversation")
        >>> result = replay_tiered(trace, [("GPU", 2_000), ("CPU", 8_000)])
        >>> result.summary["tier_hit_blocks"]
        {'GPU': 15665, 'CPU': 45381}
        >>> result.summary["hit_blocks"] == replay(trace, capacity_blocks=10_000).summary.hit_blocks
        True
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    specs = tier_specs(tiers)
    if touch_order not in TOUCH_ORDERS:
        raise ValueError(f"touch_order must be one of {TOUCH_ORDERS}, got {touch_order!r}")
    if not isinstance(promote, (bool, np.bool_)):
        raise ValueError(f"promote must be a bool, got {promote!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    w = warmup_fraction
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
        raise ValueError(f"warmup_fraction must be a number in [0, 1), got {w!r}")
    for spec in specs:
        if spec.policy is not None:
            get_policy(spec.policy)
    not_lru = [s for s in specs if s.policy != "lru"]
    if engine == "kernel" and not_lru:
        raise ValueError(f"engine='kernel' needs every tier's policy to be 'lru': tier {not_lru[0].name!r} has "
                         f"policy {not_lru[0].policy!r} (use engine='reference')")
    if engine == "kernel" and len(specs) > MAX_TIERS:
        raise ValueError(f"engine='kernel' takes at most {MAX_TIERS} tiers, got {len(specs)} (use engine='reference')")
    if engine == "kernel" and walk != "per_block":
        raise ValueError(f"engine='kernel' implements walk='per_block' only, got walk={walk!r} (use engine='reference')")
    use_kernel = engine == "kernel" or (engine == "auto" and not not_lru and len(specs) <= MAX_TIERS
                                        and walk == "per_block")
    keys = None if use_kernel else trace.frame["block_keys"].to_list()
    store = TieredStore(specs, write_policy=write_policy, promote=bool(promote),
                        selective_hits=selective_hits, walk=walk)  # validates the rest
    skip = int(np.floor(w * len(trace)))
    if use_kernel:
        run = run_tiered(trace.flat, [s.capacity_blocks for s in specs], write_policy=write_policy,
                         promote=bool(promote), touch_order=touch_order, selective_hits=selective_hits, split=skip)
        hits, used = run.hit_blocks, run.used_log
        counters = {name: run.counters[:, i] - run.counters_at_split[:, i] for i, name in enumerate(COUNTERS)}
    else:
        hits, used_blocks, counters = _run_reference(store, keys, touch_order, skip)
        used = np.column_stack((np.arange(len(keys), dtype=np.int64), used_blocks))  # a log of every request
    return _result(trace, specs, hits, used, counters, skip, "kernel" if use_kernel else "reference",
                   {"write_policy": write_policy, "promote": bool(promote), "touch_order": touch_order})


class TieredRun(NamedTuple):
    """Raw output of :func:`run_tiered`: ``hit_blocks`` (``[n_requests, T]``, the
    narrowest unsigned type holding the longest request), the resident blocks per tier
    logged where they change (``used_log``: rows of the request, then one column per tier;
    :attr:`used_blocks` expands it), the counters (``int64[T, len(COUNTERS)]``, columns
    :data:`~kvlab.tiers.kernel.COUNTERS`) after the whole run and after the first
    ``split`` requests."""

    hit_blocks: np.ndarray
    used_log: np.ndarray
    counters: np.ndarray
    counters_at_split: np.ndarray

    @property
    def used_blocks(self) -> np.ndarray:
        """The resident blocks per tier after each request (``[n_requests, T]``, the log's type)."""
        return expand_used(self.used_log, self.hit_blocks.shape[0])


def run_tiered(flat: FlatTrace, capacities_blocks: list[int | None], *, write_policy: str = "write_back",
               promote: bool = True, touch_order: str = "head_most_recent", selective_hits: int = 2,
               split: int = 0, exclusive: bool = True) -> TieredRun:
    """The numba replay of a flat trace through fresh LRU tiers (no checks: see
    :func:`replay_tiered`). ``split``: also snapshot the counters after that many
    requests (a warm-up). Write-back with promotion and no tier of capacity 0 runs
    :func:`~kvlab.tiers.kernel.exclusive_replay_range` unless ``exclusive=False``, every
    other configuration :func:`~kvlab.tiers.kernel.tiered_replay_range`.

    Example:
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> flat = flatten_block_keys(pl.Series([[7, 8, 9], [7, 8, 9]]), pl.Series([3, 3]), block_size=1)
        >>> run = run_tiered(flat, [2, 4])  # write-back: block 9 went down to the second tier
        >>> run.hit_blocks.tolist(), run.used_blocks.tolist()
        ([[0, 0], [2, 1]], [[2, 1], [2, 1]])
    """
    n_requests, n_tiers = flat.n_requests, len(capacities_blocks)
    longest = max_request_blocks(flat.offsets)
    hits = np.zeros((n_requests, n_tiers), dtype=np.min_scalar_type(longest) if longest else np.uint8)
    # the log of the resident blocks: only the rows written are ever touched (np.empty)
    used = np.empty((n_requests, n_tiers + 1), dtype=np.int32 if n_requests < 2**31 else np.int64)
    n_logged = np.zeros(1, dtype=np.int64)
    split = min(max(int(split), 0), n_requests)
    code, reverse = WRITE_POLICIES.index(write_policy), touch_order == "head_most_recent"
    if exclusive and code == WRITE_BACK and promote and flat.n_keys > 0 \
            and all(c is None or c > 0 for c in capacities_blocks):
        state = make_exclusive_state(flat.n_keys, capacities_blocks)
        args, kernel = (reverse, state, hits, used, n_logged), exclusive_replay_range
    else:
        state = make_tiered_state(flat.n_keys, capacities_blocks)
        args = (reverse, code, bool(promote), min(int(selective_hits), 2**31 - 1), state, hits, used, n_logged)
        kernel = tiered_replay_range
    kernel(flat.offsets, flat.block_ids, 0, split, *args)
    at_split = state.counters.copy()
    kernel(flat.offsets, flat.block_ids, split, n_requests, *args)
    return TieredRun(hits, used[:n_logged[0]], state.counters.copy(), at_split)


def _run_reference(store: TieredStore, keys: list[list[int]], touch_order: str,
                   skip: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Request by request through the store: hits and used blocks per tier, counters after warm-up."""
    n, n_tiers = len(keys), len(store.tiers)
    hits = np.zeros((n, n_tiers), dtype=np.int32)
    used = np.zeros((n, n_tiers), dtype=np.int32)
    at_split = store.counters()
    for r, request in enumerate(keys):
        if r == skip:
            at_split = store.counters()
        for t in store.access_request(request, touch_order=touch_order).tiers:
            hits[r, t] += 1
        used[r] = [len(tier) for tier in store.tiers]
    end = store.counters()
    if skip >= n:
        at_split = end
    names = [f.name for f in fields(TierCounters)]
    counters = {c: np.array([end[t.name][c] - at_split[t.name][c] for t in store.tiers], dtype=np.int64)
                for c in names}
    return hits, used, counters


def _result(trace: Trace, specs: list[TierSpec], hit_blocks: np.ndarray, used_log: np.ndarray,
            counters: dict[str, np.ndarray], skip: int, engine: str, options: dict) -> TieredReplayResult:
    """The frames and summary from the hit blocks per request and tier and the log of the
    resident blocks (:attr:`TieredRun.used_log`)."""
    flat = trace.flat
    n_tiers = len(specs)
    n = flat.n_requests
    hits, used = np.empty((n_tiers, n), dtype=np.uint32), np.empty((n_tiers, n), dtype=np.uint32)
    total, computed = np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.uint32)
    tier_hits = np.zeros(n_tiers, dtype=np.int64)
    hit_sum, hit_tokens, n_inputs = request_columns(flat.offsets, flat.input_tokens, flat.block_size, skip, hit_blocks,
                                                    used_log, hits, used, total, computed, tier_hits)
    measured = np.ones(flat.n_requests, dtype=np.bool_)
    measured[:skip] = False
    columns = {
        "request_id": trace.frame["request_id"],
        "arrival_s": trace.frame["arrival_s"],
        "input_tokens": trace.frame["input_tokens"],
        "hit_blocks": pl.Series(total),
        "computed_blocks": pl.Series(computed),
    }
    for t, spec in enumerate(specs):
        columns[f"hit_blocks_{spec.name}"] = pl.Series(hits[t])
    for t, spec in enumerate(specs):
        columns[f"used_blocks_{spec.name}"] = pl.Series(used[t])
    columns["measured"] = measured
    zeros = np.zeros(n_tiers, dtype=np.int64)
    rows = {f.name: counters.get(f.name, zeros).astype(np.int64) for f in fields(TierCounters)}
    rows["removed_blocks"] = rows["evicted_blocks"] + rows["promoted_out_blocks"] + rows["cleared_blocks"] \
        + rows["dropped_blocks"]
    tier_counters = pl.DataFrame({
        "tier": [s.name for s in specs],
        "capacity_blocks": pl.Series([s.capacity_blocks for s in specs], dtype=pl.Int64),
        "policy": pl.Series([s.policy for s in specs], dtype=pl.String),
        **rows,
    })
    refs, hit_sum, hit_tokens, n_inputs = int(flat.offsets[-1] - flat.offsets[skip]), int(hit_sum), int(hit_tokens), \
        int(n_inputs)
    summary = {
        "requests": flat.n_requests - skip, "warmup_requests": skip,
        "block_refs": refs, "hit_blocks": hit_sum,
        "block_hit_ratio": hit_sum / refs if refs else 0.0,
        "input_tokens": n_inputs, "hit_tokens": hit_tokens,
        "token_hit_ratio": hit_tokens / n_inputs if n_inputs else 0.0,
        "tier_hit_blocks": {s.name: int(tier_hits[t]) for t, s in enumerate(specs)},
        "engine": engine, **options,
    }
    return TieredReplayResult(pl.DataFrame(columns), tier_counters, summary, engine)
