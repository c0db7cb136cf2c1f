"""The numba tiered replay (kvlab.tiers.driver, kvlab.tiers.replay) against the reference
TieredStore: per request and tier, the hits and the resident blocks, and every counter,
exactly — for every tier policy, every write policy, with and without promotion, both
touch orders."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces, make_trace
from kvlab.core import check_result
from kvlab.sim import replay
from kvlab.tiers.driver import COUNTERS
from kvlab.tiers.replay import replay_tiered
from kvlab.tiers.store import WRITE_POLICIES, TieredStore, TierSpec
from kvlab.tiers.types import tier_policies

TOUCH = st.sampled_from(["head_most_recent", "tail_most_recent"])
CAPACITY = st.one_of(st.integers(0, 10), st.none())
#: Every tier policy in every tier (each tuple of policies compiles the kernel once, so the
#: tiers share one policy, or take one of a few mixes).
POLICIES = st.one_of(st.sampled_from([*tier_policies(), None]).map(lambda p: (p, p, p)),
                     st.sampled_from([("s3fifo", "sieve", "arc"), ("lru", None, "fifo"), ("lfu", "arc", None)]))
TIERS = st.tuples(st.lists(CAPACITY, min_size=1, max_size=3), POLICIES).map(
    lambda drawn: [TierSpec(f"T{i}", c, p) for i, (c, p) in enumerate(zip(*drawn))])
ARBITRARY = st.lists(st.lists(st.integers(0, 15), max_size=6), min_size=1, max_size=30).map(
    lambda keys: make_trace(keys, block_size=1))  # repeated keys within a request included


def store_replay(trace, specs, touch_order: str, **options) -> tuple[np.ndarray, np.ndarray, dict]:
    """The oracle: TieredStore.access_request, request by request."""
    store = TieredStore(specs, **options)
    num_tiers = len(specs)
    hits, used = [], []
    for keys in trace.frame["block_keys"].to_list():
        hits.append(store.access_request(keys, touch_order=touch_order).blocks_per_tier(num_tiers))
        used.append([len(t) for t in store.tiers])
    store.check()
    return np.array(hits).reshape(-1, num_tiers), np.array(used).reshape(-1, num_tiers), store.counters()


@given(trace=st.one_of(chained_traces(), ARBITRARY), specs=TIERS, write_policy=st.sampled_from(WRITE_POLICIES),
       promote=st.booleans(), touch=TOUCH, selective_hits=st.integers(1, 3))
def test_kernel_equals_the_reference_store(trace, specs, write_policy, promote, touch, selective_hits) -> None:
    """Every tier policy (and None) x every write policy x promote, capacities 0..10 and
    unbounded: the kernel's hits and residency per tier after each request, and its
    counters, are the store's."""
    options = {"write_policy": write_policy, "promote": promote, "selective_hits": selective_hits}
    result = replay_tiered(trace, specs, touch_order=touch, engine="kernel", **options)
    hits, used, counters = store_replay(trace, specs, touch, **options)
    for t, spec in enumerate(specs):
        assert result.requests[f"hit_blocks_{spec.name}"].to_list() == hits[:, t].tolist(), spec.name
        assert result.requests[f"used_blocks_{spec.name}"].to_list() == used[:, t].tolist(), spec.name
    for row in result.tier_counters.iter_rows(named=True):
        assert {c: row[c] for c in counters[row["tier"]]} == counters[row["tier"]], row["tier"]
    assert result.requests["hit_blocks"].to_list() == hits.sum(axis=1).tolist()


@given(trace=chained_traces(max_requests=20), specs=TIERS, write_policy=st.sampled_from(WRITE_POLICIES),
       promote=st.booleans(), touch=TOUCH, warmup=st.sampled_from([0.0, 0.5]))
def test_kernel_and_reference_engines_give_the_same_result(trace, specs, write_policy, promote, touch,
                                                           warmup) -> None:
    runs = [replay_tiered(trace, specs, write_policy=write_policy, promote=promote, touch_order=touch,
                          warmup_fraction=warmup, engine=engine) for engine in ("kernel", "reference")]
    assert [r.engine for r in runs] == ["kernel", "reference"]
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].timeline.equals(runs[1].timeline)
    assert runs[0].tier_counters.equals(runs[1].tier_counters)
    kernel, reference = (r.summary.to_dict() for r in runs)
    assert kernel.pop("engine") == kernel["config"].pop("engine") == "kernel"
    assert reference.pop("engine") == reference["config"].pop("engine") == "reference"
    assert kernel == reference
    check_result(runs[0])


