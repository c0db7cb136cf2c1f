"""Miss-ratio curves: the LRU hit ratio at every capacity from one pass over a trace.

Mattson et al., "Evaluation techniques for storage hierarchies" (IBM Systems Journal,
1970): LRU keeps the ``C`` most recently used blocks at every capacity ``C`` (the
inclusion property), so the stack distance of each lookup decides hit or miss at all
capacities at once. kvlab's prefix semantics (docs/DESIGN.md) carry over: a request's
block ``j`` is a prefix hit at ``C`` iff blocks ``0..j`` all are, i.e. iff the running
maximum of their distances is ``<= C``. Distances are counted with a Fenwick tree over
access timestamps (:mod:`kvlab.sim.mrc_kernel`).

SHARDS (Waldspurger, Park, Garthwaite, Ahmad: "Efficient MRC Construction with
SHARDS", FAST'15) samples block keys spatially to cut the work and memory further.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from kvlab.core.validate import check_choice, check_int, check_real
from kvlab.sim.mrc_kernel import SHARDS_MODULUS, shards_keep, stack_distance_histograms
from kvlab.sim.replay import TOUCH_ORDERS
from kvlab.sim.sweep import SWEEP_SCHEMA
from kvlab.traces import Trace

#: Number of points of the default capacity grid (log-spaced, see :func:`mrc`).
DEFAULT_GRID_POINTS = 100


def mrc(trace: Trace, *, capacities_blocks: Iterable[int | None] | None = None,
        touch_order: str = "head_most_recent", warmup_fraction: float = 0.0, shards_rate: float | None = None,
        seed: int = 0) -> pl.DataFrame:
    """LRU prefix-cache hit ratios at many capacities from one pass over ``trace``.

    Models Mattson et al.'s stack-distance pass (1970) under kvlab's prefix semantics, and
    SHARDS sampling (Waldspurger et al., FAST'15) when ``shards_rate`` is given. The exact
    curve equals separate :func:`kvlab.sim.replay` runs (policy ``"lru"``, mode
    ``"prefix"``) at every capacity — block hits, token hits and evictions alike (tested).
    Under SHARDS the ratios are estimates (``hit_blocks = round(block_hit_ratio ·
    block_refs)``, ``evictions`` null); capacities ``>= num_keys`` are exactly unbounded.
    ``docs/README.md`` ("Miss-ratio curves") gives the method, the SHARDS approximation
    under prefix semantics, its measured error on the bundled traces, and the cost.

    Args:
        trace: the workload.
        capacities_blocks: cache capacities in blocks (integers in ``[0, 2**63)``;
            ``None`` = unbounded), one row each, in the order given. Default: 100 log-spaced
            integers from 1 to ``trace.distinct_blocks`` (the working set, beyond which
            every capacity is unbounded), de-duplicated, then ``None``.
        touch_order: ``"head_most_recent"`` or ``"tail_most_recent"``
            (:class:`~kvlab.sim.ReplayConfig`).
        warmup_fraction: in ``[0, 1)``; the first ``floor(f · num_requests)`` requests
            fill the cache but are not counted.
        shards_rate: ``None`` (exact) or the SHARDS sampling rate in ``(0, 1]``
            (``>= 2**-24``, so that ``T >= 1``; far lower rates than ~0.01 sample too
            few keys for a useful curve: the error is reported, not prevented).
        seed: integer in ``[0, 2**64)`` choosing the SHARDS sample (unused when exact).

    Returns:
        One row per capacity, the schema of :func:`kvlab.sim.sweep`
        (:data:`~kvlab.sim.sweep.SWEEP_SCHEMA`): ``policy`` (``"lru"``),
        ``capacity_blocks`` (i64, null = unbounded), ``block_hit_ratio``,
        ``token_hit_ratio`` (f64; 0.0 when the denominator is 0), ``rejected_requests``
        (always 0), ``block_refs``, ``hit_blocks``, ``evictions`` (i64; evictions null
        under SHARDS), ``mean_orphaned_share`` (f64, always null: orphans are not tracked
        here), ``mode`` (``"prefix"``), ``hit_semantics``, ``touch_order`` (str),
        ``warmup_fraction`` (f64), ``source``.

    Raises:
        ValueError: ``trace`` is not a Trace or has no block identity; a capacity that is not an integer in
            ``[0, 2**63)`` or ``None``; an unknown ``touch_order``; ``warmup_fraction`` outside
            ``[0, 1)``; ``shards_rate`` outside ``(0, 1]`` or too small; ``seed`` not an
            integer in ``[0, 2**64)`` (each message names the parameter).

    Complexity:
        Time ``O(refs · log refs)`` (with SHARDS ``O(refs + num_keys + R · refs · log(R ·
        refs))``); memory about 4 bytes per (sampled) reference and 41 per distinct block,
        besides the trace's :class:`~kvlab.traces.FlatTrace`.

    Example:
        >>> from kvlab.paths import bundled_trace_path
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace(bundled_trace_path("conversation"))
        >>> curve = mrc(trace, capacities_blocks=[1_000, 10_000, None])
        >>> [(c, h, round(r, 4)) for c, h, r in curve.select("capacity_blocks", "hit_blocks", "block_hit_ratio").rows()]
        [(1000, 12847, 0.0445), (10000, 61046, 0.2116), (None, 105710, 0.3664)]
        >>> len(mrc(trace))  # default: 100 log-spaced capacities, de-duplicated (90 here), then unbounded
        91
        >>> round(mrc(trace, capacities_blocks=[10_000], shards_rate=0.1)["block_hit_ratio"][0], 4)
        0.1744
    """
    _check(trace, touch_order, warmup_fraction, shards_rate, seed)
    flat = trace.flat
    n, num_keys = flat.num_requests, flat.num_keys
    capacities = _capacities(capacities_blocks, num_keys)
    skip = int(np.floor(warmup_fraction * n))
    threshold = SHARDS_MODULUS if shards_rate is None else round(shards_rate * SHARDS_MODULUS)
    sampled = shards_rate is not None
    keep = shards_keep(flat.keys, threshold, seed) if sampled else np.ones(num_keys, dtype=np.bool_)
    num_slots = int(np.count_nonzero(keep[flat.block_ids])) if sampled else flat.num_refs
    block_hist, token_hist, evict_hist = (np.zeros(num_keys + 2, dtype=np.int64) for _ in range(3))
    stack_distance_histograms(flat.offsets, flat.block_ids, flat.input_tokens, flat.block_size, skip,
                              touch_order == "head_most_recent", sampled, keep, num_slots,
                              block_hist, token_hist, evict_hist)

    block_refs = int(flat.offsets[n] - flat.offsets[skip])
    inputs = flat.input_tokens[skip:]
    input_tokens = int(inputs.sum())
    cum_blocks = np.cumsum(block_hist[: num_keys + 1])  # [d] = hits at capacity d, d <= num_keys
    cum_tokens = np.cumsum(token_hist[: num_keys + 1])
    caps = np.array([num_keys if c is None else min(c, num_keys) for c in capacities], dtype=np.int64)
    if not sampled:
        hit_blocks = cum_blocks[caps]
        hit_tokens = cum_tokens[caps]
        evictions = np.where(caps > 0, evict_hist.sum() - np.cumsum(evict_hist)[caps], 0)
        block_ratio = hit_blocks / block_refs if block_refs else np.zeros(len(caps))
        token_ratio = hit_tokens / input_tokens if input_tokens else np.zeros(len(caps))
    else:
        # hit iff d / R <= C  <=>  d <= floor(C * T / P); C >= num_keys is exactly unbounded
        idx = np.where(caps >= num_keys, num_keys, np.minimum(caps * threshold // SHARDS_MODULUS, num_keys))
        sampled_refs, sampled_tokens = int(block_hist.sum()), int(token_hist.sum())
        block_weights = int(np.minimum(flat.blocks_per_request()[skip:] * flat.block_size, inputs).sum())
        block_ratio = cum_blocks[idx] / sampled_refs if sampled_refs else np.zeros(len(caps))
        token_ratio = (cum_tokens[idx] / sampled_tokens * block_weights / input_tokens
                       if sampled_tokens and input_tokens else np.zeros(len(caps)))
        hit_blocks = np.rint(block_ratio * block_refs).astype(np.int64)
        evictions = None
    k = len(capacities)
    return pl.DataFrame({
        "source": [trace.source] * k, "policy": ["lru"] * k, "mode": ["prefix"] * k, "hit_semantics": ["prefix"] * k,
        "touch_order": [touch_order] * k,
        "warmup_fraction": [float(warmup_fraction)] * k, "capacity_blocks": capacities,
        "block_refs": [block_refs] * k, "hit_blocks": hit_blocks,
        "evictions": pl.Series([None] * k, dtype=pl.Int64) if evictions is None else evictions,
        "block_hit_ratio": block_ratio, "token_hit_ratio": token_ratio, "rejected_requests": [0] * k,
        "mean_orphaned_share": pl.Series([None] * k, dtype=pl.Float64),
    }, schema=SWEEP_SCHEMA)


def _check(trace: object, touch_order: object, warmup_fraction: object, shards_rate: object, seed: object) -> None:
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    trace.require_block_identity("a miss-ratio curve (kvlab.sim.mrc)")
    check_choice("touch_order", touch_order, TOUCH_ORDERS)
    if check_real("warmup_fraction", warmup_fraction, low=0.0) >= 1.0:
        raise ValueError(f"warmup_fraction must be a number in [0, 1), got {warmup_fraction!r}")
    r = shards_rate
    if r is not None and round(check_real("shards_rate", r, low=0.0, high=1.0, low_open=True) * SHARDS_MODULUS) < 1:
        raise ValueError(f"shards_rate must be None or a number in (0, 1] that samples at least 1 in 2**24 keys "
                         f"(>= 2**-24), got {r!r}")
    check_int("seed", seed, low=0, high=2**64 - 1)


def _capacities(capacities_blocks: object, num_keys: int) -> list[int | None]:
    if capacities_blocks is None:
        grid = np.unique(np.rint(np.geomspace(1, num_keys, DEFAULT_GRID_POINTS))).astype(np.int64) if num_keys else []
        return [*(int(c) for c in grid), None]
    if isinstance(capacities_blocks, (str, bytes)) or not isinstance(capacities_blocks, Iterable):
        raise ValueError(f"capacities_blocks must be an iterable of integers >= 0 or None, got {capacities_blocks!r}")
    capacities = list(capacities_blocks)
    if not capacities:
        raise ValueError("capacities_blocks is empty: give at least one capacity (or None for the default grid)")
    return [check_int(f"capacities_blocks[{i}]", c, low=0, high=2**63 - 1, optional=True)
            for i, c in enumerate(capacities)]
