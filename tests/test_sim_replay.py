"""Cache-level replay: exact scenarios, kernel vs reference, invariants, accounting."""

from __future__ import annotations

import importlib

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces, make_trace
from kvlab.engines import replay_requests
from kvlab.policies.lru import LRU
from kvlab.sim import ReplayConfig, replay, replay_reference
from kvlab.sim import sweep as kvlab_sweep

A, B, C, D, E = 10, 11, 12, 13, 14
SCENARIO = [[A, B, C], [A, B, D], [A, E], [A, B, C]]


def eviction_order(trace, capacity: int, touch_order: str) -> list[int]:
    """Evicted keys in order, from the reference LRU stepped by hand."""
    cache, evicted = LRU(capacity), []
    for keys in trace.frame["block_keys"].to_list():
        order = reversed(keys) if touch_order == "head_most_recent" else keys
        for key in order:
            evicted += cache.access(key, 0)
    return evicted


@pytest.mark.parametrize(("touch", "hits", "evictions", "order"), [
    # head most recent: a request's tail is evicted first (c after R1), the shared head stays
    ("head_most_recent", [0, 2, 1, 2], [0, 1, 1, 2], [C, D, B, E]),
    # tail most recent: the head ages first; R3 loses its prefix at b
    ("tail_most_recent", [0, 2, 1, 1], [0, 1, 1, 2], [C, B, D, E]),
])
def test_golden_scenario_capacity_3(touch, hits, evictions, order) -> None:
    trace = make_trace(SCENARIO, block_size=1)
    result = replay(trace, capacity_blocks=3, touch_order=touch)
    assert result.requests["hit_blocks"].to_list() == hits
    assert result.requests["evictions"].to_list() == evictions
    assert result.requests["used_blocks"].to_list() == [3, 3, 3, 3]
    assert eviction_order(trace, 3, touch) == order
    ref = replay_reference(trace, capacity_blocks=3, touch_order=touch).requests
    assert ref["hit_blocks"].to_list() == hits and ref["evictions"].to_list() == evictions


@given(trace=chained_traces(), capacity=st.one_of(st.none(), st.integers(0, 60)),
       touch=st.sampled_from(["head_most_recent", "tail_most_recent"]),
       semantics=st.sampled_from(["prefix", "independent"]))
def test_kernel_equals_reference(trace, capacity, touch, semantics) -> None:
    """The numba kernel and the OrderedDict reference agree request by request — hits,
    occupancy, evictions and orphaned blocks (the kernel's incremental count against a
    recount from scratch) — so their frames and totals are equal."""
    result = replay(trace, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics,
                    track_orphans=True)
    ref = replay_reference(trace, capacity_blocks=capacity, touch_order=touch, hit_semantics=semantics,
                           track_orphans=True)
    assert result.requests.equals(ref.requests) and result.timeline.equals(ref.timeline)
    assert {**result.summary.to_dict(), "driver": "replay_reference"} == ref.summary.to_dict()


def test_reference_refuses_the_vllm_mode_and_bad_input() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    with pytest.raises(ValueError, match="replay_reference models mode 'prefix' only"):
        replay_reference(trace, mode="vllm")
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        replay_reference(trace.frame)
    with pytest.raises(ValueError, match="config must be a ReplayConfig or None, got 3"):
        replay_reference(trace, 3)


@given(trace=chained_traces(), capacity=st.integers(0, 30))
def test_capacity_never_exceeded_and_blocks_conserved(trace, capacity) -> None:
    req = replay(trace, capacity_blocks=capacity).requests
    assert req["used_blocks"].max() <= capacity
    # every miss inserts a block (unless capacity is 0): inserted - evicted = resident
    misses = req["miss_blocks"].cast(pl.Int64).sum()
    if capacity > 0:
        assert req["used_blocks"][-1] == misses_inserted(trace, capacity) - req["evictions"].sum()
    assert (req["hit_blocks"] <= req["blocks"]).all() and misses >= 0


def misses_inserted(trace, capacity) -> int:
    """Blocks inserted (accesses to non-resident blocks), counted with the reference."""
    cache, inserted = LRU(capacity), 0
    for keys in trace.frame["block_keys"].to_list():
        for key in reversed(keys):
            inserted += key not in cache
            cache.access(key, 0)
    return inserted


