"""The shared JSON-lines field reader: both paths give the same columns; errors name file:line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kvlab.traces import TraceFormatError
from kvlab.traces.jsonl_fields import Field, check_block_counts, first_duplicate, read_fields

FIELDS = (Field("n", "count"), Field("k", "int", low=-1, high=5), Field("t", "time"), Field("s", "str"),
          Field("ids", "ids"), Field("names", "strs"), Field("i", "id"))
ROWS = [{"n": 3, "k": -1, "t": 0.5, "s": 'say "hi"', "ids": [1, 2**64 - 1], "names": ['a"b', "c\\d"], "i": 2**64 - 1},
        {"n": 0, "k": 5, "t": 2, "s": "", "ids": [], "names": [], "i": 0}]


@pytest.mark.parametrize("blank", [False, True])
def test_both_paths_read_the_same_columns(tmp_path: Path, blank: bool) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text(("\n\n" if blank else "\n").join(json.dumps(r) for r in ROWS) + "\n")
    frame, lines = read_fields(path, FIELDS)
    assert frame.to_dicts() == [{**r, "t": float(r["t"])} for r in ROWS]
    assert frame.schema["ids"] == pl.List(pl.UInt64) and frame.schema["t"] == pl.Float64
    assert lines.tolist() == ([1, 3] if blank else [1, 2])


def test_block_counts_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    ids = pl.Series([[1, 2], [3], []], dtype=pl.List(pl.UInt64))
    lines = np.array([1, 2, 4])
    assert check_block_counts(path, lines, np.array([17, 16, 0]), ids, 16).tolist() == [0, 2, 3, 3]
    with pytest.raises(TraceFormatError, match=r"f.jsonl:2: 1 hash_ids but input_length=17 needs ceil\(17/16\)=2"):
        check_block_counts(path, lines, np.array([17, 17, 0]), ids, 16)
    first_duplicate(path, lines, np.array([5, 6, 7]), "chat_id")
    with pytest.raises(TraceFormatError, match=r"f.jsonl:4: field 'chat_id': value 5 repeats line 1"):
        first_duplicate(path, lines, np.array([5, 6, 5]), "chat_id")


@pytest.mark.parametrize(("value", "message"), [(-1, "got -1"), (2**64, "got 18446744073709551616"),
                                                ("7", "got '7'"), (1.0, "got 1.0")])
def test_a_bad_id_names_file_and_line(tmp_path: Path, value: object, message: str) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps({"i": 3}) + "\n" + json.dumps({"i": value}) + "\n")
    with pytest.raises(TraceFormatError, match=rf"f.jsonl:2: field 'i' must be an integer in \[0, 2\*\*64\), "
                                               rf"{message}"):
        read_fields(path, [Field("i", "id")])
