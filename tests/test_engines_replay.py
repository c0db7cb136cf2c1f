"""The engine replays (kvlab.engines.replay): the vLLM engine and the numba replay's vLLM
mode agree request by request; oMLX without forks or SSD and with its pool at full size
gives the vLLM engine's hits; both drivers keep the result contract."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces
from kvlab.core import check_result
from kvlab.engines.replay import EngineReplayConfig, OmlxReplayConfig, full_block_keys, replay_omlx, replay_requests
from kvlab.sim import replay, sweep


@pytest.mark.parametrize("capacity", [1_000, 10_000, 50_000])
def test_conversation_trace_classic_order(conversation, capacity) -> None:
    """Issue #4: one request at a time, classic free order, the conversation trace's ids
    as block hashes — identical per-request hits at three capacities."""
    engine = replay_requests(conversation, capacity_blocks=capacity, free_order="classic")
    kernel = replay(conversation, capacity_blocks=capacity, mode="vllm", free_order="classic").requests
    assert np.array_equal(engine.requests["hit_blocks"].to_numpy(), kernel["hit_blocks"].to_numpy())
    assert not engine.requests["rejected"].any() and not kernel["rejected"].any()
    assert engine.manager.prefix_cache_stats.hits == engine.summary.hit_blocks * conversation.block_size


@given(trace=chained_traces(max_requests=30), capacity=st.integers(1, 40),
       order=st.sampled_from(["classic", "current"]))
def test_random_traces_both_orders(trace, capacity, order) -> None:
    """Hits, rejections, evictions and cached blocks after each request, as the kernel."""
    engine = replay_requests(trace, capacity_blocks=capacity, free_order=order).requests
    kernel = replay(trace, capacity_blocks=capacity, mode="vllm", free_order=order).requests
    assert engine["hit_blocks"].to_list() == kernel["hit_blocks"].to_list()
    assert engine["rejected"].to_list() == kernel["rejected"].to_list()
    assert engine["evictions"].to_list() == kernel["evictions"].to_list()
    assert engine["cached_blocks"].to_list() == kernel["used_blocks"].to_list()


@given(trace=chained_traces(max_requests=30), capacity=st.integers(1, 40),
       order=st.sampled_from(["classic", "current"]))
def test_omlx_without_fork_or_ssd_is_vllm(trace, capacity, order) -> None:
    """kvlab's oMLX extends vLLM's manager: unforked, SSD-less, its pool created at full
    size, every per-request column is vLLM's (upstream oMLX differs: see
    kvlab/engines/omlx/paged_cache.py) and the pool never grows."""
    vllm = replay_requests(trace, capacity_blocks=capacity, free_order=order).requests
    omlx = replay_omlx(trace, capacity_blocks=capacity, free_order=order).requests
    assert omlx.select(vllm.columns).equals(vllm)
    assert omlx["restored_blocks"].sum() == 0 and omlx["pool_blocks"].n_unique() == 1


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
@pytest.mark.parametrize("order", ["classic", "current"])
def test_unbounded_ssd_hits_as_an_unbounded_pool(name, order, conversation, synthetic) -> None:
    """Paged-SSD-only mode with an unbounded SSD: every block ever cached stays on it, so a
    300-block pool hits exactly as an unbounded vLLM pool (which never evicts), request by
    request — the blocks evicted from the pool are registered again from the SSD."""
    trace = {"conversation": conversation, "synthetic": synthetic}[name].head(400)
    unbounded = replay_requests(trace).requests["hit_blocks"]
    omlx = replay_omlx(trace, capacity_blocks=300, free_order=order, ssd_only=True)
    assert omlx.requests["hit_blocks"].equals(unbounded)
    assert omlx.summary.restored_blocks > 0 and omlx.summary.ssd_evictions == 0


@given(trace=chained_traces(max_requests=30), capacity=st.integers(1, 40), ssd=st.integers(1, 60))
def test_ssd_store_bounds(trace, capacity, ssd) -> None:
    """A bounded SSD never holds more than its capacity, holds every block saved minus
    those it evicted, and hits no more than an unbounded vLLM pool."""
    run = replay_omlx(trace, capacity_blocks=capacity, ssd_only=True, ssd_capacity_blocks=ssd)
    requests, tier = run.requests, run.manager.ssd.tier
    assert (requests["ssd_blocks"] <= ssd).all() and run.summary.ssd_blocks == len(run.manager.ssd)
    assert run.summary.ssd_blocks == tier.counters.written_blocks - run.summary.ssd_evictions
    unbounded = replay_requests(trace).requests["hit_blocks"]
    assert (requests["hit_blocks"] <= unbounded).all()


def test_results_keep_the_contract(synthetic) -> None:
    trace = synthetic.head(50)
    for result in (replay_requests(trace, capacity_blocks=500),
                   replay_omlx(trace, capacity_blocks=500, initial_blocks=100, ssd_only=True,
                               ssd_capacity_blocks=800)):
        check_result(result)
        config = result.summary.to_dict()["config"]
        assert config == {name: getattr(result.config, name) for name in config}
        assert result.summary.source == trace.source and result.summary.requests == 50
        assert set(result.timeline["tier"].unique()) <= {"GPU", "SSD"}


def test_a_request_larger_than_the_pool_is_rejected(synthetic) -> None:
    """A request needing more blocks than the pool is rejected (a miss) and changes nothing."""
    trace = synthetic.head(20)
    blocks = replay_requests(trace).requests["blocks"]
    capacity = int(blocks[:5].max())  # requests 0-4 fit; a longer one later does not
    for run in (replay_requests(trace, capacity_blocks=capacity), replay_omlx(trace, capacity_blocks=capacity)):
        requests = run.requests
        assert requests["rejected"].to_list() == (blocks > capacity).to_list()
        assert requests.filter("rejected")["hit_blocks"].sum() == 0
        assert run.summary.rejected_requests == int((blocks > capacity).sum()) > 0
        cached = requests["cached_blocks"].to_list()
        assert all(cached[i] == cached[i - 1] for i in range(1, len(cached)) if requests["rejected"][i])


def test_configs_refuse_bad_fields() -> None:
    for kwargs, message in (({"capacity_blocks": 0}, "capacity_blocks must be an integer >= 1 or None, got 0"),
                            ({"free_order": "lru"}, "free_order must be one of"),
                            ({"enable_caching": 1}, "enable_caching must be a bool, got 1")):
        with pytest.raises(ValueError, match=message):
            EngineReplayConfig(**kwargs)
    for kwargs, message in (({"capacity_blocks": 10, "initial_blocks": 11},
                             r"initial_blocks must be <= capacity_blocks \(10\), got 11"),
                            ({"ssd_capacity_blocks": 5}, "ssd_capacity_blocks=5 needs ssd_only=True"),
                            ({"ssd_only": True, "enable_caching": False}, "ssd_only=True needs enable_caching=True")):
        with pytest.raises(ValueError, match=message):
            OmlxReplayConfig(**kwargs)
    with pytest.raises(ValueError, match="EngineReplayConfig has no field 'ssd_only'"):
        replay_requests(None, ssd_only=True)
    with pytest.raises(ValueError, match="config must be a OmlxReplayConfig or None"):
        replay_omlx(None, EngineReplayConfig())
    with pytest.raises(ValueError, match="trace must be a kvlab Trace, got NoneType"):
        replay_omlx(None)


def test_full_block_keys_drop_the_partial_tail(synthetic) -> None:
    keys = full_block_keys(synthetic)
    inputs = synthetic.frame["input_tokens"].to_list()
    assert [len(k) for k in keys] == [n // 512 for n in inputs]


def test_kvlab_replay_runs_omlx(synthetic) -> None:
    """``kvlab.replay(mode="omlx")`` is :func:`replay_omlx` with the pool at full size."""
    trace = synthetic.head(60)
    via_sim = replay(trace, mode="omlx", capacity_blocks=400, free_order="classic", ssd_only=True,
                     ssd_capacity_blocks=900)
    direct = replay_omlx(trace, capacity_blocks=400, free_order="classic", ssd_only=True, ssd_capacity_blocks=900)
    assert via_sim.requests.equals(direct.requests) and via_sim.summary == direct.summary
    for kwargs, message in (({"ssd_only": True}, "ssd_only and ssd_capacity_blocks apply to mode 'omlx' only"),
                            ({"mode": "omlx", "warmup_fraction": 0.5}, "mode 'omlx' has no warm-up"),
                            ({"mode": "omlx", "timeline_points": 10}, "timeline_points applies to modes"),
                            ({"mode": "omlx", "policy": "fifo"}, "mode 'omlx' replays vLLM's free queue"),
                            ({"mode": "omlx", "capacity_blocks": 0}, "capacity_blocks must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            replay(trace, **kwargs)
    with pytest.raises(ValueError, match="mode 'omlx' runs oMLX's engine model, not a kernel"):
        sweep(trace, [100], mode="omlx", executor="serial")
