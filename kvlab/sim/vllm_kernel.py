"""vLLM-faithful cache-level replay: vLLM v1's block pool, one request at a time, in numba.

The cache is ``capacity_blocks`` physical blocks (the pool minus its null block) in a
free queue (docs/specs/engines.md §1). For each request, in arrival order:

1. hit = the longest run of leading **full** blocks whose chained key is cached, capped
   by the last-token rule at ``floor((input_tokens - 1) / block_size)`` blocks (V6);
2. the request needs ``ceil(input_tokens / block_size)`` blocks; if that exceeds the
   pool it is not admitted (0 hits, nothing changes);
3. hit blocks leave the free queue (touch, V5); the other blocks are taken from the
   queue head, evicting the key a taken block held (lazy eviction, V3);
4. the new full blocks are cached under their keys — without de-duplication: a key may
   be held by several blocks (V8); lookups use its oldest copy;
5. the request finishes and frees its blocks in reverse (V4): ``classic`` appends them
   all to the queue tail; ``current`` prepends the unhashed (partial) block to the head.

A trace whose last block is keyed although partial (Mooncake ids) has that key
ignored: vLLM only ever hashes full blocks.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.policies.structs import list_insert_after, list_pop_front, list_push_back, list_unlink, make_lists

FREE_ORDERS = ("classic", "current")


def make_vllm_state(num_keys: int, capacity_blocks: int, max_request_blocks: int) -> tuple[np.ndarray, ...]:
    """Arrays of an empty pool: the free queue's links (``int64[capacity + 1]``, sentinel
    ``capacity``), the key each slot holds (``-1``: none), per key the list of slots holding
    it, oldest first (``copy_prev``/``copy_next``, ``int64[capacity + num_keys]``: slot ``s``'s
    links at ``s``, key ``k``'s sentinel at ``capacity + k``), a request block-table buffer,
    counters. The lists are :mod:`kvlab.policies.structs` lists.

    Initially every slot is free, queued in ascending order (vLLM's start-up order).
    """
    c = capacity_blocks
    order = np.arange(c + 1, dtype=np.int64)  # one list through every slot, in order, then the sentinel
    q_next, q_prev = np.roll(order, -1), np.roll(order, 1)
    slot_key = np.full(c, -1, dtype=np.int64)
    copy_prev, copy_next = make_lists(c, num_keys, np.int64)
    table = np.empty(max(max_request_blocks, 1), dtype=np.int64)
    counters = np.zeros(1, dtype=np.int64)  # cached blocks
    return q_next, q_prev, slot_key, copy_next, copy_prev, table, counters


@kernel_jit(nogil=True, _nrt=False)
def vllm_replay_range(offsets: np.ndarray, block_ids: np.ndarray, input_tokens: np.ndarray, block_size: int,
                      current_order: bool, start: int, stop: int,
                      q_next: np.ndarray, q_prev: np.ndarray, slot_key: np.ndarray, copy_next: np.ndarray,
                      copy_prev: np.ndarray, table: np.ndarray, counters: np.ndarray, hit_blocks: np.ndarray,
                      used_blocks: np.ndarray, evictions: np.ndarray, admitted: np.ndarray) -> None:
    """Replay requests ``start..stop-1`` (state carries over between calls).

    Outputs per request: ``hit_blocks`` (full blocks reused), ``used_blocks`` (cached
    blocks after it), ``evictions`` (cached blocks whose slot it took), ``admitted``.
    """
    capacity = slot_key.shape[0]
    sentinel = capacity
    for r in range(start, stop):
        a = offsets[r]
        n = np.int64(input_tokens[r])
        full = n // block_size
        need = (n + block_size - 1) // block_size
        if need > capacity:
            hit_blocks[r] = 0
            evictions[r] = 0
            admitted[r] = False
            used_blocks[r] = counters[0]
            continue
        admitted[r] = True
        limit = min(full, (n - 1) // block_size) if n > 0 else 0
        h = 0
        while h < limit and copy_next[capacity + block_ids[a + h]] != capacity + block_ids[a + h]:
            h += 1
        hit_blocks[r] = h
        for j in range(h):  # touch: hit blocks (each key's oldest copy) leave the free queue
            s = copy_next[capacity + block_ids[a + j]]
            list_unlink(q_prev, q_next, s)
            table[j] = s
        ev = 0
        for j in range(h, need):  # new blocks from the queue head, lazily evicting their keys
            s = list_pop_front(q_prev, q_next, sentinel)
            if slot_key[s] != -1:
                list_unlink(copy_prev, copy_next, s)
                slot_key[s] = -1
                counters[0] -= 1
                ev += 1
            table[j] = s
        evictions[r] = ev
        for j in range(h, full):  # cache the new full blocks (no de-duplication)
            s = table[j]
            k = block_ids[a + j]
            slot_key[s] = k
            list_push_back(copy_prev, copy_next, capacity + k, s)
            counters[0] += 1
        for j in range(need - 1, -1, -1):  # free in reverse
            s = table[j]
            if current_order and slot_key[s] == -1:
                list_insert_after(q_prev, q_next, sentinel, s)  # unhashed: to the head
            else:
                list_push_back(q_prev, q_next, sentinel, s)  # to the tail
        used_blocks[r] = counters[0]
