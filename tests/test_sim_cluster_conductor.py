"""Mooncake's Conductor (FAST'25 Algorithm 1) and its baselines on the cluster simulation
(cluster_sim.md §6.6, rules C15–C17, C21; engines.md §5.3 M4).

Expected TTFTs are computed here from the roofline (``Roofline().step_time``) and the network
device (``Device.read_time_s``), not from the router.
"""

from __future__ import annotations

import polars as pl
import pytest
from sim_cluster_reference import cluster_trace

from kvlab.core import check_result
from kvlab.sim.cluster import (
    ROUTERS,
    Conductor,
    Decision,
    LeastLoaded,
    LoadBalance,
    Roofline,
    Router,
    StepBatch,
    get_router,
    simulate,
)
from kvlab.tiers.devices import Device, get_device
from kvlab.traces import load_trace

KV_TOKEN = 131_072  # Llama-3.1-8B KV bytes per token
BLOCK = 16
ROOF = Roofline()
SLOW_NET = Device("slow_net", capacity_bytes=0, read_bytes_per_s=1e9, write_bytes_per_s=1e9, latency_s=10e-6,
                  concurrency=1)


def prefill_s(tokens: int, cached: int = 0) -> float:
    """One prefill alone on an idle worker."""
    return ROOF.step_time(StepBatch(prefill=[(tokens - cached, cached)])).step_s


def copy_s(blocks: int, net: Device) -> float:
    return net.read_time_s(blocks * BLOCK * KV_TOKEN, num_ops=1)


class Forced(Router):
    """Requests named in ``fixed`` go where it says; the rest to ``inner``."""

    name = "forced"

    def __init__(self, inner: Router, fixed: dict[int, str]) -> None:
        self.inner, self.fixed = inner, fixed
        self.uses_index = inner.uses_index

    def select(self, request, view, now):
        worker = self.fixed.get(request.index)
        return Decision(worker) if worker else self.inner.select(request, view, now)


def hot_prefix_scenario(long_tokens: int, num_long: int, *, w1_warm: bool = False) -> tuple[list, dict[int, str]]:
    """w0 computes a 136-token prompt of conversation 1 (8 full blocks cached); optionally w1 a
    72-token one (4 blocks); at t=1 ``num_long`` prompts of ``long_tokens`` are queued on w0, then
    the probe (200 tokens of conversation 1: 8 blocks on w0) arrives at the same instant."""
    rows = [(0.0, 136, 2, 1)]
    fixed = {0: "w0"}
    if w1_warm:
        rows.append((0.0, 72, 2, 1))
        fixed[1] = "w1"
    for k in range(num_long):
        fixed[len(rows)] = "w0"
        rows.append((1.0, long_tokens, 2, 100 + k))
    rows.append((1.0, 200, 2, 1))
    return rows, fixed


def probe_run(router: Conductor, long_tokens: int, num_long: int, *, w1_warm: bool = False,
              network: Device | str = "rdma_400gbps"):
    rows, fixed = hot_prefix_scenario(long_tokens, num_long, w1_warm=w1_warm)
    result = simulate(cluster_trace(rows), num_workers=2, capacity_blocks=2000, network=network,
                      router=Forced(router, fixed))
    check_result(result)
    return result, result.requests.row(len(rows) - 1, named=True)


@pytest.mark.parametrize("long_tokens", [256, 512])
def test_transfer_chosen_iff_cheaper_than_the_queue(long_tokens):
    """C15/C16: w0 holds the probe's 8 blocks behind one queued prefill; w1 is idle and empty, so
    its candidate is the copy (8/1 > 1.5). On a 1 GB/s network the copy (16.8 ms) costs more than
    a 256-token queue (10.4 ms) and less than a 512-token one (19.8 ms)."""
    result, probe = probe_run(Conductor(), long_tokens, 1, network=SLOW_NET)
    queue = prefill_s(long_tokens)
    ttft_w0 = queue + prefill_s(200, 128)
    ttft_w1 = copy_s(8, SLOW_NET) + prefill_s(200, 128)
    transfer = ttft_w1 < ttft_w0
    assert transfer == (long_tokens == 512)  # the scenario straddles the boundary
    assert probe["worker"] == ("w1" if transfer else "w0")
    assert probe["predicted_ttft_s"] == pytest.approx(min(ttft_w0, ttft_w1), rel=1e-12)
    moved = result.transfers.filter(pl.col("kind") == "transfer")
    if transfer:
        assert moved.select("src", "dst", "request_id", "bytes").row(0) == ("w0", "w1", 2, 8 * BLOCK * KV_TOKEN)
        assert (probe["remote_hit_tokens"], probe["gpu_hit_tokens"]) == (128, 0)
        assert probe["ttft_s"] == pytest.approx(ttft_w1, rel=1e-12)  # w1 idle: the prediction is exact
    else:
        assert moved.height == 0
        assert (probe["remote_hit_tokens"], probe["gpu_hit_tokens"]) == (0, 128)


