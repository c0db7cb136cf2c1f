"""Local vs global cache scope (cluster_sim.md §6.7, rule C20; Mooncake Store, engines.md §5.1
M1–M2): the shared pool, its homes and remote reads, its eviction rounds, and what the index sees.

Expected fetch times come from the device models (``fetch_time_s``), not from the simulation.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from sim_cluster_reference import cluster_trace

from kvlab.sim.cluster import ClusterConfig, ClusterTier, Decision, RoundRobin, Router, simulate
from kvlab.sim.cluster.mooncake_figures import MooncakeSetup
from kvlab.sim.cluster.tier_store import STORE_POD, ClusterStore, build_stores
from kvlab.tiers.cost import fetch_time_s
from kvlab.tiers.devices import get_device
from kvlab.tiers.store import TieredStore
from kvlab.traces import load_trace

DRAM = ClusterTier("DRAM", 1_000)


class Fixed(Router):
    """Request ``i`` goes to ``workers[i]``; it reads the index (so KV events are kept)."""

    name = "fixed"
    uses_index = True

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers

    def select(self, request, view, now):  # noqa: ARG002
        return Decision(self.workers[request.index])


def two_worker_run(scope: str, **config: object) -> object:
    """w0 computes a 160-token prompt (10 blocks); at t=5 the same prompt goes to w1."""
    trace = cluster_trace([(0.0, 160, 2, 1), (5.0, 160, 2, 1)])
    cfg = ClusterConfig(num_workers=2, capacity_blocks=200, tiers=(DRAM,), cache_scope=scope,
                        router=Fixed(["w0", "w1"]), **config)
    return simulate(trace, cfg)


# ---------------------------------------------------------------- the stores


def test_global_scope_shares_one_pool_of_n_times_the_capacity() -> None:
    local = build_stores(ClusterConfig(num_workers=3, capacity_blocks=50, tiers=(DRAM,)), publish=False)
    pool = build_stores(ClusterConfig(num_workers=3, capacity_blocks=50, tiers=(DRAM,), cache_scope="global"),
                        publish=False)
    assert len({id(s) for s in local}) == 3 and [s.pod for s in local] == ["w0", "w1", "w2"]
    assert [s.tiers[0].capacity_blocks for s in local] == [1_000] * 3
    assert len({id(s) for s in pool}) == 1 and pool[0].pod == STORE_POD and pool[0].shared
    assert pool[0].tiers[0].capacity_blocks == 3_000


def test_pool_capacity_counts_only_routable_workers() -> None:
    cfg = ClusterConfig(num_workers=3, roles=("prefill", "prefill", "decode"), capacity_blocks=50, tiers=(DRAM,),
                        cache_scope="global")
    assert build_stores(cfg, publish=False)[0].tiers[0].capacity_blocks == 2_000


def test_a_block_lives_in_the_segment_of_the_worker_that_wrote_it_first() -> None:
    pool = ClusterStore([("DRAM", 100, "lru")], "write_back", 16, STORE_POD, shared=True)
    pool.put([1, 2, 3], writer=0)
    pool.put([1, 2, 4], writer=1)  # 1 and 2 are already there: they stay w0's
    assert pool.homes == {1: 0, 2: 0, 3: 0, 4: 1}
    assert pool.remote_blocks([1, 2, 3, 4], reader=0) == 1
    assert pool.remote_blocks([1, 2, 3, 4], reader=1) == 3
    own = ClusterStore([("DRAM", 100, "lru")], "write_back", 16, "w0")
    own.put([1, 2], writer=0)
    assert own.remote_blocks([1, 2], reader=5) == 0  # a worker's own store is never remote


def test_high_watermark_round_evicts_five_percent_lru_first() -> None:
    """M2: usage reaching 0.9 × 100 blocks starts a round of round(0.05 × 90) = 4 (not 5:
    5 % of the objects, not of the capacity) LRU victims, the oldest first."""
    pool = ClusterStore([("DRAM", 100, "lru")], "write_back", 16, STORE_POD, shared=True, high_watermark=0.9,
                        publish=True)
    pool.put(list(range(1, 90)), writer=0)  # 89 blocks: below the watermark
    assert pool.tier_blocks("DRAM") == 89 and pool.eviction_rounds == 0
    pool.take_events()
    pool.put([90], writer=0)  # 90 = 0.9 × 100
    assert pool.eviction_rounds == 1 and pool.tier_blocks("DRAM") == 86
    removed = [e for e in pool.take_events() if type(e).__name__ == "BlockRemoved"]
    assert [k for e in removed for k in e.block_keys_u64()] == [1, 2, 3, 4]
    assert pool.lookup([1, 5]) == () and pool.lookup([5, 6]) == (0, 0)


def test_without_a_watermark_a_full_tier_evicts_one_block_per_new_one() -> None:
    store = ClusterStore([("DRAM", 4, "lru")], "write_back", 16, "w0")
    store.put([1, 2, 3, 4, 5], writer=0)
    assert store.tier_blocks("DRAM") == 4 and store.lookup([1]) == () and store.eviction_rounds == 0
    assert store.store.events == []  # nothing kept when nobody reads the events


def test_tiered_store_evict_round_follows_the_write_policy() -> None:
    store = TieredStore([("GPU", 3), ("CPU", 3)], write_policy="write_back")
    store.put([1, 2, 3])
    assert store.evict("GPU", 2) == 2
    assert store.tier_blocks() == {"GPU": [3], "CPU": [1, 2]}  # write-back victims move down
    assert store.evict("CPU", 10) == 2 and store.tier_blocks()["CPU"] == []
    with pytest.raises(ValueError, match="num_blocks"):
        store.evict("GPU", -1)


# ---------------------------------------------------------------- the simulation


def test_remote_read_crosses_the_network_in_global_scope() -> None:
    """The prompt w0 wrote is read by w1 from w0's segment: DRAM then the network (C14, C20)."""
    result = two_worker_run("global")
    cfg = result.config
    probe = result.requests.row(1, named=True)
    need_blocks = 10  # tokens_to_load(0, 160, 160) = 159 tokens: all 10 blocks
    expected = fetch_time_s(need_blocks, cfg.block_bytes, DRAM.device, get_device("rdma_400gbps"))
    assert probe["worker"] == "w1" and probe["tier_hit_tokens_DRAM"] == 159
    assert probe["remote_store_tokens"] == 159
    assert probe["fetch_s"] == pytest.approx(expected, rel=1e-12)
    fetch = result.transfers.filter(pl.col("kind") == "fetch").row(0, named=True)
    assert fetch["src"] == STORE_POD and fetch["worker"] == "w1"
    assert result.summary.remote_store_ratio == pytest.approx(159 / 320)


