"""Cache-level replay: a trace's requests, in arrival order, through one prefix cache.

Hit semantics (docs/DESIGN.md): a request hits the longest run of its leading blocks that
are cached; then all its blocks are inserted or touched, in ``touch_order``. Token
hits count full blocks as ``block_size`` tokens and the last block as the input's
remainder, i.e. ``hit_tokens = min(hit_blocks * block_size, input_tokens)``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvlab.core.result import RunResult, RunSummary
from kvlab.core.semantics import HIT_SEMANTICS, TOUCH_ORDERS
from kvlab.core.validate import check_choice, check_flag, check_int, check_positive, check_real, config_with
from kvlab.engines.replay import replay_omlx
from kvlab.policies import get_policy
from kvlab.sim.kernel import make_orphan_tracker, replay_range
from kvlab.sim.replay_frames import frames_of, run_totals
from kvlab.sim.replay_pass import (
    ADMITTED,
    EVICTIONS,
    HIT_TOKENS,
    HITS,
    INPUT_TOKENS,
    NONEMPTY,
    PEAK_USED,
    REFS,
    RequestTotals,
)
from kvlab.sim.vllm_kernel import FREE_ORDERS, make_vllm_state, vllm_replay_range
from kvlab.traces import Trace
from kvlab.traces.flat import FlatTrace

#: Replay modes: kvlab's cache-level prefix cache, vLLM v1's block pool (:mod:`kvlab.sim.vllm_kernel`),
#: or oMLX's paged cache (:func:`kvlab.engines.replay_omlx`).
MODES = ("prefix", "vllm", "omlx")
_CHUNK_REFS = 2_000_000  # block refs per kernel call when a progress bar is shown
#: Default :attr:`ReplayConfig.timeline_points`: points per timeline metric (charts draw at most
#: about this many, see :mod:`kvlab.viz`).
TIMELINE_POINTS = 2_000


@dataclass(frozen=True)
class ReplayConfig:
    """What to replay a trace through.

    Attributes:
        policy: eviction policy name (see :data:`kvlab.policies.POLICIES`).
        capacity_blocks: cache capacity in blocks (≥ 0); ``None`` = unbounded.
        touch_order: ``"head_most_recent"`` (default: after a request, its first block
            is the most recently used, so its tail is evicted first, as vLLM's reverse
            free does) or ``"tail_most_recent"``.
        warmup_fraction: fraction in [0, 1) of the first requests excluded from the
            measured statistics (they still fill the cache): the first
            ``floor(warmup_fraction * num_requests)`` requests.
        window_requests: window of the timeline's rolling hit ratio, requests (≥ 1).
        mode: ``"prefix"`` (default: every block of a request, a partial last one
            included, is a cache entry under ``policy``) or ``"vllm"`` — vLLM v1's block
            pool, one request at a time: full blocks only, the last-token rule, no
            de-duplication, ``capacity_blocks`` physical blocks whose free queue is the
            eviction order (:mod:`kvlab.sim.vllm_kernel`; needs ``policy="lru"`` and
            the default touch order, which the free queue implies).
            ``"omlx"`` — oMLX's paged cache manager through :func:`kvlab.engines.replay_omlx`
            (the Python engine model, one request at a time; its result is that
            function's :class:`kvlab.engines.EngineResult`): ``capacity_blocks`` (>= 1, or
            ``None``) is the pool's usable blocks at ``max_blocks``, the pool created at
            that size; same ``policy`` / touch-order requirements as ``"vllm"``, no
            warm-up, ``window_requests`` unused.
        free_order: vLLM's free-queue discipline in ``"vllm"`` and ``"omlx"`` modes:
            ``"current"`` (unhashed blocks to the head, PR #42656; what ``None``, the
            default, becomes there) or ``"classic"``; must stay ``None`` in mode
            ``"prefix"``, which has no free queue.
        hit_semantics: ``"prefix"`` (default: the longest run of cached leading blocks)
            or ``"independent"`` (every block looked up and accessed on its own, in touch
            order — a plain object cache, for comparing with libCacheSim).
        track_orphans: count orphaned blocks (resident, parent not resident) after every
            request (timeline metric ``orphaned_blocks``; costs some speed).
        ssd_only: ``"omlx"`` mode only: oMLX's paged-SSD-only mode (block data on a paged
            SSD store, the pool holding metadata).
        ssd_capacity_blocks: ``"omlx"`` mode with ``ssd_only``: the SSD store's capacity in
            blocks (>= 1); ``None`` = unbounded.
        timeline_points: most points per metric the timeline records (>= 1; default
            :data:`TIMELINE_POINTS`), so its size does not grow with the trace; ``None`` =
            one point per request (full resolution). The requests are cut into buckets of
            ``ceil(num_requests / timeline_points)`` consecutive requests
            (:func:`kvlab.core.timeline_steps`); see :func:`replay` for what a point holds.
            The ``requests`` frame and the summary stay exact either way.

    Raises:
        ValueError: a field out of range or an unknown policy (names field and value).

    Example:
        >>> ReplayConfig(capacity_blocks=10_000).touch_order
        'head_most_recent'
        >>> ReplayConfig(capacity_blocks=-1)
        Traceback (most recent call last):
        ...
        ValueError: capacity_blocks must be an integer in [0, 2**63) or None, got -1
    """

    policy: str = "lru"
    capacity_blocks: int | None = None
    touch_order: str = "head_most_recent"
    warmup_fraction: float = 0.0
    window_requests: int = 1000
    mode: str = "prefix"
    free_order: str | None = None
    hit_semantics: str = "prefix"
    track_orphans: bool = False
    ssd_only: bool = False
    ssd_capacity_blocks: int | None = None
    timeline_points: int | None = TIMELINE_POINTS

    def __post_init__(self) -> None:
        get_policy(self.policy)
        normal = {
            "capacity_blocks": check_int("capacity_blocks", self.capacity_blocks, low=0, high=2**63 - 1,
                                         optional=True),
            "touch_order": check_choice("touch_order", self.touch_order, TOUCH_ORDERS),
            "warmup_fraction": check_real("warmup_fraction", self.warmup_fraction),
            "window_requests": check_positive("window_requests", self.window_requests),
            "mode": check_choice("mode", self.mode, MODES),
            "free_order": None if self.free_order is None else check_choice("free_order", self.free_order,
                                                                            FREE_ORDERS),
            "hit_semantics": check_choice("hit_semantics", self.hit_semantics, HIT_SEMANTICS),
            "track_orphans": check_flag("track_orphans", self.track_orphans),
            "ssd_only": check_flag("ssd_only", self.ssd_only),
            "ssd_capacity_blocks": check_int("ssd_capacity_blocks", self.ssd_capacity_blocks, low=1,
                                             high=2**63 - 1, optional=True),
            "timeline_points": check_int("timeline_points", self.timeline_points, low=1, optional=True),
        }
        if not 0.0 <= normal["warmup_fraction"] < 1.0:
            raise ValueError(f"warmup_fraction must be a number in [0, 1), got {self.warmup_fraction!r}")
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        if self.mode == "prefix" and self.free_order is not None:
            raise ValueError(f"free_order applies to modes 'vllm' and 'omlx' (vLLM's free queue), not to mode "
                             f"'prefix': got free_order={self.free_order!r}")
        if self.mode != "prefix" and self.free_order is None:
            object.__setattr__(self, "free_order", "current")
        if self.mode != "prefix" and (self.hit_semantics != "prefix" or self.track_orphans):
            raise ValueError(f"mode {self.mode!r} models vLLM's prefix lookups: hit_semantics='independent' and "
                             "track_orphans apply to mode 'prefix' only")
        if self.mode != "prefix" and (self.policy != "lru" or self.touch_order != "head_most_recent"):
            raise ValueError(f"mode {self.mode!r} replays vLLM's free queue, an LRU freed in reverse: it needs "
                             f"policy='lru' and touch_order='head_most_recent', got policy={self.policy!r}, "
                             f"touch_order={self.touch_order!r}")
        if self.mode == "omlx" and self.timeline_points != TIMELINE_POINTS:
            raise ValueError(f"mode 'omlx' records its engine's timeline at one point per request; "
                             f"timeline_points applies to modes 'prefix' and 'vllm', got {self.timeline_points!r}")
        if self.mode == "omlx" and self.warmup_fraction:
            raise ValueError(f"mode 'omlx' has no warm-up, got warmup_fraction={self.warmup_fraction!r}")
        if self.mode != "omlx" and (self.ssd_only is not False or self.ssd_capacity_blocks is not None):
            raise ValueError("ssd_only and ssd_capacity_blocks apply to mode 'omlx' only")

    def warmup_requests(self, num_requests: int) -> int:
        """Number of leading requests excluded from the statistics."""
        return int(np.floor(self.warmup_fraction * num_requests))


@dataclass(frozen=True)
class ReplaySummary(RunSummary):
    """Totals over the measured requests (after warm-up) of one :func:`replay`.

    ``requests`` counts the measured requests only; ``warmup_requests`` the excluded
    ones before them. ``block_refs``, ``hit_blocks``, ``input_tokens``,
    ``hit_tokens`` and ``evictions`` are sums over the measured requests;
    ``peak_used_blocks`` is over the whole run. ``rejected_requests`` (``"vllm"`` mode)
    counts measured requests needing more blocks than the pool: never admitted, they
    count as misses (``str()`` prints them in ``"vllm"`` mode, beside the hit ratios).
    Ratios are 0.0 when their denominator is 0; ``mean_orphaned_share`` is ``None`` unless
    ``config.track_orphans``. ``config`` is the :class:`ReplayConfig` run (policy,
    capacity, mode ...).

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> s = replay(chat_sessions(ChatWorkload(num_sessions=4, block_size=64), seed=0)).summary
        >>> s.driver, s.config.policy, s.to_dict()["config"]["capacity_blocks"], s.evictions
        ('replay', 'lru', None, 0)
    """

    driver: ClassVar[str] = "replay"
    source: str
    config: ReplayConfig
    requests: int
    warmup_requests: int
    block_refs: int
    hit_blocks: int
    block_hit_ratio: float
    input_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    mean_request_block_hit_ratio: float
    evictions: int
    peak_used_blocks: int
    rejected_requests: int
    mean_orphaned_share: float | None

    def __str__(self) -> str:
        c = self.config
        cap = "unbounded" if c.capacity_blocks is None else f"{c.capacity_blocks:,} blocks"
        return "\n".join([
            f"trace        {self.source}",
            f"cache        {c.policy}, {cap}, touch order {c.touch_order}"
            + ("" if c.mode == "prefix" else f", mode {c.mode}"),
            f"requests     {self.requests:,} measured ({self.warmup_requests:,} warm-up)",
            f"block hits   {self.hit_blocks:,} / {self.block_refs:,} = {self.block_hit_ratio:.4f}",
            f"token hits   {self.hit_tokens:,} / {self.input_tokens:,} = {self.token_hit_ratio:.4f}",
            f"evictions    {self.evictions:,}   peak used {self.peak_used_blocks:,} blocks",
            *([f"rejected     {self.rejected_requests:,} of {self.requests:,} requests never admitted (more "
               f"blocks than the pool; counted as misses)"] if c.mode != "prefix" or self.rejected_requests else []),
        ])


@dataclass(frozen=True, eq=False)
class KernelRun:
    """Raw per-request kernel output (``int32[num_requests]`` each; ``admitted`` bool;
    ``orphans`` all 0 unless tracked)."""

    hit_blocks: np.ndarray
    used_blocks: np.ndarray
    evictions: np.ndarray
    admitted: np.ndarray
    orphans: np.ndarray


def run_kernel(trace: Trace, config: ReplayConfig, *, progress: bool = False) -> KernelRun:
    """Run the numba replay for ``config`` and return per-request arrays.

    ``progress`` shows a tqdm bar over block references (use on a TTY).

    Raises:
        ValueError: ``trace`` is not a :class:`~kvlab.traces.Trace`, or has no block identity
            (:meth:`~kvlab.traces.Trace.require_block_identity`).
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    trace.require_block_identity("a cache replay (kvlab.sim.replay)")
    return run_flat(trace.flat, config, progress=progress)