@pytest.mark.parametrize(("threshold", "transfer"), [(2.0, False), (1.99, True)])
def test_threshold_boundary_and_only_missing_blocks_are_sent(threshold, transfer):
    """w0 holds 8 blocks, w1 4: the ratio is exactly 2. At threshold 2.0 no copy (C16: strictly
    greater); at 1.99 the copy is w1's candidate, and it sends only the 4 blocks w1 lacks. w0 is
    behind a 4096-token prefill, so w1 wins either way."""
    result, probe = probe_run(Conductor(kvcache_balancing_threshold=threshold), 4096, 1, w1_warm=True)
    net = get_device("rdma_400gbps")
    ttft_w0 = prefill_s(4096) + prefill_s(200, 128)
    ttft_w1 = (copy_s(4, net) + prefill_s(200, 128)) if transfer else prefill_s(200, 64)
    assert ttft_w1 < ttft_w0
    assert probe["worker"] == "w1"
    assert probe["predicted_ttft_s"] == pytest.approx(ttft_w1, rel=1e-12)
    moved = result.transfers.filter(pl.col("kind") == "transfer")
    if transfer:
        assert moved.select("src", "dst", "bytes").row(0) == ("w0", "w1", 4 * BLOCK * KV_TOKEN)
        assert (probe["gpu_hit_tokens"], probe["remote_hit_tokens"]) == (64, 64)
    else:
        assert moved.height == 0
        assert (probe["gpu_hit_tokens"], probe["remote_hit_tokens"]) == (64, 0)


class Recording(Router):
    """Records, per request, the index's prefix length on every worker; routes to w0."""

    name = "recording"
    uses_index = True
    seen: list[dict[str, int]] = []  # a class attribute: the loop deep-copies the router

    def select(self, request, view, now):  # noqa: ARG002
        Recording.seen.append({w: view.prefix_blocks(request, w) for w in view.workers})
        return Decision("w0")


class _Then(Router):
    """``first`` routes every request before position ``at``, ``then`` the rest."""

    name = "then"
    uses_index = True

    def __init__(self, first: Router, then: Router, at: int) -> None:
        self.first, self.then, self.at = first, then, at

    def select(self, request, view, now):
        return (self.first if request.index < self.at else self.then).select(request, view, now)


@pytest.mark.parametrize("allow_transfer", [True, False])
def test_a_copy_replicates_the_prefix_in_the_index(allow_transfer):
    """w0 holds a 125-block prefix, behind a short queued prefill at t=1 when the probe (the
    prefix + 92 tokens) arrives. Conductor copies the prefix to idle w1 (fast network); later,
    a request of the prefix finds it on both workers in the index — on w1 only through the copy's
    KV events, since the probe computed just its tail there. Local cache-aware keeps the probe
    on w0, and w1 stays empty."""
    rows = [(0.0, 2008, 2, 1), (1.0, 64, 2, 100), (1.0, 2100, 2, 1), (5.0, 2008, 2, 1)]
    net = get_device("mooncake_te_8x400gbps")
    ttft_w0 = prefill_s(64) + prefill_s(2100, 2000)
    ttft_copy = copy_s(125, net) + prefill_s(2100, 2000)
    assert ttft_copy < ttft_w0 < prefill_s(2100)  # so Conductor copies and local stays on w0
    Recording.seen = []
    router = Forced(_Then(Conductor(allow_transfer=allow_transfer), Recording(), 3), {0: "w0", 1: "w0"})
    result = simulate(cluster_trace(rows), num_workers=2, capacity_blocks=2000, network=net, router=router)
    probe = result.requests.row(2, named=True)
    assert probe["worker"] == ("w1" if allow_transfer else "w0")
    assert (result.transfers["kind"] == "transfer").sum() == int(allow_transfer)
    assert Recording.seen == [{"w0": 125, "w1": 125 if allow_transfer else 0}]


def test_predicted_ttft_is_the_realised_one_alone():
    """A lone request on an idle worker, then the same conversation's next turn alone: Conductor's
    prediction is the roofline prefill of the uncached part, and it is what happens."""
    trace = cluster_trace([(0.0, 3000, 4, 1), (2.0, 3500, 4, 1)])
    result = simulate(trace, num_workers=2, router="conductor")
    req = result.requests
    cached = 3000 // BLOCK * BLOCK
    assert req["worker"].to_list() == ["w0", "w0"]
    assert req["predicted_ttft_s"].to_list() == pytest.approx([prefill_s(3000), prefill_s(3500, cached)], rel=1e-12)
    assert req["ttft_s"].to_list() == pytest.approx(req["predicted_ttft_s"].to_list(), rel=1e-12)


