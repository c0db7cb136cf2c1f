"""replay_segments: prefix and segment reuse against plain-Python references, sim.replay, the RAGPulse sample."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend import replay_segments
from kvlab.paths import bundled_trace_path
from kvlab.sim import replay
from kvlab.traces import Trace, load_trace
from kvlab.traces.chain import segment_block_keys

SAMPLE = bundled_trace_path("ragpulse")  # the upstream files, gzip-compressed (data/README.md)
#: kvcache-blog's precomputed.json, trace "ragpulse" (docs/specs/traces.md §2.4; the file is not bundled)
BLOG = {"warmupRequests": 3_553, "infiniteHitTokens": 7_658_936, "totalMeasuredTokens": 10_535_055,
        "infiniteHitRate": 0.7269953502853094}


def segment_trace(segments: list[list[int]], lengths: dict[int, int], tails: list[int], block_size: int) -> Trace:
    """A trace with segment columns and the loader's block keys."""
    seg_off = np.concatenate([[0], np.cumsum([len(s) for s in segments])]).astype(np.int64)
    ids = np.array([i for s in segments for i in s], dtype=np.uint64)
    toks = np.array([lengths[i] for s in segments for i in s], dtype=np.int64)
    inputs = np.array([sum(lengths[i] for i in s) + t for s, t in zip(segments, tails, strict=True)])
    blk_off, keys = segment_block_keys(seg_off, ids, toks, inputs, block_size)
    frame = pl.DataFrame({
        "request_id": np.arange(len(segments), dtype=np.uint64), "arrival_s": np.arange(len(segments), dtype=float),
        "input_tokens": inputs, "output_tokens": np.ones(len(segments), dtype=np.int64),
        "block_keys": [keys[blk_off[r]:blk_off[r + 1]].tolist() for r in range(len(segments))],
        "segment_ids": pl.Series(segments, dtype=pl.List(pl.UInt64)),
        "segment_tokens": pl.Series([[lengths[i] for i in s] for s in segments], dtype=pl.List(pl.UInt32))})
    return Trace(frame, block_size=block_size, source="segments", partial_block_keyed=False)


def reference(segments: list[list[int]], lengths: dict[int, int]) -> tuple[list[int], list[int]]:
    """Plain Python: leading segments whose whole prefix an earlier request had; segments an earlier one had."""
    prefixes: set[tuple] = set()
    seen: set[int] = set()
    pre, blend = [], []
    for segs in segments:
        hit, k = 0, 0
        while k < len(segs) and tuple(segs[:k + 1]) in prefixes:
            hit += lengths[segs[k]]
            k += 1
        pre.append(hit)
        blend.append(sum(lengths[i] for i in segs if i in seen))
        prefixes.update(tuple(segs[:k + 1]) for k in range(len(segs)))
        seen.update(segs)
    return pre, blend


def test_a_small_trace_by_hand() -> None:
    lengths = {1: 10, 2: 7, 3: 5, 4: 3}
    segments = [[1, 2, 3], [1, 3, 2], [2, 1, 4], [1, 3, 2, 4], [4, 4]]
    result = replay_segments(segment_trace(segments, lengths, [2, 2, 2, 2, 0], 4), warmup_fraction=0.4)
    req = result.requests
    assert req["prefix_hit_tokens"].to_list() == [0, 10, 0, 22, 0]
    assert req["prefix_hit_segments"].to_list() == [0, 1, 0, 3, 0]
    assert req["blend_hit_tokens"].to_list() == [0, 22, 17, 25, 6]  # [4, 4]: request 2 had segment 4
    assert req["hit_blocks"].to_list() == [0, 2, 0, 5, 0]  # floor(prefix tokens / 4)
    assert req["measured"].to_list() == [False, False, True, True, True]
    s = result.summary
    assert (s.measured_input_tokens, s.prefix_hit_tokens, s.blend_hit_tokens) == (22 + 27 + 6, 22, 48)
    assert s.blend_hit_ratio == 48 / 55 and s.warmup_requests == 2 and s.measured_segments == 9


@settings(max_examples=80, deadline=None)
@given(data=st.data(), block_size=st.integers(1, 8), warmup=st.sampled_from([0.0, 0.5]))
def test_against_a_plain_reference_and_sim_replay(data: st.DataObject, block_size: int, warmup: float) -> None:
    lengths = {i: data.draw(st.integers(0, 12)) for i in range(8)}
    segments = data.draw(st.lists(st.lists(st.integers(0, 7), max_size=5), min_size=1, max_size=15))
    tails = data.draw(st.lists(st.integers(0, 4), min_size=len(segments), max_size=len(segments)))
    trace = segment_trace(segments, lengths, tails, block_size)
    result = replay_segments(trace, warmup_fraction=warmup)
    pre, blend = reference(segments, lengths)
    assert result.requests["prefix_hit_tokens"].to_list() == pre
    assert result.requests["blend_hit_tokens"].to_list() == blend
    # the block-level prefix hit is exactly sim.replay's unbounded one on the loader's block keys
    unbounded = replay(trace, capacity_blocks=None)
    assert result.requests["hit_blocks"].to_list() == unbounded.requests["hit_blocks"].to_list()
    assert result.requests["hit_tokens"].to_list() == unbounded.requests["hit_tokens"].to_list()
    if block_size == 1:
        assert unbounded.requests["hit_tokens"].to_list() == pre


