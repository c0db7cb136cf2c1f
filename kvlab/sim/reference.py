"""A plain-Python replay over a policy's reference class: the oracle for the kernel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.policies import get_policy
from kvlab.traces import Trace


@dataclass(frozen=True, eq=False)
class ReferenceRun:
    """Per-request output of :func:`replay_reference` (all ``int64[n_requests]``;
    ``orphans`` counts resident blocks whose parent block is not resident, recounted
    from scratch after every request when asked for)."""

    hit_blocks: np.ndarray
    used_blocks: np.ndarray
    evictions: np.ndarray
    orphans: np.ndarray


def replay_reference(trace: Trace, *, policy: str = "lru", capacity_blocks: int | None = None,
                     touch_order: str = "head_most_recent", hit_semantics: str = "prefix",
                     count_orphans: bool = False) -> ReferenceRun:
    """Replay ``trace`` one block at a time through the policy's reference class.

    Same semantics as :func:`kvlab.sim.replay` (prefix hit, then every block touched
    in ``touch_order``; or, with ``hit_semantics="independent"``, each block looked up
    and then accessed in touch order), written for reading, not speed: it works on the
    original block keys, not on the interned ids, so it also checks the interning.
    ``count_orphans`` recounts orphaned blocks from scratch after every request
    (O(keys) each: for small traces only; otherwise ``orphans`` stays 0).

    Raises:
        ValueError: unknown policy or touch order, or a bad capacity.

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> trace = chat_sessions(ChatWorkload(n_sessions=4, block_size=64), seed=0)
        >>> run = replay_reference(trace, capacity_blocks=50)
        >>> int(run.used_blocks.max()) <= 50
        True
    """
    if touch_order not in ("head_most_recent", "tail_most_recent"):
        raise ValueError(f"touch_order must be 'head_most_recent' or 'tail_most_recent', got {touch_order!r}")
    if hit_semantics not in ("prefix", "independent"):
        raise ValueError(f"hit_semantics must be 'prefix' or 'independent', got {hit_semantics!r}")
    spec = get_policy(policy)
    requests = trace.frame["block_keys"].to_list()
    cache = (spec.reference(capacity_blocks, requests=requests) if spec.reference_uses_trace
             else spec.reference(capacity_blocks))
    n = len(trace)
    hits, used, evictions, orphans = (np.zeros(n, dtype=np.int64) for _ in range(4))
    parent: dict[int, int | None] = {}
    ref_index = 0
    for r, keys in enumerate(requests):
        for i, key in enumerate(keys):
            parent.setdefault(key, keys[i - 1] if i else None)
        order = range(len(keys) - 1, -1, -1) if touch_order == "head_most_recent" else range(len(keys))
        if hit_semantics == "prefix":
            while hits[r] < len(keys) and keys[hits[r]] in cache:
                hits[r] += 1
        for i in order:
            if hit_semantics == "independent" and keys[i] in cache:
                hits[r] += 1
            evictions[r] += len(cache.access(keys[i], ref_index + i))
        used[r] = len(cache)
        if count_orphans:
            orphans[r] = sum(1 for k, p in parent.items() if k in cache and p is not None and p not in cache)
        ref_index += len(keys)
    return ReferenceRun(hits, used, evictions, orphans)
