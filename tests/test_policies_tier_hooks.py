"""The tier hooks of every policy a tier can run (``touch``, ``insert``, ``evict``, ``remove``)
against the reference class driven the way :class:`kvlab.tiers.Tier` drives it: the same
victims, the same residency after every operation."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import POLICIES, get_policy
from kvlab.policies.base import (
    has_tier_hooks,
    kernel_contains,
    kernel_evict,
    kernel_insert,
    kernel_remove,
    kernel_touch,
    kernel_used,
)
from kvlab.tiers.types import tier_policies
from kvlab.traces.flat import flatten_block_keys

KEYS = 12
OPS = st.lists(st.tuples(st.sampled_from(["access", "access", "access", "access", "remove", "evict"]),
                         st.integers(0, KEYS - 1)), max_size=80)


def state_for(name: str, capacity: int, max_refs: int):  # noqa: ANN201 - a policy's state
    """A kernel state over ids ``0 .. KEYS - 1`` (each referenced ``max_refs`` times, for LFU's
    count table)."""
    keys = pl.Series([list(range(KEYS))] * max_refs, dtype=pl.List(pl.UInt64))
    flat = flatten_block_keys(keys, pl.Series([KEYS] * max_refs), block_size=1)
    assert flat.block_ids[:KEYS].tolist() == list(range(KEYS))  # dense ids in first-seen order: id = key
    return get_policy(name).make_state(flat, capacity)


def test_which_policies_have_tier_hooks() -> None:
    have = sorted(name for name in POLICIES if has_tier_hooks(state_for(name, 2, 1)))
    assert have == tier_policies() == ["arc", "fifo", "lfu", "lru", "s3fifo", "sieve"]


@pytest.mark.parametrize("name", ["arc", "fifo", "lfu", "lru", "s3fifo", "sieve"])
@given(ops=OPS, capacity=st.integers(1, 8))
def test_tier_hooks_equal_the_reference(name: str, ops: list[tuple[str, int]], capacity: int) -> None:
    """``access`` of a resident block is a touch; of a new one, ``evict`` first when full,
    then ``insert``; ``remove`` and ``evict`` as they are."""
    reference = get_policy(name).reference(capacity)
    state = state_for(name, capacity, len(ops) + 1)
    for i, (op, key) in enumerate(ops):
        if op == "access":
            if key in reference:
                assert reference.access(key, i) == []
                kernel_touch(state, key)
            else:
                if len(reference) >= capacity:
                    assert kernel_evict(state) == reference.evict()
                assert reference.access(key, i) == []
                kernel_insert(state, key)
        elif op == "remove":
            assert kernel_remove(state, key) == reference.remove(key)
        else:
            victim = reference.evict()
            assert kernel_evict(state) == (-1 if victim is None else victim)
        assert [k for k in range(KEYS) if kernel_contains(state, k)] == [k for k in range(KEYS) if k in reference]
        assert kernel_used(state) == len(reference)


def test_fifo_compacts_its_ring_of_stale_entries() -> None:
    """Removed blocks leave stale entries in FIFO's ring (capacity 3: 6 slots); an insert
    into a ring full of entries compacts it, keeping the order; an eviction skips a stale
    entry."""
    state = state_for("fifo", 3, 1)
    for k in (1, 2, 3):
        kernel_insert(state, k)
    for gone, new in ((1, 4), (4, 5), (5, 6)):  # entries 1, 2, 3, 4, 5, 6; stale: 1, 4, 5
        assert kernel_remove(state, gone)
        kernel_insert(state, new)
    assert state.ring.tolist() == [1, 2, 3, 4, 5, 6] and state.counters.tolist() == [3, 3, 0, 6, 3]
    assert kernel_remove(state, 6)
    kernel_insert(state, 7)  # full of entries: compacted to 2, 3, then 7 appended
    assert state.ring[:3].tolist() == [2, 3, 7] and state.counters.tolist() == [3, 3, 0, 3, 0]
    assert kernel_remove(state, 7)
    kernel_insert(state, 8)  # entries 2, 3, 7 (stale), 8
    assert [kernel_evict(state) for _ in range(4)] == [2, 3, 8, -1]