def test_local_scope_reads_only_its_own_store() -> None:
    probe = two_worker_run("local").requests.row(1, named=True)
    assert probe["tier_hit_tokens_DRAM"] == 0 and probe["fetch_s"] == 0.0
    assert probe["computed_prefill_tokens"] == 160 and probe["remote_store_tokens"] == 0


def test_own_segment_read_uses_the_host_link() -> None:
    """Two requests of one prompt on w0 with a GPU pool too small to keep it: the second reads
    the pool's blocks from w0's own segment — DRAM then PCIe, no network."""
    trace = cluster_trace([(0.0, 160, 2, 1), (1.0, 160, 2, 2), (2.0, 160, 2, 1)])
    cfg = ClusterConfig(num_workers=2, capacity_blocks=11, tiers=(DRAM,), cache_scope="global",
                        router=Fixed(["w0", "w0", "w0"]))
    probe = simulate(trace, cfg).requests.row(2, named=True)
    expected = fetch_time_s(10, cfg.block_bytes, DRAM.device, get_device("pcie_gen5_x16"))
    assert probe["gpu_hit_tokens"] == 0 and probe["remote_store_tokens"] == 0
    assert probe["fetch_s"] == pytest.approx(expected, rel=1e-12)


def test_index_credits_every_worker_with_the_global_pool() -> None:
    """The pool publishes as one pod every worker reads: the router credits w1 with w0's prompt
    (global), not at all (local)."""
    glob = two_worker_run("global").requests["index_prefix_blocks"].to_list()
    loc = two_worker_run("local").requests["index_prefix_blocks"].to_list()
    assert glob == [0, 10] and loc == [0, 0]


def test_one_worker_local_equals_global() -> None:
    """40 prompts of 100 blocks drawn from 5 (seeded); a GPU pool of 2 prompts and a DRAM tier of
    4.4 with eviction rounds at 396 blocks: the store is hit and evicts, and one worker's pool
    behaves as its own store."""
    prompts = np.random.default_rng(3).integers(0, 5, size=40).tolist()
    trace = cluster_trace([(0.5 * i, 1_600, 4, p) for i, p in enumerate(prompts)])
    frames = []
    for scope in ("local", "global"):
        cfg = ClusterConfig(num_workers=1, capacity_blocks=200, tiers=(ClusterTier("DRAM", 440),),
                            cache_scope=scope, store_high_watermark=0.9, router="local_cache_aware")
        frames.append(simulate(trace, cfg))
    local, glob = frames
    assert local.summary.tier_hit_ratio["DRAM"] > 0.1  # the store is used...
    assert 0 < local.summary.token_hit_ratio < 0.9  # ...and evicts
    assert_frame_equal(local.requests, glob.requests)
    assert_frame_equal(local.steps, glob.steps)
    assert_frame_equal(local.transfers, glob.transfers)


def test_global_hit_rate_at_least_local_on_conversation() -> None:
    """C20 smoke test (cluster_sim.md §6.10 item 8) on the first 2,000 conversation requests,
    prefill only as Figure 10 runs them."""
    trace = MooncakeSetup().workload(load_trace("conversation").head(2000))
    hits = {}
    for scope in ("local", "global"):
        cfg = ClusterConfig(num_workers=4, model="Llama-3-70B", gpu="A800", tp=8, block_size=512,
                            capacity_blocks=300, tiers=(ClusterTier("DRAM", 600),), cache_scope=scope,
                            router="local_cache_aware")
        hits[scope] = simulate(trace, cfg).summary.token_hit_ratio
    assert hits["global"] >= hits["local"] > 0


def test_round_robin_routes_alike_in_both_scopes() -> None:
    """Scope changes where KV is, not where requests go, for a cache-blind router."""
    trace = MooncakeSetup().workload(load_trace("conversation").head(100))
    workers = [simulate(trace, ClusterConfig(num_workers=3, capacity_blocks=1_000, block_size=256, tiers=(DRAM,),
                                             cache_scope=s,
                                             router=RoundRobin())).requests["worker"].to_list()
               for s in ("local", "global")]
    assert workers[0] == workers[1] == [f"w{i % 3}" for i in range(100)]


@pytest.mark.parametrize(("changes", "message"), [
    ({"cache_scope": "global"}, "cache_scope='global'"),
    ({"cache_scope": "cluster", "tiers": (DRAM,)}, "cache_scope must be one of"),
    ({"store_high_watermark": 1.5, "tiers": (DRAM,)}, "store_high_watermark"),
    ({"store_eviction_ratio": 0.0, "tiers": (DRAM,)}, "store_eviction_ratio"),
])
def test_bad_scope_settings_name_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig(capacity_blocks=10, **changes)