@given(trace=chained_traces(), capacity=st.one_of(st.none(), st.integers(0, 30)),
       warmup=st.floats(0.0, 0.95))
def test_warmup_accounting(trace, capacity, warmup) -> None:
    result = replay(trace, capacity_blocks=capacity, warmup_fraction=warmup)
    req, s = result.requests, result.summary
    skip = int(np.floor(warmup * len(trace)))
    assert s.warmup_requests == skip == (~req["measured"]).sum()
    measured = req.filter("measured")
    assert s.requests == measured.height
    assert s.block_refs == measured["blocks"].cast(pl.Int64).sum()
    assert s.hit_blocks == measured["hit_blocks"].cast(pl.Int64).sum()
    assert s.hit_tokens == measured["hit_tokens"].cast(pl.Int64).sum()
    assert s.evictions == measured["evictions"].sum()
    # warm-up requests still fill the cache: per-request hits do not depend on the warm-up
    assert req["hit_blocks"].to_list() == replay(trace, capacity_blocks=capacity).requests["hit_blocks"].to_list()


def test_token_accounting_counts_last_block_remainder() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 3], [1, 2, 9]], block_size=4, input_tokens=[10, 10, 12])
    req = replay(trace).requests
    assert req["hit_tokens"].to_list() == [0, 10, 8]
    assert req["miss_tokens"].to_list() == [10, 0, 4]
    s = replay(trace).summary
    assert (s.hit_tokens, s.input_tokens) == (18, 32)
    assert s.token_hit_ratio == pytest.approx(18 / 32)
    assert s.block_hit_ratio == pytest.approx(5 / 9)


def test_capacity_zero_caches_nothing() -> None:
    s = replay(make_trace(SCENARIO, block_size=1), capacity_blocks=0).summary
    assert (s.hit_blocks, s.evictions, s.peak_used_blocks) == (0, 0, 0)


def test_unbounded_equals_working_set_capacity(conversation) -> None:
    unbounded = replay(conversation).requests
    exact = replay(conversation, capacity_blocks=conversation.distinct_blocks).requests
    assert unbounded["hit_blocks"].equals(exact["hit_blocks"])
    assert exact["evictions"].sum() == 0


def test_timeline_long_format() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    result = replay(trace, capacity_blocks=3, window_requests=2)
    tl = result.timeline
    assert tl.columns == ["step", "time_s", "tier", "metric", "value"]
    assert set(tl["metric"].unique()) == {"used_blocks", "evictions", "hit_ratio_rolling", "capacity_blocks",
                                          "hit_blocks", "miss_blocks"}
    hits = tl.filter(pl.col("metric") == "hit_blocks")["value"].to_list()
    misses = tl.filter(pl.col("metric") == "miss_blocks")["value"].to_list()
    assert hits == [0.0, 2.0, 1.0, 2.0] and misses == [3.0, 1.0, 1.0, 1.0]  # golden scenario, head most recent
    ratio = tl.filter(pl.col("metric") == "hit_ratio_rolling")["value"].to_list()
    assert ratio == pytest.approx([0.0, 2 / 6, 3 / 5, 3 / 5])
    assert "capacity_blocks" not in replay(trace).timeline["metric"].to_list()


def test_progress_chunks_give_the_same_result(conversation, monkeypatch) -> None:
    # kvlab.sim re-exports the function replay(), which hides the module of the same name
    monkeypatch.setattr(importlib.import_module("kvlab.sim.replay"), "_CHUNK_REFS", 10_000)
    chunked = replay(conversation, capacity_blocks=5_000, progress=True).requests
    whole = replay(conversation, capacity_blocks=5_000).requests
    assert chunked.equals(whole)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("capacity_blocks", -1, "capacity_blocks must be an integer in [0, 2**63) or None, got -1"),
    ("capacity_blocks", 2.5, "capacity_blocks must be an integer in [0, 2**63) or None, got 2.5"),
    ("touch_order", "random", "touch_order must be one of"),
    ("warmup_fraction", 1.0, "warmup_fraction must be a number in [0, 1), got 1.0"),
    ("window_requests", 0, "window_requests must be an integer >= 1, got 0"),
    ("policy", "nope", "unknown policy 'nope'; known policies: ["),
    ("hit_semantics", "suffix", "hit_semantics must be one of"),
    ("track_orphans", 1, "track_orphans must be a bool, got 1"),
])
def test_config_errors_name_field_and_value(field, value, message) -> None:
    with pytest.raises(ValueError) as info:
        ReplayConfig(**{field: value})
    assert message in str(info.value)


