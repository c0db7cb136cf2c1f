"""Routing in time (C18), cache-aware routing and CacheBlend on workers (cluster_sim.md §6.6)."""

from __future__ import annotations

import numpy as np
import pytest
from sim_cluster_reference import cluster_trace

from kvlab.blend import prefill_savings
from kvlab.core import check_result
from kvlab.index.scorers import SCORERS
from kvlab.sim.cluster import (
    BlendSpec,
    ClusterConfig,
    ClusterTier,
    Decision,
    LeastLoaded,
    Roofline,
    ScorerRouter,
    StepBatch,
    simulate,
)
from kvlab.traces import rag


def test_least_loaded_sees_live_loads_and_stale_snapshots():
    """Ten long requests 1 ms apart on four workers: with live loads (C18 default) LeastLoaded
    spreads them; with snapshots every 10 s the first arrival sees the cluster idle (w0), and every
    later one the snapshot taken at the first arrival's instant, after its step started (C2: step
    ends before snapshots): w0 busy, the rest idle, so the ties all go to w1."""
    rows = [(0.001 * i, 2048, 64, i) for i in range(10)]
    live = simulate(cluster_trace(rows), num_workers=4, router=LeastLoaded())
    stale = simulate(cluster_trace(rows), num_workers=4, router=LeastLoaded(), snapshot_interval_s=10.0)
    assert live.requests["worker"].to_list() == ["w0", "w1", "w2", "w3"] * 2 + ["w0", "w1"]
    assert stale.requests["worker"].to_list() == ["w0"] + ["w1"] * 9
    assert stale.summary.ttft_mean_s > live.summary.ttft_mean_s


