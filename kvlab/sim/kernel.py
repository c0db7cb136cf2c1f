"""The numba replay driver: prefix hits, then touch/insert, for any registered policy.

The driver is generic over the policy: it calls the hooks of
:mod:`kvlab.policies.base`, and numba compiles one specialisation per policy state
type. It is not cached on disk: numba's cache would not notice an edit to a policy
module, and a stale kernel would silently disagree with its reference class.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvlab.policies.base import kernel_access, kernel_contains, kernel_used


@njit(nogil=True)
def replay_range(offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                 state, hit_blocks: np.ndarray, used_blocks: np.ndarray,  # noqa: ANN001
                 evictions: np.ndarray) -> None:
    """Replay requests ``start..stop-1`` of a flat trace through a policy's state.

    For each request ``r``: the hit is the longest run of leading blocks that are
    resident (prefix semantics); then every block is accessed — from the tail to the
    head when ``reverse`` (the head ends most recent, as vLLM frees a request's blocks
    in reverse), else from the head to the tail.

    Args:
        offsets: ``int64[n_requests + 1]`` CSR offsets.
        block_ids: ``int32[n_refs]`` dense block ids.
        start, stop: request range to replay (state carries over between calls).
        reverse: touch order, ``True`` = head most recent.
        state: a registered policy state (``NamedTuple`` of arrays), mutated.
        hit_blocks: ``int32[n_requests]`` out: prefix-hit blocks per request.
        used_blocks: ``int64[n_requests]`` out: resident blocks after the request.
        evictions: ``int64[n_requests]`` out: blocks evicted by the request.
    """
    for r in range(start, stop):
        a = offsets[r]
        b = offsets[r + 1]
        h = 0
        while a + h < b and kernel_contains(state, block_ids[a + h]):
            h += 1
        hit_blocks[r] = h
        evictions[r] = kernel_access(state, block_ids, a, b, reverse)
        used_blocks[r] = kernel_used(state)
