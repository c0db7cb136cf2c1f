"""FIFO, LFU, S3-FIFO and SIEVE: exact scenarios, kernel vs reference, libCacheSim goldens."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from conftest import chained_traces, make_trace
from kvlab.policies import POLICIES, fifo, get_policy, lfu, register_policy, s3fifo, sieve
from kvlab.policies.base import kernel_access
from kvlab.policies.fifo import FIFO
from kvlab.policies.lfu import LFU
from kvlab.policies.s3fifo import S3FIFO, queue_sizes
from kvlab.policies.sieve import Sieve
from kvlab.sim import replay, replay_reference

NAMES = ["fifo", "lfu", "s3fifo", "sieve"]
TOUCH = ["head_most_recent", "tail_most_recent"]


@pytest.fixture(autouse=True, scope="module")
def registered() -> Iterator[None]:
    """Register the four policies (idempotent) until kvlab.policies imports them; undo it
    afterwards so that other modules see the registry as kvlab ships it."""
    added = [m.SPEC.name for m in (fifo, lfu, s3fifo, sieve) if m.SPEC.name not in POLICIES]
    for module in (fifo, lfu, s3fifo, sieve):
        register_policy(module.SPEC)
    yield
    for name in added:
        del POLICIES[name]


def evictions_of(cache, keys: list[int]) -> list[int]:
    """Evicted ids, in order, when ``keys`` are accessed one by one."""
    out: list[int] = []
    for i, key in enumerate(keys):
        out += cache.access(key, i)
    return out


# --- hand-computed scenarios (reference classes) -------------------------------------

def test_fifo_scenario_hits_do_not_reorder() -> None:
    cache = FIFO(3)
    # 1 is hit before 4 arrives, yet evicted first (LRU would evict 2)
    assert evictions_of(cache, [1, 2, 3, 1, 4, 5, 1, 2]) == [1, 2, 3, 4]
    assert cache.resident() == [5, 1, 2]


def test_lfu_scenario_counts_then_recency() -> None:
    cache = LFU(3)
    keys = [1, 1, 2, 2, 2, 3, 4, 3, 5, 4, 1, 6, 2, 1, 7, 7, 7, 7, 8, 9]
    # a newcomer (count 1) is always the victim while 1 and 2 hold counts 2..4; once 1, 2
    # and 7 all have count 4, the least recently used of them (2) goes
    assert evictions_of(cache, keys) == [3, 4, 3, 5, 4, 6, 2, 8]
    assert cache.counts() == {1: 4, 7: 4, 9: 1}


def test_lfu_count_is_reset_on_eviction() -> None:
    cache = LFU(2)
    # 3 evicts 1 (count 3 < 4); 1 returns, evicting 2 (count 4, less recent than 3), with
    # count 1, not 4 — so 4 evicts it again rather than 3
    assert evictions_of(cache, [1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 4]) == [1, 2, 1]
    assert cache.counts() == {3: 4, 4: 1}


def test_sieve_scenario_hand_and_wrap() -> None:
    cache = Sieve(2)
    # 3: the hand clears 1 and evicts 2, the newest, so it rests nowhere; 4: from the tail,
    # 1 (cleared) goes; 5: the hand rests on 3 (visited): clear, evict 4. Same as libCacheSim.
    assert evictions_of(cache, [1, 2, 1, 3, 3, 4, 5]) == [2, 1, 4]
    assert cache.resident() == [3, 5]
    cache = Sieve(3)
    # all visited: the hand clears 1, 2, 3, wraps to the tail and evicts 1
    assert evictions_of(cache, [1, 2, 3, 1, 2, 3, 4]) == [1]
    assert evictions_of(cache, [5]) == [2]  # 2 was cleared by the sweep


def test_s3fifo_scenario() -> None:
    cache = S3FIFO(3)  # small 1, main 2, ghost 2 (queue_sizes)
    keys = [1, 2, 3, 4, 2, 1, 5, 5, 5, 6, 4, 7, 8, 9, 6]
    # 2, 3 go to main (small full before any eviction); 4 evicts 1 from small to the ghost;
    # 1 (a ghost hit) goes to main, evicting 4; main over its share: 2 (hit) reinserted, 3
    # out; 5 hit twice in small moves to main, then main evicts 1; 4 (ghost) evicts 6;
    # 7 evicts 2; then small churns 7, 8, 9 through the 2-entry ghost (6 falls out of it)
    assert evictions_of(cache, keys) == [1, 4, 3, 1, 6, 2, 7, 8, 9]
    assert cache.queues() == {"small": [6], "main": [5, 4], "ghost": [8, 9]}


@pytest.mark.parametrize(("capacity", "sizes"), [(0, (0, 0, 0)), (1, (1, 0, 0)), (9, (1, 8, 8)), (19, (1, 18, 17)),
                                                 (20, (2, 18, 18)), (10_000, (1_000, 9_000, 9_000))])
def test_s3fifo_queue_sizes(capacity: int, sizes: tuple[int, int, int]) -> None:
    assert queue_sizes(capacity) == sizes


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"small_size_ratio": 0.0}, "small_size_ratio must be a finite number in (0.0, 1.0), got 0.0"),
    ({"small_size_ratio": 1}, "small_size_ratio must be a finite number in (0.0, 1.0), got 1"),
    ({"small_size_ratio": "0.1"}, "small_size_ratio must be a finite number in (0.0, 1.0), got '0.1'"),
    ({"ghost_size_ratio": -0.5}, "ghost_size_ratio must be a finite number in [0.0, 10.0], got -0.5"),
    ({"move_to_main_threshold": 4}, "move_to_main_threshold must be an integer in [1, 3], got 4"),
    ({"move_to_main_threshold": True}, "move_to_main_threshold must be an integer in [1, 3], got True"),
])
def test_s3fifo_rejects_bad_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        S3FIFO(10, **kwargs)


@njit
def _kernel_victims(offsets, block_ids, reverse, state, out):  # noqa: ANN001, ANN202
    """Replay a flat trace through a policy's kernel ``access`` hook; victims go to ``out``."""
    n = 0
    for r in range(offsets.shape[0] - 1):
        n += kernel_access(state, block_ids, offsets[r], offsets[r + 1], reverse, out[n:])
    return n


