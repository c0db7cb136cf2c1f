"""TieredStore: the issue's cases 1-7, Opal's lookup scenarios, and a state machine whose
counters, capacities and events must always agree with the state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from conftest import chained_traces, make_trace
from kvlab.sim import replay_reference
from kvlab.tiers.events import TierEvent, apply_kv_events
from kvlab.tiers.store import TieredStore, TierSpec

TOUCH = st.sampled_from(["head_most_recent", "tail_most_recent"])


def replay_store(store: TieredStore, trace, touch_order: str) -> list[int]:
    hits = []
    for keys in trace.frame["block_keys"].to_list():
        hits.append(store.access_request(keys, touch_order=touch_order).hit_blocks)
        store.check()
    return hits


def event_view(store: TieredStore) -> dict[str, list[int]]:
    view = apply_kv_events({}, store.kv_events())
    return {t.name: sorted(view.get(t.name, ())) for t in store.tiers}


# ---------------------------------------------------------------- case 1


ARBITRARY = st.lists(st.lists(st.integers(0, 15), max_size=6), min_size=1, max_size=30).map(
    lambda keys: make_trace(keys, block_size=1))


@given(trace=st.one_of(chained_traces(), ARBITRARY), gpu=st.integers(0, 8), cpu=st.integers(0, 12), touch=TOUCH)
def test_exclusive_two_tier_lru_equals_one_lru_of_the_sum(trace, gpu, cpu, touch) -> None:
    """Case 1: write-back, promote on hit: the hits of one LRU of capacity G + C."""
    store = TieredStore([("GPU", gpu), ("CPU", cpu)], write_policy="write_back", promote=True)
    single = replay_reference(trace, policy="lru", capacity_blocks=gpu + cpu, touch_order=touch).requests
    assert replay_store(store, trace, touch) == single["hit_blocks"].to_list()
    assert sum(len(t) for t in store.tiers) == single["used_blocks"][-1]


def test_exclusive_split_between_tiers() -> None:
    """The GPU holds the most recent blocks, the CPU the next ones."""
    store = TieredStore([("GPU", 2), ("CPU", 3)], write_policy="write_back")
    for keys in ([1, 2], [3, 4], [5]):
        store.access_request(keys, touch_order="tail_most_recent")
    assert store.tier_blocks() == {"GPU": [4, 5], "CPU": [1, 2, 3]}
    result = store.access_request([1, 2, 9], touch_order="tail_most_recent")
    assert (result.hit_blocks, result.tiers) == (2, (1, 1))
    assert store.tier_blocks() == {"GPU": [2, 9], "CPU": [1, 4, 5]}  # 3 fell off the CPU's LRU end


# ---------------------------------------------------------------- cases 2-7


def test_lower_tier_is_asked_only_for_the_rest() -> None:
    """Case 2: a 1000-token prompt (10 blocks of 100), local hit 600, the lower tier
    finds 200 of the remaining 400: it is asked about 400 tokens, 200 are computed."""
    store = TieredStore([("GPU", 6), ("CPU", 10)], write_policy="write_back")
    store.put([6, 7])
    store.put(list(range(6)))  # pushes 6, 7 down to the CPU
    assert store.tier_blocks() == {"GPU": list(range(6)), "CPU": [6, 7]}
    before = store.counters()
    result = store.lookup(list(range(10)))
    after = store.counters()
    asked = {name: after[name]["queried_blocks"] - before[name]["queried_blocks"] for name in after}
    assert result.blocks_per_tier(2) == [6, 2]
    assert asked == {"GPU": 10, "CPU": 4}  # × 100 tokens: 1000 and 400
    assert 10 - result.hit_blocks == 2  # 200 tokens computed


def test_pushed_down_prefix_is_served_from_the_cpu() -> None:
    """Case 4: GPU 4 blocks, CPU 8: a prefix pushed to the CPU is found there, whether
    or not the GPU has room."""
    store = TieredStore([("GPU", 4), ("CPU", 8)], write_policy="write_back")
    store.put([1, 2, 3, 4])
    store.put([5, 6, 7, 8])
    assert store.lookup([1, 2, 3, 4]).tiers == (1, 1, 1, 1)
    store.reset("GPU")  # plenty of room now
    assert store.lookup([1, 2, 3, 4]).tiers == (1, 1, 1, 1)
    result = store.get([1, 2, 3, 4])
    assert result.hit_blocks == 4 and store.tier_blocks() == {"GPU": [1, 2, 3, 4], "CPU": []}


def test_write_through_to_remote_keeps_evicted_blocks_readable() -> None:
    """Case 5: CPU of 2 objects, write-through to a remote tier: C evicts A from the CPU,
    A stays readable from the remote tier; no pin outlives its operation."""
    store = TieredStore([("CPU", 2, "lru"), ("remote", None)], write_policy="write_through")

    def baseline() -> None:
        assert all(not t.pins for t in store.tiers)
        store.check()

    for key in (10, 11, 12):  # A, B, C
        store.put([key])
        baseline()
    assert store.tier_blocks() == {"CPU": [11, 12], "remote": [10, 11, 12]}
    result = store.get([10], request_id="r")
    assert result.tiers == (1,) and store.tiers[0].pins == {10: 1}
    store.release("r")
    baseline()
    assert store.tier_blocks() == {"CPU": [10, 12], "remote": [10, 11, 12]}  # promoted copy evicted B


def test_promoted_blocks_stay_pinned_until_released() -> None:
    """Case 6: blocks promoted for a running request cannot be evicted until released."""
    store = TieredStore([("GPU", 2), ("CPU", 4)], write_policy="write_back")
    store.put([1, 2])
    store.put([3, 4])  # 1, 2 go down to the CPU
    assert store.get([1, 2], request_id="r").tiers == (1, 1)
    assert store.tiers[0].pins == {1: 1, 2: 1}
    store.put([5, 6])  # the GPU is full of pinned blocks: 5, 6 are written to the CPU
    assert store.tier_blocks()["GPU"] == [1, 2]
    store.release("r")
    store.put([7])
    assert store.tier_blocks()["GPU"] in ([2, 7], [1, 7])
    with pytest.raises(ValueError, match="holds no pinned blocks"):
        store.release("r")


def test_reset_of_one_tier_leaves_the_others_visible() -> None:
    """Case 7: after resetting the GPU tier only, an index fed by the events still sees
    the CPU copies."""
    store = TieredStore([("GPU", 4), ("CPU", 8)], write_policy="write_through")
    store.put([1, 2, 3])
    store.reset("GPU")
    assert event_view(store) == {"GPU": [], "CPU": [1, 2, 3]} == store.tier_blocks()
    store.reset()
    assert store.events[-1] == TierEvent("all_cleared", "", ())
    assert event_view(store) == {"GPU": [], "CPU": []}


# ---------------------------------------------------------------- Opal scenarios (index_blend.md B.8)


def _opal_store(walk: str) -> TieredStore:
    store = TieredStore([TierSpec("T0", None, None), TierSpec("T1", None, None)], write_policy="write_through",
                        walk=walk)
    return store


def test_opal_lookup_walk() -> None:
    """T-O3 (both walks) and T-O4 (Opal's strict walk does not go back to T0)."""
    for walk in ("per_block", "opal"):
        store = _opal_store(walk)
        store.tiers[0].insert(100, 0), store.tiers[0].insert(101, 1), store.tiers[1].insert(102, 2)
        result = store.lookup([100, 101, 102, 103])
        assert (result.hit_blocks, result.blocks_per_tier(2)) == (3, [2, 1])
    strict, per_block = _opal_store("opal"), _opal_store("per_block")
    for store in (strict, per_block):
        store.tiers[0].insert(100, 0), store.tiers[0].insert(102, 1), store.tiers[1].insert(101, 2)
    assert strict.lookup([100, 101, 102]).hit_blocks == 2
    assert per_block.lookup([100, 101, 102]).tiers == (0, 1, 0)


def test_no_eviction_tier_spills_to_the_next_and_stops() -> None:
    """T-O6: a tier that never evicts stores what fits; write-back spills the rest down."""
    store = TieredStore([TierSpec("T0", 2, None), TierSpec("T1", 4, None)], write_policy="write_back")
    store.put([1, 2, 3])
    assert store.tier_blocks() == {"T0": [1, 2], "T1": [3]}
    store.put([4, 5, 6, 7])
    assert store.tier_blocks() == {"T0": [1, 2], "T1": [3, 4, 5, 6]}  # 7 is stored nowhere
    assert store.lookup([7]).hit_blocks == 0


def test_selective_write_through_copies_after_two_uses() -> None:
    store = TieredStore([("GPU", 4), ("CPU", 4)], write_policy="write_through_selective")
    store.put([1])
    assert store.tier_blocks() == {"GPU": [1], "CPU": []}
    store.get([1])
    assert store.tier_blocks() == {"GPU": [1], "CPU": [1]}
    assert [e.kind for e in store.events] == ["stored", "copied"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tiers": []}, "at least one tier"),
    ({"tiers": [("GPU", 1), ("GPU", 2)]}, "unique"),
    ({"tiers": [("GPU", 1)], "write_policy": "write_around"}, "write_policy must be one of"),
    ({"tiers": [("GPU", 1)], "walk": "random"}, "walk must be one of"),
    ({"tiers": [("GPU", -1)]}, "capacity_blocks must be an integer >= 0"),
    ({"tiers": [("GPU", 4, "mru")]}, "unknown policy 'mru'"),
    ({"tiers": [("", 4)]}, "tier name must be a non-empty str, got ''"),
    ({"tiers": [("GPU", 4, "belady")]}, "reads the whole trace and cannot run in a tier"),
    ({"tiers": [("GPU", 4)], "selective_hits": 0}, "selective_hits must be an integer >= 1"),
])
def test_bad_configuration(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TieredStore(**kwargs)


def test_bad_calls() -> None:
    store = TieredStore([("GPU", 2)])
    with pytest.raises(ValueError, match=r"unknown tier 'HBM'; tiers: \['GPU'\]"):
        store.reset("HBM")
    with pytest.raises(ValueError, match="touch_order"):
        store.access_request([1], touch_order="random")
    store.get([], request_id="r")
    store.put([1, 2])
    store.get([1, 2], request_id="r")
    with pytest.raises(ValueError, match="below the 2 blocks pinned"):
        store.set_capacity("GPU", 1)


# ---------------------------------------------------------------- state machine

KEYS = st.lists(st.integers(0, 11), max_size=5)


class StoreMachine(RuleBasedStateMachine):
    """Random puts/gets/releases/resets/capacity changes: counters balance, capacities
    hold, and the events always describe the state."""

    @initialize(write_policy=st.sampled_from(["write_through", "write_back", "write_through_selective"]),
                promote=st.booleans(), policies=st.lists(st.sampled_from(["lru", "fifo", "s3fifo", "sieve", None]),
                                                          min_size=3, max_size=3),
                capacities=st.lists(st.integers(0, 6), min_size=3, max_size=3))
    def start(self, write_policy, promote, policies, capacities) -> None:
        names = ["GPU", "CPU", "NVMe"]
        self.store = TieredStore([TierSpec(n, c, p) for n, c, p in zip(names, capacities, policies)],
                                 write_policy=write_policy, promote=promote)
        self.running: list[str] = []
        self.gets = 0

    @rule(keys=KEYS, touch=TOUCH)
    def request(self, keys, touch) -> None:
        self.store.access_request(keys, touch_order=touch)

    @rule(keys=KEYS)
    def put(self, keys) -> None:
        self.store.put(keys)

    @rule(keys=KEYS)
    def get(self, keys) -> None:
        self.gets += 1
        request_id = f"r{self.gets}"
        self.store.get(keys, request_id=request_id)
        self.running.append(request_id)

    @rule()
    def release(self) -> None:
        if self.running:
            self.store.release(self.running.pop(0))

    @rule(tier=st.sampled_from(["GPU", "CPU", "NVMe", None]))
    def reset(self, tier) -> None:
        self.store.reset(tier)

    @rule(tier=st.sampled_from(["GPU", "CPU", "NVMe"]), capacity=st.integers(0, 6))
    def set_capacity(self, tier, capacity) -> None:
        target = self.store._tier(tier)
        if capacity < len(target.pins) or (not target.evicts and capacity < len(target)):
            with pytest.raises(ValueError):
                self.store.set_capacity(tier, capacity)
        else:
            self.store.set_capacity(tier, capacity)

    @rule(keys=KEYS)
    def remove(self, keys) -> None:
        self.store.remove(keys)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "store"):
            self.store.check()
            assert event_view(self.store) == self.store.tier_blocks()


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_victim_skips_a_tier_that_stores_nothing() -> None:
    """Under write-back a GPU victim passes a capacity-0 CPU tier on to the NVMe, as a new
    block that does not fit does."""
    store = TieredStore([("GPU", 1), ("CPU", 0), ("NVMe", 4)], write_policy="write_back")
    store.put([1])
    store.put([2])
    assert store.tier_blocks() == {"GPU": [2], "CPU": [], "NVMe": [1]}
    assert store.events == [TierEvent("stored", "GPU", (1,)), TierEvent("stored", "GPU", (2,)),
                            TierEvent("moved", "GPU", (1,), "NVMe")]


