"""Mooncake loader: every malformed-input case names file and line; bundled traces match the spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_lines
from kvlab.traces import TraceFormatError, load_mooncake, load_trace

GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}



def record(**changes: object) -> str:
    rec = {**GOOD, **changes}
    return json.dumps({k: v for k, v in rec.items() if v is not _DROP})


_DROP = object()

BAD_LINES = [
    ("malformed JSON", '{"timestamp": 0, "input_length": 1000,', "malformed JSON"),
    ("not an object", "[1, 2, 3]", "expected a JSON object, got list"),
    ("missing timestamp", record(timestamp=_DROP), "missing field 'timestamp'"),
    ("missing input_length", record(input_length=_DROP), "missing field 'input_length'"),
    ("missing output_length", record(output_length=_DROP), "missing field 'output_length'"),
    ("missing hash_ids", record(hash_ids=_DROP), "missing field 'hash_ids'"),
    ("negative input", record(input_length=-1, hash_ids=[]),
     "field 'input_length' must be an integer in [0, 2**32), got -1"),
    ("negative output", record(output_length=-3), "field 'output_length' must be an integer in [0, 2**32), got -3"),
    ("float length", record(input_length=1000.5), "field 'input_length' must be an integer in [0, 2**32), got 1000.5"),
    ("string length", record(output_length="5"), "field 'output_length' must be an integer in [0, 2**32), got '5'"),
    ("length above u32", record(output_length=2**32),
     "field 'output_length' must be an integer in [0, 2**32), got 4294967296"),
    ("float id", record(hash_ids=[0, 1.0]), "hash_ids[1] must be an integer in [0, 2**64), got 1.0"),
    ("string id", record(hash_ids=["a", 1]), "hash_ids[0] must be an integer in [0, 2**64), got 'a'"),
    ("bool id", record(hash_ids=[0, True]), "hash_ids[1] must be an integer in [0, 2**64), got True"),
    ("negative id", record(hash_ids=[0, -7]), "hash_ids[1] must be an integer in [0, 2**64), got -7"),
    ("id beyond u64", record(hash_ids=[0, 2**64]), "hash_ids[1] must be an integer in [0, 2**64)"),
    ("ids not a list", record(hash_ids=5), "field 'hash_ids' must be a list, got int"),
    ("too few ids", record(hash_ids=[0]), "1 hash_ids but input_length=1000 needs ceil(1000/512)=2"),
    ("too many ids", record(hash_ids=[0, 1, 2]), "3 hash_ids but input_length=1000 needs ceil(1000/512)=2"),
    ("negative timestamp", record(timestamp=-1), "field 'timestamp' must be a finite number >= 0"),
    ("string timestamp", record(timestamp="0"), "field 'timestamp' must be a finite number >= 0"),
]


@pytest.mark.parametrize(("case", "line", "message"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_names_file_and_line(tmp_path: Path, case: str, line: str, message: str) -> None:
    path = write_lines(tmp_path, [record(), "", line, record(timestamp=9)])
    with pytest.raises(TraceFormatError) as info:
        load_mooncake(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: ")
    assert message in str(info.value)


@pytest.mark.parametrize(("case", "line", "message"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_without_blank_lines_gets_the_same_error(tmp_path: Path, case: str, line: str, message: str) -> None:
    # no blank line: the columnar reader tries the file first and must hand the bad line on, not load it
    path = write_lines(tmp_path, [record(), line, record(timestamp=9)])
    with pytest.raises(TraceFormatError) as info:
        load_mooncake(path)
    assert info.value.line == 2
    assert message in str(info.value)


def test_decreasing_timestamp_is_rejected(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(timestamp=5), record(timestamp=4)])
    with pytest.raises(TraceFormatError, match=r":2: timestamp 4.0 is earlier than the previous record's 5.0"):
        load_mooncake(path)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    path = write_lines(tmp_path, ["", "  "])
    with pytest.raises(TraceFormatError, match="no records"):
        load_mooncake(path)


def test_unknown_fields_warn_once_with_first_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(), record(session=1), record(session=2)])
    with pytest.warns(UserWarning, match=r"'session' \(first at line 2\)"):
        trace = load_mooncake(path)
    assert len(trace) == 3


def test_fields_are_converted(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(timestamp=1500, hash_ids=[7, 2**64 - 1]), record(timestamp=2000.5)])
    frame = load_mooncake(path).frame
    assert frame["arrival_s"].to_list() == [1.5, 2.0005]
    assert frame["request_id"].to_list() == [0, 1]
    assert frame["block_keys"].to_list() == [[7, 2**64 - 1], [0, 1]]


def test_block_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        load_mooncake(write_lines(tmp_path, [record()]), block_size=0)


def test_load_trace_dispatch(tmp_path: Path) -> None:
    path = write_lines(tmp_path, ["", record()])
    assert len(load_trace(path)) == 1
    other = write_lines(tmp_path, ['{"requests": []}'])
    with pytest.raises(TraceFormatError, match=r"t.jsonl: no known trace format fits; tried:\n(.*\n)*  mooncake "
                                               r"\(.*\): line 1: field 'timestamp': missing \(no Mooncake field"):
        load_trace(other)
    array = write_lines(tmp_path, ["[1, 2]"])
    with pytest.raises(TraceFormatError, match="mooncake .*: line 1: a JSON list, not a JSON object"):
        load_trace(array)
    with pytest.raises(FileNotFoundError, match="no trace file"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceFormatError, match="no known trace format fits(.*\n)*  mooncake .*: a folder, not a file"):
        load_trace(tmp_path)
    with pytest.raises(FileNotFoundError, match="empty trace path"):
        load_trace("")


def test_a_partial_mooncake_record_gets_the_missing_field_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(hash_ids=_DROP)])
    with pytest.raises(TraceFormatError, match=":1: missing field 'hash_ids'"):
        load_trace(path)


def test_load_trace_block_size_and_bundled_names(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(input_length=8, hash_ids=[0, 1])])
    trace = load_trace(path, block_size=4)
    assert trace.block_size == 4
    assert load_trace("synthetic").block_refs == 121_877
    trace.write_parquet(tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="block_size cannot be set for a Parquet trace"):
        load_trace(tmp_path / "x.parquet", block_size=4)


def test_ids_that_are_not_chained_are_rejected(tmp_path: Path) -> None:
    repeated = write_lines(tmp_path, [record(hash_ids=[1, 1])])
    with pytest.raises(TraceFormatError, match=r":1: hash_ids\[1\]=1 follows id 1 here but nothing \(first block\) "
                                               r"at position 0 on line 1: the ids are not prefix-chained"):
        load_mooncake(repeated)
    two_parents = write_lines(tmp_path, [record(hash_ids=[1, 2]), record(hash_ids=[3, 2])])
    with pytest.raises(TraceFormatError, match=r":2: hash_ids\[1\]=2 follows id 3 here but id 1 at position 1 "
                                               r"on line 1"):
        load_mooncake(two_parents)


def test_binary_and_gzip_files(tmp_path: Path) -> None:
    import gzip

    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\x1f\x8b\x08\x00\x9a\xff\xfe")  # gzip by its magic bytes, truncated
    with pytest.raises(TraceFormatError, match=r"b.jsonl:1: cannot read: Compressed file ended"):
        load_trace(binary)
    binary.write_bytes(b"\x00\x9a\xff\xfe")
    with pytest.raises(TraceFormatError, match=r"b.jsonl:1: not UTF-8 text"):
        load_trace(binary)
    hidden = tmp_path / "packed.jsonl"  # gzip under a plain name: found by content
    hidden.write_bytes(gzip.compress(record().encode()))
    assert len(load_trace(hidden)) == 1
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress((record() + "\n" + record(timestamp=5) + "\n").encode()))
    assert len(load_trace(packed)) == 2
    fake = tmp_path / "f.jsonl.gz"
    fake.write_text(record())
    with pytest.raises(TraceFormatError, match="f.jsonl.gz:1: cannot read"):
        load_trace(fake)
    misnamed = tmp_path / "n.parquet"  # the content decides, not the suffix
    misnamed.write_text(record())
    assert load_trace(misnamed).provenance["format"] == "mooncake"
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"PAR1 and then nothing")
    with pytest.raises(TraceFormatError, match="b.parquet: not a readable Parquet file"):
        load_trace(broken)


def test_parquet_round_trip(tmp_path: Path, synthetic) -> None:
    path = tmp_path / "s.parquet"
    synthetic.write_parquet(path)
    back = load_trace(path)
    assert back.block_size == 512 and back.source == synthetic.source
    assert back.frame.equals(synthetic.frame)


def test_parquet_without_metadata_is_rejected(tmp_path: Path, synthetic) -> None:
    path = tmp_path / "plain.parquet"
    synthetic.frame.write_parquet(path)
    with pytest.raises(TraceFormatError, match="no 'kvlab.block_size' metadata"):
        load_trace(path)


# Bundled traces: the statistics of docs/specs/traces.md §3 (independent script).
SPEC_STATS = {
    "conversation": dict(requests=12_031, time_span_s=3_536.999, input_tokens_min=891, input_tokens_max=126_195,
                         output_tokens_min=1, output_tokens_max=2_000, input_tokens_total=144_793_823,
                         block_refs=288_500, distinct_blocks=182_790, max_blocks_per_request=247,
                         input_mean=12_035.1, output_mean=342.6),
    "synthetic": dict(requests=3_993, time_span_s=1_022.025, input_tokens_min=13, input_tokens_max=191_378,
                      output_tokens_min=1, output_tokens_max=893, input_tokens_total=61_194_628,
                      block_refs=121_877, distinct_blocks=43_924, max_blocks_per_request=374,
                      input_mean=15_325.5, output_mean=149.1),
}


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_bundled_trace_statistics(name: str, request: pytest.FixtureRequest) -> None:
    trace = request.getfixturevalue(name)
    stats = trace.describe().to_dict()
    expected = dict(SPEC_STATS[name])
    assert round(stats.pop("input_tokens_mean"), 1) == expected.pop("input_mean")
    assert round(stats.pop("output_tokens_mean"), 1) == expected.pop("output_mean")
    assert stats["time_span_s"] == pytest.approx(expected.pop("time_span_s"), abs=1e-9)
    for key, value in expected.items():
        assert stats[key] == value, key
    assert stats["block_size"] == 512


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_bundled_traces_are_chained_with_dense_ids(name: str, request: pytest.FixtureRequest) -> None:
    trace = request.getfixturevalue(name)
    assert trace.check_chained().height == 0
    # ids are dense and first-seen ordered, so interning keeps them
    assert trace.flat.keys.tolist() == list(range(trace.distinct_blocks))


def test_conversation_has_one_root_block(conversation) -> None:
    first = conversation.frame["block_keys"].list.first()
    assert first.unique().to_list() == [0]


def rewrite_keys(path: Path, block_keys: list[list[int]]) -> None:
    """Rewrite a kvlab Parquet trace's ``block_keys`` in place, its metadata kept (as a user's script might)."""
    import polars as pl

    meta = pl.read_parquet_metadata(path)
    frame = pl.read_parquet(path).with_columns(block_keys=pl.Series(block_keys, dtype=pl.List(pl.UInt64)))
    frame.write_parquet(path, metadata=meta)


def test_every_loader_rejects_keys_that_are_not_chained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 14 item 12: a Parquet trace rewritten with [[1, 2], [3, 2]] loaded and replayed silently;
    only the Mooncake reader checked chaining. Both readers now share one check, naming file and row."""
    from kvlab.cli import main

    jsonl = write_lines(tmp_path, [record(input_length=8, hash_ids=[1, 2]), record(input_length=8, hash_ids=[1, 4])])
    path = tmp_path / "t.parquet"
    load_trace(jsonl, block_size=4).write_parquet(path)
    rewrite_keys(path, [[1, 2], [3, 2]])
    message = (f"{path}: row 1: block_keys[1]=2 follows key 3 here but key 1 at position 1 in row 0: the keys are "
               f"not prefix-chained")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert str(info.value) == message and (info.value.path, info.value.line) == (path, None)
    assert main(["replay", str(path)]) == 2
    assert capsys.readouterr().err == f"kvlab: error: {message}\n"
    rewrite_keys(path, [[5, 5], [5, 6]])  # a key repeated inside one request
    with pytest.raises(TraceFormatError, match=r"row 0: block_keys\[1\]=5 follows key 5 here but nothing \(first "
                                               r"block\) at position 0 in row 0"):
        load_trace(path)
    # the same keys as Mooncake JSONL, after a blank line: the error names lines instead of rows
    jsonl.write_text("\n".join([record(input_length=8, hash_ids=[1, 2]), "", record(input_length=8, hash_ids=[3, 2])]))
    with pytest.raises(TraceFormatError, match=r"t.jsonl:3: hash_ids\[1\]=2 follows id 3 here but id 1 at position 1 "
                                               r"on line 1: the ids are not prefix-chained"):
        load_trace(jsonl, block_size=4)