def kernel_victims(trace, name: str, capacity: int, reverse: bool) -> list[int]:
    """Evicted block keys, in order, from the numba kernel."""
    flat = trace.flat
    out = np.zeros(max(flat.num_refs, 1), dtype=np.int64)
    state = get_policy(name).make_state(flat, min(capacity, flat.num_keys))
    return flat.keys[out[:_kernel_victims(flat.offsets, flat.block_ids, reverse, state, out)]].tolist()


@pytest.mark.parametrize(("name", "hits", "evictions", "victims"), [
    # capacity 4, head most recent (each request touched tail first)
    ("fifo", [0, 2, 1, 2, 0], [0, 0, 1, 3, 2], [3, 2, 1, 4, 5, 3]),
    ("lfu", [0, 2, 1, 2, 0], [0, 0, 1, 1, 2], [3, 4, 5, 3]),
    # small 1 / main 3: 2, 1, 4 fill main before any eviction; 3 returns as a ghost hit;
    # R4 finds main over its share: 2 and 1 (hit) are reinserted, 4 goes
    ("s3fifo", [0, 2, 1, 2, 0], [0, 0, 1, 1, 2], [3, 5, 4, 7]),
    ("sieve", [0, 2, 1, 2, 0], [0, 0, 1, 1, 2], [3, 4, 5, 3]),
])
def test_kernel_golden_scenario(name: str, hits: list[int], evictions: list[int], victims: list[int]) -> None:
    """A whole-request replay by the kernel: exact per-request values and victims."""
    trace = make_trace([[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3], [6, 7]], block_size=1)
    req = replay(trace, policy=name, capacity_blocks=4).requests
    assert req["hit_blocks"].to_list() == hits
    assert req["evictions"].to_list() == evictions
    assert req["used_blocks"].to_list() == [3, 4, 4, 4, 4]
    assert kernel_victims(trace, name, 4, reverse=True) == victims