def test_write_back_promotion_never_targets_its_own_tier() -> None:
    """A top tier that cannot take the block (capacity 0, never evicting and full, or a
    block pinned below): the hit is served in place — no self-promotion, no crash."""
    for tiers in ([("GPU", 0), ("CPU", 4)], [TierSpec("GPU", 1, None), ("CPU", 4)]):
        store = TieredStore(tiers)
        store.put([1, 2])
        before = store.counters()
        store.get([1, 2], request_id="a")
        store.get([1, 2], request_id="b")  # pinned below the top: served in place
        store.release("a"), store.release("b")
        after = store.counters()
        assert after["CPU"]["promoted_out_blocks"] == before["CPU"]["promoted_out_blocks"]
        assert not [e for e in store.events if e.kind == "moved" and e.tier == e.to_tier]
        store.check()


def test_release_after_a_get_without_hits_and_bad_keys() -> None:
    store = TieredStore([("GPU", 2)])
    store.get([7], request_id="r")
    store.release("r")  # nothing was pinned: still fine
    with pytest.raises(ValueError, match=r"keys\[1\] must be an integer in \[0, 2\*\*64\), got 'x'"):
        store.put([1, "x"])
    with pytest.raises(ValueError, match=r"tiers\[0\] must be a TierSpec or a \(name, capacity_blocks"):
        TieredStore(["GPU"])
    with pytest.raises(ValueError, match="promote must be a bool"):
        TieredStore([("GPU", 1)], promote="no")


