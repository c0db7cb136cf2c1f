"""ServeGen offline loader: synthesized arrivals (rate, seed), chained ids, file:line errors.

``tests/data/servegen_trace_c_head.jsonl`` is the first 50 records of ServeGen's real
``data/offline/trace_c.jsonl`` (Apache-2.0; tests/data/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reference_rechain, write_lines
from kvlab.traces import FORMATS, TraceFormatError, detect_format, load_trace
from kvlab.traces.servegen import load_servegen, synthesize_arrivals

HEAD = Path(__file__).parent / "data" / "servegen_trace_c_head.jsonl"
GOOD = {"request_id": 0, "type": "text", "input_length": 20, "hash_ids": [7, 8], "img_ids": []}
STAT = {"request_id": 0, "type": "text", "input_length": 61, "output_length": 2370, "duration": 14000}
_DROP = object()


def record(base: dict | None = None, **changes: object) -> str:
    rec = {**(GOOD if base is None else base), **changes}
    return json.dumps({k: v for k, v in rec.items() if v is not _DROP})




def test_real_head_of_trace_c() -> None:
    trace = load_trace(HEAD, rate_per_s=4.0, seed=7)
    frame = trace.frame
    assert trace.provenance["format"] == "servegen" and len(trace) == 50 and trace.block_size == 16
    keys = frame["block_keys"].to_list()
    assert all(k[:23] == list(range(655296, 655319)) for k in keys)  # a 368-token shared prefix
    assert keys[23][23] == keys[14][23] == 655380  # the same 24th block after the same prefix
    assert frame["input_tokens"].to_list()[:3] == [446, 420, 417]
    assert frame["output_tokens"].sum() == 0 and frame["img_ids"].to_list()[49] == ["img_00050"]
    assert frame["type"].unique().to_list() == ["multimodal"]
    assert frame["request_id"].to_list() == list(range(50))
    assert trace.distinct_blocks == 23 + 1364 - 50 * 23 - 4  # shared prefix + tails - 4 repeated 24th blocks
    notes = trace.provenance["notes"]
    assert "poisson arrivals synthesized at 4.0 requests/s" in notes[0] and "default_rng(7)" in notes[0]
    assert "output_tokens = 0" in notes[1]
    assert trace.provenance["options"] == {"rate_per_s": 4.0, "seed": 7, "block_size": 16, "arrivals": "poisson",
                                           "rechain_ids": False}


def test_arrivals_follow_rate_and_seed() -> None:
    a = load_servegen(HEAD, rate_per_s=4.0, seed=7).frame["arrival_s"].to_numpy()
    b = load_servegen(HEAD, rate_per_s=4.0, seed=7).frame["arrival_s"].to_numpy()
    c = load_servegen(HEAD, rate_per_s=4.0, seed=8).frame["arrival_s"].to_numpy()
    d = load_servegen(HEAD, rate_per_s=8.0, seed=7).frame["arrival_s"].to_numpy()
    expected = np.concatenate([[0.0], np.cumsum(np.random.default_rng(7).exponential(0.25, 49))])
    assert np.array_equal(a, b) and np.array_equal(a, expected) and not np.array_equal(a, c)
    np.testing.assert_allclose(d, a / 2, rtol=1e-12)  # the same gaps at twice the rate
    u = load_servegen(HEAD, rate_per_s=2.0, arrivals="uniform").frame["arrival_s"].to_list()
    assert u == [r / 2.0 for r in range(50)]
    assert synthesize_arrivals(1, 3.0, 0, "poisson").tolist() == [0.0]


@pytest.mark.parametrize("rate", [0, -1.0, float("nan"), float("inf"), "2", None, True])
def test_bad_rates_are_rejected(rate: object) -> None:
    with pytest.raises(ValueError, match="rate_per_s must be a finite number > 0"):
        load_servegen(HEAD, rate_per_s=rate)


def test_other_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        load_servegen(HEAD, rate_per_s=1.0, seed=-1)
    with pytest.raises(ValueError, match=r"arrivals must be one of \('poisson', 'uniform'\)"):
        load_servegen(HEAD, rate_per_s=1.0, arrivals="bursty")
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        load_servegen(HEAD, rate_per_s=1.0, block_size=0)


def test_load_trace_needs_rate_per_s() -> None:
    assert detect_format(HEAD).name == "servegen"
    with pytest.raises(ValueError, match=r"no arrival times .*pass rate_per_s=…"):
        load_trace(HEAD)
    names = list(FORMATS)
    assert names.index("servegen") < names.index("mooncake")


def test_unchained_ids_are_rejected_or_rechained(tmp_path: Path) -> None:
    rows = [[1, 2], [3, 2], [1, 2, 5]]
    path = write_lines(tmp_path, [record(request_id=r, input_length=16 * len(ids), hash_ids=ids)
                                  for r, ids in enumerate(rows)])
    with pytest.raises(TraceFormatError, match=r":2: hash_ids\[1\]=2 follows id 3 here but id 1 .* on line 1"):
        load_servegen(path, rate_per_s=1.0)
    trace = load_servegen(path, rate_per_s=1.0, rechain_ids=True)
    assert trace.frame["block_keys"].to_list() == reference_rechain(rows) == [[0, 1], [2, 3], [0, 1, 4]]
    assert "re-chained" in trace.provenance["notes"][1]


def test_stat_traces_load_without_block_identity(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(STAT), record(STAT, request_id=1, input_length=32, duration=5)])
    trace = load_trace(path, rate_per_s=1.0, arrivals="uniform")
    assert not trace.block_identity and trace.frame["duration_ms"].to_list() == [14000, 5]
    assert trace.frame["output_tokens"].to_list() == [2370, 2370]
    assert trace.frame["block_keys"].to_list() == [[0, 1, 2, 3], [4, 5]]
    assert "placeholder keys" in trace.provenance["notes"][1] and not trace.provenance["content_hash"]
    with pytest.raises(ValueError, match="no block identity"):
        trace.require_block_identity()
    out = tmp_path / "s.parquet"
    trace.write_parquet(out)
    assert load_trace(out).same_as(trace)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=20), st.booleans(),
       st.integers(0, 2**32), st.floats(0.01, 1000.0))
def test_random_files_survive_parquet(tmp_path: Path, paths: list[list[int]], blank: bool, seed: int,
                                      rate: float) -> None:
    rows = reference_rechain(paths)  # chained by construction
    path = tmp_path / "r.jsonl"
    sep = "\n\n" if blank else "\n"
    path.write_text(sep.join(record(request_id=r, input_length=16 * len(ids), hash_ids=ids, img_ids=[f"i{r}"])
                             for r, ids in enumerate(rows)) + "\n")
    trace = load_trace(path, rate_per_s=rate, seed=seed)
    assert trace.frame["block_keys"].to_list() == rows
    assert trace.frame["arrival_s"].to_list() == synthesize_arrivals(len(rows), rate, seed, "poisson").tolist()
    out = tmp_path / "r.parquet"
    trace.write_parquet(out)
    assert load_trace(out).same_as(trace)


BAD_LINES = [
    ("malformed JSON", '{"request_id": 1,', "malformed JSON"),
    ("not an object", '"text"', "expected a JSON object, got str"),
    *[(f"missing {f}", record(request_id=1, **{f: _DROP}), f"missing field {f!r}") for f in GOOD if f != "request_id"],
    ("missing request_id", record(request_id=_DROP), "missing field 'request_id'"),
    ("negative input", record(request_id=1, input_length=-5, hash_ids=[]),
     "field 'input_length' must be an integer in [0, 2**32), got -5"),
    ("string input", record(request_id=1, input_length="20"), "field 'input_length' must be an integer"),
    ("negative request_id", record(request_id=-1), "field 'request_id' must be an integer in [0, "),
    ("numeric type", record(request_id=1, type=1), "field 'type' must be a string, got 1"),
    ("numeric image id", record(request_id=1, img_ids=[3]), "img_ids[0] must be a string, got 3"),
    ("image ids not a list", record(request_id=1, img_ids="a"), "field 'img_ids' must be a list, got str"),
    ("negative id", record(request_id=1, hash_ids=[7, -8]), "hash_ids[1] must be an integer in [0, 2**64), got -8"),
    ("too few ids", record(request_id=1, hash_ids=[7]), "1 hash_ids but input_length=20 needs ceil(20/16)=2"),
    ("repeated request_id", record(request_id=0), "field 'request_id': value 0 repeats line 1"),
]


@pytest.mark.parametrize(("case", "line", "message"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
@pytest.mark.parametrize("blank", [False, True], ids=["columnar", "by-line"])
def test_bad_line_names_file_line_and_field(tmp_path: Path, case: str, line: str, message: str, blank: bool) -> None:
    lines = [record(), *([""] if blank else []), line, record(request_id=9, hash_ids=[7, 9])]
    path = write_lines(tmp_path, lines)
    with pytest.raises(TraceFormatError) as info:
        load_servegen(path, rate_per_s=1.0)
    assert info.value.line == (3 if blank else 2), str(info.value)
    assert message in info.value.reason, str(info.value)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceFormatError, match="no records"):
        load_servegen(path, rate_per_s=1.0)


def test_bom_and_gzip_load_like_the_plain_file(tmp_path: Path) -> None:
    text = HEAD.read_bytes()
    plain = load_servegen(HEAD, rate_per_s=1.0)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    packed = tmp_path / "packed.jsonl.gz"
    packed.write_bytes(gzip.compress(text))
    hidden = tmp_path / "hidden.jsonl"
    hidden.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text))
    for path in (bom, packed, hidden):
        assert load_trace(path, rate_per_s=1.0).frame.equals(plain.frame)


def test_sniff_leaves_records_with_timestamps_to_other_formats(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [json.dumps({"request_id": 0, "timestamp": 0, "input_length": 20, "output_length": 1,
                                              "hash_ids": [0, 1]})])
    assert detect_format(path).name == "mooncake"
    odd = write_lines(tmp_path, [json.dumps({"request_id": 0, "input_length": 20})], "odd.jsonl")
    assert detect_format(odd).name == "mooncake"  # neither hash_ids nor duration: not ServeGen
