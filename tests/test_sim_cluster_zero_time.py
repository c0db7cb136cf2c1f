"""C23: with every step taking 0 s, the cluster simulation is the routed cache replay.

``simulate(..., time_model=ZeroTime())`` serves each request at its arrival (one-token outputs:
no decode), so the pods' block pools, the KV events and the index evolve as in
:func:`kvlab.index.route_requests` — the hit counts, the chosen pods and the index-vs-truth
columns must be equal request by request (cluster_sim.md §6.1, rule C23).
"""

from __future__ import annotations

import polars as pl
import pytest

from kvlab.index import FaultInjector, route_requests
from kvlab.index.scorers import LongestPrefixScorer, get_scorer
from kvlab.sim.cluster import ScorerRouter, ZeroTime, simulate
from kvlab.traces import Trace, load_trace


def _engine_block_trace(num_requests: int) -> Trace:
    """The conversation trace's first requests, one 16-token block per trace block (the prompt
    ``route_requests`` serves), one output token each, arrivals 1 s apart (no ties)."""
    frame = load_trace("conversation").head(num_requests).frame
    frame = frame.with_columns(
        block_keys=pl.struct("block_keys", "input_tokens").map_elements(
            lambda r: r["block_keys"][: r["input_tokens"] // 512], return_dtype=pl.List(pl.UInt64)))
    frame = frame.filter(pl.col("block_keys").list.len() > 0).with_columns(
        input_tokens=(pl.col("block_keys").list.len() * 16).cast(pl.UInt32),
        output_tokens=pl.lit(1, dtype=pl.UInt32))
    frame = frame.with_columns(arrival_s=pl.int_range(pl.len()).cast(pl.Float64))
    return Trace(frame, block_size=16, source="conversation-16")


@pytest.mark.parametrize(("num_pods", "capacity_blocks", "scorer", "delay_s"), [
    (2, 400, "longest_prefix", 0.0),      # evictions: the index under-credits (docs/index_truth.md)
    (3, 2_000, "longest_prefix", 2.5),    # stale by 2.5 arrivals
    (2, 600, "dynamo_cost", 0.0),
])
def test_zero_time_equals_route_requests(num_pods: int, capacity_blocks: int, scorer: str, delay_s: float) -> None:
    trace = _engine_block_trace(150)
    faults = FaultInjector(delay_s=delay_s) if delay_s else None
    routed = route_requests(trace, num_pods=num_pods, capacity_blocks=capacity_blocks, block_size=16,
                            scorer=get_scorer(scorer), faults=faults, seed=3)
    simulated = simulate(trace, num_workers=num_pods, capacity_blocks=capacity_blocks, block_size=16,
                         time_model=ZeroTime(), router=ScorerRouter(get_scorer(scorer)), faults=faults, seed=3)
    want, got = routed.requests, simulated.requests
    assert got["ttft_s"].max() == 0.0
    assert got["rejected"].to_list() == want["rejected"].to_list()
    assert got["worker"].str.replace("w", "pod-").to_list() == want["pod"].to_list()
    assert got["gpu_hit_tokens"].to_list() == want["hit_tokens"].to_list()
    for column in ("index_prefix_blocks", "true_prefix_blocks", "best_true_prefix_blocks", "wrong"):
        assert got[column].to_list() == want[column].to_list(), column
    assert int(want["hit_blocks"].sum()) > 0  # the comparison covers hits, not only misses


def test_zero_time_stale_index_under_credits() -> None:
    """The equality is not trivial: a 50 s event delay (C18) leaves the index behind the pools."""
    trace = _engine_block_trace(150)

    def under(faults: FaultInjector | None) -> int:
        requests = simulate(trace, num_workers=3, capacity_blocks=2_000, time_model=ZeroTime(),
                            router=ScorerRouter(LongestPrefixScorer()), faults=faults).requests
        return int((requests["index_prefix_blocks"] < requests["true_prefix_blocks"]).sum())

    assert under(None) == 0
    assert under(FaultInjector(delay_s=50.0)) > 10
