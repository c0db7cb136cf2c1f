"""Engine-level replay: a trace's requests through an engine's cache, one at a time.

Each request is looked up (``get_computed_blocks``), admitted with its prompt
(``allocate_slots``) and finished (``free``) before the next arrives — the setting in
which the numba replay's ``"vllm"`` mode (:mod:`kvlab.sim.vllm_kernel`) must give
identical hits, and the one a teacher steps through in a notebook. Two drivers:

==========================  ========================================  =============================
driver                      engine                                    ``capacity_blocks``
==========================  ========================================  =============================
:func:`replay_requests`     vLLM v1 ``KVCacheManager`` + ``BlockPool``  usable blocks (pool - null)
:func:`replay_omlx`         oMLX ``PagedCacheManager`` (+ paged SSD)  usable blocks at ``max_blocks``
==========================  ========================================  =============================

Both return an :class:`EngineResult` (a :class:`kvlab.core.RunResult` with the final
manager): ``requests`` holds the core columns, ``rejected`` (a request needing more blocks
than the pool can ever hold: it is not admitted and counts as a miss), then ``blocks``
(the blocks it needs), ``evictions`` (cached blocks evicted to make room for it) and
``cached_blocks`` (blocks holding a hash after it); oMLX adds ``restored_blocks``
(blocks its lookup registered again from the SSD), ``pool_blocks`` (the pool's size,
which grows), ``ssd_blocks`` and ``ssd_evictions``. The ``timeline`` has the shared metric names
(:data:`kvlab.core.TIMELINE_METRICS`), so :mod:`kvlab.viz` draws it: tier ``"GPU"`` (the block
pool: ``used_blocks`` = cached blocks, ``capacity_blocks``, ``evictions``, the ``hit_blocks`` it
served, the request's ``miss_blocks``; oMLX adds ``pool_blocks``) and ``"SSD"`` (oMLX's paged
SSD store: ``used_blocks``, ``capacity_blocks`` when bounded, ``evictions``, and the restored
blocks it served as ``hit_blocks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.result import RunResult, RunSummary, timeline_frame
from kvlab.core.validate import check_choice, check_flag, check_positive, config_with
from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.vllm.block_pool import FREE_ORDERS, MEDIUM_GPU, BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.traces import Trace


@dataclass(frozen=True)
class EngineReplayConfig:
    """What :func:`replay_requests` runs: a vLLM v1 block pool.

    Attributes:
        capacity_blocks: usable blocks (the pool gets one more: the null block), an
            integer >= 1; ``None``: enough for every request's blocks (no eviction).
            Larger capacities behave as that one.
        free_order: ``"current"`` or ``"classic"`` (:class:`~kvlab.engines.vllm.BlockPool`).
        enable_caching: prefix caching on or off.

    Raises:
        ValueError: a bad field (names it and the value).

    Example:
        >>> EngineReplayConfig(capacity_blocks=0)
        Traceback (most recent call last):
        ValueError: capacity_blocks must be an integer >= 1 or None, got 0
    """

    capacity_blocks: int | None = None
    free_order: str = "current"
    enable_caching: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity_blocks", check_positive("capacity_blocks", self.capacity_blocks,
                                                                   optional=True))
        check_choice("free_order", self.free_order, FREE_ORDERS)
        object.__setattr__(self, "enable_caching", check_flag("enable_caching", self.enable_caching))


@dataclass(frozen=True)
class OmlxReplayConfig(EngineReplayConfig):
    """What :func:`replay_omlx` runs: oMLX's paged cache manager.

    Attributes:
        capacity_blocks: usable blocks once the pool has grown to ``max_blocks``
            (``max_blocks = capacity_blocks + 1``, the null block); ``None`` as in
            :class:`EngineReplayConfig`.
        initial_blocks: usable blocks at start-up (oMLX ``initial_blocks`` minus the null
            block), at most ``capacity_blocks``; ``None``: the pool starts at full size
            and never grows.
        ssd_only: oMLX's paged-SSD-only mode: the pool holds metadata, block data lives
            on a paged SSD store (:class:`~kvlab.engines.omlx.PagedSSDCache`).
        ssd_capacity_blocks: that store's capacity in blocks (an integer >= 1), ``None``:
            unbounded; only with ``ssd_only``.
        free_order, enable_caching: as :class:`EngineReplayConfig` (``ssd_only`` needs
            caching).

    Raises:
        ValueError: a bad field or combination (names it and the value).

    Example:
        >>> OmlxReplayConfig(capacity_blocks=300, ssd_capacity_blocks=1_000)
        Traceback (most recent call last):
        ValueError: ssd_capacity_blocks=1000 needs ssd_only=True
    """

    initial_blocks: int | None = None
    ssd_only: bool = False
    ssd_capacity_blocks: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        initial = check_positive("initial_blocks", self.initial_blocks, optional=True)
        if initial is not None and self.capacity_blocks is not None and initial > self.capacity_blocks:
            raise ValueError(f"initial_blocks must be <= capacity_blocks ({self.capacity_blocks}), got {initial}")
        object.__setattr__(self, "initial_blocks", initial)
        object.__setattr__(self, "ssd_only", check_flag("ssd_only", self.ssd_only))
        object.__setattr__(self, "ssd_capacity_blocks", check_positive("ssd_capacity_blocks",
                                                                       self.ssd_capacity_blocks, optional=True))
        if self.ssd_capacity_blocks is not None and not self.ssd_only:
            raise ValueError(f"ssd_capacity_blocks={self.ssd_capacity_blocks} needs ssd_only=True")
        if self.ssd_only and not self.enable_caching:
            raise ValueError("ssd_only=True needs enable_caching=True: the paged SSD store keys data by block hash")


@dataclass(frozen=True)
class EngineReplaySummary(RunSummary):
    """Totals of :func:`replay_requests` (every request counted; no warm-up).

    ``token_hit_ratio`` is ``hit_tokens / input_tokens`` (0.0 without input);
    ``cached_blocks`` is the count after the last request.

    Example:
        >>> from kvlab.traces import load_trace
        >>> replay_requests(load_trace("synthetic").head(20)).summary.to_dict()["config"]
        {'capacity_blocks': None, 'free_order': 'current', 'enable_caching': True}
    """

    driver: ClassVar[str] = "engine_vllm"
    source: str
    config: EngineReplayConfig
    requests: int
    rejected_requests: int
    input_tokens: int
    hit_blocks: int
    hit_tokens: int
    token_hit_ratio: float
    evictions: int
    cached_blocks: int


@dataclass(frozen=True)
class OmlxReplaySummary(EngineReplaySummary):
    """Totals of :func:`replay_omlx`: :class:`EngineReplaySummary`'s, plus blocks restored
    from the SSD, the pool's final size, and the SSD store's blocks and evictions.

    Example:
        >>> from kvlab.traces import load_trace
        >>> s = replay_omlx(load_trace("synthetic").head(20), capacity_blocks=100, initial_blocks=50).summary
        >>> s.driver, s.pool_blocks, s.ssd_blocks  # grown to the largest request that fits (95) + null
        ('engine_omlx', 96, 0)
    """

    driver: ClassVar[str] = "engine_omlx"
    restored_blocks: int
    pool_blocks: int
    ssd_blocks: int
    ssd_evictions: int


@dataclass(frozen=True, eq=False)
class EngineResult(RunResult):
    """A :class:`kvlab.core.RunResult` plus ``manager``: the engine's manager after the
    last request (its pool, stats and, for oMLX, SSD store).

    Example:
        >>> from kvlab.traces import load_trace
        >>> run = replay_requests(load_trace("synthetic").head(20), capacity_blocks=500)
        >>> run.manager.block_pool.num_blocks, run.requests.columns[5:]
        (501, ['rejected', 'blocks', 'evictions', 'cached_blocks'])
    """

    manager: KVCacheManager


def full_block_keys(trace: Trace) -> list[list[int]]:
    """Each request's keys of full blocks only (a keyed partial tail is dropped).

    Example:
        >>> from kvlab.traces import load_trace
        >>> keys = full_block_keys(load_trace("conversation"))
        >>> len(keys[0])  # 6758 tokens: 13 full 512-token blocks (+ a partial 14th)
        13
    """
    size = trace.block_size
    return [keys[: n // size] for keys, n in zip(trace.frame["block_keys"].to_list(),
                                                 trace.frame["input_tokens"].to_list())]


def _needed_blocks(trace: Trace) -> tuple[np.ndarray, int]:
    """Each request's blocks (``int64[n]``) and their sum (at least 1): the pool that never evicts."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    inputs = trace.frame["input_tokens"].to_numpy().astype(np.int64)
    blocks = -(-inputs // trace.block_size)
    return blocks, max(int(blocks.sum()), 1)


def _run(trace: Trace, manager: KVCacheManager, extra: dict[str, Callable[[], int]]) -> dict[str, np.ndarray]:
    """Replay ``trace`` through ``manager``: per-request columns, and each ``extra`` value
    sampled after every request."""
    pool = manager.block_pool
    n = len(trace)
    out = {name: np.zeros(n, dtype=np.int64) for name in ("hit_blocks", "evictions", "cached_blocks", *extra)}
    out["rejected"] = np.zeros(n, dtype=np.bool_)
    columns = zip(trace.frame["request_id"].to_list(), full_block_keys(trace), trace.frame["input_tokens"].to_list())
    for r, (request_id, keys, num_tokens) in enumerate(columns):
        evicted = pool.num_evicted_blocks
        if num_tokens:
            request = Request.from_block_keys(str(request_id), num_tokens, keys)
            blocks, num_hit_tokens = manager.get_computed_blocks(request)
            if manager.allocate_slots(request, num_tokens - num_hit_tokens, num_hit_tokens, blocks) is None:
                out["rejected"][r] = True
            else:
                out["hit_blocks"][r] = len(blocks)
                manager.free(request)
        out["evictions"][r] = pool.num_evicted_blocks - evicted
        out["cached_blocks"][r] = pool.num_cached_blocks
        for name, sample in extra.items():
            out[name][r] = sample()
    return out


def _gpu_metrics(trace: Trace, run: dict[str, np.ndarray], capacity_blocks: int,
                 gpu_hit_blocks: np.ndarray) -> dict[str, np.ndarray]:
    """The GPU pool's timeline metrics (:data:`kvlab.core.TIMELINE_METRICS` names): cached
    blocks as ``used_blocks``, the usable ``capacity_blocks``, ``evictions``, the hit blocks the
    pool served and the request's ``miss_blocks`` (its blocks minus every tier's hits)."""
    blocks, _ = _needed_blocks(trace)
    return {"used_blocks": run["cached_blocks"], "capacity_blocks": np.full(len(trace), capacity_blocks),
            "evictions": run["evictions"], "hit_blocks": gpu_hit_blocks, "miss_blocks": blocks - run["hit_blocks"]}


def _result(trace: Trace, config: EngineReplayConfig, manager: KVCacheManager, run: dict[str, np.ndarray],
            summary_type: type[EngineReplaySummary], timeline: dict[str, dict[str, np.ndarray]],
            totals: dict[str, int]) -> EngineResult:
    blocks, _ = _needed_blocks(trace)
    inputs = trace.frame["input_tokens"].to_numpy().astype(np.int64)
    hit_tokens = run["hit_blocks"] * trace.block_size
    own = [name for name in run if name not in ("hit_blocks", "rejected")]
    requests = pl.DataFrame({
        "request_id": trace.frame["request_id"],
        "arrival_s": trace.frame["arrival_s"],
        "input_tokens": trace.frame["input_tokens"],
        "hit_blocks": pl.Series(run["hit_blocks"], dtype=pl.UInt32),
        "hit_tokens": pl.Series(hit_tokens, dtype=pl.UInt32),
        "rejected": run["rejected"],
        "blocks": pl.Series(blocks, dtype=pl.UInt32),
        **{name: run[name] for name in own},
    })
    step, time_s = np.arange(len(trace), dtype=np.int64), trace.frame["arrival_s"].to_numpy()
    frames = [timeline_frame(step, time_s, tier, metrics) for tier, metrics in timeline.items()]
    summary = summary_type(
        source=trace.source, config=config, requests=len(trace), rejected_requests=int(run["rejected"].sum()),
        input_tokens=int(inputs.sum()), hit_blocks=int(run["hit_blocks"].sum()), hit_tokens=int(hit_tokens.sum()),
        token_hit_ratio=float(hit_tokens.sum() / inputs.sum()) if inputs.sum() else 0.0,
        evictions=int(run["evictions"].sum()), cached_blocks=manager.block_pool.num_cached_blocks, **totals)
    return EngineResult(requests, pl.concat(frames), summary, config, manager)


def replay_requests(trace: Trace, config: EngineReplayConfig | None = None, **overrides: object) -> EngineResult:
    """Replay ``trace`` through vLLM v1's :class:`~kvlab.engines.vllm.KVCacheManager`, one
    request at a time (module docstring).

    Args:
        trace: the workload; its block keys serve as vLLM block hashes.
        config: an :class:`EngineReplayConfig`; keyword ``overrides`` replace its fields
            (``replay_requests(trace, capacity_blocks=2_000)``).

    Returns:
        An :class:`EngineResult`; summary :class:`EngineReplaySummary`.

    Raises:
        ValueError: not a trace or one without block identity, or a bad configuration field.

    Example:
        >>> from kvlab.traces import load_trace
        >>> run = replay_requests(load_trace("synthetic").head(200), capacity_blocks=2000)
        >>> int(run.requests["hit_blocks"].sum()), int(run.requests["rejected"].sum())
        (193, 0)
    """
    config = config_with(EngineReplayConfig, config, overrides)
    _, needed = _needed_blocks(trace)
    trace.require_block_identity("an engine replay (kvlab.engines.replay_requests)")
    capacity = needed if config.capacity_blocks is None else min(config.capacity_blocks, needed)
    pool = BlockPool(capacity + 1, enable_caching=config.enable_caching, free_order=config.free_order,
                     block_size=trace.block_size)
    manager = KVCacheManager(pool, block_size=trace.block_size, enable_caching=config.enable_caching)
    run = _run(trace, manager, {})
    timeline = {MEDIUM_GPU: _gpu_metrics(trace, run, capacity, run["hit_blocks"])}
    return _result(trace, config, manager, run, EngineReplaySummary, timeline, {})


def replay_omlx(trace: Trace, config: OmlxReplayConfig | None = None, **overrides: object) -> EngineResult:
    """Replay ``trace`` through oMLX's :class:`~kvlab.engines.omlx.PagedCacheManager`, one
    request at a time, without forks (module docstring).

    The pool starts at ``initial_blocks + 1`` blocks and grows up to ``capacity_blocks + 1``
    (the null block included); in paged-SSD-only mode every cached block is saved to a
    :class:`~kvlab.engines.omlx.PagedSSDCache` of ``ssd_capacity_blocks``. With the pool
    at full size from the start and no SSD, the hits are exactly :func:`replay_requests`'s.

    Args:
        trace: the workload; its block keys serve as block hashes.
        config: an :class:`OmlxReplayConfig`; keyword ``overrides`` replace its fields.

    Returns:
        An :class:`EngineResult`; summary :class:`OmlxReplaySummary`.

    Raises:
        ValueError: not a trace or one without block identity, or a bad configuration field.

    Example:
        >>> from kvlab.traces import load_trace
        >>> trace = load_trace("synthetic").head(200)
        >>> replay_requests(trace, capacity_blocks=300).summary.hit_blocks  # vLLM, 300 blocks
        85
        >>> s = replay_omlx(trace, capacity_blocks=300, ssd_only=True, ssd_capacity_blocks=3000).summary
        >>> s.hit_blocks, s.restored_blocks, s.ssd_blocks, s.ssd_evictions
        (321, 236, 3000, 1809)
    """
    config = config_with(OmlxReplayConfig, config, overrides)
    _, needed = _needed_blocks(trace)
    trace.require_block_identity("an engine replay (kvlab.engines.replay_omlx)")
    capacity = needed if config.capacity_blocks is None else min(config.capacity_blocks, needed)
    initial = capacity if config.initial_blocks is None else min(config.initial_blocks, capacity)
    pool = PagedBlockPool(initial + 1, max_blocks=capacity + 1, enable_caching=config.enable_caching,
                          free_order=config.free_order, block_size=trace.block_size)
    ssd = PagedSSDCache(config.ssd_capacity_blocks) if config.ssd_only else None
    manager = PagedCacheManager(pool, block_size=trace.block_size, enable_caching=config.enable_caching, ssd=ssd)
    extra = {"restored_blocks": lambda: manager.stats.restored_blocks, "pool_blocks": lambda: pool.num_blocks,
             "ssd_blocks": lambda: 0 if ssd is None else len(ssd),
             "ssd_evictions": lambda: 0 if ssd is None else ssd.tier.counters.evicted_blocks}
    run = _run(trace, manager, extra)
    totals = {name: int(run[name][-1]) if len(trace) else sample() for name, sample in extra.items()}
    for name in ("restored_blocks", "ssd_evictions"):  # counters -> per request
        run[name] = np.diff(run[name], prepend=0)
    restored = np.where(run["rejected"], 0, run["restored_blocks"])  # a rejected request is served nowhere
    timeline = {MEDIUM_GPU: {**_gpu_metrics(trace, run, capacity, run["hit_blocks"] - restored),
                             "pool_blocks": run["pool_blocks"]}}
    if ssd is not None:
        timeline["SSD"] = {"used_blocks": run["ssd_blocks"], "evictions": run["ssd_evictions"],
                           "hit_blocks": restored}
        if config.ssd_capacity_blocks is not None:
            timeline["SSD"]["capacity_blocks"] = np.full(len(trace), config.ssd_capacity_blocks)
    return _result(trace, config, manager, run, OmlxReplaySummary, timeline, totals)
