"""The small routing cluster: a fresh index routes exactly; stale events make wrong choices."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chained_traces, make_trace, scramble
from kvlab.engines.replay import replay_requests
from kvlab.hashing import sim
from kvlab.index import FaultInjector, MaxPrefixScorer, route_requests, trace_token_ids
from kvlab.traces import Trace, load_trace


@pytest.fixture(scope="module")
def conversation_head() -> Trace:
    return load_trace("conversation").head(300)


def token_trace(*prompts: list[int]) -> Trace:
    """A trace of these prompts (token ids), one second apart."""
    frame = pl.DataFrame({"request_id": list(range(len(prompts))), "arrival_s": [float(i) for i in range(len(prompts))],
                          "output_tokens": [1] * len(prompts), "token_ids": [list(p) for p in prompts]})
    return Trace.from_token_ids(frame, sim(4))


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
    frame = route_requests(trace, num_pods=1, capacity_blocks=capacity, block_size=size).requests
    engine = replay_requests(trace, capacity_blocks=capacity)
    assert frame["hit_blocks"].to_list() == engine.requests["hit_blocks"].to_list()


def test_a_fresh_index_never_over_credits(conversation_head: Trace) -> None:
    """Without faults the index never credits a block a pod does not hold; it can under-credit:
    vLLM publishes a BlockRemoved per evicted *copy* of a block (a fully cached prompt's last
    block is recomputed into a second copy), and llm-d then drops the block while the other
    copy is still cached — so even a fresh index is sometimes wrong."""
    result = route_requests(conversation_head, capacity_blocks=2_000)
    frame = result.requests
    credited, true = frame["index_prefix_blocks"].to_numpy(), frame["true_prefix_blocks"].to_numpy()
    assert (credited <= true).all() and (credited < true).any()
    # vLLM recomputes a block-aligned prompt's last block: hits = the true prefix, capped one short of the prompt
    capped = np.minimum(frame["true_prefix_blocks"].to_numpy(), frame["prompt_blocks"].to_numpy() - 1)
    assert frame["hit_blocks"].to_list() == capped.tolist()
    s = result.summary
    assert s.over_credited_share == 0.0 < s.under_credited_share == float((credited < true).mean())
    assert s.hit_blocks == frame["hit_blocks"].sum() and s.requests == 300 and s.rejected_requests == 0


def test_coalesced_events_make_wrong_choices_reproducibly(conversation_head: Trace) -> None:
    runs = [route_requests(conversation_head, capacity_blocks=2_000, faults=FaultInjector(seed=1, coalesce_s=30.0))
            .requests for _ in range(2)]
    assert runs[0].equals(runs[1])
    assert runs[0]["wrong"].sum() > 0
    assert (runs[0]["true_prefix_blocks"] <= runs[0]["best_true_prefix_blocks"]).all()


def test_other_scorers_plug_in(conversation_head: Trace) -> None:
    frame = route_requests(conversation_head.head(50), num_pods=3, scorer=MaxPrefixScorer(), seed=3).requests
    assert set(frame["pod"]) <= {"pod-0", "pod-1", "pod-2"} and not frame["wrong"].any()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_pods": 0}, "num_pods"), ({"capacity_blocks": -1}, "capacity_blocks"), ({"scorer": "llmd"}, "scorer"),
    ({"faults": 0.05}, "faults"), ({"seed": "x"}, "seed"),
])
def test_bad_arguments_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        route_requests(token_trace(range(4)), **kwargs)


def test_only_a_trace_is_routed() -> None:
    with pytest.raises(ValueError, match="trace must be a kvlab Trace, got list"):
        route_requests([np.arange(4, dtype=np.uint32)])


def test_a_prompt_larger_than_the_pod_is_flagged_not_served() -> None:
    result = route_requests(token_trace(range(8), range(4)), capacity_blocks=1, block_size=4)
    frame = result.requests
    assert frame["rejected"].to_list() == [True, False] and frame["hit_blocks"].to_list() == [0, 0]
    assert frame["input_tokens"].to_list() == [8, 4] and result.summary.rejected_requests == 1


def test_the_trace_tokens_are_routed_and_the_timeline_follows_the_pods() -> None:
    """A trace with token ids is routed on those tokens; each pod is a tier of the timeline."""
    result = route_requests(token_trace(range(8), range(8), range(100, 104)), block_size=4)
    frame = result.requests
    # request 1 repeats request 0: the last-token rule leaves one of its 2 blocks to recompute
    assert frame["hit_blocks"].to_list() == [0, 1, 0] and frame["hit_tokens"].to_list() == [0, 4, 0]
    timeline = result.timeline.filter(pl.col("metric") == "used_blocks").pivot(on="tier", index="step",
                                                                               values="value")
    first, repeat, last = frame["pod"].to_list()
    assert repeat == first  # the index knows who holds the prompt
    expected = {pod: [2.0 * (pod == first)] * 2 + [2.0 * (pod == first) + (pod == last)] for pod in ("pod-0", "pod-1")}
    assert {pod: timeline[pod].to_list() for pod in expected} == expected  # full blocks cached per pod
    config = json.loads(json.dumps(result.summary.to_dict()))["config"]
    assert config["scorer"]["type"] == "LongestPrefixScorer" and config["faults"] is None and config["num_pods"] == 2


def test_at_scale_stale_events_make_wrong_choices_and_eviction_too(conversation_head: Trace) -> None:
    """Notebook 07 §2 on the first 300 requests: roomy pools (nothing evicted) and 2,000-block pools."""
    roomy = sum(len(t) for t in trace_token_ids(conversation_head, 16)) // 16
    faults = {"none": {}, "coalesced": {"coalesce_s": 30.0}, "lossy": {"loss_p": 0.05}}
    runs, lost = {}, {}
    for pool, capacity in (("roomy", roomy), ("tight", 2_000)):
        for name, options in faults.items():
            injector = FaultInjector(seed=1, **options)
            runs[pool, name] = route_requests(conversation_head, capacity_blocks=capacity, faults=injector)
            lost[pool, name] = injector.stats["lost"]
            assert runs[pool, name].summary.messages == injector.stats["messages"]
    wrong = {key: r.summary.wrong_share for key, r in runs.items()}
    assert wrong["roomy", "none"] == 0 < wrong["roomy", "coalesced"]  # a fresh exact index is never wrong
    assert runs["roomy", "none"].requests["pod"].n_unique() == 1  # pure longest prefix: all on one pod
    assert wrong["tight", "none"] > 0  # the copy effect: a fresh index under eviction is wrong too
    assert runs["roomy", "none"].summary.over_credited_share == runs["tight", "none"].summary.over_credited_share == 0
    assert lost["roomy", "lossy"] > 0 and lost["tight", "lossy"] > 0
    assert runs["tight", "lossy"].summary.under_credited_share > 0


def test_four_scorers_disagree_on_one_index_state() -> None:
    """Notebook 07 §3: pod-a holds 6 of the 8 keys on CPU, pod-b 5 on GPU, pod-c the 2-block prefix."""
    from kvlab.index import CacheAwareScorer, DynamoCostScorer, InMemoryIndex, LongestPrefixScorer, PodEntry, PodLoad

    keys = list(range(1, 9))
    state = InMemoryIndex()
    for pod, tier, n in (("pod-a", "cpu", 6), ("pod-b", "gpu", 5), ("pod-c", "gpu", 2)):
        state.add(None, keys[:n], [PodEntry(pod, tier)])
    loads = {"pod-a": PodLoad(active_blocks=40, running_requests=10, tree_size_blocks=6),
             "pod-b": PodLoad(active_blocks=30, running_requests=12, tree_size_blocks=5),
             "pod-c": PodLoad(active_blocks=0, running_requests=2, tree_size_blocks=2)}
    scorers = [LongestPrefixScorer(), MaxPrefixScorer(), DynamoCostScorer(), CacheAwareScorer()]
    picks = [(s.name, s.select(keys, state, list(loads), loads=loads, rng=np.random.default_rng(0))) for s in scorers]
    # llm-d weighs tiers (5 GPU > 6 x 0.8 CPU); MaxPrefix and SGLang take the longest match; Dynamo the idle pod
    assert picks == [("longest_prefix", "pod-b"), ("max_prefix", "pod-a"), ("dynamo_cost", "pod-c"),
                     ("cache_aware", "pod-a")]
    assert LongestPrefixScorer().score(keys, state) == {"pod-a": pytest.approx(4.8), "pod-b": 5.0, "pod-c": 2.0}
