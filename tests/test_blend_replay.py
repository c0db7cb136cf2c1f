"""Replaying RAG traces through prefix-only caching and prefix + blend caching."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend.replay import replay_rag
from kvlab.hashing import sim
from kvlab.tiers.devices import get_device
from kvlab.tiers.models import get_model
from kvlab.traces import Trace, rag

LLAMA = get_model("Llama-3-8B")
H100 = 989.5e12


def _trace(*prompts: list[int], block_size: int = 4) -> Trace:
    frame = pl.DataFrame({"request_id": list(range(len(prompts))), "arrival_s": [float(i) for i in range(len(prompts))],
                          "output_tokens": [1] * len(prompts), "token_ids": [list(p) for p in prompts]})
    return Trace.from_token_ids(frame, sim(block_size))


SYS, A, B = [1, 2, 3, 4], list(range(100, 108)), list(range(200, 208))


def _col(result, name: str) -> list[int]:
    return result.requests[name].to_list()


def test_reordered_documents_prefix_saves_only_the_system_prompt_blend_reuses_both() -> None:
    r = replay_rag(_trace(SYS + A + B, SYS + B + A), chunk_size=4, recompute_ratio=0.0, min_blend_tokens=0)
    assert _col(r, "prefix_only_saved_tokens") == [0, 4]
    assert _col(r, "hit_tokens") == [0, 4]
    assert _col(r, "blended_tokens") == [0, 16]
    assert _col(r, "fresh_tokens") == [20, 0]
    assert _col(r, "saved_tokens") == [0, 20]
    assert r.summary.prefix_only_saved_tokens == 4 and r.summary.saved_tokens == 20


def test_recompute_ratio_is_charged_on_the_blended_tokens() -> None:
    r = replay_rag(_trace(SYS + A + B, SYS + B + A), chunk_size=4, recompute_ratio=0.25, min_blend_tokens=0)
    assert _col(r, "recomputed_blend_tokens") == [0, 4]
    assert _col(r, "saved_tokens") == [0, 16]
    assert r.summary.recomputed_blend_tokens == 4


@pytest.mark.parametrize("min_blend, blended", [(0, 16), (16, 16), (17, 0)])
def test_min_blend_tokens_threshold(min_blend: int, blended: int) -> None:
    r = replay_rag(_trace(SYS + A + B, SYS + B + A), chunk_size=4, recompute_ratio=0.0, min_blend_tokens=min_blend)
    assert _col(r, "blended_tokens") == [0, blended]
    assert _col(r, "saved_tokens") == [0, 4 + blended]


def test_unaligned_documents_are_found_at_shifted_offsets() -> None:
    # a 2-token system prompt shifts chunk boundaries: only chunks lying inside one document recur
    r = replay_rag(_trace([1, 2] + A + B, [1, 2] + B + A, block_size=2), chunk_size=4, recompute_ratio=0.0,
                   min_blend_tokens=0)
    # request 1's chunks: [1 2 A0 A1] [A2..A5] [A6 A7 B0 B1] [B2..B5]; request 2 holds [B2..B5] at 4, [A2..A5] at 12
    assert _col(r, "hit_tokens") == [0, 0]
    assert _col(r, "blended_tokens") == [0, 8]
    assert _col(r, "fresh_tokens") == [18, 10]


def test_repeated_identical_prompt_is_a_full_prefix_hit_in_both() -> None:
    r = replay_rag(_trace(SYS + A, SYS + A), chunk_size=4, min_blend_tokens=0)
    assert _col(r, "prefix_only_saved_tokens") == [0, 12]
    assert _col(r, "saved_tokens") == [0, 12] and _col(r, "blended_tokens") == [0, 0]


@pytest.mark.parametrize("capacity, blended", [(None, 8), (5, 8), (4, 4), (3, 0)])
def test_an_evicted_chunk_is_no_longer_blended(capacity: int | None, blended: int) -> None:
    # A (2 chunks), then X (3 fresh chunks) pushes A out of a small cache, then Y + A
    x, y = list(range(300, 312)), list(range(400, 404))
    r = replay_rag(_trace(A, x, y + A), chunk_size=4, capacity_chunks=capacity, recompute_ratio=0.0,
                   min_blend_tokens=0)
    # a request's chunks are refreshed tail first: with room for 4, A's tail chunk goes, its head stays
    assert _col(r, "blended_tokens") == [0, 0, blended]
    evicted = {None: 0, 5: 3, 4: 4, 3: 5}[capacity]  # 8 distinct chunks stored over the run
    assert r.summary.prefix_only_evicted_chunks == r.summary.evicted_chunks == evicted
    timeline = r.timeline.pivot(on="metric", index="step", values="value")
    assert timeline["evictions"].sum() == evicted
    room = capacity or 8
    assert timeline["used_blocks"].to_list() == [2, min(5, room), min(8, room)]  # 2, 3 and 3 new chunks


def test_eviction_of_the_prefix_chunk_drops_the_prefix_hit() -> None:
    x = list(range(300, 316))
    r = replay_rag(_trace(SYS + A, x, SYS + A), chunk_size=4, capacity_chunks=4, min_blend_tokens=0)
    assert _col(r, "prefix_only_saved_tokens") == [0, 0, 0]
    assert _col(r, "saved_tokens") == [0, 0, 0]


def test_blended_chunks_are_refreshed_in_the_blend_cache_only() -> None:
    # request 1 blends A: in the blend cache A becomes recent, so X is evicted before A there
    x, y, z = list(range(300, 304)), list(range(400, 404)), list(range(500, 504))
    r = replay_rag(_trace(A, x, y + A, z + A), chunk_size=4, capacity_chunks=5, recompute_ratio=0.0,
                   min_blend_tokens=0)
    assert _col(r, "blended_tokens") == [0, 0, 8, 8]
    assert _col(r, "prefix_only_saved_tokens") == [0, 0, 0, 0]


def test_sorted_all_documents_is_all_prefix_shuffled_needs_blending() -> None:
    kw = {"num_documents": 3, "docs_per_request": 3, "document_tokens": 512, "system_prompt_tokens": 256}
    prompt = 256 + 3 * 512
    r = replay_rag(rag(6, **kw, order="sorted", seed=4), recompute_ratio=0.0)
    assert _col(r, "prefix_only_saved_tokens") == [0] + [prompt] * 5 == _col(r, "saved_tokens")
    r = replay_rag(rag(6, **kw, order="shuffled", seed=4), recompute_ratio=0.0)
    assert _col(r, "saved_tokens") == [0] + [prompt] * 5  # every chunk found, prefix or not
    assert min(_col(r, "prefix_only_saved_tokens")[1:]) < prompt


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), num_docs=st.integers(1, 6), k=st.integers(1, 4), doc=st.integers(1, 5),
       sys_tokens=st.integers(0, 300), order=st.sampled_from(["sorted", "shuffled", 0.5]),
       popularity=st.sampled_from(["uniform", "zipf"]), ratio=st.sampled_from([0.0, 0.15, 1.0]),
       min_blend=st.sampled_from([0, 64, 256]), seed=st.integers(0, 1000))
def test_blend_never_saves_less_than_prefix_only_and_matches_a_naive_replay(
        n: int, num_docs: int, k: int, doc: int, sys_tokens: int, order: object, popularity: str, ratio: float,
        min_blend: int, seed: int) -> None:
    trace = rag(n, num_documents=num_docs, document_tokens=doc * 64, system_prompt_tokens=sys_tokens,
                docs_per_request=min(k, num_docs), order=order, popularity=popularity, seed=seed)
    r = replay_rag(trace, chunk_size=64, recompute_ratio=ratio, min_blend_tokens=min_blend)
    f = r.requests
    assert (f["saved_tokens"] >= f["prefix_only_saved_tokens"]).all()
    assert (f["hit_tokens"] == f["prefix_only_saved_tokens"]).all()  # unbounded: same cache contents
    assert (f["hit_tokens"] + f["blended_tokens"] + f["fresh_tokens"] == f["input_tokens"]).all()
    expected = _naive_replay(trace.frame["token_ids"].to_list(), 64, min_blend)
    assert list(zip(_col(r, "hit_tokens"), _col(r, "blended_tokens"))) == expected


def _naive_replay(prompts: list[list[int]], chunk: int, min_blend: int) -> list[tuple[int, int]]:
    """Unbounded cache by hand: prefix = leading chunks seen as a prefix before; blend = leftmost greedy
    over every stored chunk content (a RAG prompt never repeats a token, so each window occurs once)."""
    prefixes: set[tuple[int, ...]] = set()
    contents: set[tuple[int, ...]] = set()
    out = []
    for p in prompts:
        num_chunks = len(p) // chunk
        hit = 0
        while hit < num_chunks and tuple(p[:(hit + 1) * chunk]) in prefixes:
            hit += 1
        blended, pos = 0, hit * chunk
        while pos + chunk <= len(p):
            if tuple(p[pos:pos + chunk]) in contents:
                blended, pos = blended + chunk, pos + chunk
            else:
                pos += 1
        out.append((hit * chunk, blended if blended >= min_blend else 0))
        for j in range(num_chunks):
            prefixes.add(tuple(p[:(j + 1) * chunk]))
            contents.add(tuple(p[j * chunk:(j + 1) * chunk]))
    return out


def test_ttft_columns_with_a_model_and_a_device() -> None:
    trace = rag(5, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
                order="shuffled", seed=0)
    on_gpu = replay_rag(trace, model=LLAMA, gpu_flops=H100)
    nvme = replay_rag(trace, model=LLAMA, gpu_flops=H100, device=get_device("nvme_gen4"),
                      link=get_device("pcie_gen4_x16"))
    for r in (on_gpu, nvme):
        assert (r.requests["ttft_saved_s"] >= r.requests["prefix_only_ttft_saved_s"]).all()
        assert r.summary.ttft_saved_s == pytest.approx(r.requests["ttft_saved_s"].sum())
        assert r.requests["ttft_saved_s"][0] == 0.0
    assert (nvme.requests["ttft_saved_s"] <= on_gpu.requests["ttft_saved_s"]).all()
    assert nvme.summary.ttft_saved_s < on_gpu.summary.ttft_saved_s
    assert "ttft_saved_s" not in replay_rag(trace).requests.columns


def test_summary_totals_and_fractions() -> None:
    r = replay_rag(rag(8, num_documents=4, document_tokens=256, system_prompt_tokens=256, docs_per_request=2,
                       order="shuffled", seed=2))
    f = r.requests
    assert r.summary.requests == 8
    for col in ("input_tokens", "prefix_only_saved_tokens", "blended_tokens", "saved_tokens", "fresh_tokens"):
        assert getattr(r.summary, col) == f[col].sum()
    assert r.summary.saved_fraction == pytest.approx(f["saved_tokens"].sum() / f["input_tokens"].sum())
    assert r.summary.saved_fraction >= r.summary.prefix_only_saved_fraction
    assert f["request_id"].to_list() == list(range(8))


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk_size": 24}, "chunk_size=24 must be a multiple of the trace's block_size=16"),
    ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
    ({"capacity_chunks": 0}, "capacity_chunks must be an integer >= 1 or None, got 0"),
    ({"model": LLAMA}, "model and gpu_flops go together"),
    ({"gpu_flops": H100}, "model and gpu_flops go together"),
    ({"recompute_ratio": 2.0}, r"recompute_ratio must be a finite number in \[0.0, 1.0\], got 2.0"),
    ({"min_blend_tokens": -1}, "min_blend_tokens must be an integer >= 0, got -1"),
])
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replay_rag(rag(2, num_documents=2, document_tokens=64, system_prompt_tokens=0, docs_per_request=1), **kwargs)


def test_trace_without_token_ids_raises() -> None:
    trace = rag(2, num_documents=2, document_tokens=64, docs_per_request=1)
    with pytest.raises(ValueError, match="token_ids"):
        replay_rag(Trace(trace.frame.drop("token_ids"), block_size=16, partial_block_keyed=False))
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        replay_rag(trace.frame)


def test_deterministic() -> None:
    trace = rag(10, num_documents=5, document_tokens=256, system_prompt_tokens=128, order=0.5, seed=3)
    a, b = replay_rag(trace, capacity_chunks=20), replay_rag(trace, capacity_chunks=20)
    assert a.requests.equals(b.requests) and a.summary == b.summary
    assert np.all(a.requests["saved_tokens"].to_numpy() <= a.requests["input_tokens"].to_numpy())


@pytest.mark.parametrize("docs", [1, 3])
def test_blend_reuses_the_same_tokens_whatever_the_order(docs: int) -> None:
    """Notebook 08 §3: shuffling the documents hurts prefix-only caching, not what blend finds."""
    corpus = {"num_documents": 5, "document_tokens": 512, "system_prompt_tokens": 256, "seed": 0}
    sorted_run, shuffled_run = (replay_rag(rag(20, docs_per_request=docs, order=order, **corpus))
                                for order in ("sorted", "shuffled"))
    reused = [r.requests["hit_tokens"] + r.requests["blended_tokens"] for r in (sorted_run, shuffled_run)]
    assert reused[0].to_list() == reused[1].to_list()
    s, t = sorted_run.summary, shuffled_run.summary
    if docs == 1:  # one document: every cached document is a prefix hit, nothing to blend
        assert s.blended_tokens == t.blended_tokens == 0 and s.saved_fraction == t.prefix_only_saved_fraction
    else:
        assert t.prefix_only_saved_fraction < s.prefix_only_saved_fraction
        assert t.saved_fraction > t.prefix_only_saved_fraction
        assert s.hit_tokens + s.blended_tokens > s.prefix_only_saved_tokens  # sorted, yet cached off the prefix


def test_loading_the_kv_from_a_tier_costs_part_of_the_saving() -> None:
    trace = rag(6, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
                order="shuffled", seed=1)
    gpu = replay_rag(trace, model=LLAMA, gpu_flops=H100)
    dram = replay_rag(trace, model=LLAMA, gpu_flops=H100, device=get_device("host_dram_ddr5_4800_8ch"),
                      link=get_device("pcie_gen5_x16"))
    assert (dram.requests["ttft_saved_s"] <= gpu.requests["ttft_saved_s"]).all()
    assert (dram.requests["ttft_saved_s"] >= dram.requests["prefix_only_ttft_saved_s"]).all()
    assert dram.summary.ttft_saved_s < gpu.summary.ttft_saved_s