@pytest.mark.parametrize(("gpu", "cpu"), [(2_000, 8_000), (0, 10_000), (10_000, 0)])
def test_exclusive_two_tiers_equal_one_lru_of_the_sum(conversation, gpu, cpu) -> None:
    """Write-back with promotion: the tiers hold one LRU's blocks, split by recency."""
    result = replay_tiered(conversation, [("GPU", gpu), ("CPU", cpu)], write_policy="write_back", promote=True)
    single = replay(conversation, capacity_blocks=gpu + cpu)
    assert result.engine == "kernel"
    assert result.requests["hit_blocks"].to_list() == single.requests["hit_blocks"].to_list()
    used = result.requests["used_blocks_GPU"].cast(pl.Int64) + result.requests["used_blocks_CPU"]
    assert used.to_list() == single.requests["used_blocks"].to_list()
    assert result.summary.token_hit_ratio == single.summary.token_hit_ratio
    assert result.summary.block_hit_ratio == single.summary.block_hit_ratio


def test_result_frames_and_timeline() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 4], [1, 2, 3]], block_size=4, input_tokens=[12, 10, 9])
    result = replay_tiered(trace, [("GPU", 2), ("CPU", None)], warmup_fraction=0.34)
    check_result(result)
    assert result.requests.columns == ["request_id", "arrival_s", "input_tokens", "hit_blocks", "hit_tokens",
                                       "computed_blocks", "hit_blocks_GPU", "hit_blocks_CPU", "used_blocks_GPU",
                                       "used_blocks_CPU", "measured"]
    assert result.requests["hit_blocks"].to_list() == [0, 2, 3]
    assert result.requests["hit_tokens"].to_list() == [0, 8, 9]  # the last block counts its remainder
    assert result.requests["computed_blocks"].to_list() == [3, 1, 0]
    assert result.summary.requests == 2 and result.summary.warmup_requests == 1
    assert result.summary.hit_tokens == 8 + 9
    assert result.summary.tier_hit_blocks == {"GPU": 4, "CPU": 1}
    assert result.tier_counters["hit_blocks"].to_list() == [4, 1]  # measured requests only
    assert [t.counters.hit_blocks for t in result.summary.tiers] == [4, 1]
    # resident blocks: GPU 2, 2, 2; CPU 1, 2, 2: logged after requests 0 and 1 (changes), and 2 (the last)
    assert result.requests["used_blocks_CPU"].to_list() == [1, 2, 2]
    assert result.timeline.columns == ["step", "time_s", "tier", "metric", "value"]
    timeline = result.timeline
    assert timeline.filter(metric="used_blocks").rows() == [(0, 0.0, "GPU", "used_blocks", 2.0),
                                                            (1, 1.0, "GPU", "used_blocks", 2.0),
                                                            (2, 2.0, "GPU", "used_blocks", 2.0),
                                                            (0, 0.0, "CPU", "used_blocks", 1.0),
                                                            (1, 1.0, "CPU", "used_blocks", 2.0),
                                                            (2, 2.0, "CPU", "used_blocks", 2.0)]
    # every request's hits per tier, the computed blocks under the first tier, bounded capacities
    for tier, hits in (("GPU", [0.0, 2.0, 2.0]), ("CPU", [0.0, 0.0, 1.0])):
        assert timeline.filter(metric="hit_blocks", tier=tier).select("step", "value").rows() == list(enumerate(hits))
        assert result.requests[f"hit_blocks_{tier}"].to_list() == hits
    assert timeline.filter(metric="miss_blocks").select("step", "tier", "value").rows() == [
        (0, "GPU", 3.0), (1, "GPU", 1.0), (2, "GPU", 0.0)]
    assert timeline.filter(metric="capacity_blocks").select("step", "tier", "value").rows() == [
        (0, "GPU", 2.0), (2, "GPU", 2.0)]


def test_timeline_keeps_the_changes_and_the_requests_before_them() -> None:
    """Three one-block requests of new keys, then repeats of the first: the GPU (2 blocks)
    fills after requests 0 and 1 and never changes again: steps 0, 1 and the last."""
    trace = make_trace([[1], [2], [1], [2], [1], [2]], block_size=1)
    timeline = replay_tiered(trace, [("GPU", 2)]).timeline.filter(metric="used_blocks")
    assert timeline["step"].to_list() == [0, 1, 5] and timeline["value"].to_list() == [1.0, 2.0, 2.0]


