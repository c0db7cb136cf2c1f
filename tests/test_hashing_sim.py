"""kvlab's simulation hash chain_u64 (not an engine's hash)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing.base import RequestExtras
from kvlab.hashing.sim_hash import SimHasher, chain_u64, chain_u64_batch

tokens_st = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=80)


@given(tokens=tokens_st, block_size=st.integers(1, 16), position=st.integers(0, 79), delta=st.integers(1, 2**31))
def test_changing_a_token_changes_its_block_and_every_later_key(tokens, block_size, position, delta) -> None:
    position %= len(tokens)
    edited = list(tokens)
    edited[position] = (edited[position] + delta) % 2**32
    a, b = chain_u64(tokens, block_size), chain_u64(edited, block_size)
    first = position // block_size
    assert (a[:first] == b[:first]).all()
    assert (a[first:] != b[first:]).all()


@given(tokens=tokens_st, d=st.integers(1, 64), k=st.integers(1, 64))
def test_no_small_linear_edit_keeps_a_key(tokens, d, k) -> None:
    """Bug-report case 4 in general: raise one token by d*k, lower its neighbour by d."""
    if len(tokens) < 2:
        return
    edited = list(tokens)
    edited[0] = (edited[0] + d * k) % 2**32
    edited[1] = (edited[1] - d) % 2**32
    assert chain_u64(tokens, 2)[0] != chain_u64(edited, 2)[0]


def test_case_4_same_parent_two_blocks() -> None:
    a = chain_u64([7, 7, 100, 200], 2)
    b = chain_u64([7, 7, 131, 199], 2)
    assert a[0] == b[0] and a[1] != b[1]


def test_seeds_partial_tail_and_dtypes() -> None:
    t = list(range(1, 33))
    assert (chain_u64(t, 16, seed=42) == chain_u64(np.array(t, dtype=np.uint64), 16, seed=42)).all()
    assert (chain_u64(t, 16, seed=42) != chain_u64(t, 16, seed=43)).all()
    tail = chain_u64(list(range(20)), 16, partial_tail=True)
    assert len(tail) == 2 and tail[0] == chain_u64(range(16), 16)[0]
    assert chain_u64(list(range(16)), 8, partial_tail=True)[1] != tail[1]  # a tail differs from a full block


@pytest.mark.parametrize(("call", "message"), [
    (lambda: chain_u64([1, -2], 4), "token_ids must be >= 0, got -2"),
    (lambda: chain_u64([1.5], 4), r"token_ids\[0\] must be an integer in \[0, 2\*\*64\), got 1.5"),
    (lambda: chain_u64([[1]], 4), "one-dimensional"),
    (lambda: chain_u64([1], 0), "block_size must be an integer >= 1, got 0"),
    (lambda: chain_u64([1], 4, seed=-1), r"seed must be an integer in \[0, 2\*\*64\), got -1"),
    (lambda: SimHasher(4).block_keys([1, 2, 3, 4], RequestExtras(cache_salt="s")), "does not model request extras"),
])
def test_bad_input(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_hasher_interface() -> None:
    hasher = SimHasher(block_size=4, seed=1)
    assert hasher.block_hashes([1, 2, 3, 4, 5]) == chain_u64([1, 2, 3, 4], 4, 1).tolist()
    assert hasher.to_u64(5) == 5 and hasher.num_hashed_blocks(9) == 2
    assert SimHasher(4, partial_tail=True).num_hashed_blocks(9) == 3


@given(prompts=st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=40), max_size=8), block_size=st.integers(1, 9),
       seed=st.integers(0, 2**64 - 1), partial_tail=st.booleans())
def test_batch_equals_one_call_per_prompt(prompts, block_size, seed, partial_tail) -> None:
    offsets = np.cumsum([0] + [len(p) for p in prompts])
    tokens = np.array([t for p in prompts for t in p], dtype=np.uint64)
    key_offsets, keys = chain_u64_batch(offsets, tokens, block_size, seed, partial_tail=partial_tail)
    assert key_offsets.dtype == np.int64 and keys.dtype == np.uint64 and key_offsets[-1] == len(keys)
    for r, prompt in enumerate(prompts):
        one = chain_u64(np.array(prompt, dtype=np.uint64), block_size, seed, partial_tail=partial_tail)
        assert keys[key_offsets[r]:key_offsets[r + 1]].tolist() == one.tolist()


@pytest.mark.parametrize(("offsets", "tokens", "message"), [
    ([0, 3], [1, 2], r"offsets must be non-decreasing from 0 to len\(token_ids\) = 2, got 0 ... 3"),
    ([1, 2], [1, 2], "offsets must be non-decreasing"),
    ([0, 2, 1, 2], [1, 2], "offsets must be non-decreasing"),
    ([], [], "offsets must be a one-dimensional integer array"),
    ([0.0, 2.0], [1, 2], "offsets must be a one-dimensional integer array"),
    ([0, 2], [1, -2], "token_ids must be >= 0, got -2"),
])
def test_batch_bad_input(offsets, tokens, message) -> None:
    with pytest.raises(ValueError, match=message):
        chain_u64_batch(offsets, tokens, 4)


@given(prompts=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=40), max_size=9), block_size=st.integers(1, 9),
       partial_tail=st.booleans(), dtype=st.sampled_from(["int32", "uint32", "int64"]))
def test_batch_reads_narrow_arrays_as_they_are(prompts, block_size, partial_tail, dtype) -> None:
    """int32/uint32/int64 arrays skip the conversion: same keys as the uint64 array."""
    offsets = np.cumsum([0] + [len(p) for p in prompts])
    tokens = np.array([t for p in prompts for t in p], dtype=np.uint64)
    want = chain_u64_batch(offsets, tokens, block_size, partial_tail=partial_tail)
    got = chain_u64_batch(offsets, tokens.astype(dtype), block_size, partial_tail=partial_tail)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("where", [0, 5, 37, 63, 99])  # full block, tail, short prompt, in flight
def test_batch_kernel_finds_a_negative_id(dtype, where) -> None:
    """The kernel checks signed arrays for negative ids wherever the id sits."""
    offsets = [0, 40, 43, 60, 64, 100]
    tokens = np.arange(100, dtype=dtype)
    tokens[where] = -7
    with pytest.raises(ValueError, match="token_ids must be >= 0, got -7"):
        chain_u64_batch(offsets, tokens, 4, partial_tail=False)
