"""kvlab.blend.kernels: T-B1..T-B8 (base 31, docs/specs/index_blend.md D.4) exactly, and the
kernels against plain Python ints reduced mod 2**64 (B5-B8)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend.kernels import BLEND_BASE, EMPTY, chunk_hashes, rolling_hashes, unique_hits, write_table

U64 = 1 << 64


def naive_hash(window: list[int], base: int) -> int:
    """H = x0*base^(k-1) + ... + x_(k-1), in Python ints, reduced mod 2**64."""
    h = 0
    for x in window:
        h = (h * base + x) % U64
    return h


tokens_u32 = st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=80)
bases = st.sampled_from([31, BLEND_BASE, 0, 1, 2**64 - 1, 2**63])


# --- T-B1..T-B8 (base 31) ----------------------------------------------------------------------

def test_tb1_rolling_windows():
    out = rolling_hashes(np.array([1, 2, 3, 4, 5]), 3, base=31)
    assert out.dtype == np.uint64
    assert out.tolist() == [1026, 2019, 3012]


def test_tb2_chunks_and_partial_tail():
    assert chunk_hashes(np.array([1, 2, 3, 4, 5, 6]), 3, base=31).tolist() == [1026, 4005]
    assert len(chunk_hashes(np.arange(10), 4, base=31)) == 2


def test_tb3_rolling_k1_is_input():
    tokens = np.array([7, 0, 2**32 - 1, 5], dtype=np.uint32)
    assert rolling_hashes(tokens, 1, base=31).tolist() == tokens.tolist()


def test_tb4_first_chunk_equals_first_window():
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.uint32)
    assert chunk_hashes(tokens, 4, base=31)[0] == rolling_hashes(tokens, 4, base=31)[0]


def test_tb5_write_one_slot():
    table = np.full(8, EMPTY, dtype=np.int64)
    write_table(np.array([9], dtype=np.uint64), table, np.array([42]))
    assert table.tolist() == [-1, 42, -1, -1, -1, -1, -1, -1]


def test_tb6_last_write_wins():
    table = np.full(8, EMPTY, dtype=np.int32)
    write_table(np.array([0, 8], dtype=np.uint64), table, np.array([10, 20]))
    assert table[0] == 20
    assert (table[1:] == EMPTY).all()


def test_tb7_unique_hits_first_encounter_order():
    table = np.full(8, EMPTY, dtype=np.int64)
    table[:3] = [2, 0, 1]
    assert unique_hits(np.array([0, 1, 2], dtype=np.uint64), table, 3).tolist() == [2, 0, 1]


def test_tb8_unique_hits_dedup():
    table = np.full(8, EMPTY, dtype=np.int64)
    table[1] = 3
    assert unique_hits(np.array([1, 9], dtype=np.uint64), table, 4).tolist() == [3]


# --- differential and properties ----------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(tokens=tokens_u32, k=st.integers(1, 12), base=bases)
def test_rolling_matches_python_ints(tokens, k, base):
    arr = np.array(tokens, dtype=np.uint32)
    expected = [naive_hash(tokens[i:i + k], base) for i in range(len(tokens) - k + 1)]
    assert rolling_hashes(arr, k, base).tolist() == expected
    assert rolling_hashes(arr.astype(np.int64), k, base).tolist() == expected  # int64 input, same values


@settings(max_examples=200, deadline=None)
@given(tokens=tokens_u32, k=st.integers(1, 12), base=bases)
def test_chunks_match_python_ints_and_windows(tokens, k, base):
    arr = np.array(tokens, dtype=np.uint32)
    chunks = chunk_hashes(arr, k, base)
    assert chunks.tolist() == [naive_hash(tokens[j * k:(j + 1) * k], base) for j in range(len(tokens) // k)]
    windows = rolling_hashes(arr, k, base)
    assert chunks.tolist() == windows[::k][:len(chunks)].tolist()  # window j*k == chunk j (B6)


def test_wraparound_is_mod_2_64():
    tokens = [2**32 - 1] * 40  # base**39 * (2**32 - 1) overflows 64 bits many times over
    assert int(rolling_hashes(np.array(tokens, dtype=np.uint32), 40)[0]) == naive_hash(tokens, BLEND_BASE)
    assert naive_hash(tokens, BLEND_BASE) != sum(t * BLEND_BASE ** (39 - i) for i, t in enumerate(tokens))


def test_base31_linearity_collision():
    """Raising token i by 1 and lowering token i+1 by 31 keeps the base-31 fingerprint (why B12 confirms)."""
    a = np.array([5, 40, 37, 9], dtype=np.uint32)
    b = np.array([5, 41, 6, 9], dtype=np.uint32)  # token 1 + 1, token 2 - 31
    assert chunk_hashes(a, 4, 31)[0] == chunk_hashes(b, 4, 31)[0]
    assert chunk_hashes(a, 4, BLEND_BASE)[0] != chunk_hashes(b, 4, BLEND_BASE)[0]


@settings(max_examples=100, deadline=None)
@given(hashes=st.lists(st.integers(0, U64 - 1), max_size=40), bits=st.integers(0, 5),
       dtype=st.sampled_from(["int32", "int64"]))
def test_write_and_unique_hits_match_dict(hashes, bits, dtype):
    size = 1 << bits
    table = np.full(size, EMPTY, dtype=dtype)
    ids = list(range(100, 100 + len(hashes)))
    write_table(np.array(hashes, dtype=np.uint64), table, np.array(ids))
    slots: dict[int, int] = {}
    for h, i in zip(hashes, ids):
        slots[h % size] = i  # last write wins
    assert table.tolist() == [slots.get(s, EMPTY) for s in range(size)]
    order: list[int] = []
    for h in hashes:
        cid = slots.get(h % size, EMPTY)
        if cid != EMPTY and cid not in order:
            order.append(cid)
    assert unique_hits(np.array(hashes, dtype=np.uint64), table, 100 + len(hashes)).tolist() == order


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k must be"):
        rolling_hashes(np.arange(4), k)
    with pytest.raises(ValueError, match="k must be"):
        chunk_hashes(np.arange(4), k)


def test_bad_inputs():
    with pytest.raises(ValueError, match="base must be"):
        rolling_hashes(np.arange(4), 2, base=-1)
    with pytest.raises(ValueError, match="base must be"):
        chunk_hashes(np.arange(4), 2, base=2**64)
    with pytest.raises(ValueError, match="tokens must be"):
        rolling_hashes(np.array([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match="tokens must be"):
        chunk_hashes(np.zeros((2, 2), dtype=np.int64), 1)
    with pytest.raises(ValueError, match="power of two"):
        write_table(np.zeros(1, dtype=np.uint64), np.full(6, -1), np.zeros(1))
    with pytest.raises(ValueError, match="power of two"):
        unique_hits(np.zeros(1, dtype=np.uint64), np.full(4, -1.0), 1)
    with pytest.raises(ValueError, match="equal length"):
        write_table(np.zeros(2, dtype=np.uint64), np.full(4, -1), np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="num_ids must be"):
        unique_hits(np.zeros(1, dtype=np.uint64), np.full(4, -1), -1)
    with pytest.raises(ValueError, match="id 7 outside"):
        unique_hits(np.zeros(1, dtype=np.uint64), np.array([7, -1]), 3)


def test_short_input_gives_empty():
    assert rolling_hashes(np.arange(3), 4).tolist() == []
    assert chunk_hashes(np.arange(3), 4).tolist() == []
    assert rolling_hashes(np.zeros(0, dtype=np.uint32), 1).tolist() == []
