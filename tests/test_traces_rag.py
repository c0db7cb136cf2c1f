"""Opal's RAG workload (index_blend.md B.7, O28-O31, T-O8)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.hashing import sim, vllm
from kvlab.traces import Trace, rag

TO8 = {"num_documents": 4, "document_tokens": 128, "system_prompt_tokens": 32, "docs_per_request": 4}


def _doc_ids(trace: Trace, sys_tokens: int, doc_tokens: int) -> dict[int, tuple[int, ...]]:
    """Document -> its token ids, checking every occurrence agrees."""
    seen: dict[int, tuple[int, ...]] = {}
    for tokens, docs in zip(trace.frame["token_ids"].to_list(), trace.frame["document_ids"].to_list()):
        for i, d in enumerate(docs):
            ids = tuple(tokens[sys_tokens + i * doc_tokens: sys_tokens + (i + 1) * doc_tokens])
            assert seen.setdefault(d, ids) == ids, f"document {d} changed ids"
    return seen


def test_t_o8_lengths_system_prompt_reuse_and_disjoint_documents() -> None:
    trace = rag(3, **TO8, block_size=16)
    assert len(trace) == 3
    assert trace.frame["input_tokens"].to_list() == [544, 544, 544]
    assert trace.frame["token_ids"].list.len().to_list() == [544, 544, 544]
    tokens = trace.frame["token_ids"].to_list()
    assert all(t[:32] == list(range(32)) for t in tokens)
    docs = _doc_ids(trace, 32, 128)
    assert set(docs) == {0, 1, 2, 3}  # all 4 of 4 documents in every request: doc 0 recurs 3 times
    assert set(docs[0]).isdisjoint(docs[1])
    assert all(len(set(ids)) == 128 for ids in docs.values())


def test_t_o8_too_many_documents_per_request_raises() -> None:
    with pytest.raises(ValueError, match="docs_per_request=5 exceeds num_documents=4"):
        rag(3, **{**TO8, "docs_per_request": 5})


def test_defaults_give_opal_context_length_and_fixed_output() -> None:
    trace = rag(2)
    assert trace.frame["input_tokens"].to_list() == [66_560, 66_560]
    assert trace.frame["output_tokens"].to_list() == [128, 128]
    assert trace.block_size == 16 and not trace.partial_block_keyed
    assert trace.frame["block_keys"].list.len().to_list() == [66_560 // 16] * 2


def test_monotonic_allocator_gives_documents_ids_in_order_of_first_use() -> None:
    trace = rag(30, num_documents=6, document_tokens=8, system_prompt_tokens=4, docs_per_request=3,
                order="shuffled", seed=3)
    first_use: list[int] = []
    for docs in trace.frame["document_ids"].to_list():
        first_use += [d for d in docs if d not in first_use]
    ids = _doc_ids(trace, 4, 8)
    for rank, d in enumerate(first_use):
        assert ids[d] == tuple(range(4 + 8 * rank, 4 + 8 * (rank + 1)))


def test_sorted_orders_by_index_shuffled_does_not_and_probability_mixes() -> None:
    kw = {"num_documents": 10, "document_tokens": 4, "system_prompt_tokens": 0, "docs_per_request": 4}
    is_sorted = {}
    for order in ("sorted", "shuffled", 0.5, 0.0, 1.0):
        docs = np.array(rag(2000, **kw, order=order, seed=1).frame["document_ids"].to_list())
        assert (np.diff(np.sort(docs, axis=1), axis=1) > 0).all()  # distinct
        is_sorted[order] = float((np.diff(docs, axis=1) > 0).all(axis=1).mean())
    assert is_sorted["sorted"] == is_sorted[0.0] == 1.0
    # a random permutation of 4 is sorted with probability 1/24
    assert abs(is_sorted["shuffled"] - 1 / 24) < 0.02 and abs(is_sorted[1.0] - 1 / 24) < 0.02
    assert abs(is_sorted[0.5] - (0.5 + 0.5 / 24)) < 0.04


@pytest.mark.parametrize("popularity, alpha", [("uniform", 1.0), ("zipf", 0.0), ("zipf", 1.0), ("zipf", 2.0)])
def test_one_document_per_request_follows_the_popularity_law(popularity: str, alpha: float) -> None:
    n, docs = 40_000, 8
    trace = rag(n, num_documents=docs, document_tokens=2, system_prompt_tokens=0, docs_per_request=1,
                popularity=popularity, zipf_alpha=alpha, seed=5)
    counts = np.bincount(trace.frame["document_ids"].explode().to_numpy(), minlength=docs) / n
    weights = np.ones(docs) if popularity == "uniform" else 1.0 / np.arange(1, docs + 1) ** alpha
    np.testing.assert_allclose(counts, weights / weights.sum(), atol=0.01)


def test_zipf_draws_without_replacement_match_successive_sampling() -> None:
    # P(first two picks are {0, 1}) under successive weighted draws without replacement
    w = 1.0 / np.arange(1, 4)
    p = w / w.sum()
    expected = p[0] * p[1] / (1 - p[0]) + p[1] * p[0] / (1 - p[1])
    docs = rag(40_000, num_documents=3, document_tokens=1, system_prompt_tokens=0, docs_per_request=2,
               popularity="zipf", seed=2).frame["document_ids"].to_list()
    assert abs(sum(d == [0, 1] for d in docs) / len(docs) - expected) < 0.01


def test_arrivals_every_one_over_rate_and_request_ids() -> None:
    trace = rag(5, **TO8, request_rate_per_s=0.25)
    assert trace.frame["arrival_s"].to_list() == [0.0, 4.0, 8.0, 12.0, 16.0]
    assert trace.frame["request_id"].to_list() == [0, 1, 2, 3, 4]


def test_seeded_and_deterministic() -> None:
    kw = {**TO8, "num_documents": 8, "order": 0.3, "popularity": "zipf"}
    a = rag(50, **kw, seed=7)
    assert a.frame.equals(rag(50, **kw, seed=7).frame)
    assert a.frame.equals(rag(50, **kw, seed=np.random.default_rng(7)).frame)
    assert not a.frame.equals(rag(50, **kw, seed=8).frame)
    assert "seed=7" in a.source and "order=0.3" in a.source


def test_block_keys_are_the_hashers_keys_of_the_token_ids() -> None:
    hasher = vllm(block_size=16)
    trace = rag(4, **{**TO8, "num_documents": 6}, hasher=hasher, seed=1)
    assert trace.block_size == 16 and "VllmHasher" in trace.source
    rebuilt = Trace.from_token_ids(trace.frame.drop("block_keys"), hasher)
    assert rebuilt.frame["block_keys"].equals(trace.frame["block_keys"])
    assert trace.check_chained().height == 0
    coarse = rag(4, **TO8, block_size=64)
    assert coarse.frame["block_keys"].to_list()[0] == sim(64).block_keys(np.arange(544)).tolist()


@pytest.mark.parametrize("kwargs, field", [
    ({"num_requests": 0}, "num_requests"),
    ({"num_documents": 0}, "num_documents"),
    ({"document_tokens": 0}, "document_tokens"),
    ({"docs_per_request": 0}, "docs_per_request"),
    ({"system_prompt_tokens": -1}, "system_prompt_tokens"),
    ({"output_tokens": 1.5}, "output_tokens"),
    ({"request_rate_per_s": 0}, "request_rate_per_s"),
    ({"zipf_alpha": -1.0}, "zipf_alpha"),
    ({"order": "random"}, "order"),
    ({"order": 1.5}, "order"),
    ({"popularity": "pareto"}, "popularity"),
    ({"block_size": 0}, "block_size"),
    ({"hasher": "vllm"}, "hasher"),
    ({"hasher": vllm(block_size=16), "block_size": 32}, "block_size"),
    ({"seed": -1}, "seed"),
    ({"document_tokens": 2**31, "num_documents": 4}, "u32"),
])
def test_bad_parameters_raise_naming_the_field(kwargs: dict, field: str) -> None:
    args = {"num_requests": 2, **TO8, **kwargs}
    with pytest.raises(ValueError, match=field):
        rag(args.pop("num_requests"), **args)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20), num_docs=st.integers(1, 7), k=st.integers(1, 7), doc=st.integers(1, 40),
       sys_tokens=st.integers(0, 40), order=st.sampled_from(["sorted", "shuffled", 0.5]),
       popularity=st.sampled_from(["uniform", "zipf"]), seed=st.integers(0, 2**16))
def test_invariants_over_random_parameters(n: int, num_docs: int, k: int, doc: int, sys_tokens: int, order: object,
                                           popularity: str, seed: int) -> None:
    k = min(k, num_docs)
    trace = rag(n, num_documents=num_docs, document_tokens=doc, system_prompt_tokens=sys_tokens,
                docs_per_request=k, order=order, popularity=popularity, seed=seed, block_size=8)
    assert len(trace) == n
    frame = trace.frame
    assert frame["input_tokens"].to_list() == [sys_tokens + k * doc] * n
    for tokens, docs in zip(frame["token_ids"].to_list(), frame["document_ids"].to_list()):
        assert len(set(docs)) == k and all(0 <= d < num_docs for d in docs)
        assert len(set(tokens)) == len(tokens)  # a prompt never repeats a token id
        assert tokens[:sys_tokens] == list(range(sys_tokens))
        if order == "sorted":
            assert docs == sorted(docs)
    ids = _doc_ids(trace, sys_tokens, doc)
    used = sorted(i for t in ids.values() for i in t)
    assert used == list(range(sys_tokens, sys_tokens + doc * len(ids)))  # dense, no gaps, disjoint
    assert isinstance(frame["document_ids"].dtype, pl.List)
