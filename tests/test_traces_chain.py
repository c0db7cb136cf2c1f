"""The loaders' chaining check (numba, one pass) against Trace.check_chained (polars)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_trace
from kvlab.traces import TraceFormatError
from kvlab.traces.chain import check_chained_keys, rechain


def first_unchained_row(rows: list[list[int]]) -> tuple[int, int] | None:
    """Plain Python: (row, first row) of the first key seen before with another parent or position."""
    first: dict[int, tuple[int | None, int, int]] = {}
    for r, row in enumerate(rows):
        for position, key in enumerate(row):
            parent = row[position - 1] if position else None
            seen = first.setdefault(key, (parent, position, r))
            if seen[:2] != (parent, position):
                return r, seen[2]
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=1, max_size=12))
def test_check_chained_keys_agrees_with_check_chained(rows: list[list[int]]) -> None:
    trace = make_trace(rows, block_size=1)
    want = first_unchained_row(rows)
    assert (want is None) == (trace.check_chained().height == 0)
    if want is None:
        check_chained_keys(trace.flat, "t")
        return
    with pytest.raises(TraceFormatError, match=rf"^t: row {want[0]}: .* in row {want[1]}: the keys are not"):
        check_chained_keys(trace.flat, "t")


def test_check_chained_keys_names_both_rows_and_lines() -> None:
    trace = make_trace([[1, 2], [4], [3, 2]], block_size=1)
    with pytest.raises(TraceFormatError, match=r"^t: row 2: block_keys\[1\]=2 follows key 3 here but key 1 at "
                                               r"position 1 in row 0: the keys are not prefix-chained$"):
        check_chained_keys(trace.flat, "t")
    with pytest.raises(TraceFormatError, match=r"^t:30: ids\[1\]=2 follows id 3 here but id 1 at position 1 on "
                                               r"line 10: the ids are not prefix-chained$"):
        check_chained_keys(trace.flat, "t", field="ids", noun="id", lines=[10, 20, 30])
    with pytest.raises(TraceFormatError, match=r"row 0: block_keys\[1\]=5 follows key 5 here but nothing "
                                               r"\(first block\) at position 0 in row 0"):
        check_chained_keys(make_trace([[5, 5]], block_size=1).flat, "t")


@given(st.lists(st.lists(st.integers(0, 6), max_size=8), min_size=1, max_size=30))
def test_rechain_matches_a_dictionary_of_prefixes(rows: list[list[int]]) -> None:
    """Equal chained keys exactly when the whole id prefixes are equal (a naive reference)."""
    offsets = np.cumsum([0] + [len(r) for r in rows])
    ids = np.array([i for r in rows for i in r], dtype=np.uint64)
    keys = rechain(offsets, ids).tolist()
    by_prefix: dict[tuple[int, ...], int] = {}
    expected = [by_prefix.setdefault(tuple(r[:j + 1]), len(by_prefix)) for r in rows for j in range(len(r))]
    assert keys == expected


def test_rechain_rejects_bad_offsets() -> None:
    with pytest.raises(ValueError, match="offsets must run from 0 to len"):
        rechain(np.array([0, 3]), np.array([1, 2], dtype=np.uint64))
    with pytest.raises(ValueError, match="offsets must run from 0 to len"):
        rechain(np.array([0, 2, 1, 2]), np.array([1, 2], dtype=np.uint64))
