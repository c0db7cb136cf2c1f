"""The LRU kernel (one interleaved list, a branch-free step, its own loop for independent
lookups) against the ``OrderedDict`` reference: arbitrary id streams (repeats inside a
request, a list emptied at capacity 1, unbounded), both touch orders, both hit semantics,
with and without orphan tracking (without it, independent lookups take LRU's own loop)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import make_trace
from kvlab.policies.lru import LRU, access, contains, evict, insert, make_state, remove, replay_independent, touch
from kvlab.sim import replay, replay_reference
from kvlab.traces import zipf_objects
from kvlab.traces.flat import flatten_block_keys

REQUESTS = st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=6), min_size=1, max_size=40)
CAPACITY = st.one_of(st.none(), st.integers(0, 8))
TOUCH = st.sampled_from(["head_most_recent", "tail_most_recent"])
SEMANTICS = st.sampled_from(["prefix", "independent"])
COLUMNS = ["hit_blocks", "evictions", "used_blocks"]


def frames_agree(trace, **config) -> None:  # noqa: ANN001
    kernel = replay(trace, **config).requests
    ref = replay_reference(trace, **config).requests
    for column in COLUMNS:
        assert kernel[column].to_list() == ref[column].to_list(), column


@given(requests=REQUESTS, capacity=CAPACITY, touch=TOUCH, semantics=SEMANTICS)
def test_kernel_equals_reference_on_any_id_stream(requests, capacity, touch, semantics) -> None:
    """Ids repeat inside and across requests (no chaining), so a request can hit, evict and
    re-insert the same block; capacity 0, 1 (each miss empties the list) and unbounded."""
    frames_agree(make_trace(requests, block_size=1), capacity_blocks=capacity, touch_order=touch,
                 hit_semantics=semantics)


@pytest.mark.parametrize("capacity", [1, 2, 30, 299, None])
@pytest.mark.parametrize("touch", ["head_most_recent", "tail_most_recent"])
def test_kernel_equals_reference_on_a_zipf_stream(capacity, touch) -> None:
    """20 000 one-block requests over 300 objects: hits and misses interleave at random."""
    frames_agree(zipf_objects(20_000, 300, seed=3), capacity_blocks=capacity, touch_order=touch,
                 hit_semantics="independent")


def test_independent_lookups_of_multi_block_requests_exact_values() -> None:
    """Capacity 2, independent lookups in forward order: [1, 2, 1] hits 1 at its second
    look-up; [3, 2] evicts 2, then 1 (2 was evicted by 3): no hit; [1, 1] evicts 3, then
    hits the 1 it just inserted."""
    trace = make_trace([[1, 2, 1], [3, 2], [1, 1]], block_size=1)
    frame = replay(trace, capacity_blocks=2, touch_order="tail_most_recent", hit_semantics="independent").requests
    assert frame["hit_blocks"].to_list() == [1, 0, 1]
    assert frame["evictions"].to_list() == [0, 2, 1]
    assert frame["used_blocks"].to_list() == [2, 2, 2]
    frames_agree(trace, capacity_blocks=2, touch_order="tail_most_recent", hit_semantics="independent")


def state_for(num_keys: int, capacity: int):  # noqa: ANN201 - an LRUState
    keys = pl.Series([list(range(num_keys))], dtype=pl.List(pl.UInt64))
    return make_state(flatten_block_keys(keys, pl.Series([num_keys]), block_size=1), capacity)


@given(keys=st.lists(st.integers(0, 9), max_size=60), capacity=st.integers(0, 5), reverse=st.booleans())
def test_access_hook_evicts_the_reference_victims_in_order(keys, capacity, reverse) -> None:
    """One ``access`` call over a whole stream: the victims, in order, and the residency."""
    state = state_for(10, capacity)
    block_ids = np.array(keys, dtype=np.int32)
    evicted = np.full(max(len(keys), 1), -7, dtype=np.int64)
    num = access(state, block_ids, 0, len(keys), reverse, evicted)
    ref, victims = LRU(capacity), []
    for i, k in enumerate(reversed(keys) if reverse else keys):
        victims += ref.access(k, i)
    assert evicted[:num].tolist() == victims
    assert [k for k in range(10) if contains(state, k)] == sorted(ref.resident())
    assert state.counters[0] == len(ref)


@given(requests=REQUESTS, capacity=st.integers(0, 8), reverse=st.booleans())
def test_replay_independent_hook_per_request_outputs(requests, capacity, reverse) -> None:
    """LRU's own loop over requests: hits at lookup, evictions and occupancy per request."""
    flat = make_trace(requests, block_size=1).flat
    state = make_state(flat, capacity)
    n = flat.num_requests
    hits, used, evictions = (np.full(n, -7, dtype=np.int32) for _ in range(3))
    evicted = np.empty(max(int(flat.blocks_per_request().max()), 1), dtype=np.int64)
    replay_independent(state, flat.offsets, flat.block_ids, 0, n, reverse, evicted, hits, used, evictions)
    ref = LRU(capacity)
    for r in range(n):
        ids = flat.block_ids[flat.offsets[r]:flat.offsets[r + 1]].tolist()
        h = ev = 0
        for k in reversed(ids) if reverse else ids:
            h += k in ref
            ev += len(ref.access(k, 0))
        assert (hits[r], evictions[r], used[r]) == (h, ev, len(ref))


def test_tier_hooks_keep_the_list_consistent_after_an_emptied_list() -> None:
    """Capacity 1 as a tier drives it: evict to empty, insert, touch, remove, evict."""
    state = state_for(4, 1)
    insert(state, 2)
    touch(state, 2)
    assert evict(state) == 2 and evict(state) == -1
    insert(state, 3)
    assert remove(state, 3) and not remove(state, 3)
    assert evict(state) == -1 and state.counters[0] == 0
    insert(state, 1)
    assert contains(state, 1) and not contains(state, 3) and evict(state) == 1
    assert state.links[-2:].tolist() == [4, 4]  # the sentinel links to itself again
