"""A plain-Python replay over a policy's reference class: the oracle for the kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvlab.core.result import RunResult
from kvlab.core.validate import config_with
from kvlab.policies import get_policy
from kvlab.sim.replay import KernelRun, ReplayConfig, ReplaySummary, result_of
from kvlab.traces import Trace


@dataclass(frozen=True)
class ReferenceSummary(ReplaySummary):
    """:class:`~kvlab.sim.replay.ReplaySummary` of :func:`replay_reference` (the same totals).

    Example:
        >>> ReferenceSummary.driver
        'replay_reference'
    """

    driver: ClassVar[str] = "replay_reference"


def replay_reference(trace: Trace, config: ReplayConfig | None = None, **overrides: object) -> RunResult:
    """Replay ``trace`` one block at a time through the policy's reference class.

    Same semantics and the same result as :func:`kvlab.sim.replay` (prefix hit, then every
    block touched in ``touch_order``; or, with ``hit_semantics="independent"``, each block
    looked up and then accessed in touch order), written for reading, not speed: it works on
    the original block keys, not on the interned ids, so it also checks the interning.
    ``track_orphans`` recounts orphaned blocks from scratch after every request (O(keys) each:
    for small traces only).

    Args:
        trace: the workload.
        config: a :class:`~kvlab.sim.ReplayConfig` in mode ``"prefix"``; keyword ``overrides``
            replace its fields (``replay_reference(trace, capacity_blocks=50)``).

    Returns:
        A :class:`~kvlab.core.RunResult` shaped as :func:`kvlab.sim.replay`'s, with a
        :class:`ReferenceSummary`.

    Raises:
        ValueError: not a :class:`~kvlab.traces.Trace` or one without block identity, a bad
            configuration field, or mode
            ``"vllm"`` (the reference models the cache-level replay only).
        TypeError: an override that is not a :class:`~kvlab.sim.ReplayConfig` field.

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> trace = chat_sessions(ChatWorkload(num_sessions=4, block_size=64), seed=0)
        >>> run = replay_reference(trace, capacity_blocks=50)
        >>> int(run.requests["used_blocks"].max()) <= 50, run.summary.driver
        (True, 'replay_reference')
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
    trace.require_block_identity("a cache replay (kvlab.sim.replay_reference)")
    if config is not None and not isinstance(config, ReplayConfig):
        raise ValueError(f"config must be a ReplayConfig or None, got {config!r}")
    config = config_with(ReplayConfig, config, overrides)
    if config.mode != "prefix":
        raise ValueError(f"replay_reference models mode 'prefix' only, got mode={config.mode!r}")
    return result_of(trace, config, _run(trace, config), ReferenceSummary)


def _run(trace: Trace, config: ReplayConfig) -> KernelRun:
    """Per-request hits, occupancy, evictions and orphans of the reference class."""
    spec = get_policy(config.policy)
    requests = trace.frame["block_keys"].to_list()
    capacity = config.capacity_blocks
    cache = spec.reference(capacity, requests=requests) if spec.reference_uses_trace else spec.reference(capacity)
    n = len(trace)
    hits, used, evictions, orphans = (np.zeros(n, dtype=np.int32) for _ in range(4))
    parent: dict[int, int | None] = {}
    ref_index = 0
    for r, keys in enumerate(requests):
        for i, key in enumerate(keys):
            parent.setdefault(key, keys[i - 1] if i else None)
        order = range(len(keys) - 1, -1, -1) if config.touch_order == "head_most_recent" else range(len(keys))
        if config.hit_semantics == "prefix":
            while hits[r] < len(keys) and keys[hits[r]] in cache:
                hits[r] += 1
        for i in order:
            if config.hit_semantics == "independent" and keys[i] in cache:
                hits[r] += 1
            evictions[r] += len(cache.access(keys[i], ref_index + i))
        used[r] = len(cache)
        if config.track_orphans:
            orphans[r] = sum(1 for k, p in parent.items() if k in cache and p is not None and p not in cache)
        ref_index += len(keys)
    return KernelRun(hits, used, evictions, np.ones(n, dtype=np.bool_), orphans)
