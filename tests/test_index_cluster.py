"""The small routing cluster: a fresh index routes exactly; stale events make wrong choices."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import chained_traces, make_trace, scramble
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engines.replay import replay_requests
from kvlab.index import FaultInjector, MaxPrefixScorer, route_requests, trace_token_ids
from kvlab.traces import Trace, load_trace


@pytest.fixture(scope="module")
def conversation_head() -> tuple[list[float], list[np.ndarray]]:
    trace = load_trace("conversation").head(300)
    return trace.frame["arrival_s"].to_list(), trace_token_ids(trace, 16)


def test_trace_token_ids_keep_prefix_sharing_exactly() -> None:
    trace = make_trace([[scramble(1), scramble(2)], [scramble(1), scramble(3)], []], block_size=4)
    a, b, empty = trace_token_ids(trace, 8)
    assert a.dtype == np.uint32 and len(a) == len(b) == 16 and len(empty) == 0
    assert (a[:8] == b[:8]).all() and not (a[8:] == b[8:]).all()
    assert int(a.max()) < 2**31


@settings(max_examples=25)
@given(chained_traces(max_requests=25), st.integers(2, 20))
def test_one_pod_serves_as_the_engine_replay(drawn: Trace, capacity: int) -> None:
    """With one pod the router has no choice: hits are the vLLM engine replay's, exactly."""
    size = drawn.block_size
    full = [keys[: n // size] for keys, n in zip(drawn.frame["block_keys"].to_list(),
                                                  drawn.frame["input_tokens"].to_list())]
    trace = make_trace(full, block_size=size)
    frame = route_requests(trace.frame["arrival_s"].to_list(), trace_token_ids(trace, size), n_pods=1,
                           capacity_blocks=capacity, block_size_tokens=size)
    assert frame["hit_blocks"].to_list() == replay_requests(trace, capacity_blocks=capacity).requests["hit_blocks"].to_list()


def test_a_fresh_index_never_over_credits(conversation_head: tuple) -> None:
    """Without faults the index never credits a block a pod does not hold; it can under-credit:
    vLLM publishes a BlockRemoved per evicted *copy* of a block (a fully cached prompt's last
    block is recomputed into a second copy), and llm-d then drops the block while the other
    copy is still cached — so even a fresh index is sometimes wrong."""
    arrival, tokens = conversation_head
    frame = route_requests(arrival, tokens, capacity_blocks=2_000)
    credited, true = frame["index_prefix_blocks"].to_numpy(), frame["true_prefix_blocks"].to_numpy()
    assert (credited <= true).all() and (credited < true).any()
    # vLLM recomputes a block-aligned prompt's last block: hits = the true prefix, capped one short of the prompt
    capped = np.minimum(frame["true_prefix_blocks"].to_numpy(), frame["prompt_blocks"].to_numpy() - 1)
    assert frame["hit_blocks"].to_list() == capped.tolist()


def test_coalesced_events_make_wrong_choices_reproducibly(conversation_head: tuple) -> None:
    arrival, tokens = conversation_head
    runs = [route_requests(arrival, tokens, capacity_blocks=2_000, faults=FaultInjector(seed=1, coalesce_s=30.0))
            for _ in range(2)]
    assert runs[0].equals(runs[1])
    assert runs[0]["wrong"].sum() > 0
    assert (runs[0]["true_prefix_blocks"] <= runs[0]["best_true_prefix_blocks"]).all()


def test_other_scorers_plug_in(conversation_head: tuple) -> None:
    arrival, tokens = conversation_head
    frame = route_requests(arrival[:50], tokens[:50], n_pods=3, scorer=MaxPrefixScorer(), seed=3)
    assert set(frame["pod"]) <= {"pod-0", "pod-1", "pod-2"} and not frame["wrong"].any()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_pods": 0}, "n_pods"), ({"capacity_blocks": -1}, "capacity_blocks"), ({"scorer": "llmd"}, "scorer"),
    ({"faults": 0.05}, "faults"), ({"seed": "x"}, "seed"),
])
def test_bad_arguments_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        route_requests([0.0], [np.arange(4, dtype=np.uint32)], **kwargs)


def test_bad_requests_are_refused() -> None:
    tokens = [np.arange(4, dtype=np.uint32)] * 2
    with pytest.raises(ValueError, match="1 times but token_ids 2"):
        route_requests([0.0], tokens)
    with pytest.raises(ValueError, match=r"arrival_s\[1\] = 1.0 is before"):
        route_requests([2.0, 1.0], tokens)
    for bad in (float("nan"), -5.0, "1"):
        with pytest.raises(ValueError, match=r"arrival_s\[1\] must be a finite number >= 0"):
            route_requests([0.0, bad], tokens)


def test_a_prompt_larger_than_the_pod_is_flagged_not_served() -> None:
    frame = route_requests([0.0, 1.0], [np.arange(8, dtype=np.uint32), np.arange(4, dtype=np.uint32)],
                           capacity_blocks=1, block_size_tokens=4)
    assert frame["admitted"].to_list() == [False, True] and frame["hit_blocks"].to_list() == [0, 0]
