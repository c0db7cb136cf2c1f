"""Trace construction, validation, chaining check and flattening."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import make_trace
from kvlab.traces import Trace
from kvlab.traces.trace import read_trace_parquet


def frame(**changes: object) -> pl.DataFrame:
    base = {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "input_tokens": [8, 5], "output_tokens": [1, 2],
            "block_keys": [[1, 2], [1, 3]]}
    base.update(changes)
    return pl.DataFrame(base)


@pytest.mark.parametrize(("changes", "message"), [
    ({"input_tokens": [8, -5]}, "column 'input_tokens' has a value out of range for UInt32"),
    ({"block_keys": [[1, 2], [1, -3]]}, "column 'block_keys' has a value out of range for List(UInt64)"),
    # no truncating or parsing casts: a float key would merge distinct keys
    ({"block_keys": [[1.5, 2.0], [1.2, 3.0]]}, "column 'block_keys' must have integer values"),
    ({"input_tokens": [8.0, 5.9]}, "column 'input_tokens' must have integer values (UInt32), got dtype Float64"),
    ({"request_id": [0.5, 0.9]}, "column 'request_id' must have integer values"),
    ({"arrival_s": ["0", "1"]}, "column 'arrival_s' must have numeric values (Float64), got dtype String"),
    ({"output_tokens": [True, False]}, "column 'output_tokens' must have integer values"),
    ({"arrival_s": [0.0, None]}, "column 'arrival_s' has a null at row 1"),
    ({"block_keys": [[1, 2], [1, None]]}, "column 'block_keys' has a null at row 1"),
    ({"request_id": [4, 4]}, "column 'request_id' has duplicate value 4 (row 1)"),
    ({"arrival_s": [2.0, 1.0]}, "must be non-decreasing (rows in arrival order); row 1 has 1.0 after 2.0"),
    ({"arrival_s": [0.0, float("inf")]}, "column 'arrival_s' must be finite and >= 0; row 1 has inf"),
    ({"input_tokens": [8, 9]}, "row 1: 2 block keys but input_tokens=9 needs ceil(9/4)=3"),
    ({"token_ids": [[1] * 8, [1] * 4]}, "row 1: token_ids has 4 tokens but input_tokens=5"),
])
def test_invalid_frames_name_column_and_row(changes: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Trace(frame(**changes), block_size=4)
    assert message in str(info.value)


def test_missing_column_and_bad_block_size() -> None:
    with pytest.raises(ValueError, match=r"missing column\(s\) \['block_keys'\]"):
        Trace(frame().drop("block_keys"), block_size=4)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
            Trace(frame(), block_size=bad)
    with pytest.raises(ValueError, match="polars DataFrame"):
        Trace({"a": 1}, block_size=4)


def test_columns_are_cast_and_ordered() -> None:
    trace = Trace(frame(session_id=["a", "b"]).select(pl.exclude("request_id"), pl.col("request_id")), block_size=4)
    assert trace.frame.columns[:5] == ["request_id", "arrival_s", "input_tokens", "output_tokens", "block_keys"]
    assert trace.frame.schema["block_keys"] == pl.List(pl.UInt64)
    assert trace.frame.schema["input_tokens"] == pl.UInt32
    assert trace.frame["session_id"].to_list() == ["a", "b"]


def test_check_chained_reports_parent_and_position_conflicts() -> None:
    trace = make_trace([[1, 2, 3], [5, 2], [1, 2, 3], [3]], block_size=1)
    report = trace.check_chained().sort("block_key")
    assert report["block_key"].to_list() == [2, 3]
    assert report.filter(pl.col("block_key") == 2)["parents"].to_list() == [[1, 5]]
    assert report.filter(pl.col("block_key") == 3)["positions"].to_list() == [[2, 0]]
    assert report.filter(pl.col("block_key") == 3)["parents"].to_list() == [[2, None]]
    assert report["first_request_id"].to_list() == [0, 0]


def test_check_chained_catches_a_key_repeated_in_one_request() -> None:
    report = make_trace([[9, 9]], block_size=1).check_chained()
    assert report["block_key"].to_list() == [9]
    assert report["positions"].to_list() == [[0, 1]]


def test_flat_interns_in_first_seen_order() -> None:
    trace = make_trace([[50, 7], [50, 7, 2**64 - 1], [], [8]], block_size=2, input_tokens=[4, 5, 0, 1])
    flat = trace.flat
    assert flat.offsets.tolist() == [0, 2, 5, 5, 6]
    assert flat.block_ids.tolist() == [0, 1, 0, 1, 2, 3]
    assert flat.keys.tolist() == [50, 7, 2**64 - 1, 8]
    assert flat.input_tokens.tolist() == [4, 5, 0, 1]
    assert (trace.block_refs, trace.distinct_blocks) == (6, 4)


def test_describe_and_head() -> None:
    trace = make_trace([[1, 2], [1, 3, 4]], block_size=4, input_tokens=[8, 10], arrival_s=[1.0, 3.5])
    stats = trace.describe()
    assert (stats.requests, stats.time_span_s, stats.input_tokens_min, stats.input_tokens_max) == (2, 2.5, 8, 10)
    assert (stats.block_refs, stats.distinct_blocks, stats.max_blocks_per_request) == (5, 4, 3)
    assert "distinct blocks" in str(stats)
    head = trace.head(1)
    assert len(head) == 1 and head.block_refs == 2 and head.source == "test[:1]"


def test_empty_trace_and_bad_source_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        make_trace([])
    with pytest.raises(ValueError, match="source must be a str, got 123"):
        Trace(frame(), block_size=4, source=123)


def test_datetime_arrivals_are_rejected() -> None:
    from datetime import datetime

    with pytest.raises(ValueError, match="column 'arrival_s' must have numeric values"):
        Trace(frame(arrival_s=[datetime(2025, 1, 1), datetime(2025, 1, 2)]), block_size=4)


def test_block_identity_and_provenance_survive_parquet_and_views(tmp_path) -> None:
    frame = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "input_tokens": [20, 8],
                          "output_tokens": [1, 2], "block_keys": [[0, 1], [2]]})
    trace = Trace(frame, block_size=16, source="csv", block_identity=False,
                  provenance={"format": "azure-llm-2023", "notes": ["placeholder keys"]})
    assert "no block identity" in repr(trace)
    with pytest.raises(ValueError, match=r"trace 'csv' has no block identity \(azure-llm-2023: .*synthesize_prefix"):
        trace.require_block_identity()
    trace.write_parquet(tmp_path / "t.parquet")
    back = read_trace_parquet(tmp_path / "t.parquet")
    assert back.same_as(trace) and not back.block_identity
    head = trace.head(1)
    assert not head.block_identity and head.provenance == trace.provenance
    assert not head.same_as(trace)
    with pytest.raises(ValueError, match="provenance must be JSON-serialisable"):
        Trace(frame, block_size=16, provenance={"x": object()})


def test_filter_keeps_semantics_and_names_the_subset() -> None:
    frame = pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0], "input_tokens": [20, 8, 16],
                          "output_tokens": [1, 2, 3], "block_keys": [[0, 1], [2], [0]], "session_id": ["a", "b", "a"]})
    trace = Trace(frame, block_size=16, source="t", provenance={"format": "x"})
    a = trace.filter(pl.col("session_id") == "a", "a")
    assert a.frame["request_id"].to_list() == [0, 2] and a.source == "t[a]" and a.provenance == {"format": "x"}
    with pytest.raises(ValueError, match="no request of 't' satisfies"):
        trace.filter(pl.col("session_id") == "z")
    with pytest.raises(ValueError, match="predicate must be a polars expression"):
        trace.filter("session_id")