def test_summary_echoes_the_configuration() -> None:
    trace = make_trace([[1, 2], [1, 3]], block_size=1, source="toy")
    result = replay_tiered(trace, [("GPU", 2, "sieve"), ("NVMe", None, None)], write_policy="write_through")
    summary = result.summary.to_dict()
    assert summary["driver"] == "replay_tiered" and summary["source"] == "toy" and summary["engine"] == "kernel"
    assert summary["config"] == {
        "tiers": [{"name": "GPU", "capacity_blocks": 2, "policy": "sieve"},
                  {"name": "NVMe", "capacity_blocks": None, "policy": None}],
        "write_policy": "write_through", "promote": True, "selective_hits": 2, "walk": "per_block",
        "touch_order": "head_most_recent", "warmup_fraction": 0.0, "engine": "auto"}
    assert [(t["name"], t["capacity_blocks"], t["policy"]) for t in summary["tiers"]] == \
        [("GPU", 2, "sieve"), ("NVMe", None, None)]
    # write-through: 2, 1 into both; then 3 evicts 2 from the GPU (the oldest, unvisited), and 1 hits there
    assert summary["tiers"][0]["counters"]["written_blocks"] == 3
    assert summary["tiers"][1]["counters"]["written_blocks"] == 3
    assert summary["tiers"][0]["counters"]["evicted_blocks"] == 1
    assert summary["tier_hit_blocks"] == {"GPU": 1, "NVMe": 0}


def test_engines_pick_and_other_policies() -> None:
    trace = make_trace([[1, 2], [1, 3], [1, 2]], block_size=1)
    assert replay_tiered(trace, [("GPU", 2), ("CPU", 4)]).engine == "kernel"
    mixed = replay_tiered(trace, [TierSpec("GPU", 1, "s3fifo"), TierSpec("CPU", 2, None)])
    assert mixed.engine == "kernel"
    assert mixed.tier_counters["policy"].to_list() == ["s3fifo", None]
    assert replay_tiered(trace, [(f"T{i}", 1) for i in range(9)]).engine == "reference"  # beyond MAX_TIERS
    assert replay_tiered(trace, [("GPU", 1)], walk="opal").engine == "reference"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"trace": "conversation"}, "trace must be a kvlab Trace"),
    ({"tiers": "GPU"}, "tiers must be a list"),
    ({"tiers": [("GPU",)]}, r"tiers\[0\] must be a TierSpec"),
    ({"tiers": []}, "at least one tier"),
    ({"tiers": [("GPU", 1), ("GPU", 2)]}, "unique"),
    ({"tiers": [("GPU", -1)]}, "capacity_blocks must be an integer >= 0 or None, got -1"),
    ({"tiers": [("GPU", 4, "mru")]}, "unknown policy 'mru'"),
    ({"tiers": [("GPU", 4, "belady")]}, "reads the whole trace and cannot run in a tier"),
    ({"write_policy": "write_around"}, "write_policy must be one of .*'write_around'"),
    ({"promote": "yes"}, "promote must be a bool, got 'yes'"),
    ({"promote": 1}, "promote must be a bool, got 1"),
    ({"touch_order": "random"}, "touch_order must be one of .*'random'"),
    ({"selective_hits": 0}, "selective_hits must be an integer >= 1, got 0"),
    ({"engine": "gpu"}, "engine must be one of .*'gpu'"),
    ({"warmup_fraction": 1.0}, r"warmup_fraction must be a number in \[0, 1\), got 1.0"),
    ({"warmup_fraction": -0.5}, r"warmup_fraction must be a finite number >= 0.0, got -0.5"),
    ({"tiers": [(f"T{i}", 1) for i in range(9)], "engine": "kernel"}, "engine='kernel' takes at most 8 tiers"),
    ({"walk": "opal", "engine": "kernel"}, "engine='kernel' implements walk='per_block' only"),
])
def test_bad_arguments(kwargs, message) -> None:
    arguments = {"trace": make_trace([[1, 2]]), "tiers": [("GPU", 2), ("CPU", 4)], **kwargs}
    with pytest.raises(ValueError, match=message):
        replay_tiered(arguments.pop("trace"), arguments.pop("tiers"), **arguments)


def test_counter_names_are_tier_counters() -> None:
    store = TieredStore([("GPU", 1)])
    assert set(COUNTERS) <= set(store.counters()["GPU"])
