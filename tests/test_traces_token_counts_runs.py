"""What runs on a trace without block identity: every cache-level driver refuses it with
Trace.require_block_identity's message; the timed cluster simulation serves it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvlab.blend import replay_rag, replay_segments
from kvlab.engines import replay_omlx, replay_requests
from kvlab.index import route_requests
from kvlab.sim import replay, replay_reference, sweep
from kvlab.sim.cluster import simulate
from kvlab.sim.mrc import mrc
from kvlab.tiers import replay_tiered
from kvlab.traces import load_trace, synthesize_prefix


@pytest.fixture(scope="module")
def azure_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 Azure-format requests, 0.25 s apart, 100 ns fractions, lengths 17-1,000 tokens."""
    rows = [f"2023-11-16 18:15:{46 + i // 4:02d}.{(i % 4) * 2500000 + 1:07d},{17 + 233 * i % 984},{5 + i % 50}"
            for i in range(40)]
    path = tmp_path_factory.mktemp("azure") / "AzureLLMInferenceTrace_sample.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + "\r\n".join(rows) + "\r\n")
    return path


DRIVERS = {
    "replay prefix": lambda t: replay(t, capacity_blocks=100),
    "replay vllm": lambda t: replay(t, capacity_blocks=100, mode="vllm"),
    "replay omlx": lambda t: replay(t, capacity_blocks=100, mode="omlx"),
    "replay independent": lambda t: replay(t, hit_semantics="independent"),
    "replay_reference": lambda t: replay_reference(t, capacity_blocks=100),
    "sweep": lambda t: sweep(t, [10, None], executor="serial"),
    "mrc": lambda t: mrc(t),
    "replay_tiered": lambda t: replay_tiered(t, [("GPU", 50), ("CPU", 100)]),
    "replay_tiered reference": lambda t: replay_tiered(t, [("GPU", 50)], engine="reference"),
    "replay_requests": lambda t: replay_requests(t, capacity_blocks=100),
    "replay_omlx": lambda t: replay_omlx(t, capacity_blocks=100),
    "replay_rag": lambda t: replay_rag(t),
    "replay_segments": lambda t: replay_segments(t),
    "route_requests": lambda t: route_requests(t),
}


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_cache_level_driver_refuses_a_trace_without_block_identity(azure_sample: Path, driver: str) -> None:
    trace = load_trace(azure_sample)
    with pytest.raises(ValueError, match=r"has no block identity \(azure-llm: arrivals and token counts only\).*"
                                         r"kvlab simulate.*synthesize_prefix"):
        DRIVERS[driver](trace)


def test_the_cluster_simulation_serves_it_with_no_hits(azure_sample: Path) -> None:
    trace = load_trace(azure_sample)
    result = simulate(trace, num_workers=2)
    s, requests = result.summary, result.requests
    assert s.requests == len(trace) == 40
    assert s.completed_requests + s.rejected_requests == 40 and s.rejected_requests == 0
    assert requests["request_id"].to_list() == trace.frame["request_id"].to_list()
    assert int(requests["hit_tokens"].sum()) == 0 and s.token_hit_ratio == 0.0
    assert s.computed_prefill_tokens == s.input_tokens == int(trace.frame["input_tokens"].sum())
    assert s.output_tokens == int(trace.frame["output_tokens"].sum())
    assert (requests["ttft_s"].to_numpy() > 0).all()
    assert s.to_dict()["block_identity"] is False and "block_identity" in str(s)
    assert simulate(load_trace("conversation").head(5)).summary.block_identity is True


def test_a_synthesized_sharing_model_replays_and_simulates(azure_sample: Path) -> None:
    trace = synthesize_prefix(load_trace(azure_sample), shared_prefix_tokens=256, num_prefixes=2, seed=0)
    run = replay(trace)
    assert run.summary.hit_blocks > 0 and "num_prefixes=2" in run.summary.source
    result = simulate(trace, num_workers=1)
    assert result.summary.block_identity is True and result.summary.token_hit_ratio > 0
    assert np.array_equal(result.requests["request_id"].to_numpy(), trace.frame["request_id"].to_numpy())