def test_a_byte_order_mark_and_capital_suffixes_are_accepted(tmp_path: Path, synthetic) -> None:
    """Issue 14 item 17: a UTF-8 BOM (Windows editors) and `.GZ` / `.PARQUET` names."""
    import gzip

    text = record() + "\n" + record(timestamp=5, hash_ids=[0, 2]) + "\n"
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    plain = tmp_path / "plain.jsonl"
    plain.write_text(text)
    assert load_trace(bom).frame.equals(load_trace(plain).frame)
    packed = tmp_path / "T.JSONL.GZ"
    packed.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text.encode()))
    assert load_trace(packed).frame.equals(load_trace(plain).frame)
    upper = tmp_path / "S.PARQUET"
    synthetic.write_parquet(upper)
    assert load_trace(upper).frame.equals(synthetic.frame)


@pytest.mark.parametrize(("name", "variant"), [
    ("toolagent_trace.jsonl", "FAST'25 tool&agent trace"),
    ("mooncake_trace.jsonl.gz", "arXiv 2407.00079 trace (FAST25-release/arxiv-trace)"),
    ("Conversation_Trace.JSONL", "FAST'25 conversation trace"),
    ("my_trace.jsonl", None),
])
def test_the_published_mooncake_files_are_recognised_by_name(tmp_path: Path, name: str, variant: str | None) -> None:
    import gzip

    path = tmp_path / name
    text = record() + "\n"
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    trace = load_trace(path)
    assert trace.provenance["format"] == "mooncake" and trace.provenance.get("variant") == variant
    assert trace.describe().format == (f"mooncake ({variant})" if variant else "mooncake")


def test_a_bad_byte_far_down_is_reported_on_its_own_line(tmp_path: Path) -> None:
    """The text reader decodes in chunks: the error must still name the line of the bad byte."""
    lines = [record(timestamp=i).encode() for i in range(2_000)]
    lines[1_500] = lines[1_500][:-1] + b', "x": "\xff"}'
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceFormatError, match=r"t.jsonl:1501: not UTF-8 text \(invalid start byte at byte \d+ of"):
        load_trace(path)
