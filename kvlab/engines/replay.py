"""Engine-level replay: a trace's requests through vLLM's block pool, one at a time.

Each request is looked up (:meth:`KVCacheManager.get_computed_blocks`), admitted with
its prompt (:meth:`KVCacheManager.allocate_slots`) and finished (:meth:`KVCacheManager.free`)
before the next arrives — the setting in which the numba replay's ``"vllm"`` mode
(:mod:`kvlab.sim.vllm_kernel`) must give identical hits, and the one a teacher steps
through in a notebook.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.traces import Trace


@dataclass(frozen=True, eq=False)
class EngineRun:
    """Per-request results of :func:`replay_requests` (``int64`` / ``bool`` arrays).

    Attributes:
        hit_blocks: prefix-hit blocks at admission.
        admitted: False when the request needs more blocks than the pool has.
        manager: the manager after the last request (its pool and stats).
    """

    hit_blocks: np.ndarray
    admitted: np.ndarray
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


def replay_requests(trace: Trace, *, capacity_blocks: int | None = None, free_order: str = "current",
                    enable_caching: bool = True) -> EngineRun:
    """Replay ``trace`` through a :class:`KVCacheManager` one request at a time.

    Args:
        trace: the workload; its block keys serve as vLLM block hashes.
        capacity_blocks: usable blocks (the pool gets one more: the null block);
            ``None`` = enough for every request's blocks (no eviction); larger
            capacities are clamped to that (they behave the same).
        free_order: ``"current"`` or ``"classic"`` (:class:`BlockPool`).
        enable_caching: prefix caching on or off.

    Returns:
        An :class:`EngineRun`.

    Raises:
        ValueError: a bad capacity or free order, or not a trace.

    Example:
        >>> from kvlab.traces import load_trace
        >>> run = replay_requests(load_trace("synthetic").head(200), capacity_blocks=2000)
        >>> int(run.hit_blocks.sum()), bool(run.admitted.all())
        (193, True)
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    size = trace.block_size
    inputs = trace.frame["input_tokens"].to_numpy().astype(np.int64)
    needed = max(int((-(-inputs // size)).sum()), 1)  # every block of every request: never evicts
    if capacity_blocks is not None and (isinstance(capacity_blocks, bool)
                                        or not isinstance(capacity_blocks, (int, np.integer)) or capacity_blocks < 1):
        raise ValueError(f"capacity_blocks must be an integer >= 1 or None, got {capacity_blocks!r}")
    capacity_blocks = needed if capacity_blocks is None else min(int(capacity_blocks), needed)
    pool = BlockPool(int(capacity_blocks) + 1, enable_caching=enable_caching, free_order=free_order, block_size=size)
    manager = KVCacheManager(pool, block_size=size, enable_caching=enable_caching)
    hits = np.zeros(len(trace), dtype=np.int64)
    admitted = np.ones(len(trace), dtype=np.bool_)
    for r, (request_id, keys, n) in enumerate(zip(trace.frame["request_id"].to_list(), full_block_keys(trace),
                                                  inputs.tolist())):
        if n == 0:
            continue
        request = Request.from_block_keys(str(request_id), n, keys)
        blocks, n_hit = manager.get_computed_blocks(request)
        if manager.allocate_slots(request, n - n_hit, n_hit, blocks) is None:
            admitted[r] = False
            continue
        hits[r] = len(blocks)
        manager.free(request)
    return EngineRun(hits, admitted, manager)
