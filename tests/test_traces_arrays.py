"""Trace.from_arrays, the numba dense-id interning, and the Mooncake loader's columnar path."""

from __future__ import annotations

import gzip

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.paths import bundled_trace_path
from kvlab.traces import Trace, TraceFormatError, load_mooncake, zipf_objects
from kvlab.traces.flat import _intern_hashed, flatten_block_keys, intern_first_seen
from kvlab.traces.mooncake import _load_by_line, _load_columnar

U64_MAX = 2**64 - 1


def numpy_intern(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The former flatten_block_keys: np.unique + argsort of first indices."""
    sorted_keys, first_index, inverse = np.unique(refs, return_index=True, return_inverse=True)
    order = np.argsort(first_index, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return rank[inverse].astype(np.int32), sorted_keys[order]


# keys from a few pools: tiny values, the extremes, keys equal in their low bits (strides of
# 2**32 and 2**40: they share every low-order slot bit before mixing), and any u64
KEYS = st.one_of(st.integers(0, 20), st.sampled_from([0, 1, U64_MAX, U64_MAX - 1, 2**63, 2**63 - 1]),
                 st.integers(0, 2**20).map(lambda k: (k << 32) & U64_MAX),
                 st.integers(0, 2**20).map(lambda k: (k << 40) & U64_MAX), st.integers(0, U64_MAX))


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, max_size=3000))
def test_intern_matches_numpy(keys: list[int]) -> None:
    refs = np.array(keys, dtype=np.uint64)
    ids, table = intern_first_seen(refs)
    want_ids, want_keys = numpy_intern(refs)
    assert ids.tolist() == want_ids.tolist()
    assert table.tolist() == want_keys.tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, U64_MAX - 5000), st.lists(st.integers(0, 5000), min_size=1, max_size=2000))
def test_direct_table_and_hash_map_agree(low: int, offsets: list[int]) -> None:
    # keys within a narrow range (the direct table), anywhere in u64, against the hash map
    refs = np.array([low + k for k in offsets], dtype=np.uint64)
    ids, table = intern_first_seen(refs)
    hashed_ids = np.empty(refs.shape[0], dtype=np.int32)
    hashed_keys, count = _intern_hashed(refs, 1024, hashed_ids)
    assert ids.tolist() == hashed_ids.tolist() == numpy_intern(refs)[0].tolist()
    assert table.tolist() == hashed_keys[:count].tolist()


def test_intern_grows_past_many_colliding_keys() -> None:
    # 50,000 keys equal in their low 40 bits, each seen twice: the map doubles many times
    refs = np.repeat(np.arange(50_000, dtype=np.uint64) << np.uint64(40), 2)[::-1].copy()
    ids, table = intern_first_seen(refs)
    assert ids[:4].tolist() == [0, 0, 1, 1]
    assert table.shape == (50_000,) and int(table[0]) == 49_999 << 40
    assert (table[ids] == refs).all()


def test_intern_extremes_in_first_seen_order() -> None:
    ids, table = intern_first_seen(np.array([U64_MAX, 0, U64_MAX, 5, 0], dtype=np.uint64))
    assert ids.tolist() == [0, 1, 0, 2, 1]
    assert table.tolist() == [U64_MAX, 0, 5]


def test_intern_rejects_other_dtypes() -> None:
    with pytest.raises(ValueError, match="uint64"):
        intern_first_seen(np.array([1, 2], dtype=np.int64))


def test_from_arrays_object_ids_equal_hand_built_frame() -> None:
    ids = np.array([5, 2**64 - 1, 5, 0], dtype=np.uint64)
    trace = Trace.from_arrays(ids, arrival_s=[0.0, 0.5, 0.5, 2.0], source="ids")
    want = Trace(pl.DataFrame({"request_id": [0, 1, 2, 3], "arrival_s": [0.0, 0.5, 0.5, 2.0],
                               "input_tokens": [1, 1, 1, 1], "output_tokens": [0, 0, 0, 0],
                               "block_keys": pl.Series([[5], [U64_MAX], [5], [0]], dtype=pl.List(pl.UInt64))}),
                 block_size=1, source="ids")
    assert trace.frame.equals(want.frame)
    assert trace.flat.block_ids.tolist() == [0, 1, 0, 2]


def test_from_arrays_csr_with_empty_and_partial_requests() -> None:
    trace = Trace.from_arrays(np.array([7, 9, 7, 3, 4]), offsets=np.array([0, 2, 2, 5]), block_size=16,
                              input_tokens=[20, 0, 40], output_tokens=[1, 2, 3], request_id=[10, 11, 12],
                              arrival_s=[1.0, 2.0, 3.0])
    assert trace.frame["block_keys"].to_list() == [[7, 9], [], [7, 3, 4]]
    assert trace.frame["request_id"].to_list() == [10, 11, 12]
    assert trace.flat.offsets.tolist() == [0, 2, 2, 5]
    assert trace.flat.block_ids.tolist() == [0, 1, 0, 2, 3]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=4), min_size=1, max_size=40), st.booleans(), st.booleans())
def test_from_arrays_equals_the_checked_frame(rows: list[list[int]], uniform: bool, give_columns: bool) -> None:
    # the columns from_arrays makes itself (and so does not check again) and its flat form, built from the
    # arrays, equal a hand-built Trace's and its flat form built from the list column
    if uniform:
        rows = [(row + [7, 8, 9])[:3] for row in rows]
    keys = np.array([k for row in rows for k in row], dtype=np.uint64)
    offsets = np.cumsum([0] + [len(row) for row in rows])
    n = len(rows)
    columns = {"request_id": np.arange(n) * 3 + 1, "arrival_s": np.arange(n) / 2.0,
               "input_tokens": np.array([len(row) * 4 for row in rows])} if give_columns else {}
    trace = Trace.from_arrays(keys, offsets=offsets, block_size=4, **columns)
    want = Trace(pl.DataFrame({
        "request_id": columns.get("request_id", np.arange(n)), "arrival_s": columns.get("arrival_s", np.arange(n)),
        "input_tokens": [len(row) * 4 for row in rows], "output_tokens": [0] * n,
        "block_keys": pl.Series(rows, dtype=pl.List(pl.UInt64))}), block_size=4, source="arrays")
    assert trace.frame.equals(want.frame)
    flat = flatten_block_keys(want.frame["block_keys"], want.frame["input_tokens"], 4)
    for name in ("offsets", "block_ids", "keys", "input_tokens"):
        assert getattr(trace.flat, name).tolist() == getattr(flat, name).tolist()
    if n > 1:  # an object-id stream too
        ids = Trace.from_arrays(keys[:n] if keys.size >= n else np.arange(n))
        assert ids.flat.block_ids.tolist() == numpy_intern(ids.frame["block_keys"].explode().to_numpy())[0].tolist()


def test_from_arrays_holds_copies_of_the_arrays() -> None:
    ids, arrival = np.array([5, 7, 5], dtype=np.uint64), np.array([0.0, 1.0, 2.0])
    trace = Trace.from_arrays(ids, arrival_s=arrival, input_tokens=np.ones(3, dtype=np.uint32))
    ids[0], arrival[2] = 99, -1.0
    assert trace.frame["block_keys"].to_list() == [[5], [7], [5]] and trace.flat.keys.tolist() == [5, 7]
    assert trace.frame["arrival_s"].to_list() == [0.0, 1.0, 2.0]


def test_zipf_objects_is_from_arrays_of_its_ids() -> None:
    trace = zipf_objects(2000, 300, seed=4)
    again = Trace.from_arrays(trace.frame["block_keys"].explode().to_numpy(), arrival_s=trace.frame["arrival_s"],
                              source=trace.source)
    assert trace.frame.equals(again.frame)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_keys": [1.0, 2.0]}, "block_keys must hold integers, got dtype float64"),
    ({"block_keys": [True]}, "block_keys must hold integers, got dtype bool"),
    ({"block_keys": [3, -1]}, r"block_keys must be >= 0; block_keys\[1\] is -1"),
    ({"block_keys": [[1, 2]]}, "block_keys must be a one-dimensional array"),
    ({"block_keys": []}, "at least one request"),
    ({"block_keys": np.array([], dtype=np.uint64), "offsets": [0]}, "at least one request"),
    ({"block_keys": [1, 2], "offsets": [0, 1]}, "offsets must start at 0 and end at len"),
    ({"block_keys": [1, 2], "offsets": [0, 2, 1, 2]}, r"non-decreasing; offsets\[2\]=1 after 2"),
    ({"block_keys": [1, 2], "arrival_s": [0.0]}, "arrival_s has 1 values for 2 requests"),
    ({"block_keys": [1, 2], "arrival_s": [1.0, 0.5]}, "'arrival_s' must be non-decreasing"),
    ({"block_keys": [1, 2], "request_id": [4, 4]}, "'request_id' has duplicate value 4 .row 1."),
    ({"block_keys": [1, 2], "input_tokens": [1, 2]}, "row 1: 1 block keys but input_tokens=2"),
    ({"block_keys": [1], "block_size": 0}, "block_size"),
])
def test_from_arrays_errors_name_field_and_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Trace.from_arrays(kwargs.pop("block_keys"), **kwargs)


def test_mooncake_columnar_path_equals_line_reader(tmp_path) -> None:
    path = bundled_trace_path("conversation")
    fast, slow = load_mooncake(path), _load_by_line(path, 512)
    assert fast.frame.equals(slow.frame) and fast.source == slow.source
    packed = tmp_path / "conv.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert load_mooncake(packed).frame.equals(fast.frame)


def test_mooncake_columnar_path_reads_unusual_but_valid_records(tmp_path) -> None:
    # keys in another order, spacing, float timestamps, ids past 2**63, CRLF line ends: the schema read
    # (no blank line, four fields) equals the line reader
    lines = ['{"hash_ids":[18446744073709551615, 9223372036854775808],"output_length":3,"input_length":600,'
             '"timestamp":1.5}',
             '{ "timestamp" : 2 , "input_length" : 512 , "output_length" : 0 , "hash_ids" : [ 18446744073709551615 ] }',
             '{"timestamp": 2.25, "input_length": 0, "output_length": 1, "hash_ids": []}']
    path = tmp_path / "t.jsonl"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    fast = _load_columnar(path, 512)
    assert fast is not None and fast.frame.equals(_load_by_line(path, 512).frame)
    assert fast.frame["block_keys"].to_list() == [[U64_MAX, 2**63], [U64_MAX], []]


def test_mooncake_errors_keep_file_and_line(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
    path.write_text(good + "\n" + '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [2, 1]}\n')
    with pytest.raises(TraceFormatError, match=r"t.jsonl:3: .*on line 1"):
        load_mooncake(path)
    path.write_text(good + '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0]}\n')
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: 1 hash_ids but input_length=600"):
        load_mooncake(path)
