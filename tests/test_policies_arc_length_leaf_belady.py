"""ARC, length-aware LFU, leaf-first LRU and Belady: exact scenarios, kernel vs reference,
libCacheSim goldens.

``length_aware``, ``leaf_first_lru`` and ``belady`` need the trace in their reference
class (positions, parents, next uses): their specs set ``reference_uses_trace`` and
:func:`kvlab.sim.replay_reference` hands the block keys over.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from conftest import chained_traces, make_trace
from kvlab.policies import arc, belady, get_policy, leaf_first_lru, length_aware
from kvlab.policies.arc import ARC
from kvlab.policies.base import kernel_access
from kvlab.policies.belady import NEVER, Belady
from kvlab.policies.leaf_first_lru import LeafFirstLRU
from kvlab.policies.length_aware import LengthAware
from kvlab.policies.lru import LRU
from kvlab.sim import replay, replay_reference

SPECS = [arc.SPEC, length_aware.SPEC, leaf_first_lru.SPEC, belady.SPEC]
NAMES = [spec.name for spec in SPECS]
TOUCH = st.sampled_from(["head_most_recent", "tail_most_recent"])


def reference_cache(name: str, capacity: int | None, trace):
    """The policy's reference object, given the trace's block keys when it needs them."""
    spec = get_policy(name)
    if spec.reference_uses_trace:
        return spec.reference(capacity, requests=trace.frame["block_keys"].to_list())
    return spec.reference(capacity)


def run_reference(trace, name: str, **kwargs):
    """:func:`kvlab.sim.replay_reference` of ``name``."""
    return replay_reference(trace, policy=name, **kwargs).requests


def reference_eviction_order(trace, name: str, capacity: int | None, touch: str) -> list[int]:
    """Evicted keys in order, the reference class stepped as the driver steps it."""
    cache, out, ref = reference_cache(name, capacity, trace), [], 0
    for keys in trace.frame["block_keys"].to_list():
        order = range(len(keys) - 1, -1, -1) if touch == "head_most_recent" else range(len(keys))
        for i in order:
            out += cache.access(keys[i], ref + i)
        ref += len(keys)
    return out


@njit
def _kernel_evictions(state, offsets, block_ids, reverse, out):  # noqa: ANN001, ANN202
    n = 0
    for r in range(offsets.shape[0] - 1):
        n += kernel_access(state, block_ids, offsets[r], offsets[r + 1], reverse, out[n:])
    return n


def kernel_eviction_order(trace, name: str, capacity: int | None, touch: str) -> list[int]:
    """Evicted keys in order, from the compiled kernel hooks."""
    flat = trace.flat
    state = get_policy(name).make_state(flat, flat.num_keys if capacity is None else min(capacity, flat.num_keys))
    out = np.empty(max(flat.num_refs, 1), dtype=np.int64)
    n = _kernel_evictions(state, flat.offsets, flat.block_ids, touch == "head_most_recent", out)
    return flat.keys[out[:n]].tolist()


def hits(trace, name: str, capacity: int, touch: str = "tail_most_recent", semantics: str = "prefix") -> list[int]:
    """Per-request hit blocks of the kernel replay."""
    result = replay(trace, policy=name, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics)
    return result.requests["hit_blocks"].to_list()


def one_block_requests(stream: list[int]):
    """A trace with one block per request (a plain object stream)."""
    return make_trace([[k] for k in stream], block_size=1)


# ---------------------------------------------------------------- exact scenarios, by hand


def test_arc_cases_by_hand() -> None:
    cache = ARC(capacity_blocks=2)
    evicted = [cache.access(k, i) for i, k in enumerate([1, 2, 1, 3, 2, 4, 1, 3])]
    # 1, 2 -> T1; 1 hit -> T2; 3: |T1| = 1 > p = 0, T1's 2 -> B1; 2 (B1 hit): p = 1, |T1| = 1
    # is not > p, T2's 1 -> B2; 4: T2's 2 -> B2; 1 (B2 hit): p = 0, T1's 3 -> B1;
    # 3 (B1 hit, |B1| = |B2| = 1): p = 1, T2's 1 -> B2
    assert evicted == [[], [], [], [2], [1], [2], [3], [1]]
    assert cache.p == 1.0
    assert cache.lists() == {"T1": [4], "T2": [3], "B1": [], "B2": [2, 1]}


def test_arc_case_iv_a_drops_t1_lru_without_ghost() -> None:
    cache = ARC(capacity_blocks=2)
    assert [cache.access(k, i) for i, k in enumerate([1, 2, 3, 1])] == [[], [], [1], [2]]
    assert cache.lists() == {"T1": [3, 1], "T2": [], "B1": [], "B2": []}


def test_arc_replace_takes_t1_on_a_b2_hit_when_t1_equals_p() -> None:
    cache = ARC(capacity_blocks=3)
    evicted = [cache.access(k, i) for i, k in enumerate([3, 2, 3, 4, 1, 2, 4, 3])]
    # ... 4 (B1 hit): p = 2, |T1| = 1, T2's 3 -> B2; 3 (B2 hit): p = 1 = |T1|, so T1's 1 -> B1
    assert evicted == [[], [], [], [], [2], [4], [3], [1]]
    assert cache.p == 1.0
    assert cache.lists() == {"T1": [], "T2": [2, 4, 3], "B1": [1], "B2": []}
    assert kernel_eviction_order(one_block_requests([3, 2, 3, 4, 1, 2, 4, 3]), "arc", 3,
                                 "tail_most_recent") == [2, 4, 3, 1]


def test_arc_fractional_delta_by_hand() -> None:
    """|B1| = 2, |B2| = 3 at a B1 hit: δ1 = 3 / 2 moves p to 2.5 (libCacheSim's older
    integer rule: 2)."""
    stream = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6, 7, 6, 8, 9, 10, 7, 1, 8]
    for integral, ps in ((False, [2.5, 1.5, 3.0]), (True, [2.0, 1.0, 2.0])):
        cache = ARC(capacity_blocks=5, integral_delta=integral)
        evicted, p = [], []
        for i, k in enumerate(stream):
            evicted += cache.access(k, i)
            p.append(cache.p)
        assert evicted == [1, 6, 2, 3, 7, 8, 4, 9, 5]
        assert p[-3:] == ps
        assert cache.lists() == {"T1": [10], "T2": [6, 7, 1, 8], "B1": [9], "B2": [2, 3, 4, 5]}
    trace = one_block_requests(stream)
    assert kernel_eviction_order(trace, "arc", 5, "tail_most_recent") == [1, 6, 2, 3, 7, 8, 4, 9, 5]


@pytest.mark.parametrize(("touch", "order", "hit_blocks", "evictions"), [
    # forward: R1 evicts 2 = (1, 1) before 3 = (1, 2); R2 evicts 4 = (1, 1) (plain LFU
    # would take the older 3); R3 evicts 5 = (1, 0)
    ("tail_most_recent", [2, 4, 5], [0, 1, 0, 1], [0, 1, 1, 1]),
    # head most recent: R1 inserts 4 first, evicting the head 1 = (1, 0) it is about to hit
    ("head_most_recent", [1, 2, 1, 5], [0, 1, 0, 0], [0, 2, 1, 1]),
])
def test_length_aware_by_hand(touch, order, hit_blocks, evictions) -> None:
    trace = make_trace([[1, 2, 3], [1, 4], [5], [1, 4]], block_size=1)
    assert reference_eviction_order(trace, "length_aware", 3, touch) == order
    assert kernel_eviction_order(trace, "length_aware", 3, touch) == order
    req = replay(trace, policy="length_aware", capacity_blocks=3, touch_order=touch).requests
    assert req["hit_blocks"].to_list() == hit_blocks
    assert req["evictions"].to_list() == evictions


def test_length_aware_depth_is_the_deepest_position() -> None:
    """Unchained keys: 2 was seen at position 1, then at 0; it keeps depth 1, so at equal
    counts the more recent 1 (depth 0) goes first."""
    trace = make_trace([[1, 2], [2], [1], [3]], block_size=1)
    for order in (reference_eviction_order, kernel_eviction_order):
        assert order(trace, "length_aware", 2, "tail_most_recent") == [1]


def test_leaf_first_keeps_chains_whole() -> None:
    """Forward order: LRU evicts the head 1 and R2 misses; leaf-first evicts the leaf 3,
    then the leaf 4 (older than the touched leaf 2), and R2 hits its whole prefix."""
    trace = make_trace([[1, 2, 3], [4], [1, 2, 5]], block_size=1)
    assert reference_eviction_order(trace, "leaf_first_lru", 3, "tail_most_recent") == [3, 4]
    assert kernel_eviction_order(trace, "leaf_first_lru", 3, "tail_most_recent") == [3, 4]
    assert hits(trace, "leaf_first_lru", 3) == [0, 0, 2]
    assert hits(trace, "lru", 3) == [0, 0, 0]


def test_leaf_first_parent_returns_at_its_own_recency() -> None:
    """When 2 leaves, its parent 1 becomes a leaf as the least recent block, not the most."""
    trace = make_trace([[1, 2], [3], [4], [5]], block_size=1)
    for order in (reference_eviction_order, kernel_eviction_order):
        assert order(trace, "leaf_first_lru", 3, "tail_most_recent") == [2, 1]


def test_leaf_first_touching_a_returned_parent_makes_it_most_recent() -> None:
    """1 and 3 (touched at t5, t6) return as leaves when 2 and 4 leave; touching 1 again
    (t9) makes it the most recent leaf, so 3 (t6) goes before 5 (t7)."""
    trace = make_trace([[1, 2], [3, 4], [1], [3], [5], [6], [1], [7]], block_size=1)
    for order in (reference_eviction_order, kernel_eviction_order):
        assert order(trace, "leaf_first_lru", 4, "tail_most_recent") == [2, 4, 3]


def test_belady_by_hand() -> None:
    # flat order 1@0 2@1 3@2 1@3 2@4 3@5: R1 evicts 2 (next use 4 > 3); R3 evicts the
    # dead 1; LRU never hits
    trace = make_trace([[1, 2], [3], [1], [2], [3]], block_size=1)
    for touch in ("head_most_recent", "tail_most_recent"):
        assert reference_eviction_order(trace, "belady", 2, touch) == [2, 1]
        assert kernel_eviction_order(trace, "belady", 2, touch) == [2, 1]
        assert hits(trace, "belady", 2, touch) == [0, 0, 1, 0, 1]
    assert hits(trace, "lru", 2) == [0, 0, 0, 0, 0]


def test_belady_dead_blocks_go_least_recent_first() -> None:
    trace = make_trace([[1], [2], [3], [4]], block_size=1)
    assert kernel_eviction_order(trace, "belady", 2, "tail_most_recent") == [1, 2]
    assert reference_eviction_order(trace, "belady", 2, "tail_most_recent") == [1, 2]


def test_belady_key_repeated_inside_a_request() -> None:
    """Tail first, 1@2 (never used again) is touched before 1@0 (next use 2, already past):
    1 is live again, so the dead 2 is the victim."""
    trace = make_trace([[1, 2, 1], [3]], block_size=1)
    for order in (reference_eviction_order, kernel_eviction_order):
        assert order(trace, "belady", 2, "head_most_recent") == [2]


def test_belady_is_not_prefix_optimal() -> None:
    """[A, B, C] twice, 2 blocks: forward, C's insertion evicts B (next use 4 > 3) and the
    repeat hits only A, although keeping A, B gives 2 — which tail-first insertion finds,
    and which independent lookups (A and C) also reach."""
    trace = make_trace([[1, 2, 3], [1, 2, 3]], block_size=1)
    assert hits(trace, "belady", 2, "tail_most_recent") == [0, 1]
    assert hits(trace, "belady", 2, "head_most_recent") == [0, 2]
    assert hits(trace, "belady", 2, "tail_most_recent", "independent") == [0, 2]


@pytest.mark.parametrize("cls", [LengthAware, LeafFirstLRU, Belady])
def test_trace_aware_references_without_a_trace(cls) -> None:
    """Without ``requests``: Belady and leaf-first are LRU, length-aware is LFU (LRU ties)."""
    stream = [1, 2, 1, 3, 4, 1, 2, 5, 3, 1]
    cache, lru = cls(2), LRU(2)
    got = [cache.access(k, i) for i, k in enumerate(stream)]
    expected = [lru.access(k, i) for i, k in enumerate(stream)]
    if cls is LengthAware:  # 1 (count 2, then 3) survives where LRU drops it
        expected = [[], [], [], [2], [3], [], [4], [2], [5], []]
    assert got == expected


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
def test_bad_capacity_names_parameter_and_value(name, bad) -> None:
    with pytest.raises(ValueError, match=f"capacity_blocks must be an integer >= 0 or None, got {bad!r}"):
        get_policy(name).reference(bad)


def test_belady_next_use_table_matches_reference() -> None:
    trace = make_trace([[1, 2], [1, 3], [2], [1, 2]], block_size=1)
    expected = [2, 4, 5, NEVER, 6, NEVER, NEVER]
    assert belady.next_use_table(trace.flat).tolist() == expected
    assert Belady(None, requests=trace.frame["block_keys"].to_list())._next_use == expected


# ------------------------------------------------------------ libCacheSim goldens (ARC, Belady)

#: (seed, ids, references, capacity, libCacheSim ARC hits, libCacheSim Belady hits), from
#: ``libcachesim`` 0.3.5 (``ARC(cache_size=c)``, ``Belady(cache_size=c)``, one ``get`` per id)
#: on :func:`lcg_stream`; streams where flooring ARC's deltas changes the hits.
LCS_GOLDEN = [(3, 24, 161, 10, 84, 114), (6, 45, 272, 19, 140, 193), (8, 59, 346, 15, 143, 226),
              (12, 29, 143, 7, 53, 83), (13, 36, 180, 20, 107, 136), (15, 50, 254, 16, 120, 165)]


def lcg_stream(seed: int, n_ids: int, length: int) -> list[int]:
    """A skewed id stream (low ids hot) from a plain LCG, reproducible anywhere."""
    x, out = seed * 2654435761 % 2**32 or 1, []
    for _ in range(length):
        x = (1103515245 * x + 12345) % 2**31
        out.append(int(n_ids * (x / 2**31) ** 2))
    return out


@pytest.mark.parametrize(("seed", "n_ids", "length", "capacity", "arc_hits", "belady_hits"), LCS_GOLDEN)
def test_hits_equal_libcachesim(seed, n_ids, length, capacity, arc_hits, belady_hits) -> None:
    stream = lcg_stream(seed, n_ids, length)
    trace = one_block_requests(stream)
    for name, expected in (("arc", arc_hits), ("belady", belady_hits)):
        assert sum(hits(trace, name, capacity, semantics="independent")) == expected
    floored = ARC(capacity, integral_delta=True)
    assert sum((k in floored, floored.access(k, i))[0] for i, k in enumerate(stream)) != arc_hits


# ------------------------------------------------------------------ kernel vs reference

ARBITRARY_TRACES = st.lists(st.lists(st.integers(0, 12), max_size=8), min_size=1, max_size=30).map(
    lambda keys: make_trace(keys, block_size=1))


@pytest.mark.parametrize("name", NAMES)
@given(trace=chained_traces(), capacity=st.one_of(st.none(), st.integers(0, 40)), touch=TOUCH,
       semantics=st.sampled_from(["prefix", "independent"]))
def test_kernel_equals_reference(name, trace, capacity, touch, semantics) -> None:
    req = replay(trace, policy=name, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics).requests
    ref = run_reference(trace, name, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics)
    assert req["hit_blocks"].to_list() == ref["hit_blocks"].to_list()
    assert req["used_blocks"].to_list() == ref["used_blocks"].to_list()
    assert req["evictions"].to_list() == ref["evictions"].to_list()


@pytest.mark.parametrize("name", NAMES)
@given(trace=st.one_of(chained_traces(), ARBITRARY_TRACES), capacity=st.one_of(st.none(), st.integers(0, 40)),
       touch=TOUCH)
def test_kernel_eviction_order_equals_reference(name, trace, capacity, touch) -> None:
    """Same victims in the same order, also on unchained traces (keys repeating inside a
    request, varying parents)."""
    assert kernel_eviction_order(trace, name, capacity, touch) == reference_eviction_order(trace, name, capacity, touch)


#: Long streams: more than 4,096 references (a bit tree of three levels), many keys per request
#: and repeats inside a request, so the kernel's table of recent next uses misses too.
LONG_STREAMS = st.tuples(st.integers(1, 60), st.integers(0, 2**32 - 1), st.integers(1, 6)).map(
    lambda a: make_trace(_chunks(lcg_stream(a[1], a[0], 5000), a[2]), block_size=1))


def _chunks(stream: list[int], size: int) -> list[list[int]]:
    return [stream[i:i + size] for i in range(0, len(stream), size)]


@pytest.mark.parametrize("recent", [1, None], ids=["one-entry-table", "default-table"])
@settings(max_examples=15, deadline=None)
@given(trace=LONG_STREAMS, capacity=st.integers(1, 30), touch=TOUCH)
def test_belady_kernel_equals_reference_on_long_streams(recent, trace, capacity, touch) -> None:
    """Same victims in the same order when the furthest next use's block must be read from
    the trace (a table of one entry) as when it mostly comes from the table."""
    with pytest.MonkeyPatch.context() as patch:
        if recent is not None:
            patch.setattr(belady, "RECENT_MIN", recent)
            patch.setattr(belady, "RECENT_MAX", recent)
        got = kernel_eviction_order(trace, "belady", capacity, touch)
    assert got == reference_eviction_order(trace, "belady", capacity, touch)


def test_belady_next_use_table_names_a_dtype_too_small() -> None:
    small = make_trace([[k] for k in range(126)], block_size=1)
    assert belady.next_use_table(small.flat, np.int8).tolist() == [127] * 126
    with pytest.raises(ValueError, match="num_refs must be < 127 for an int8 next-use table, got 127"):
        belady.next_use_table(make_trace([[k] for k in range(127)], block_size=1).flat, np.int8)


@given(trace=chained_traces(), capacity=st.integers(0, 40))
def test_belady_is_optimal_for_independent_forward_lookups(trace, capacity) -> None:
    """With one lookup per block in flat order, MIN hits at least as much as any policy."""
    best = sum(hits(trace, "belady", capacity, semantics="independent"))
    for name in ("lru", "arc", "length_aware", "leaf_first_lru"):
        assert best >= sum(hits(trace, name, capacity, semantics="independent"))