def test_a_trace_without_segments_uses_its_blocks() -> None:
    trace = Trace.from_arrays([1, 2, 1, 3, 4], offsets=[0, 2, 5], block_size=4, input_tokens=[7, 10])
    req = replay_segments(trace, warmup_fraction=0.0).requests
    assert req["segments"].to_list() == [2, 3]
    assert req["prefix_hit_tokens"].to_list() == [0, 4] and req["blend_hit_tokens"].to_list() == [0, 4]


def test_bad_input_is_refused() -> None:
    trace = Trace.from_arrays([1, 2], block_size=4)
    with pytest.raises(ValueError, match="trace must be a kvlab Trace, got DataFrame"):
        replay_segments(trace.frame)
    with pytest.raises(ValueError, match=r"warmup_fraction must be a number in \[0, 1\), got 1.0"):
        replay_segments(trace, warmup_fraction=1.0)
    import dataclasses
    with pytest.raises(ValueError, match="has no block identity"):
        replay_segments(dataclasses.replace(trace, block_identity=False))
    longer = trace.frame.with_columns(segment_ids=pl.Series([[1], [2]], dtype=pl.List(pl.UInt64)),
                                      segment_tokens=pl.Series([[3], [5]], dtype=pl.List(pl.UInt32)))
    with pytest.raises(ValueError, match="request row 1: its segments hold more tokens than input_tokens=4"):
        replay_segments(Trace(longer, block_size=4))


# -- the published sample: plain-Python references on the raw files, computed here -----------------

def raw_sample() -> tuple[list[dict], dict[int, int]]:
    recs = [json.loads(line) for line in gzip.open(SAMPLE / "0_trace.jsonl.gz", "rt").read().splitlines()
            if line.strip()]
    lengths = {}
    for path in SAMPLE.glob("[1-5]_*.jsonl.gz"):
        for line in gzip.open(path, "rt").read().splitlines():
            if line.strip():
                rec = json.loads(line)
                lengths[next(v for k, v in rec.items() if k.endswith("_id"))] = rec["token_length"]
    return recs, lengths


def ids_of(rec: dict) -> list[int]:
    return [i for comp in ("sys_prompt", "passages_ids", "history", "web_search", "user_input")
            for i in rec["hash_ids"][comp]]


def test_the_sample_prefix_and_segment_reuse() -> None:
    recs, lengths = raw_sample()
    arrival = sorted(range(len(recs)), key=lambda i: int(recs[i]["timestamp"]))  # stable
    measured = arrival[len(recs) // 2:]
    pre, blend = reference([ids_of(recs[i]) for i in arrival], lengths)
    want = (sum(recs[i]["input_length"] for i in measured), sum(pre[len(recs) // 2:]), sum(blend[len(recs) // 2:]))
    assert want == (10_534_827, 3_304_214, 7_860_074)
    trace = load_trace(SAMPLE)
    result = replay_segments(trace)
    s = result.summary
    assert (s.measured_input_tokens, s.prefix_hit_tokens, s.blend_hit_tokens) == want
    assert (round(s.prefix_hit_ratio, 4), round(s.blend_hit_ratio, 4)) == (0.3136, 0.7461)
    # file order (not arrival order) moves both: the figures the file order would give
    pre_f, blend_f = reference([ids_of(r) for r in recs], lengths)
    file_tokens = sum(r["input_length"] for r in recs[len(recs) // 2:])
    assert (sum(pre_f[3553:]), sum(blend_f[3553:]), file_tokens) == (3_178_778, 7_308_528, 10_098_812)
    # and the block-level prefix hit is sim.replay's unbounded one on the same block keys
    unbounded = replay(trace, capacity_blocks=None)
    assert (result.requests["hit_blocks"] == unbounded.requests["hit_blocks"]).all()


def test_the_kvcache_blog_figure_is_non_prefix_reuse_of_evenly_weighted_ids() -> None:
    """0.727 = every listed id that any earlier id reference had (earlier in the same request too),
    each id weighing round(input_length / ids) tokens, arrival order, last 50 %: the component files'
    lengths are not used."""
    recs, _ = raw_sample()
    blog = BLOG
    arrival = sorted(range(len(recs)), key=lambda i: int(recs[i]["timestamp"]))
    seen: set[int] = set()
    hit = measured = 0
    for pos, i in enumerate(arrival):
        ids = ids_of(recs[i])
        weight = math.floor(recs[i]["input_length"] / len(ids) + 0.5)
        for key in ids:
            if pos >= blog["warmupRequests"]:
                hit += weight if key in seen else 0
                measured += weight
            seen.add(key)
    assert (hit, measured) == (blog["infiniteHitTokens"], blog["totalMeasuredTokens"]) == (7_658_936, 10_535_055)
    assert hit / measured == blog["infiniteHitRate"]
