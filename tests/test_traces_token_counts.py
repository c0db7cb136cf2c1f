"""The Azure LLM and Vidur CSV loaders: exact values, every malformed input, detection, the
Parquet round trip, and the real files."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.paths import bundled_trace_path
from kvlab.traces import FORMATS, TraceFormatError, detect_format, load_azure_llm, load_trace, load_vidur

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens"
AZURE_REAL = bundled_trace_path("azure-conv")  # the upstream files, gzip-compressed (data/README.md)
VIDUR_REAL = bundled_trace_path("splitwise-conv")


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def azure(tmp_path: Path, *rows: str, name: str = "t.csv") -> Path:
    return write(tmp_path, "\r\n".join([AZURE_HEADER, *rows]) + "\r\n", name)


def vidur(tmp_path: Path, *rows: str, name: str = "t.csv") -> Path:
    return write(tmp_path, "\n".join([VIDUR_HEADER, *rows]) + "\n", name)


def test_azure_times_are_exact_to_100_ns_and_keys_are_placeholders(tmp_path: Path) -> None:
    path = azure(tmp_path, "2023-11-16 18:15:46.6805900,20,3", "2023-11-16 18:15:46.6805901,16,1",
                 "2023-11-16 18:15:47.0000000,1,2")
    trace = load_azure_llm(path)
    assert trace.frame["arrival_s"].to_list() == [0.0, 1e-7, 0.3194100]
    assert trace.frame["input_tokens"].to_list() == [20, 16, 1]
    assert trace.frame["output_tokens"].to_list() == [3, 1, 2]
    assert trace.frame["request_id"].to_list() == [0, 1, 2]
    assert trace.frame["block_keys"].to_list() == [[0, 1], [2], [3]]
    assert not trace.block_identity and trace.partial_block_keyed and trace.block_size == 16
    p = trace.provenance
    assert (p["format"], p["options"], p["first_timestamp"]) == ("azure-llm", {"block_size": 16},
                                                                 "2023-11-16 18:15:46.6805900")
    assert any("no block identity" in n for n in p["notes"]) and any("line 2" in n for n in p["notes"])


def test_azure_2024_times_with_utc_offsets_and_no_fraction(tmp_path: Path) -> None:
    path = azure(tmp_path, "2024-05-12 00:00:00+00:00,5,1", "2024-05-12 00:00:00.001163+00:00,5,1",
                 "2024-05-12 01:00:00.5+01:00,5,1")
    trace = load_azure_llm(path, block_size=4)
    assert trace.frame["arrival_s"].to_list() == [0.0, 0.001163, 0.5]
    assert trace.frame["block_keys"].to_list() == [[0, 1], [2, 3], [4, 5]]
    assert any("UTC offsets" in n for n in trace.provenance["notes"])


def test_vidur_loads_and_warns_once_about_extra_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                           "1.5,33,2,35,16.5\n2.0,0,7,7,0.0\n")
    with pytest.warns(UserWarning, match="not loaded: 'num_total_tokens', 'pd_ratio'") as caught:
        trace = load_vidur(path, block_size=32)
    assert len(caught) == 1
    assert trace.frame["arrival_s"].to_list() == [0.0, 0.5]
    assert trace.frame["block_keys"].to_list() == [[0, 1], []]  # a 0-token prompt has no block
    assert trace.provenance["format"] == "vidur"


@pytest.mark.parametrize("fmt", ["azure", "vidur"])
def test_rows_out_of_time_order_are_sorted_stably(tmp_path: Path, fmt: str) -> None:
    if fmt == "azure":
        path = azure(tmp_path, "2023-01-01 00:00:02,1,1", "2023-01-01 00:00:01,2,1", "2023-01-01 00:00:02,3,1",
                     "2023-01-01 00:00:01,4,1")
    else:
        path = vidur(tmp_path, "2,1,1", "1,2,1", "2,3,1", "1,4,1")
    trace = load_trace(path)
    assert trace.frame["request_id"].to_list() == [1, 3, 0, 2]
    assert trace.frame["input_tokens"].to_list() == [2, 4, 1, 3]
    assert trace.frame["arrival_s"].to_list() == [0.0, 0.0, 1.0, 1.0]
    assert trace.frame["block_keys"].to_list() == [[0], [1], [2], [3]]
    assert any("2 record(s) arrive before" in n and "line 3" in n for n in trace.provenance["notes"])


AZURE_BAD = [
    ("2023-11-16 18:15:46,abc,1", 2, "field 'ContextTokens': 'abc' is not an integer"),
    ("2023-11-16 18:15:46,1.5,1", 2, "field 'ContextTokens': '1.5' is not an integer"),
    ("2023-11-16 18:15:46,-3,1", 2, "field 'ContextTokens': -3 is negative"),
    ("2023-11-16 18:15:46,4294967296,1", 2, "field 'ContextTokens': 4294967296 is above 4,294,967,295"),
    ("2023-11-16 18:15:46,3,", 2, "field 'GeneratedTokens': empty or missing"),
    ("2023-11-16 18:15:46,3", 2, "field 'GeneratedTokens': empty or missing"),
    ("16/11/2023 18:15,3,1", 2, "field 'TIMESTAMP': '16/11/2023 18:15' is not a time like"),
    ("2023-11-16 18:15:46.,3,1", 2, "field 'TIMESTAMP': '2023-11-16 18:15:46.' is not a time"),
    ("2023-11-16 18:15:46+00:00,3,1", 2, "the file mixes times with and without a UTC offset"),
    ("2023-11-16 18:15:46,3,1,9", 2, "4 fields but the CSV header has 3"),
]


@pytest.mark.parametrize(("row", "line", "message"), AZURE_BAD)
def test_bad_azure_rows_name_file_line_and_field(tmp_path: Path, row: str, line: int, message: str) -> None:
    path = azure(tmp_path, "2023-11-16 18:15:45,1,1", row)
    with pytest.raises(TraceFormatError, match=message) as err:
        load_azure_llm(path)
    assert err.value.line == line + 1 and str(err.value).startswith(f"{path}:{line + 1}: ")


@pytest.mark.parametrize(("row", "message"), [
    ("nan,1,1", "field 'arrived_at': 'nan' is not a finite number"),
    ("x,1,1", "field 'arrived_at': 'x' is not a number"),
    ("1.0,2,-1", "field 'num_decode_tokens': -1 is negative"),
    ("1.0,2.0,1", "field 'num_prefill_tokens': '2.0' is not an integer"),
    (",2,1", "field 'arrived_at': empty or missing"),
])
def test_bad_vidur_rows_name_file_line_and_field(tmp_path: Path, row: str, message: str) -> None:
    path = vidur(tmp_path, "0.0,1,1", row)
    with pytest.raises(TraceFormatError, match=message) as err:
        load_vidur(path)
    assert err.value.line == 3


def test_blank_lines_are_skipped_and_later_lines_keep_their_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, "\n" + VIDUR_HEADER + "\n\n0.0,1,1\n  \n1.0,x,1\n\n")
    with pytest.raises(TraceFormatError, match="field 'num_prefill_tokens': 'x'") as err:
        load_vidur(path)
    assert err.value.line == 6
    spaced = "arrived_at, num_prefill_tokens , num_decode_tokens"  # spaces around names are dropped
    ok = write(tmp_path, f"\r\n{spaced}\r\n\r\n0.0,1,1\r\n \r\n1.0,2,1\r\n\r\n", "ok.csv")
    assert load_trace(ok).frame["input_tokens"].to_list() == [1, 2]


@pytest.mark.parametrize("loader", [load_azure_llm, load_vidur])
def test_missing_column_is_named_on_the_header_line(tmp_path: Path, loader) -> None:
    path = write(tmp_path, "\n\nTIMESTAMP,arrived_at,num_prefill_tokens,ContextTokens\n1,1,1,1\n")
    missing = "GeneratedTokens" if loader is load_azure_llm else "num_decode_tokens"
    with pytest.raises(TraceFormatError, match=f"^{path}:3: field '{missing}': missing from the CSV header"):
        loader(path)


@pytest.mark.parametrize("loader", [load_azure_llm, load_vidur])
@pytest.mark.parametrize(("text", "line", "message"), [
    ("", None, "no records \\(empty file\\)"),
    ("\n \r\n", None, "no records \\(empty file\\)"),
    ("HEADER\n", 1, "no records after the CSV header"),
])
def test_empty_files_are_rejected(tmp_path: Path, loader, text: str, line: int | None, message: str) -> None:
    header = AZURE_HEADER if loader is load_azure_llm else VIDUR_HEADER
    path = write(tmp_path, text.replace("HEADER", header))
    with pytest.raises(TraceFormatError, match=message) as err:
        loader(path)
    assert err.value.line == line


def test_bom_gzip_and_binary_files(tmp_path: Path) -> None:
    plain = vidur(tmp_path, "0.0,10,1", "0.5,20,2")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    zipped = tmp_path / "zipped.csv"  # gzip found by its magic bytes, not the name
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    zipped_az = tmp_path / "azure.csv.gz"
    az = azure(tmp_path, "2023-11-16 18:15:46,3,1", name="a.csv")
    zipped_az.write_bytes(gzip.compress(b"\xef\xbb\xbf" + az.read_bytes()))
    expected = load_trace(plain).frame
    for path in (bom, zipped):
        trace = load_trace(path)
        assert trace.frame.equals(expected) and trace.provenance["format"] == "vidur"
    assert load_trace(zipped_az).provenance["format"] == "azure-llm"
    latin = write(tmp_path, VIDUR_HEADER + "\n0.0,1,1\n1.0,2,1\n", "latin.csv")
    latin.write_bytes(latin.read_bytes() + b"2.0,3,\xff\n")
    with pytest.raises(TraceFormatError, match="not UTF-8") as err:
        load_vidur(latin)
    assert err.value.line == 4
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(gzip.compress(plain.read_bytes())[:20])
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_vidur(broken)


def test_detection_and_sniff_reasons(tmp_path: Path) -> None:
    assert detect_format(azure(tmp_path, "2023-11-16 18:15:46,3,1")).name == "azure-llm"
    assert detect_format(vidur(tmp_path, "0,1,1", name="v.csv")).name == "vidur"
    jsonl = write(tmp_path, '{"timestamp": 0}\n', "t.jsonl")
    from kvlab.traces.sniff import Peek

    reason = FORMATS["azure-llm"].sniff(Peek.of(jsonl))
    assert reason.startswith("line 1: field 'TIMESTAMP': missing from the CSV header")
    other = write(tmp_path, "\narrived_at,prefill\n0,1\n", "other.csv")
    with pytest.raises(TraceFormatError, match="vidur .*: line 2: field 'num_prefill_tokens': missing"):
        load_trace(other)
    with pytest.raises(ValueError, match="do not apply to vidur traces"):
        load_trace(vidur(tmp_path, "0,1,1", name="w.csv"), rate_per_s=1.0)
    forced = load_trace(vidur(tmp_path, "0,40,1", name="f.csv"), format="vidur", block_size=8)
    assert forced.block_size == 8 and forced.block_refs == 5


@st.composite
def csv_rows(draw: st.DrawFn) -> tuple[str, list[str]]:
    fmt = draw(st.sampled_from(["azure", "vidur"]))
    n = draw(st.integers(1, 12))
    inputs = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
    ticks = draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n))  # unsorted on purpose
    if fmt == "azure":
        times = [f"2023-11-16 18:{t // 10**7 % 60:02d}:{t // 10**5 % 60:02d}.{t % 10**7:07d}" for t in ticks]
    else:
        times = [repr(t / 1000) for t in ticks]
    return fmt, [f"{t},{i},{o}" for t, i, o in zip(times, inputs, outputs)]


@settings(max_examples=40, deadline=None)
@given(rows=csv_rows(), block_size=st.integers(1, 64))
def test_written_and_reread_trace_is_the_same(tmp_path_factory: pytest.TempPathFactory, rows, block_size: int) -> None:
    fmt, lines = rows
    folder = tmp_path_factory.mktemp("rt")
    path = (azure if fmt == "azure" else vidur)(folder, *lines)
    trace = load_trace(path, block_size=block_size)
    assert (trace.frame["arrival_s"].diff().drop_nulls() >= 0).all()
    assert trace.frame["block_keys"].explode().drop_nulls().to_list() == list(range(trace.block_refs))
    trace.write_parquet(folder / "t.parquet")
    back = load_trace(folder / "t.parquet")
    assert back.same_as(trace) and not back.block_identity


def test_the_real_azure_and_vidur_files_agree() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no column left unloaded, nothing reordered
        az, vi = load_trace(AZURE_REAL), load_trace(VIDUR_REAL)
    assert (az.provenance["format"], vi.provenance["format"]) == ("azure-llm", "vidur")
    assert len(az) == len(vi) == 19_366
    assert az.provenance["first_timestamp"] == "2023-11-16 18:15:46.6805900"
    assert not any("sorted" in n for n in az.provenance["notes"] + vi.provenance["notes"])
    # Vidur's splitwise_conv.csv is the Azure conversation trace in seconds (rounded to µs)
    assert np.abs(az.frame["arrival_s"].to_numpy() - vi.frame["arrival_s"].to_numpy()).max() < 1e-6
    for col in ("input_tokens", "output_tokens", "block_keys"):
        assert az.frame[col].equals(vi.frame[col])
    assert az.block_refs == az.distinct_blocks == 1_406_937