def run_flat(flat: FlatTrace, config: ReplayConfig, *, progress: bool = False) -> KernelRun:
    """:func:`run_kernel` on the flat arrays alone (no polars frame needed).

    Memory: the outputs are four ``int32[num_requests]`` arrays and a bool array, plus
    the policy's state (a few arrays of ``num_keys``).
    """
    if config.mode == "omlx":
        raise ValueError("mode 'omlx' runs oMLX's engine model, not a kernel: use kvlab.replay or "
                         "kvlab.engines.replay_omlx")
    n = flat.num_requests
    hits, used, evictions, orphans = (np.zeros(n, dtype=np.int32) for _ in range(4))
    admitted = np.ones(n, dtype=np.bool_)
    step = _vllm_step(flat, config, hits, used, evictions, admitted) if config.mode == "vllm" \
        else _prefix_step(flat, config, hits, used, evictions, orphans)
    if not progress:
        step(0, n)
    else:
        from tqdm.auto import tqdm

        cuts = np.searchsorted(flat.offsets, np.arange(0, flat.num_refs, _CHUNK_REFS)[1:])
        bounds = [0, *cuts.tolist(), n]
        with tqdm(total=flat.num_refs, unit="block", unit_scale=True, desc=config.policy, file=sys.stderr) as bar:
            for a, b in zip(bounds[:-1], bounds[1:]):
                step(a, b)
                bar.update(int(flat.offsets[b] - flat.offsets[a]))
    if config.capacity_blocks is not None and n and int(used.max()) > config.capacity_blocks:
        r = int(np.argmax(used > config.capacity_blocks))
        raise RuntimeError(f"policy {config.policy!r} exceeded capacity_blocks={config.capacity_blocks}: "
                           f"{int(used[r])} blocks resident after request {r} (a plug-in bug)")
    return KernelRun(hits, used, evictions, admitted, orphans)


