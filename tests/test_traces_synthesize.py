"""synthesize_prefix: exact keys, determinism, parameter errors, and hit shares against the
model's own expectation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlab.sim import replay
from kvlab.traces import Trace, synthesize_prefix
from kvlab.traces.token_counts import load_vidur


def counts_trace(inputs: list[int] | np.ndarray, block_size: int = 16) -> Trace:
    """A token-count trace (placeholder keys, no block identity), as the CSV loaders make it."""
    inputs = np.asarray(inputs, dtype=np.int64)
    blocks = -(-inputs // block_size)
    offsets = np.concatenate([[0], np.cumsum(blocks)])
    trace = Trace.from_arrays(np.arange(offsets[-1]), offsets=offsets, input_tokens=inputs,
                              output_tokens=np.ones_like(inputs), block_size=block_size, source="counts")
    object.__setattr__(trace, "block_identity", False)
    return trace


def test_exact_keys_with_one_prefix() -> None:
    # 32 shared tokens, 16-token blocks: blocks wholly inside the first 32 tokens are shared
    trace = counts_trace([40, 40, 10, 10, 12, 32, 20])
    s = synthesize_prefix(trace, shared_prefix_tokens=32, num_prefixes=1)
    assert s.frame["block_keys"].to_list() == [
        [0, 1, 2],  # two shared blocks, the third straddles the boundary: unique
        [0, 1, 3],
        [4],        # 10 tokens, all shared: a partial block (prefix 0, block 0, 10 tokens)
        [4],        # the same 10 tokens
        [5],        # 12 tokens: another partial block
        [0, 1],     # exactly the shared part
        [0, 6],     # 20 tokens: block 1 holds tokens 16-19 of the prefix only
    ]
    assert s.frame["prefix_id"].to_list() == [0] * 7
    assert s.block_identity and s.partial_block_keyed and s.check_chained().height == 0
    assert replay(s).requests["hit_tokens"].to_list() == [0, 32, 0, 10, 0, 32, 16]


def test_exact_keys_and_draws_with_three_prefixes() -> None:
    trace = counts_trace([20, 20, 20, 20, 20, 20], block_size=8)
    s = synthesize_prefix(trace, shared_prefix_tokens=16, num_prefixes=3, zipf_alpha=1.0, seed=7, block_size=8)
    weights = np.cumsum(1.0 / np.arange(1, 4) ** 1.0)  # the model, written out
    expected = np.searchsorted(weights, np.random.default_rng(7).random(6) * weights[-1], side="right")
    prefixes = s.frame["prefix_id"].to_list()
    assert prefixes == expected.tolist() == [1, 2, 1, 0, 0, 2]
    assert s.frame["block_keys"].to_list() == [[0, 1, 2], [3, 4, 5], [0, 1, 6], [7, 8, 9], [7, 8, 10], [3, 4, 11]]
    assert s.block_size == 8 and s.frame["request_id"].to_list() == list(range(6))


def test_determinism_and_echo_of_every_parameter(tmp_path) -> None:
    path = tmp_path / "v.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{i * 0.5},{100 + 37 * i % 900},{i % 7}\n" for i in range(300)))
    trace = load_vidur(path)
    kwargs = {"shared_prefix_tokens": 64, "num_prefixes": 10, "zipf_alpha": 0.8, "seed": 3}
    a, b = synthesize_prefix(trace, **kwargs), synthesize_prefix(trace, **kwargs)
    assert a.same_as(b)
    other = synthesize_prefix(trace, **{**kwargs, "seed": 4})
    assert other.frame["prefix_id"].to_list() != a.frame["prefix_id"].to_list()
    for col in ("request_id", "arrival_s", "input_tokens", "output_tokens"):
        assert a.frame[col].equals(trace.frame[col])
    source = replay(a).summary.to_dict()["source"]
    assert source == (f"{path} + synthesize_prefix(shared_prefix_tokens=64, num_prefixes=10, zipf_alpha=0.8, "
                      "seed=3, block_size=16)")
    model = a.provenance["synthetic_prefix"]
    assert {k: model[k] for k in (*kwargs, "block_size")} == {**kwargs, "block_size": 16}
    assert a.provenance["format"] == "vidur" and any("synthesize_prefix(" in n for n in a.provenance["notes"])
    a.write_parquet(tmp_path / "a.parquet")
    from kvlab.traces import load_trace

    assert load_trace(tmp_path / "a.parquet").same_as(a)


@pytest.mark.parametrize(("name", "value"), [
    ("shared_prefix_tokens", 0), ("shared_prefix_tokens", -5), ("shared_prefix_tokens", 1.5),
    ("shared_prefix_tokens", True), ("num_prefixes", 0), ("num_prefixes", "3"), ("zipf_alpha", -0.1),
    ("zipf_alpha", math.nan), ("zipf_alpha", "1"), ("seed", -1), ("seed", 2.0), ("block_size", 0),
    ("block_size", 1.5),
])
def test_bad_parameters_are_named(name: str, value: object) -> None:
    kwargs = {"shared_prefix_tokens": 32, "num_prefixes": 4, "zipf_alpha": 1.0, "seed": 0, name: value}
    with pytest.raises(ValueError, match=name):
        synthesize_prefix(counts_trace([40]), **kwargs)


def test_defaults_are_echoed() -> None:
    s = synthesize_prefix(counts_trace([600, 600]))
    assert s.source.endswith("synthesize_prefix(shared_prefix_tokens=512, num_prefixes=100, zipf_alpha=1.0, seed=0, "
                             "block_size=16)")


def test_not_a_trace_and_a_model_too_large() -> None:
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        synthesize_prefix("t.csv", shared_prefix_tokens=4, num_prefixes=1)
    with pytest.raises(ValueError, match="too large"):
        synthesize_prefix(counts_trace([40]), shared_prefix_tokens=2**42, num_prefixes=2**20, block_size=1)


def reference_hit_tokens(inputs: np.ndarray, prefixes: np.ndarray, shared: int, block_size: int) -> list[int]:
    """The model's prefix hits under an unbounded cache, from its statement alone: block ``b`` of
    two requests holds the same tokens iff both lie wholly in the shared parts of the same prefix
    with the same extent; a request hits its leading blocks seen before."""
    seen: set[tuple[int, int, int]] = set()
    hits = []
    for n, p in zip(inputs.tolist(), prefixes.tolist()):
        s, hit, leading = min(shared, n), 0, True
        for b in range(-(-n // block_size)):
            end = min((b + 1) * block_size, n)
            block = (p, b, end) if end <= s else None
            if leading and block in seen:
                hit = end
            else:
                leading = False
            if block is not None:
                seen.add(block)
        hits.append(hit)
    return hits


@pytest.mark.parametrize(("shared", "alpha"), [(64, 1.0), (100, 0.0), (512, 1.3)])
def test_hits_match_the_model_request_by_request(shared: int, alpha: float) -> None:
    inputs = np.random.default_rng(1).integers(1, 900, 3000)
    s = synthesize_prefix(counts_trace(inputs), shared_prefix_tokens=shared, num_prefixes=25, zipf_alpha=alpha, seed=5)
    got = replay(s).requests["hit_tokens"].to_list()
    assert got == reference_hit_tokens(inputs, s.frame["prefix_id"].to_numpy(), shared, 16)


def test_hit_share_matches_the_expected_share() -> None:
    # every prompt at least as long as the prefix: request r hits all S shared tokens iff its prefix
    # was drawn before. E[distinct prefixes in n draws] = sum_k 1 - (1 - p_k)**n
    n, k, shared, alpha = 20_000, 200, 256, 1.0
    inputs = np.random.default_rng(2).integers(shared, 4 * shared, n)
    s = synthesize_prefix(counts_trace(inputs), shared_prefix_tokens=shared, num_prefixes=k, zipf_alpha=alpha,
                          seed=11)
    p = 1.0 / np.arange(1, k + 1) ** alpha
    p /= p.sum()
    q = 1.0 - (1.0 - p) ** n
    expected = shared * (n - q.sum()) / inputs.sum()
    sigma = shared * math.sqrt((q * (1 - q)).sum()) / inputs.sum()  # distinct-count indicators: negatively associated
    got = replay(s).summary.token_hit_ratio
    assert abs(got - expected) <= 6 * sigma + 1e-12, (got, expected, sigma)
    assert got == shared * (n - s.frame["prefix_id"].n_unique()) / inputs.sum()


def test_a_trace_with_block_keys_is_refused_unless_replacing_is_asked_for() -> None:
    keyed = Trace.from_arrays(np.arange(4, dtype=np.uint64), offsets=[0, 2, 4], input_tokens=[20, 20], block_size=16)
    with pytest.raises(ValueError, match=r"has block keys of its own .*pass replace_keys=True"):
        synthesize_prefix(keyed)
    replaced = synthesize_prefix(keyed, shared_prefix_tokens=16, num_prefixes=1, replace_keys=True)
    assert replaced.frame["block_keys"].to_list() == [[0, 1], [0, 2]]
    assert "the input trace's own block keys were replaced by the model's" in replaced.provenance["notes"]