def test_slo_rejections_keep_their_rows():
    """C17 on one worker: the first request (alone) meets a TTFT SLO between its prefill and two
    prefills; the second, queued behind it, does not and is rejected with its row. A TBT SLO
    below one request's decode step rejects both; one between one and two requests' steps (the
    first is waiting when the second arrives) only the second."""
    trace = cluster_trace([(0.0, 2048, 4, 1), (0.0, 2048, 4, 2)])
    slo = 1.5 * prefill_s(2048)
    result = simulate(trace, num_workers=1, router=Conductor(ttft_slo_s=slo))
    check_result(result)
    req = result.requests
    assert req["rejected"].to_list() == [False, True]
    assert req["reject_reason"].to_list() == [None, "router"]
    assert req["predicted_ttft_s"].to_list() == pytest.approx([prefill_s(2048), 2 * prefill_s(2048)], rel=1e-12)
    alone, behind = (float(ROOF.decode_step_times(n, [n * 2048])[0]) for n in (1, 2))
    assert alone < behind
    strict = simulate(trace, num_workers=1, router=Conductor(tbt_slo_s=0.99 * alone))
    loose = simulate(trace, num_workers=1, router=Conductor(tbt_slo_s=(alone + behind) / 2))
    assert strict.requests["reject_reason"].to_list() == ["router", "router"]
    assert loose.requests["reject_reason"].to_list() == [None, "router"]  # the second sees the first waiting


def test_local_cache_aware_never_transfers():
    """The scenario where Conductor copies (512-token queue, slow network): local cache-aware
    keeps the probe on w0 behind the queue (its own 8 blocks) or sends it to empty w1, never a copy."""
    result, probe = probe_run(Conductor(allow_transfer=False), 512, 1, network=SLOW_NET)
    ttft_w0 = prefill_s(512) + prefill_s(200, 128)
    ttft_w1 = prefill_s(200)
    assert probe["worker"] == ("w0" if ttft_w0 < ttft_w1 else "w1")
    assert probe["predicted_ttft_s"] == pytest.approx(min(ttft_w0, ttft_w1), rel=1e-12)
    assert (result.transfers["kind"] == "transfer").sum() == 0


def test_load_balance_takes_the_smallest_predicted_queue():
    """w0 queues one 4000-token prefill, w1 two 100-token ones: LoadBalance (queued prefill
    seconds) picks w1, LeastLoaded (request count) w0."""
    rows = [(0.0, 4000, 2, 10), (0.0, 100, 2, 11), (0.0, 100, 2, 12), (0.0, 300, 2, 13)]
    fixed = {0: "w0", 1: "w1", 2: "w1"}
    queues = {"w0": prefill_s(4000), "w1": 2 * prefill_s(100)}
    assert queues["w1"] < queues["w0"]
    picks = {}
    for router in (LoadBalance(), LeastLoaded()):
        result = simulate(cluster_trace(rows), num_workers=2, router=Forced(router, fixed))
        picks[router.name] = result.requests["worker"][3]
    assert picks == {"load_balance": "w1", "least_loaded": "w0"}


def test_router_names_and_options():
    assert {"conductor", "local_cache_aware", "load_balance"} <= set(ROUTERS)
    local = get_router("local_cache_aware")
    assert isinstance(local, Conductor) and local.allow_transfer is False
    assert isinstance(get_router("load_balance"), LoadBalance)
    assert Conductor(kvcache_balancing_threshold=2.5).to_dict() == {
        "type": "Conductor", "name": "conductor", "kvcache_balancing_threshold": 2.5, "allow_transfer": True,
        "ttft_slo_s": None, "tbt_slo_s": None}
    with pytest.raises(ValueError, match="kvcache_balancing_threshold"):
        Conductor(kvcache_balancing_threshold=0)
    with pytest.raises(ValueError, match="allow_transfer"):
        Conductor(allow_transfer=1)


def test_the_four_schedulers_on_the_conversation_trace():
    """C21's comparison, small: 300 conversation requests on 4 workers (64-token blocks to keep
    the index cheap). All complete; only Conductor copies; random is the slowest (the paper's
    ordering starts random ≫ the rest)."""
    trace = load_trace("conversation").head(300)
    ttft = {}
    for name in ("conductor", "local_cache_aware", "load_balance", "random"):
        result = simulate(trace, num_workers=4, block_size=64, router=name)
        check_result(result)
        assert result.summary.completed_requests == 300
        copies = int((result.transfers["kind"] == "transfer").sum()) if result.transfers.height else 0
        assert (copies > 0) == (name == "conductor")
        ttft[name] = result.summary.ttft_mean_s
    print("mean TTFT s:", ttft)
    assert ttft["random"] == max(ttft.values())