# --- kernel vs reference ------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@given(trace=chained_traces(), capacity=st.one_of(st.none(), st.integers(0, 40)), touch=st.sampled_from(TOUCH),
       semantics=st.sampled_from(["prefix", "independent"]))
def test_kernel_equals_reference(name: str, trace, capacity, touch, semantics) -> None:
    result = replay(trace, policy=name, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics)
    ref = replay_reference(trace, policy=name, capacity_blocks=capacity, touch_order=touch,
                           hit_semantics=semantics).requests
    assert result.requests["hit_blocks"].to_list() == ref["hit_blocks"].to_list()
    assert result.requests["used_blocks"].to_list() == ref["used_blocks"].to_list()
    assert result.requests["evictions"].to_list() == ref["evictions"].to_list()


@pytest.mark.parametrize("name", NAMES)
@given(trace=chained_traces(), capacity=st.integers(1, 40), touch=st.sampled_from(TOUCH))
def test_kernel_victims_equal_reference(name: str, trace, capacity: int, touch: str) -> None:
    """The kernel reports the same victims, in the same order, as the reference."""
    reverse = touch == "head_most_recent"
    victims = kernel_victims(trace, name, capacity, reverse)
    cache, expected = get_policy(name).reference(capacity), []
    for keys in trace.frame["block_keys"].to_list():
        expected += evictions_of(cache, keys[::-1] if reverse else keys)
    assert victims == expected


# --- libCacheSim ----------------------------------------------------------------------

def lcg_stream(seed: int, n: int, n_ids: int, skew: float) -> list[int]:
    """A skewed id stream from a 64-bit LCG (no numpy: the same ids on every platform)."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(int(n_ids * ((x >> 11) / 2**53) ** skew))
    return out


@pytest.mark.parametrize(("name", "hits"), [
    # total hits of libcachesim 0.3.5 (FIFO, LFU, S3FIFO, Sieve; cache_size=20, 35, 60,
    # `get` per request) on lcg_stream(7, 2000, 120, 2.0)
    ("fifo", [505, 804, 1208]),
    ("lfu", [678, 943, 1320]),
    ("s3fifo", [703, 916, 1311]),
    ("sieve", [717, 947, 1308]),
])
def test_hits_equal_libcachesim(name: str, hits: list[int]) -> None:
    stream = lcg_stream(7, 2000, 120, 2.0)
    trace = make_trace([[k + 1] for k in stream], block_size=1)  # one block per request
    for capacity, expected in zip([20, 35, 60], hits):
        cache, ref_hits = get_policy(name).reference(capacity), 0
        for i, key in enumerate(stream):
            ref_hits += key in cache
            cache.access(key, i)
        kernel = replay(trace, policy=name, capacity_blocks=capacity, hit_semantics="independent",
                        touch_order="tail_most_recent").summary.hit_blocks
        assert (ref_hits, kernel) == (expected, expected)


@pytest.mark.parametrize(("params", "hits"), [
    # libcachesim 0.3.5 S3FIFO(cache_size=35, **params) on lcg_stream(7, 2000, 120, 2.0)
    ({"small_size_ratio": 0.25, "ghost_size_ratio": 0.5, "move_to_main_threshold": 1}, 918),
    ({"move_to_main_threshold": 3}, 918),
    ({}, 916),
])
def test_s3fifo_parameters_equal_libcachesim(params: dict, hits: int) -> None:
    """Non-default S3-FIFO parameters: reference and kernel (``make_state(**params)``)
    evict the same blocks, and hit as often as libCacheSim."""
    stream = lcg_stream(7, 2000, 120, 2.0)
    cache, ref_hits, ref_victims = S3FIFO(35, **params), 0, []
    for i, key in enumerate(stream):
        ref_hits += key in cache
        ref_victims += cache.access(key, i)
    flat = make_trace([[k] for k in stream], block_size=1).flat
    out = np.zeros(flat.num_refs, dtype=np.int64)
    state = s3fifo.make_state(flat, 35, **params)
    victims = flat.keys[out[:_kernel_victims(flat.offsets, flat.block_ids, False, state, out)]].tolist()
    assert ref_hits == hits
    assert victims == ref_victims
