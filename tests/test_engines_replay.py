"""The engine-level block pool and the numba replay's vLLM mode agree request by request."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces
from kvlab.engines.replay import full_block_keys, replay_requests
from kvlab.sim import replay


@pytest.mark.parametrize("capacity", [1_000, 10_000, 50_000])
def test_conversation_trace_classic_order(conversation, capacity) -> None:
    """Issue #4: one request at a time, classic free order, the conversation trace's ids
    as block hashes — identical per-request hits at three capacities."""
    engine = replay_requests(conversation, capacity_blocks=capacity, free_order="classic")
    kernel = replay(conversation, capacity_blocks=capacity, mode="vllm", free_order="classic").requests
    assert np.array_equal(engine.hit_blocks, kernel["hit_blocks"].to_numpy())
    assert engine.admitted.all() and kernel["admitted"].all()
    assert engine.manager.prefix_cache_stats.hits == int(engine.hit_blocks.sum()) * conversation.block_size


@given(trace=chained_traces(max_requests=30), capacity=st.integers(1, 40),
       order=st.sampled_from(["classic", "current"]))
def test_random_traces_both_orders(trace, capacity, order) -> None:
    engine = replay_requests(trace, capacity_blocks=capacity, free_order=order)
    kernel = replay(trace, capacity_blocks=capacity, mode="vllm", free_order=order).requests
    assert engine.hit_blocks.tolist() == kernel["hit_blocks"].to_list()
    assert engine.admitted.tolist() == kernel["admitted"].to_list()


def test_full_block_keys_drop_the_partial_tail(synthetic) -> None:
    keys = full_block_keys(synthetic)
    inputs = synthetic.frame["input_tokens"].to_list()
    assert [len(k) for k in keys] == [n // 512 for n in inputs]
