"""``remove`` and ``evict`` of every reference policy: the contract a tiered store relies on,
consistency with ``access``, and hand-written scenarios per policy."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import POLICIES, get_policy
from kvlab.policies.arc import ARC
from kvlab.policies.belady import NEVER, Belady
from kvlab.policies.fifo import FIFO
from kvlab.policies.leaf_first_lru import LeafFirstLRU
from kvlab.policies.length_aware import LengthAware
from kvlab.policies.lfu import LFU
from kvlab.policies.lru import LRU
from kvlab.policies.s3fifo import S3FIFO
from kvlab.policies.sieve import Sieve

ALL = sorted(POLICIES)
KEYS = 10  # keys 0..KEYS-1 in random sequences
FRESH = 1000  # first key never used by a random sequence

#: Random operations on a small key range; "split" starts a new request (for the trace-aware
#: references, which see the accesses grouped into requests).
OPS = st.lists(st.tuples(st.sampled_from(["access", "access", "access", "remove", "evict", "split"]),
                         st.integers(0, KEYS - 1)), max_size=60)


def requests_of(ops: list[tuple[str, int]]) -> list[list[int]]:
    """The accessed keys of ``ops`` grouped into requests (flat order = ``ref_index``)."""
    requests: list[list[int]] = [[]]
    for op, key in ops:
        if op == "access":
            requests[-1].append(key)
        elif op == "split" and requests[-1]:
            requests.append([])
    return [keys for keys in requests if keys]


def make(name: str, capacity: int | None, requests: list[list[int]]):  # noqa: ANN201 - any reference class
    spec = get_policy(name)
    return spec.reference(capacity, requests=requests) if spec.reference_uses_trace else spec.reference(capacity)


def ghosts(cache) -> set[int]:  # noqa: ANN001
    """Ids the policy remembers without holding them (S3-FIFO's ghost queue, ARC's B1/B2)."""
    if isinstance(cache, S3FIFO):
        return set(cache.queues()["ghost"])
    if isinstance(cache, ARC):
        lists = cache.lists()
        return set(lists["B1"]) | set(lists["B2"])
    return set()


def membership(cache, keys: range) -> set[int]:  # noqa: ANN001
    return {k for k in keys if k in cache}


def run(cache, ops: list[tuple[str, int]], capacity: int | None) -> int:  # noqa: ANN001
    """Apply ``ops``, checking the contract after each; return the number of accesses."""
    keys = range(KEYS)
    i = 0
    for op, key in ops:
        before = membership(cache, keys)
        size = len(cache)
        if op == "access":
            out = cache.access(key, i)
            i += 1
            assert all(v in before and v not in cache for v in out)
            assert membership(cache, keys) == (before | ({key} if capacity != 0 else set())) - set(out)
        elif op == "remove":
            if key in before:
                assert cache.remove(key) is True
                assert key not in cache and len(cache) == size - 1
                assert membership(cache, keys) == before - {key}
            else:
                state = copy.deepcopy(vars(cache))
                assert cache.remove(key) is False
                assert vars(cache) == state  # nothing changed, metadata included
        elif op == "evict":
            if size == 0:
                state = copy.deepcopy(vars(cache))
                assert cache.evict() is None
                assert vars(cache) == state
            else:
                victim = cache.evict()
                assert victim in before and victim not in cache and len(cache) == size - 1
                assert membership(cache, keys) == before - {victim}
        if capacity is not None:
            assert len(cache) <= capacity
        assert len(cache) == len(membership(cache, keys))
    return i


@pytest.mark.parametrize("name", ALL)
@given(ops=OPS, capacity=st.one_of(st.integers(0, 8), st.none()))
def test_remove_and_evict_keep_the_contract(name: str, ops: list[tuple[str, int]], capacity: int | None) -> None:
    """Capacity never exceeded; ``remove`` of a resident block drops exactly it, of any
    other block changes nothing; ``evict`` drops one resident block, or returns ``None``
    on an empty cache; ``len`` counts the resident keys."""
    run(make(name, capacity, requests_of(ops)), ops, capacity)


@pytest.mark.parametrize("name", ALL)
@given(ops=OPS, capacity=st.integers(0, 8))
def test_evict_is_the_victim_of_inserting_an_unknown_block(name: str, ops: list[tuple[str, int]],
                                                          capacity: int) -> None:
    """On a full cache, ``evict()`` equals the first victim of ``access(k, i)`` for every
    block ``k`` the policy does not know (not resident, in no ghost list), and ``evict()``
    then ``access(k, i)`` leaves the same state as ``access(k, i)`` alone."""
    fill = list(range(FRESH, FRESH + capacity))
    requests = requests_of(ops)
    cache = make(name, capacity, [*requests, fill, [2 * FRESH]] if fill else [*requests, [2 * FRESH]])
    i = run(cache, ops, capacity)
    for key in fill:  # fill up with new blocks (no eviction: the cache is not full)
        if len(cache) == capacity:
            break
        assert cache.access(key, i) == []
        i += 1
    assert len(cache) == capacity
    probe_index = sum(map(len, requests)) + len(fill)  # where the unknown block sits in the trace
    unknown = [k for k in range(KEYS) if k not in cache and k not in ghosts(cache)] + [2 * FRESH]
    for key in unknown:
        via_evict, via_access = copy.deepcopy(cache), copy.deepcopy(cache)
        victim = via_evict.evict()
        out = via_access.access(key, probe_index)
        assert victim == (out[0] if out else None)
        assert via_evict.access(key, probe_index) == []
        assert vars(via_evict) == vars(via_access)


def accessed(cache, keys: list[int]):  # noqa: ANN001, ANN201
    """``cache`` after accessing ``keys`` at reference indices 0, 1, ... (no evictions)."""
    for i, key in enumerate(keys):
        assert cache.access(key, i) == []
    return cache


def test_lru_remove_then_evict() -> None:
    cache = accessed(LRU(3), [1, 2, 3])
    assert cache.remove(2) and not cache.remove(2)
    assert cache.evict() == 1
    assert cache.resident() == [3]
    assert cache.evict() == 3 and cache.evict() is None


def test_fifo_remove_keeps_insertion_order() -> None:
    cache = accessed(FIFO(3), [1, 2, 3, 1])
    assert cache.remove(1)
    assert cache.evict() == 2
    assert cache.resident() == [3]


def test_lfu_remove_forgets_the_count() -> None:
    cache = accessed(LFU(3), [1, 1, 2, 3])
    assert cache.remove(1)
    assert cache.counts() == {2: 1, 3: 1}
    assert cache.evict() == 2
    cache.access(1, 4)
    assert cache.counts() == {1: 1, 3: 1}  # back with count 1


def test_lfu_evict_after_the_lowest_count_is_removed() -> None:
    cache = accessed(LFU(3), [1, 1, 2, 2, 3])
    assert cache.remove(3)  # the only block of count 1
    assert cache.evict() == 1  # count 2, less recent than 2
    assert cache.evict() == 2 and cache.evict() is None


def test_s3fifo_remove_from_small_and_from_main_leaves_no_ghost() -> None:
    cache = accessed(S3FIFO(3), [1, 2, 3])
    assert cache.access(4, 3) == [1]
    cache.access(2, 4)
    assert cache.queues() == {"small": [4], "main": [2, 3], "ghost": [1]}
    assert cache.remove(4)  # from small
    assert cache.queues() == {"small": [], "main": [2, 3], "ghost": [1]}
    assert cache.remove(2)  # from main
    assert cache.queues() == {"small": [], "main": [3], "ghost": [1]}
    assert not cache.remove(1)  # a ghost id is not resident: it stays
    assert cache.queues()["ghost"] == [1]


def test_s3fifo_evict_moves_small_to_main_first() -> None:
    cache = accessed(S3FIFO(3), [1, 2, 3, 1, 1])  # small [1] (counter 2), main [2, 3]
    assert cache.evict() == 2  # 1 moves to main, then main's oldest (counter 0) goes
    assert cache.queues() == {"small": [], "main": [3, 1], "ghost": []}


def test_s3fifo_evict_from_small_enters_the_ghost() -> None:
    cache = accessed(S3FIFO(3), [1, 2, 3])  # small [1], main [2, 3]
    assert cache.evict() == 1
    assert cache.queues() == {"small": [], "main": [2, 3], "ghost": [1]}


def test_sieve_removing_the_block_under_the_hand_moves_it_to_the_newer_block() -> None:
    cache = accessed(Sieve(3), [1, 2, 3, 1])
    assert cache.access(4, 4) == [2]  # the hand cleared 1 and rests on 3
    assert cache.remove(3)
    assert cache.resident() == [1, 4]
    assert cache.evict() == 4  # the hand moved on to 4 (not back to 1)


def test_sieve_removing_the_newest_block_under_the_hand_restarts_at_the_tail() -> None:
    cache = accessed(Sieve(3), [1, 2, 3, 1])
    cache.access(4, 4)  # [1, 3, 4], the hand on 3
    assert cache.remove(4)  # newer than the hand: it stays on 3
    assert cache.remove(3)  # the newest now: the next sweep starts at the tail
    cache.access(5, 5)
    cache.access(6, 6)
    assert cache.resident() == [1, 5, 6]
    assert cache.evict() == 1


def test_sieve_removing_an_older_block_keeps_the_hand_on_its_block() -> None:
    cache = accessed(Sieve(3), [1, 2, 3, 1])
    cache.access(4, 4)  # [1, 3, 4], the hand on 3
    cache.access(1, 5)
    assert cache.remove(1)
    assert cache.evict() == 3


def test_arc_removed_block_enters_no_ghost_list() -> None:
    cache = accessed(ARC(2), [1, 1, 2])
    assert cache.remove(2)
    assert cache.lists() == {"T1": [], "T2": [1], "B1": [], "B2": []}
    assert cache.p == 0.0


def test_arc_ghost_hit_in_a_cache_that_is_not_full_replaces_nothing() -> None:
    cache = accessed(ARC(2), [1, 1, 2])
    assert cache.access(3, 3) == [2]
    assert cache.lists() == {"T1": [3], "T2": [1], "B1": [2], "B2": []}
    assert not cache.remove(2)  # a ghost id: not resident, stays in B1
    assert cache.remove(3)
    assert cache.access(2, 4) == []  # B1 hit: p grows, but there is room
    assert cache.lists() == {"T1": [], "T2": [1, 2], "B1": [], "B2": []}
    assert cache.p == 1.0


def test_arc_evict_is_replace() -> None:
    cache = accessed(ARC(2), [1, 1, 2])
    assert cache.evict() == 2  # |T1| = 1 > p = 0: T1's LRU block to B1
    assert cache.lists() == {"T1": [], "T2": [1], "B1": [2], "B2": []}
    assert cache.evict() == 1  # T1 is empty: T2's LRU block to B2
    assert cache.lists() == {"T1": [], "T2": [], "B1": [2], "B2": [1]}
    assert cache.evict() is None


def test_arc_evict_with_t1_full_then_insert_drops_the_victim_as_case_iv_a() -> None:
    cache = accessed(ARC(2), [1, 2])
    assert cache.evict() == 1
    assert cache.lists()["B1"] == [1]
    assert cache.access(3, 2) == []  # the insertion trims B1 back to |T1| + |B1| = c
    assert cache.lists() == {"T1": [2, 3], "T2": [], "B1": [], "B2": []}


def test_length_aware_remove_forgets_count_and_depth() -> None:
    cache = accessed(LengthAware(3, requests=[[1, 2, 3], [2], [9, 2]]), [1, 2, 3, 2])
    assert cache.scores() == {1: (1, 0), 2: (2, 1), 3: (1, 2)}
    assert cache.remove(1)
    assert cache.evict() == 3  # (1, 2) < (2, 1)
    assert cache.remove(2)
    cache.access(9, 4)
    cache.access(2, 5)
    assert cache.scores() == {9: (1, 0), 2: (1, 1)}


def test_leaf_first_removing_the_only_child_makes_the_parent_a_leaf() -> None:
    cache = accessed(LeafFirstLRU(3, requests=[[1, 2], [3], [4]]), [1, 2, 3])
    assert cache.leaves() == [2, 3]
    assert cache.remove(2)
    assert cache.leaves() == [1, 3]  # at its own (oldest) recency
    assert cache.evict() == 1


def test_leaf_first_removing_an_inner_block_keeps_its_children() -> None:
    cache = accessed(LeafFirstLRU(3, requests=[[1, 2], [3], [4]]), [1, 2, 3])
    assert cache.remove(1)
    assert 2 in cache and cache.leaves() == [2, 3]
    assert cache.evict() == 2


def test_belady_remove_and_evict() -> None:
    cache = accessed(Belady(3, requests=[[1, 2, 4], [3, 1], [2]]), [1, 2, 4])
    assert cache.next_uses() == {1: 4, 2: 5, 4: NEVER}
    assert cache.evict() == 4  # never used again
    assert cache.remove(2)
    assert cache.next_uses() == {1: 4}
    assert cache.evict() == 1 and cache.evict() is None


@pytest.mark.parametrize("name", ALL)
def test_empty_and_zero_capacity_caches(name: str) -> None:
    for capacity in (0, 3, None):
        cache = make(name, capacity, [[1, 2]])
        assert cache.evict() is None and cache.remove(1) is False
        cache.access(1, 0)
        assert cache.remove(1) is (capacity != 0)
        assert len(cache) == 0