def test_second_trial_validation() -> None:
    store = TieredStore([("GPU", 2), TierSpec("CPU", 4, "none")])  # "none" as the CLI spells it
    assert store.tiers[1].evicts is False
    with pytest.raises(ValueError, match=r"tier 'CPU': capacity_blocks must be an integer >= 0 or None, got -1"):
        store.set_capacity("CPU", -1)
    store.put([1, 2])
    before = store.counters()
    with pytest.raises(ValueError, match="request_id must be hashable"):
        store.get([1, 2], request_id=[1])
    assert store.counters() == before  # rejected before the lookup counted anything
    with pytest.raises(ValueError, match=r"tiers must be a list of TierSpec"):
        TieredStore({"GPU": 1})
    with pytest.raises(ValueError, match=r"unknown policy 'mru' for tier 'GPU'; tier policies: \[.*'lru'.*\] or None"):
        TieredStore([("GPU", 1, "mru")])
    assert TieredStore([("GPU", 1)], block_size=np.int64(512)).block_size == 512


def test_replay_tiered_with_opal_walk(conversation) -> None:
    from kvlab.tiers.replay import replay_tiered

    trace = conversation.head(300)
    opal = replay_tiered(trace, [("GPU", 50), ("CPU", 200)], write_policy="write_through", walk="opal")
    assert opal.engine == "reference"
    store = TieredStore([("GPU", 50), ("CPU", 200)], write_policy="write_through", walk="opal")
    hits = [store.access_request(k).hit_blocks for k in trace.frame["block_keys"].to_list()]
    assert opal.requests["hit_blocks"].to_list() == hits
    with pytest.raises(ValueError, match="implements walk='per_block' only"):
        replay_tiered(trace, [("GPU", 50)], engine="kernel", walk="opal")
