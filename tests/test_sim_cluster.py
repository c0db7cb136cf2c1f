"""kvlab.sim.cluster end to end: the tests of cluster_sim.md §6.10 (1, 2, 3, 4, 6).

Expected times are the roofline (:class:`~kvlab.sim.cluster.timing.Roofline`, pinned by
test_sim_cluster_timing.py) called on the batch derived by hand from vLLM v1's rules; expected
block tables come from a KVCacheManager driven by hand (tests/sim_cluster_reference.py). Test 5
(Conductor), 7 (ZeroTime vs route_requests) and 8 (Fig. 10) live elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_cluster_reference import (
    VllmReference,
    as_array,
    busy_overlap,
    cache_map,
    cluster_trace,
    free_order,
    record_tables,
)

from kvlab.sim.cluster import ClusterConfig, ClusterTier, simulate
from kvlab.sim.cluster.loop import ClusterLoop
from kvlab.sim.cluster.prompts import PromptSource
from kvlab.sim.cluster.timing import Roofline, StepBatch
from kvlab.tiers.cost import fetch_time_s
from kvlab.tiers.devices import get_device
from kvlab.traces import Trace

ROOF = Roofline()  # the default time model: Llama-3.1-8B on one H100-SXM


def prefill_s(*chunks: tuple[int, int]) -> float:
    """A prefill-only step of chunks ``(new tokens, context)``."""
    return ROOF.step_time(StepBatch(prefill=list(chunks))).step_s


def decode_s(*contexts: int) -> float:
    """A decode-only step with these contexts."""
    return ROOF.step_time(StepBatch(decode=list(contexts))).step_s


def run_loop(trace, config: ClusterConfig) -> tuple[ClusterLoop, list]:
    """A ClusterLoop over ``trace`` (so the test can read the workers' pools), block tables recorded."""
    f = trace.frame
    rows = list(zip(f["request_id"].to_list(), f["arrival_s"].to_list(), f["input_tokens"].to_list(),
                    f["output_tokens"].to_list()))
    loop = ClusterLoop(rows, PromptSource(trace, config.block_size), config)
    tables = record_tables(loop.workers[0], len(rows))
    loop.run()
    return loop, tables


# --- 1. one request alone (C10, C13) -------------------------------------------------------------

@pytest.mark.parametrize("coalesce", [True, False])
def test_one_request_ttft_is_one_prefill_step_and_e2e_adds_the_decodes(coalesce):
    prompt, out, arrival = 1000, 5, 2.5
    result = simulate(cluster_trace([(arrival, prompt, out, 1)]), capacity_blocks=1000, coalesce_decode=coalesce)
    row = result.requests.row(0, named=True)
    ttft = prefill_s((prompt, 0))
    decodes = [decode_s(prompt + k) for k in range(out - 1)]  # contexts P, P+1, ..., P+out-2
    assert row["ttft_s"] == pytest.approx(ttft, rel=1e-12)
    assert row["first_token_s"] == pytest.approx(arrival + ttft, rel=1e-12)
    assert row["e2e_s"] == pytest.approx(ttft + sum(decodes), rel=1e-12)
    assert row["queue_s"] == 0.0 and row["gpu_hit_tokens"] == 0 and row["hit_tokens"] == 0
    assert row["computed_prefill_tokens"] == prompt and row["preemptions"] == 0
    assert row["tbt_mean_s"] == pytest.approx(np.mean(decodes), rel=1e-12)
    assert row["tbt_max_s"] == pytest.approx(max(decodes), rel=1e-12)
    steps = result.steps
    assert steps["dt_s"].to_list() == pytest.approx([ttft, *decodes], rel=1e-12)
    assert steps["num_prefill_tokens"].to_list() == [prompt] + [0] * (out - 1)
    assert steps["num_decode"].to_list() == [0] + [1] * (out - 1)
    assert result.summary.prefill_gpu_s == pytest.approx(ttft, rel=1e-12)  # C12: a prefill-only step
    assert result.summary.tbt_p50_s == pytest.approx(float(np.median(decodes)), rel=1e-12)


def test_a_long_prompt_is_chunked_by_the_token_budget():
    """20,000 tokens > 8,192: ceil(P/8192) = 3 prefill steps with contexts 0, 8192, 16384."""
    prompt, out = 20_000, 3
    result = simulate(cluster_trace([(0.0, prompt, out, 1)]), capacity_blocks=2000)
    chunks = [(8192, 0), (8192, 8192), (prompt - 2 * 8192, 2 * 8192)]
    assert math.ceil(prompt / 8192) == len(chunks)
    ttft = sum(prefill_s(c) for c in chunks)
    decodes = [decode_s(prompt), decode_s(prompt + 1)]
    row = result.requests.row(0, named=True)
    assert row["ttft_s"] == pytest.approx(ttft, rel=1e-12)
    assert row["e2e_s"] == pytest.approx(ttft + sum(decodes), rel=1e-12)
    assert result.steps["num_prefill_tokens"].to_list() == [8192, 8192, prompt - 2 * 8192, 0, 0]
    assert result.steps["dt_s"].to_list() == pytest.approx([prefill_s(c) for c in chunks] + decodes, rel=1e-12)


def test_request_overheads_add_to_ttft():
    """α0 delays the enqueue; α2 is added to each output token's time (here: the first)."""
    prompt = 500
    result = simulate(cluster_trace([(1.0, prompt, 2, 1)]), capacity_blocks=100, arrival_overhead_s=0.01,
                      output_token_overhead_s=0.002)
    row = result.requests.row(0, named=True)
    assert row["ttft_s"] == pytest.approx(0.01 + prefill_s((prompt, 0)) + 0.002, rel=1e-12)
    assert row["enqueue_s"] == pytest.approx(1.01)


# --- 2. a repeated prompt hits its full blocks (last-token rule) ---------------------------------

@pytest.mark.parametrize("prompt", [1000, 1024])
def test_a_repeated_prompt_hits_all_full_blocks_but_the_last_token(prompt):
    result = simulate(cluster_trace([(0.0, prompt, 3, 7), (1.0, prompt, 3, 7)]), capacity_blocks=500)
    first, second = result.requests.rows(named=True)
    assert first["finish_s"] < 1.0  # done before the second arrives
    hit = (prompt - 1) // 16 * 16  # vLLM: at most (P - 1) // block_size blocks
    assert second["gpu_hit_tokens"] == second["hit_tokens"] == hit and second["hit_blocks"] == hit // 16
    assert second["computed_prefill_tokens"] == prompt - hit
    assert first["computed_prefill_tokens"] == prompt and first["gpu_hit_tokens"] == 0
    assert second["ttft_s"] == pytest.approx(prefill_s((prompt - hit, hit)), rel=1e-12)
    assert second["ttft_s"] < first["ttft_s"]
    assert result.summary.gpu_hit_ratio == pytest.approx(hit / (2 * prompt))


# --- 3. preemption (C5, C6, C19) and conservation (C4) --------------------------------------------

PREEMPT = [(0.0, 64, 20, 1), (0.0, 64, 100, 2), (0.0, 64, 100, 3)]  # 4 prompt blocks each, pool of 16


def test_preemption_takes_the_last_admitted_and_it_hits_its_own_blocks():
    trace = cluster_trace(PREEMPT)
    config = ClusterConfig(capacity_blocks=16, coalesce_decode=False)
    loop, tables = run_loop(trace, config)
    ref = VllmReference(trace, capacity_blocks=16).run()
    result = simulate(trace, config)
    req = result.requests
    # by hand: all three prefill together (12 blocks), each decode takes a 5th block (15), at
    # token 80 r0 takes the last block and r1 finds none: running.pop() is r2, admitted last
    assert req["preemptions"].to_list()[:2] == [0, 0] and req["preemptions"][2] >= 1
    assert ref.tokens_at_preemption[2] == 81
    # C19: its freed prompt blocks stay cached, so the re-prefill computes less than a cold one
    assert 0 < req["recomputed_tokens"][2] < ref.tokens_at_preemption[2]
    cold = simulate(trace, config, enable_prefix_caching=False).requests
    # without caching a restart computes again every token it had computed (at least the 80 of its
    # first preemption), more than with its freed blocks cached
    assert cold["preemptions"][2] >= 1 and cold["recomputed_tokens"][2] >= 80
    assert req["recomputed_tokens"][2] < cold["recomputed_tokens"][2]
    # the whole run equals the hand-driven vLLM worker: block tables after every scheduling call,
    # batches, step times, per-request counters and times
    assert tables == ref.tables
    assert cache_map(loop.workers[0].manager.block_pool) == ref.cached_map()
    assert free_order(loop.workers[0].manager.block_pool) == free_order(ref.pool)
    expected = pl.DataFrame(ref.steps)
    got = result.steps.select(expected.columns)
    assert got.drop("t_start_s", "dt_s").equals(expected.drop("t_start_s", "dt_s"))
    assert got["dt_s"].to_list() == pytest.approx(expected["dt_s"].to_list(), rel=1e-12)
    assert got["t_start_s"].to_list() == pytest.approx(expected["t_start_s"].to_list(), rel=1e-12)
    assert req["preemptions"].to_list() == ref.preemptions
    assert req["recomputed_tokens"].to_list() == ref.recomputed_tokens
    assert req["computed_prefill_tokens"].to_list() == ref.computed_prefill_tokens
    np.testing.assert_allclose(req["first_token_s"].to_numpy(), as_array(ref.first_token_s), rtol=1e-12)
    np.testing.assert_allclose(req["finish_s"].to_numpy(), as_array(ref.finish_s), rtol=1e-12)
    # C4: counters agree, every request done, every block free again
    s = result.summary
    assert s.preemptions == req["preemptions"].sum() == result.steps["num_preempted"].sum() == sum(ref.preemptions)
    assert s.completed_requests == 3 and s.rejected_requests == 0
    assert all(r.state == "DONE" for r in loop.requests)
    assert loop.workers[0].free_blocks == 16 and loop.workers[0].preemptions == s.preemptions


# --- 4. the FETCH_KVC gate (C7, C8, C14) ---------------------------------------------------------

def tier_trace(flush_prompts: int):
    """10 prompts stored to the CPU tier at their finish, a flush evicting them from the GPU,
    then the 10 prompts again at once (tier hits)."""
    rows = [(float(i), 256, 2, 10 + i) for i in range(10)]  # 16 blocks each
    rows += [(10.0 + 0.5 * i, 1024, 2, 100 + i) for i in range(flush_prompts)]
    rows += [(20.0, 256, 2, 10 + i) for i in range(10)]
    return cluster_trace(rows)


def ready_intervals(result, rows: pl.DataFrame) -> list[tuple[float, float]]:
    """Per request: [its fetch's start, the start of the step computing it) — FETCH_KVC or READY."""
    fetch = result.transfers.filter(pl.col("kind") == "fetch")
    start = dict(zip(fetch["request_id"].to_list(), fetch["start_s"].to_list()))
    step_end = {round(t + dt, 12): t for t, dt in zip(result.steps["t_start_s"], result.steps["dt_s"])}
    return [(start[rid], step_end[round(ft, 12)]) for rid, ft in zip(rows["request_id"], rows["first_token_s"])]


@pytest.mark.parametrize("gate", [2, 8])
def test_fetch_gate_bounds_loads_in_flight(gate):
    trace = tier_trace(flush_prompts=4)  # 4 × 65 blocks > 200: the first 10 prompts leave the GPU
    result = simulate(trace, capacity_blocks=200, tiers=(ClusterTier("CPU", 10_000),), max_kvc_ready_requests=gate)
    again = result.requests.filter(pl.col("arrival_s") == 20.0)
    assert again["gpu_hit_tokens"].to_list() == [0] * 10
    assert again["tier_hit_tokens_CPU"].to_list() == [255] * 10  # C7: a full-prompt hit loads P - 1
    assert again["computed_prefill_tokens"].to_list() == [1] * 10
    fetch = result.transfers.filter(pl.col("kind") == "fetch").sort("start_s", "end_s")
    assert fetch["request_id"].sort().to_list() == again["request_id"].cast(pl.Int64).to_list()
    assert fetch["bytes"].to_list() == [255 * 131_072] * 10
    # each load: 16 blocks from host DRAM then over PCIe (C14); FIFO on the link
    service = fetch_time_s(16, 16 * 131_072, get_device("host_dram_ddr5_4800_8ch"), get_device("pcie_gen5_x16"))
    end = -math.inf
    for s, e in zip(fetch["start_s"], fetch["end_s"]):
        end = max(s, end) + service
        assert e == pytest.approx(end, rel=1e-12)
    prev_end = [-math.inf, *fetch["end_s"][:-1]]
    alone = [e - s for s, e, prev in zip(fetch["start_s"], fetch["end_s"], prev_end) if s >= prev]
    assert alone == pytest.approx([service] * len(alone), rel=1e-9) and len(alone) >= 1
    durations = dict(zip(fetch["request_id"].to_list(), (fetch["end_s"] - fetch["start_s"]).to_list()))
    assert again["fetch_s"].to_list() == pytest.approx([durations[r] for r in again["request_id"].to_list()])
    # C8: never more than `gate` requests loading or loaded-and-waiting
    overlap = busy_overlap(ready_intervals(result, again))
    assert result.steps["num_fetching"].max() <= gate
    assert overlap == 2 if gate == 2 else overlap > 2  # the gate binds at 2, not at 8


def test_tier_loads_filling_the_pool_do_not_deadlock():
    """80 blocks hold five 16-block loads; the first started request's decode needs a 17th block:
    it preempts itself, and the loaded requests holding every block are released in turn
    (``Worker._release_ready``) rather than the worker waiting forever."""
    trace = tier_trace(flush_prompts=1)
    result = simulate(trace, capacity_blocks=80, tiers=(ClusterTier("CPU", 10_000),), max_kvc_ready_requests=8)
    assert result.summary.completed_requests == trace.frame.height == 21
    assert result.summary.preemptions >= 2


@settings(max_examples=15, deadline=None)
@given(gate=st.integers(1, 3), seed=st.integers(0, 2**16),
       prompts=st.lists(st.tuples(st.integers(0, 11), st.integers(65, 128), st.integers(1, 4)), min_size=3,
                        max_size=8))
def test_fetch_gate_is_never_exceeded(gate, seed, prompts):
    """Random prompts, a flush evicting them from a small GPU, then the prompts again in a burst
    (tier hits): at most ``gate`` requests in FETCH_KVC or READY at any instant (C8); all finish (C4)."""
    rng = np.random.default_rng(seed)
    first = [(float(t), n, out, p) for t, (p, n, out) in zip(np.cumsum(rng.exponential(0.05, len(prompts))), prompts)]
    flush = [(1.0 + 0.1 * i, 128, 1, 100 + i) for i in range(3)]
    again = [(2.0 + float(t), n, out, p)
             for t, (p, n, out) in zip(np.cumsum(rng.exponential(0.002, len(prompts))), prompts)]
    rows = first + flush + again
    # 1 running × 9 blocks + 3 loads × 8 blocks < 36: allocation never fails, the gate binds
    result = simulate(cluster_trace(rows), capacity_blocks=36, max_num_seqs=1, tiers=(ClusterTier("CPU", 1000),),
                      max_kvc_ready_requests=gate)
    assert result.summary.completed_requests == len(rows)
    assert result.steps["num_fetching"].max() <= gate
    loaded = result.requests.filter(pl.col("tier_hit_tokens_CPU") > 0)
    assert busy_overlap(ready_intervals(result, loaded)) <= gate


# --- 6. decode coalescing changes nothing (C9) ---------------------------------------------------

def test_coalescing_on_and_off_give_identical_frames():
    rng = np.random.default_rng(6)
    n = 24
    rows = [(float(t), int(p), int(o), int(k)) for t, p, o, k in zip(
        np.cumsum(rng.exponential(0.05, n)), rng.integers(100, 600, n), rng.integers(20, 120, n),
        rng.integers(0, 8, n))]
    trace = cluster_trace(rows)
    kwargs = dict(num_workers=3, router="round_robin", capacity_blocks=60, tiers=(ClusterTier("CPU", 500),))
    on = simulate(trace, coalesce_decode=True, **kwargs)
    off = simulate(trace, coalesce_decode=False, **kwargs)
    assert on.summary.events < off.summary.events  # it really coalesced
    assert on.summary.preemptions > 0  # the trace exercises preemption, tier loads and offloads
    assert set(on.transfers["kind"]) == {"fetch", "offload"}
    for name in ("requests", "steps", "transfers", "timeline"):
        assert getattr(on, name).equals(getattr(off, name)), name
    skip = {"config", "events", "wall_s", "simulated_requests_per_s"}
    a, b = on.summary.to_dict(), off.summary.to_dict()
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def test_a_trace_of_full_blocks_only_keys_its_unkeyed_tail_per_request() -> None:
    """kv-cache-tester keys full 64-token blocks only: engine blocks inside the keyed part follow the
    trace keys (shared across requests), the ones past it are unique to their request."""
    from kvlab.sim.cluster.prompts import PromptSource, output_block_key

    frame = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "input_tokens": [150, 170],
                          "output_tokens": [1, 1], "block_keys": [[5, 6], [5, 6]]})
    trace = Trace(frame, block_size=64, partial_block_keyed=False)
    src = PromptSource(trace, 16)
    first, second = src.engine_keys(0), src.engine_keys(1)
    assert len(first) == 150 // 16 and len(second) == 170 // 16
    assert first[:8] == second[:8]  # 128 keyed tokens = 8 engine blocks, shared
    assert first[8:] == [output_block_key(0, 8)]
    assert second[8:] == [output_block_key(1, 8), output_block_key(1, 9)]
    assert simulate(trace, ClusterConfig()).summary.completed_requests == 2
