"""kvlab.blend kernels and matcher: caller mistakes found by a fresh-user trial raise ValueError naming the argument
(no silent truncation or wrap-around, no numba TypingError); bounds keep positions, strides and sizes inside int64 and
memory."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.blend.kernels import MAX_CHUNK_TOKENS, MAX_NUM_IDS, chunk_hashes, rolling_hashes, unique_hits, write_table
from kvlab.blend.matcher import MAX_ALIGN_TOKENS, BlendMatch, TokenRangeMatcher


def _empty(size: int = 8, dtype: str = "int64") -> np.ndarray:
    return np.full(size, -1, dtype=dtype)


# --- write_table / unique_hits --------------------------------------------------------------------------------------

@pytest.mark.parametrize("hashes, message", [
    (np.array([9.7]), "hashes must be"),  # a float would be truncated to 9
    (np.array([-1]), "hashes .* got -1"),  # would wrap to 2**64 - 1
    ([-3], "hashes .* got -3"),
    (np.zeros((1, 1), dtype=np.uint64), "hashes must be 1-D"),
    (np.array([True]), "hashes must be"),
    (["a"], "hashes must be"),
])
def test_write_table_rejects_bad_hashes(hashes, message):
    table = _empty()
    with pytest.raises(ValueError, match=message):
        write_table(hashes, table, np.array([1]))
    assert (table == -1).all()
    with pytest.raises(ValueError, match=message):
        unique_hits(hashes, table, 4)


def test_write_table_accepts_exact_integer_hashes():
    for hashes in ([9], np.array([9], dtype=np.int64), [2**64 - 7], np.array([9], dtype=np.uint32)):
        table = _empty()
        write_table(hashes, table, [5])
        assert table.tolist().count(5) == 1
        assert unique_hits(hashes, table, 6).tolist() == [5]


@pytest.mark.parametrize("ids, dtype, message", [
    (np.array([2**32 - 1]), "int32", "ids .* got 4294967295"),  # would wrap to -1 = empty: the write disappears
    (np.array([2**31]), "int32", "ids .* got 2147483648"),
    (np.array([-1]), "int64", "ids .* got -1"),
    (np.array([1.5]), "int64", "ids must be"),
    (np.array([2**63], dtype=np.uint64), "int64", "ids .* got 9223372036854775808"),
    (np.zeros((1, 1), dtype=np.int64), "int64", "ids must be 1-D"),
])
def test_write_table_rejects_bad_ids(ids, dtype, message):
    table = _empty(8, dtype)
    with pytest.raises(ValueError, match=message):
        write_table(np.array([9] * ids.size, dtype=np.uint64), table, ids)
    assert (table == -1).all()


def test_write_table_int32_table_takes_its_largest_id():
    table = _empty(8, "int32")
    write_table(np.array([3], dtype=np.uint64), table, np.array([2**31 - 1], dtype=np.uint64))
    assert table[3] == 2**31 - 1


@pytest.mark.parametrize("table, message", [
    (np.full((2, 4), -1), "table must be"),
    (np.full(8, -1.0), "table must be"),
    (np.full(6, -1), "power of two"),
    ([-1] * 8, "table must be"),
])
def test_bad_tables(table, message):
    with pytest.raises(ValueError, match=message):
        write_table(np.array([1], dtype=np.uint64), table, np.array([0]))
    with pytest.raises(ValueError, match=message):
        unique_hits(np.array([1], dtype=np.uint64), table, 1)


def test_read_only_table_refused_for_writes_only():
    table = _empty()
    table[1] = 3
    table.flags.writeable = False
    with pytest.raises(ValueError, match="table must be writable"):
        write_table(np.array([1], dtype=np.uint64), table, np.array([0]))
    assert unique_hits(np.array([1], dtype=np.uint64), table, 4).tolist() == [3]


@pytest.mark.parametrize("num_ids", [2**62, MAX_NUM_IDS + 1, -1, 2.0, True])
def test_num_ids_bounded(num_ids):
    with pytest.raises(ValueError, match="num_ids must be"):
        unique_hits(np.array([1], dtype=np.uint64), _empty(), num_ids)


def test_num_ids_numpy_integer_ok():
    assert unique_hits(np.array([1], dtype=np.uint64), _empty(), np.int64(3)).tolist() == []


@pytest.mark.parametrize("k", [2**63, MAX_CHUNK_TOKENS + 1])
def test_kernel_k_bounded(k):
    with pytest.raises(ValueError, match="k must be"):
        chunk_hashes(np.array([1, 2]), k)
    with pytest.raises(ValueError, match="k must be"):
        rolling_hashes(np.array([1, 2]), k)


def test_kernel_base_0_and_1_allowed():
    assert chunk_hashes(np.array([1, 2, 3]), 3, base=0).tolist() == [3]
    assert chunk_hashes(np.array([1, 2, 3]), 3, base=1).tolist() == [6]


# --- TokenRangeMatcher ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    ({"base": 0}, "base"), ({"base": 1}, "base"), ({"chunk_size": 2**40}, "chunk_size"),
    ({"chunk_size": MAX_CHUNK_TOKENS + 1}, "chunk_size"),
])
def test_matcher_parameter_bounds(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TokenRangeMatcher(**kwargs)


def test_matcher_base_2_and_largest_chunk_ok():
    assert TokenRangeMatcher(4, base=2).register([1, 2, 3, 4], [1]) == 1
    assert TokenRangeMatcher(MAX_CHUNK_TOKENS).chunk_size == MAX_CHUNK_TOKENS


@pytest.mark.parametrize("offset", [2**63 - 3, 2**63 - 4, 2**64, 2**63])
def test_position_offset_past_int64_refused(offset):
    m = TokenRangeMatcher(4)
    with pytest.raises(ValueError, match="position_offset"):
        m.register([1, 2, 3, 4], [1], position_offset=offset)
    assert len(m) == 0


def test_position_offset_largest_ok():
    m = TokenRangeMatcher(4)
    assert m.register([1, 2, 3, 4, 5, 6, 7, 8], [1, 2], position_offset=2**63 - 9) == 2
    assert m.match([5, 6, 7, 8]) == [BlendMatch(2**63 - 5, 2**63 - 1, 0, 4, 2)]


@pytest.mark.parametrize("align", [2**63 - 1, 2**63, MAX_ALIGN_TOKENS + 1])
def test_align_tokens_bounded(align):
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    with pytest.raises(ValueError, match="align_tokens"):
        m.match([1, 2, 3, 4], align_tokens=align)


def test_align_tokens_largest_ok():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    assert m.match([1, 2, 3, 4, 1, 2, 3, 4], align_tokens=MAX_ALIGN_TOKENS) == [BlendMatch(0, 4, 0, 4, 1)]


@pytest.mark.parametrize("keys", [5, np.uint64(5), None, "ab"])
def test_remove_non_sequence_names_keys(keys):
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [5])
    with pytest.raises(ValueError, match="storage_keys"):
        m.remove(keys)
    assert len(m) == 1


def test_remove_numpy_array_still_ok():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [5])
    assert m.remove(np.array([5], dtype=np.uint64)) == 1


def test_generator_and_string_messages_say_what_to_pass():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [5])
    with pytest.raises(ValueError, match="query_token_ids .*pass a list or 1-D integer array"):
        m.match(x for x in [1, 2, 3, 4])
    with pytest.raises(ValueError, match="token_ids .*pass a list or 1-D integer array"):
        m.register("abcd", [1])
    with pytest.raises(ValueError, match="token_ids .*pass a list or 1-D integer array"):
        m.register(list("abcd"), [1])
    with pytest.raises(ValueError, match="storage_keys .*pass a list or 1-D integer array"):
        m.register([1, 2, 3, 4], (x for x in [1]))