def test_scorer_router_follows_the_cached_prefix():
    """Four conversations, each turn extending the last: the llm-d scorer over the event-fed
    index sends a turn to the worker holding its conversation, round robin does not."""
    rows = []
    for turn in range(6):
        for conv in range(4):
            rows.append((turn * 2.0 + conv * 0.1, 512 + 256 * turn, 8, conv))
    trace = cluster_trace(rows)
    scored = simulate(trace, num_workers=3, router=ScorerRouter())
    spread = simulate(trace, num_workers=3, router="round_robin")
    later = scored.requests.filter(scored.requests["arrival_s"] >= 2.0)
    # every later turn goes where its conversation's previous turn was, and hits all of it
    by_conv = {}
    for rid, worker in zip(scored.requests["request_id"].to_list(), scored.requests["worker"].to_list()):
        by_conv.setdefault(rows[rid][3], set()).add(worker)
    assert all(len(workers) == 1 for workers in by_conv.values())
    expected_hits = [512 + 256 * (rows[rid][1] // 256 - 3) for rid in later["request_id"].to_list()]
    assert later["gpu_hit_tokens"].to_list() == expected_hits
    assert later["wrong"].sum() == 0
    assert scored.summary.gpu_hit_ratio > spread.summary.gpu_hit_ratio


def test_blend_charges_only_the_computed_tokens():
    """A RAG trace on one worker, prefix caching alone vs with CacheBlend: blended requests'
    computed prefill tokens are prefill_savings' computed tokens, and their TTFT is the roofline
    prefill of what remains (the first request's prompt is the only one nothing is stored for)."""
    trace = rag(12, num_documents=4, document_tokens=1024, system_prompt_tokens=256, docs_per_request=2,
                order="shuffled", request_rate_per_s=0.2, output_tokens=4, seed=1)
    plain = simulate(trace, num_workers=1)
    blend = simulate(trace, num_workers=1, blend=BlendSpec())
    b, p = blend.requests, plain.requests
    assert b["gpu_hit_tokens"].to_list() == p["gpu_hit_tokens"].to_list()  # blend does not change prefix hits
    assert int(b["blend_tokens"].sum()) > 0
    roof = Roofline()
    for row in b.iter_rows(named=True):
        computed = row["input_tokens"] - row["gpu_hit_tokens"] - row["blend_tokens"] + row["blend_recomputed_tokens"]
        assert row["computed_prefill_tokens"] == computed
        assert row["blend_recomputed_tokens"] == int(np.floor(0.15 * row["blend_tokens"] + 0.5))
        if row["blend_tokens"] and computed:  # alone on the worker (5 s apart): one prefill step
            assert row["ttft_s"] == pytest.approx(roof.step_time(StepBatch(prefill=[(computed, row["gpu_hit_tokens"])]))
                                                 .step_s, rel=1e-9)
    assert blend.summary.ttft_mean_s < plain.summary.ttft_mean_s
    assert blend.summary.prefill_gpu_s < plain.summary.prefill_gpu_s
    # the split is prefill_savings' own: the same counts from the library on the same prompt
    first_blended = b.filter(b["blend_tokens"] > 0).row(0, named=True)
    assert first_blended["blend_tokens"] % 256 == 0
    assert prefill_savings(first_blended["input_tokens"], first_blended["gpu_hit_tokens"]).blended_tokens == 0


def test_blend_needs_token_ids():
    with pytest.raises(ValueError, match="token_ids"):
        simulate(cluster_trace([(0.0, 64, 2, 0)]), blend=BlendSpec())


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_every_scorer_routes_a_simulation(name):
    """Each kvlab scorer behind ScorerRouter (llm-d, Dynamo, SGLang, Opal): a valid result, every
    request on a routable worker, the index never crediting more than the worker holds (no faults)."""
    rows = [(0.05 * i, 256 + 64 * (i % 3), 4, i % 4) for i in range(24)]
    result = simulate(cluster_trace(rows), num_workers=3, router=ScorerRouter(name))
    check_result(result)
    assert result.summary.completed_requests == 24
    assert set(result.requests["worker"]) <= {"w0", "w1", "w2"}
    assert (result.requests["index_prefix_blocks"] <= result.requests["true_prefix_blocks"]).all()


def test_requests_on_their_way_count_as_load():
    """A request routed but not yet queued (an arrival overhead α0; a P/D request still in prefill
    for its decode worker) is load: a burst still spreads over the workers."""
    rows = [(0.0, 2048, 64, i) for i in range(8)]
    delayed = simulate(cluster_trace(rows), num_workers=2, arrival_overhead_s=0.001)
    assert delayed.requests["worker"].to_list() == ["w0", "w1"] * 4
    assert (delayed.requests["enqueue_s"] == 0.001).all()
    pd_run = simulate(cluster_trace(rows), num_workers=4, roles=("prefill", "prefill", "decode", "decode"))
    assert pd_run.requests["decode_worker"].to_list() == ["w2", "w3"] * 4


def test_decision_and_config_mistakes_are_named():
    with pytest.raises(ValueError, match="transfer_from='w0' is the chosen worker"):
        Decision("w0", transfer_from="w0", transfer_blocks=4)
    with pytest.raises(ValueError, match="predicted_ttft_s"):
        Decision("w0", predicted_ttft_s="fast")
    with pytest.raises(ValueError, match="rate .* or time_scale"):
        simulate(cluster_trace([(0.0, 64, 2, 0)]), rate=5.0, time_scale=0.5)
    with pytest.raises(ValueError, match="roles must be a sequence"):
        ClusterConfig(num_workers=2, roles="pd", capacity_blocks=10)
    with pytest.raises(ValueError, match="tiers must be a tuple of ClusterTier"):
        ClusterConfig(tiers=ClusterTier("CPU", 100), capacity_blocks=10)


def test_empty_prompts_are_rejected_rows_and_the_echo_names_what_ran():
    result = simulate(cluster_trace([(0.0, 0, 2, 0), (0.1, 64, 2, 1)]))
    assert result.requests["reject_reason"].to_list() == ["empty_prompt", None]
    assert result.requests["index_prefix_blocks"].null_count() == 2  # no index: no truth columns
    echo = result.summary.to_dict()["config"]
    assert echo["router"] == {"type": "LeastLoaded", "name": "least_loaded"}
    assert echo["time_model"]["type"] == "Roofline" and echo["time_model"]["mfu_pf"] == 0.45
