"""kvlab.blend ranges, savings and replay: numpy integers accepted wherever Python ints are; matches validated up
front naming ``matches[i].field``; device/link without a model refused (fresh-user trial)."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.blend.matcher import BlendMatch
from kvlab.blend.ranges import classify, leftmost_non_overlapping
from kvlab.blend.replay import replay_rag
from kvlab.blend.savings import prefill_savings
from kvlab.traces import rag


def test_numpy_integers_accepted():
    ms = [BlendMatch(0, 4, 0, 4, 1), BlendMatch(0, 4, 4, 8, 2)]
    assert leftmost_non_overlapping([], np.int64(3)) == []
    assert leftmost_non_overlapping(ms, np.int64(4)) == [ms[1]]
    assert classify(ms[0], np.int32(4)) == "prefix"
    s = prefill_savings(np.int64(1000), np.int64(0), min_blend_tokens=np.int64(0), chunk_size=np.int64(4))
    assert s.prompt_tokens == 1000 and type(s.prompt_tokens) is int and s.fresh_tokens == 1000
    s = prefill_savings(1000, 0, [BlendMatch(0, 256, np.int64(0), np.int64(256), 1)])
    assert s.blended_tokens == 256 and s.blend_ranges == ((0, 256),) and type(s.blended_tokens) is int


def test_replay_numpy_chunk_size():
    trace = rag(3, num_documents=2, document_tokens=64, system_prompt_tokens=0, docs_per_request=1, seed=0)
    a, b = replay_rag(trace, chunk_size=np.int64(32), capacity_chunks=np.int64(4)), replay_rag(
        trace, chunk_size=32, capacity_chunks=4)
    assert a.requests.equals(b.requests)


def test_plain_five_tuples_are_matches():
    a = prefill_savings(1000, 0, [(0, 256, 0, 256, 1), (0, 256, 256, 512, np.uint64(2))])
    b = prefill_savings(1000, 0, [BlendMatch(0, 256, 0, 256, 1), BlendMatch(0, 256, 256, 512, 2)])
    assert a == b and a.blended_tokens == 512


@pytest.mark.parametrize("matches, message", [
    (None, "matches must be"),
    (5, "matches must be"),
    ([(0, 256)], r"matches\[0\] must be"),
    ([BlendMatch(0, 256, 0, 256, 1), "x"], r"matches\[1\] must be"),
    ([BlendMatch(0, 256, 0.0, 256, 1)], r"matches\[0\]\.cur_st must be"),
    ([BlendMatch(0, 256, 0, 256.5, 1)], r"matches\[0\]\.cur_ed must be"),
    ([BlendMatch(-1, 256, 0, 256, 1)], r"matches\[0\]\.old_st must be"),
    ([BlendMatch(0, 256, 0, 256, -1)], r"matches\[0\]\.storage_key must be"),
    ([BlendMatch(0, 256, True, 256, 1)], r"matches\[0\]\.cur_st must be"),
])
def test_bad_matches_named(matches, message):
    with pytest.raises(ValueError, match=message):
        prefill_savings(1000, 0, matches)


def test_replay_device_or_link_without_model():
    trace = rag(2, num_documents=2, document_tokens=64, system_prompt_tokens=0, docs_per_request=1)
    for kwargs in ({"device": "garbage"}, {"link": 42}, {"device": "garbage", "link": 42}):
        with pytest.raises(ValueError, match="device/link need model and gpu_flops"):
            replay_rag(trace, **kwargs)


def test_replay_device_and_link_type_checked():
    from kvlab.tiers.devices import get_device
    from kvlab.tiers.models import get_model
    trace = rag(2, num_documents=2, document_tokens=64, system_prompt_tokens=0, docs_per_request=1)
    model = get_model("Llama-3-8B")
    with pytest.raises(ValueError, match="device must be a kvlab.tiers Device"):
        replay_rag(trace, chunk_size=32, model=model, gpu_flops=1e15, device="garbage")
    with pytest.raises(ValueError, match="link must be a kvlab.tiers Device"):
        replay_rag(trace, chunk_size=32, model=model, gpu_flops=1e15, device=get_device("nvme_gen4"), link=42)


def test_capacity_lets_blend_save_less_on_a_single_request():
    """Documented in replay_rag: the two LRU caches drift apart under a capacity (the blend cache refreshes what
    it blends), so one request can save less with blend; the total still came out ahead here."""
    trace = rag(12, num_documents=5, document_tokens=256, system_prompt_tokens=256, docs_per_request=2,
                order="shuffled", seed=0)
    f = replay_rag(trace, capacity_chunks=4).requests
    worse = (f["saved_tokens"] < f["prefix_only_saved_tokens"]).to_list()
    assert worse.index(True) == 7
    assert f["saved_tokens"].sum() == 5403 and f["prefix_only_saved_tokens"].sum() == 4352
    unbounded = replay_rag(trace).requests  # same chunks cached by both: blend dominates per request
    assert (unbounded["saved_tokens"] >= unbounded["prefix_only_saved_tokens"]).all()
