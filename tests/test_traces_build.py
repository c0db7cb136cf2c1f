"""Trace.from_token_ids and Trace.rechunk."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces
from kvlab.hashing.sim_hash import SimHasher, chain_u64
from kvlab.sim import replay
from kvlab.traces import Trace


def token_frame(prompts: list[list[int]], **columns: list) -> pl.DataFrame:
    n = len(prompts)
    return pl.DataFrame({"request_id": list(range(n)), "arrival_s": [float(i) for i in range(n)],
                         "output_tokens": [1] * n, "token_ids": prompts, **columns})


def test_from_token_ids_uses_the_hasher_and_its_tail_rule() -> None:
    hasher = SimHasher(block_size=16, seed=3)
    trace = Trace.from_token_ids(token_frame([list(range(40)), list(range(64))]), hasher)
    assert trace.block_size == 16 and not trace.partial_block_keyed
    assert trace.frame["input_tokens"].to_list() == [40, 64]
    keys = trace.frame["block_keys"].to_list()
    assert keys[0] == chain_u64(range(40), 16, 3).tolist() and len(keys[1]) == 4
    assert keys[1][:2] == keys[0]
    assert trace.source == "token_ids | SimHasher(block_size=16, seed=3, partial_tail=False)"
    tailed = Trace.from_token_ids(token_frame([list(range(40))]), SimHasher(16, partial_tail=True))
    assert tailed.partial_block_keyed and tailed.frame["block_keys"].list.len().to_list() == [3]


def test_from_token_ids_errors_name_the_row() -> None:
    hasher = SimHasher(block_size=4)
    with pytest.raises(ValueError, match="needs a 'token_ids' column"):
        Trace.from_token_ids(token_frame([[1]]).drop("token_ids"), hasher)
    with pytest.raises(ValueError, match=r"row 1: input_tokens=9 but token_ids has 2 tokens"):
        Trace.from_token_ids(token_frame([[1], [2, 3]], input_tokens=[1, 9]), hasher)
    with pytest.raises(ValueError, match=r"row 1: SimHasher does not model request extras"):
        Trace.from_token_ids(token_frame([[1], [2, 3]], lora_name=[None, "ad"]), hasher)
    with pytest.raises(ValueError, match=r"row 0: invalid request extras: .*length must be an integer >= 1"):
        Trace.from_token_ids(token_frame([[1, 2]], mm_items=[[{"identifier": "img", "offset": 0, "length": 0}]]),
                             hasher)
    with pytest.raises(ValueError, match="hasher must be a kvlab.hashing BlockHasher, got str"):
        Trace.from_token_ids(token_frame([[1]]), "vllm")


@pytest.mark.parametrize(("frame", "message"), [
    ({"token_ids": [[1, None]]}, "column 'token_ids' has a null at row 0"),
    ({"token_ids": [None, [1]]}, "column 'token_ids' has a null at row 0"),
    ({"token_ids": ["abc"]}, "column 'token_ids' must hold lists of integers, got dtype String"),
    ({"token_ids": [[1.5]]}, r"column 'token_ids' must hold lists of integers, got dtype List\(Float64\)"),
    ({"token_ids": [[2**32]]}, r"token ids in \[0, 2\*\*32\) \(a Trace stores them as u32\), got 4294967296"),
    ({"token_ids": [[-1]]}, r"token ids in \[0, 2\*\*32\).*got -1"),
    ({"token_ids": [[1]], "input_tokens": [1.0]}, "column 'input_tokens' must hold integers without nulls"),
    ({"token_ids": [[1]], "lora_name": [5]}, "column 'lora_name' must hold strings"),
])
def test_from_token_ids_rejects_bad_columns(frame, message) -> None:
    n = len(frame["token_ids"])
    base = {"request_id": list(range(n)), "arrival_s": [0.0] * n, "output_tokens": [1] * n}
    with pytest.raises(ValueError, match=message):
        Trace.from_token_ids(pl.DataFrame({**base, **frame}, strict=False), SimHasher(block_size=4))
    with pytest.raises(ValueError, match="frame must be a polars DataFrame"):
        Trace.from_token_ids({"token_ids": [[1]]}, SimHasher(block_size=4))


def test_from_token_ids_rejects_hashers_without_a_trace_key_rule() -> None:
    from kvlab.hashing import dynamo

    with pytest.raises(ValueError, match=r"hashes 1 blocks of a 8-token prompt .*EAGLE windows"):
        Trace.from_token_ids(token_frame([list(range(8))]), dynamo(4, is_eagle=True))


def test_physical_block_keyed_by_its_end_boundary_hash() -> None:
    """Hash granularity 16, physical block 32, tokens 0..63: the physical blocks take the
    fine hashes at their end (h1, h3); a request sharing tokens 0..39 hits exactly the
    first physical block (32 tokens)."""
    hasher = SimHasher(block_size=16)
    fine = Trace.from_token_ids(token_frame([list(range(64)), list(range(40)) + [999] * 8]), hasher)
    h = chain_u64(range(64), 16).tolist()
    coarse = fine.rechunk(2)
    assert coarse.block_size == 32
    assert coarse.frame["block_keys"].to_list()[0] == [h[1], h[3]]
    assert replay(coarse).requests["hit_tokens"].to_list() == [0, 32]


def test_rechunk_keeps_a_partial_tail_only_when_keyed() -> None:
    keyed = Trace(token_frame([[0] * 5]).drop("token_ids").with_columns(
        input_tokens=pl.lit(5, pl.UInt32), block_keys=pl.Series([[1, 2, 3, 4, 5]], dtype=pl.List(pl.UInt64))),
        block_size=1)
    assert keyed.rechunk(2).frame["block_keys"].to_list() == [[2, 4, 5]]
    assert keyed.rechunk(5).frame["block_keys"].to_list() == [[5]]
    assert keyed.rechunk(7).frame["block_keys"].to_list() == [[5]]
    full_only = Trace(keyed.frame, block_size=1, partial_block_keyed=False)
    assert full_only.rechunk(2).frame["block_keys"].to_list() == [[2, 4]]
    assert full_only.rechunk(7).frame["block_keys"].to_list() == [[]]


def test_rechunk_of_mooncake_is_chained_and_counts_groups(synthetic) -> None:
    coarse = synthetic.rechunk(4)
    assert coarse.block_size == 2048 and coarse.check_chained().height == 0
    blocks = synthetic.flat.blocks_per_request()
    assert coarse.block_refs == int((-(-blocks // 4)).sum())
    assert synthetic.rechunk(1).frame["block_keys"].equals(synthetic.frame["block_keys"])


@pytest.mark.parametrize("k", [0, -2, 0.5, 2.0, True])
def test_rechunk_cannot_make_finer_blocks(k, synthetic) -> None:
    with pytest.raises(ValueError, match=r"^rechunk: k must be an integer >= 1, got .* blocks finer than the "
                                         r"trace's 512 tokens cannot be made"):
        synthetic.rechunk(k)


def test_rechunk_bounds_the_block_size(synthetic) -> None:
    with pytest.raises(ValueError, match="would make 17179869184-token blocks"):
        synthetic.rechunk(2**25)
    with pytest.raises(ValueError, match=r"k must be below 2\*\*31, got 4294967296"):
        synthetic.rechunk(2**32)


@given(trace=chained_traces(), k=st.integers(1, 5))
def test_coarser_blocks_never_hit_more_tokens(trace, k) -> None:
    fine = replay(trace).requests["hit_tokens"].to_numpy()
    coarse = replay(trace.rechunk(k)).requests["hit_tokens"].to_numpy()
    assert (coarse <= fine).all()
    assert trace.rechunk(k).check_chained().height == 0


def test_rechunk_keeps_parquet_round_trip(tmp_path) -> None:
    trace = Trace.from_token_ids(token_frame([list(range(40))]), SimHasher(block_size=8))
    trace.write_parquet(tmp_path / "t.parquet")
    from kvlab.traces import load_trace

    back = load_trace(tmp_path / "t.parquet")
    assert not back.partial_block_keyed and back.frame.equals(trace.frame)
    assert np.array_equal(back.flat.block_ids, trace.flat.block_ids)


def test_rechunk_refuses_keys_that_are_not_chained() -> None:
    """Keeping every k-th key merges two different prompts when keys are not chained."""
    frame = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "input_tokens": [2, 2],
                          "output_tokens": [1, 1], "block_keys": [[1, 2], [3, 2]]})
    trace = Trace(frame, block_size=1, source="nc")
    with pytest.raises(ValueError, match=r"nc: row 1: block_keys\[1\]=2 follows key 3 here but key 1"):
        trace.rechunk(2)