def test_sweep_accepts_generators_and_matches_replay() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    frame = kvlab_sweep(trace, (c for c in (1, 3, None)), policies=iter(["lru"]))
    assert frame["capacity_blocks"].to_list() == [1, 3, None]
    assert frame["hit_blocks"].to_list() == [replay(trace, capacity_blocks=c).summary.hit_blocks for c in (1, 3, None)]


def test_capacity_beyond_the_working_set_behaves_as_unbounded() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    huge = replay(trace, capacity_blocks=2**63 - 1).summary
    assert huge.config.capacity_blocks == 2**63 - 1
    assert huge.hit_blocks == replay(trace).summary.hit_blocks
    with pytest.raises(ValueError, match=r"in \[0, 2\*\*63\) or None, got 1180591620717411303424"):
        replay(trace, capacity_blocks=2**70)  # frames store capacities as int64


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: replay(t, 10_000), "config must be a ReplayConfig or None, got 10000; pass the capacity by name"),
    (lambda t: replay("conversation"), "trace must be a kvlab Trace (see kvlab.load_trace), got str"),
    (lambda t: replay(t.frame), "trace must be a kvlab Trace (see kvlab.load_trace), got DataFrame"),
    (lambda t: kvlab_sweep("synthetic", [10]), "trace must be a kvlab Trace"),
    (lambda t: kvlab_sweep(t, [10], policies="nope"), "unknown policy 'nope'"),
])
def test_caller_mistakes_are_value_errors(call, message) -> None:
    with pytest.raises(ValueError) as info:
        call(make_trace(SCENARIO, block_size=1))
    assert message in str(info.value)


def test_sweep_accepts_one_policy_name() -> None:
    assert kvlab_sweep(make_trace(SCENARIO, block_size=1), [3], policies="lru")["policy"].to_list() == ["lru"]


def test_orphans_appear_when_the_head_ages_first() -> None:
    """Hard point 4: with the head least recent (tail_most_recent), LRU evicts a chain's
    first block and leaves its children cached but unreachable; head_most_recent (vLLM's
    reverse free) keeps chains whole."""
    trace = make_trace([[A, B, C], [D]], block_size=1)
    tail = replay(trace, capacity_blocks=3, touch_order="tail_most_recent", track_orphans=True)
    head = replay(trace, capacity_blocks=3, touch_order="head_most_recent", track_orphans=True)
    orphaned = lambda r: r.timeline.filter(pl.col("metric") == "orphaned_blocks")["value"].to_list()  # noqa: E731
    assert orphaned(tail) == [0.0, 1.0]  # A evicted: B is an orphan (C's parent B is still cached)
    assert orphaned(head) == [0.0, 0.0]  # C evicted: A, B stay a whole chain
    assert tail.summary.mean_orphaned_share == pytest.approx((0 + 1 / 3) / 2)
    assert replay(trace).summary.mean_orphaned_share is None


def test_independent_semantics_counts_every_resident_block() -> None:
    trace = make_trace([[A, B, C], [A, E, C]], block_size=1)  # C repeats after a different parent
    assert replay(trace, hit_semantics="independent").requests["hit_blocks"].to_list() == [0, 2]
    assert replay(trace).requests["hit_blocks"].to_list() == [0, 1]


@pytest.mark.parametrize("run", [
    replay, replay_reference, replay_requests,
])
def test_a_misspelled_option_names_the_fields(run) -> None:
    """A typo is a ValueError listing the fields, from every replay, not a dataclass TypeError."""
    trace = make_trace([[1, 2]], block_size=1)
    with pytest.raises(ValueError, match=r"has no field 'capcity_blocks'; fields: \[.*'capacity_blocks'"):
        run(trace, capcity_blocks=10)


def test_ssd_capacity_blocks_has_one_range() -> None:
    trace = make_trace([[1, 2]], block_size=1)
    with pytest.raises(ValueError, match="ssd_capacity_blocks must be an integer in \\[1, 2\\*\\*63\\) or None, got 0"):
        replay(trace, mode="omlx", capacity_blocks=4, ssd_capacity_blocks=0)