def _prefix_step(flat: FlatTrace, config: ReplayConfig, hits: np.ndarray, used: np.ndarray, evictions: np.ndarray,
                 orphans: np.ndarray) -> Callable[[int, int], None]:
    """The cache-level replay of a policy kernel over requests ``[a, b)``."""
    # beyond the working set every capacity behaves as unbounded (and must fit the kernel's int64)
    capacity = flat.num_keys if config.capacity_blocks is None else min(config.capacity_blocks, flat.num_keys)
    state = get_policy(config.policy).make_state(flat, capacity)
    reverse = config.touch_order == "head_most_recent"
    independent = config.hit_semantics == "independent"
    evicted = np.empty(max(flat.max_blocks_per_request, 1), dtype=np.int64)
    tracker = make_orphan_tracker(flat.parent_ids() if config.track_orphans else np.zeros(0, np.int64),
                                  config.track_orphans)
    return lambda a, b: replay_range(flat.offsets, flat.block_ids, a, b, reverse, independent, state, evicted,
                                     *tracker, hits, used, evictions, orphans)


def _vllm_step(flat: FlatTrace, config: ReplayConfig, hits: np.ndarray, used: np.ndarray, evictions: np.ndarray,
               admitted: np.ndarray) -> Callable[[int, int], None]:
    """The vLLM block-pool replay (:mod:`kvlab.sim.vllm_kernel`) over requests ``[a, b)``."""
    blocks = -(-flat.input_tokens.astype(np.int64) // flat.block_size)
    total = int(blocks.sum())
    capacity = total if config.capacity_blocks is None else min(config.capacity_blocks, total)
    state = make_vllm_state(flat.num_keys, capacity, int(blocks.max()) if blocks.size else 0)
    current = config.free_order == "current"
    return lambda a, b: vllm_replay_range(flat.offsets, flat.block_ids, flat.input_tokens, flat.block_size,
                                          current, a, b, *state, hits, used, evictions, admitted)


def summarize(trace: Trace, config: ReplayConfig, run: KernelRun,
              summary_type: type[ReplaySummary] = ReplaySummary) -> ReplaySummary:
    """Totals of a kernel run over the measured requests, as a ``summary_type`` (one pass over
    the per-request arrays, :func:`kvlab.sim.replay_pass.request_pass`; no temporaries)."""
    return _summary(trace, config, run, run_totals(trace, config, run), summary_type)


def _summary(trace: Trace, config: ReplayConfig, run: KernelRun, totals: RequestTotals,
             summary_type: type[ReplaySummary]) -> ReplaySummary:
    n = trace.flat.num_requests
    skip = config.warmup_requests(n)
    counts = totals.counts
    refs, hits, inputs, hit_tokens = (int(counts[i]) for i in (REFS, HITS, INPUT_TOKENS, HIT_TOKENS))
    return summary_type(
        source=trace.source, config=config, requests=n - skip, warmup_requests=skip,
        block_refs=refs, hit_blocks=hits,
        block_hit_ratio=hits / refs if refs else 0.0,
        input_tokens=inputs, hit_tokens=hit_tokens,
        token_hit_ratio=hit_tokens / inputs if inputs else 0.0,
        mean_request_block_hit_ratio=totals.ratio_sum / int(counts[NONEMPTY]) if counts[NONEMPTY] else 0.0,
        evictions=int(counts[EVICTIONS]),
        peak_used_blocks=int(counts[PEAK_USED]),
        rejected_requests=n - skip - int(counts[ADMITTED]),
        mean_orphaned_share=_orphan_share(run, skip) if config.track_orphans else None,
    )


def _orphan_share(run: KernelRun, skip: int) -> float:
    used = run.used_blocks[skip:].astype(np.float64)
    share = np.divide(run.orphans[skip:], used, out=np.zeros_like(used), where=used > 0)
    return float(share.mean()) if share.size else 0.0


def replay(trace: Trace, config: ReplayConfig | None = None, *, progress: bool = False,
           **overrides: object) -> RunResult:
    """Replay ``trace`` through one cache (models a single global prefix cache).

    Args:
        trace: the workload.
        config: a :class:`ReplayConfig`; keyword ``overrides`` replace its fields
            (``replay(trace, capacity_blocks=10_000)``).
        progress: show a progress bar over block references.

    Returns:
        A :class:`~kvlab.core.RunResult`:

        * ``requests``: one row per request: ``request_id`` (u64), ``arrival_s`` (f64),
          ``input_tokens``, ``hit_blocks``, ``hit_tokens`` (u32), ``rejected`` (bool, true
          when a ``"vllm"``-mode pool is too small for the request: a miss), then ``blocks``,
          ``miss_blocks``, ``miss_tokens`` (u32), ``evictions``, ``used_blocks`` (i32, after
          the request; cached blocks in ``"vllm"`` mode), ``measured`` (bool, false during
          warm-up);
        * ``timeline``: at most ``config.timeline_points`` points per metric (one per request
          when ``timeline_points`` is ``None`` or the trace is shorter), tier ``"cache"``. The
          requests are cut into buckets of ``ceil(num_requests / timeline_points)`` consecutive
          requests (:func:`kvlab.core.timeline_steps`), the last warm-up request also ending
          one (so no bucket mixes warm-up and measured requests: one point more at most); a
          point's ``step`` is the index of its bucket's last request and ``time_s`` that
          request's arrival. Gauges are their value
          after that request: ``used_blocks``, ``hit_ratio_rolling`` (block-weighted over the
          last ``window_requests`` requests), ``capacity_blocks`` (bounded caches),
          ``orphaned_blocks`` (with ``track_orphans``); counters are summed over the bucket:
          ``evictions``, ``hit_blocks``, ``miss_blocks`` (so their totals over the timeline
          are the ``requests`` frame's);
        * ``summary``: a :class:`ReplaySummary`; ``config``: the :class:`ReplayConfig`.

        In mode ``"omlx"``, :func:`kvlab.engines.replay_omlx`'s result (the same four parts).

    Raises:
        ValueError: ``trace`` is not a :class:`~kvlab.traces.Trace` or has no block identity
            (token counts only: :meth:`~kvlab.traces.Trace.require_block_identity`), ``config`` is not
            a :class:`ReplayConfig`, or an invalid configuration field (names field
            and value).
        TypeError: an override that is not a :class:`ReplayConfig` field.

    Example:
        >>> from kvlab.paths import bundled_trace_path
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace(bundled_trace_path("conversation"))
        >>> s = replay(trace, capacity_blocks=10_000).summary
        >>> round(s.block_hit_ratio, 4), round(s.token_hit_ratio, 4)
        (0.2116, 0.2157)
    """
    if config is not None and not isinstance(config, ReplayConfig):
        raise ValueError(f"config must be a ReplayConfig or None, got {config!r}; "
                         "pass the capacity by name: replay(trace, capacity_blocks=...)")
    config = config_with(ReplayConfig, config, overrides)
    if config.mode == "omlx":
        return replay_omlx(trace, capacity_blocks=config.capacity_blocks, free_order=config.free_order,
                           ssd_only=config.ssd_only, ssd_capacity_blocks=config.ssd_capacity_blocks)
    return result_of(trace, config, run_kernel(trace, config, progress=progress))


def result_of(trace: Trace, config: ReplayConfig, run: KernelRun,
              summary_type: type[ReplaySummary] = ReplaySummary) -> RunResult:
    """The :class:`~kvlab.core.RunResult` of a run's per-request arrays (as :func:`replay` returns)."""
    requests, timeline, totals = frames_of(trace, config, run)
    return RunResult(requests=requests, timeline=timeline, summary=_summary(trace, config, run, totals, summary_type),
                     config=config)
