"""RAGPulse loader: segment lists, chained block keys, file:line errors, Parquet round trip, the real sample."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.paths import bundled_trace_path
from kvlab.traces import TraceFormatError, detect_format, load_ragpulse, load_trace
from kvlab.traces.chain import segment_block_keys
from kvlab.traces.ragpulse import COMPONENTS

SAMPLE = bundled_trace_path("ragpulse")  # the upstream files, gzip-compressed (data/README.md)
EMPTY_IDS = {c: [] for c in COMPONENTS}
#: id → (component, token_length) of the small folders
LENGTHS = {1: ("sys_prompt", 20), 2: ("sys_prompt", 7), 10: ("passages_ids", 12), 11: ("passages_ids", 5),
           20: ("history", 3), 30: ("web_search", 9), 40: ("user_input", 2), 41: ("user_input", 4)}


def record(ts: object = "5", n_in: object = None, ids: dict | None = None, **changes: object) -> dict:
    ids = {**EMPTY_IDS, "sys_prompt": [1], "passages_ids": [10], "user_input": [40]} if ids is None else ids
    if n_in is None:
        n_in = sum(LENGTHS[i][1] for seg in ids.values() for i in seg) + 6
    rec = {"timestamp": ts, "input_length": n_in, "output_length": 9, "hash_ids": ids, "session_id": "s1"}
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not DROP}


DROP = object()


def write_folder(root: Path, lines: list[str], *, gz: bool = False, bom: bool = False,
                 lengths: dict[int, tuple[str, int]] = LENGTHS) -> Path:
    root.mkdir(parents=True, exist_ok=True)

    def put(name: str, text: str) -> None:
        data = ("\ufeff" if bom else "") + text
        if gz:
            (root / f"{name}.jsonl.gz").write_bytes(gzip.compress(data.encode()))
        else:
            (root / f"{name}.jsonl").write_text(data, encoding="utf-8")

    put("0_trace", "\n".join(lines) + "\n\n")
    for comp, (stem, key, _) in COMPONENTS.items():
        rows = [json.dumps({key: i, "token_length": n}) for i, (c, n) in lengths.items() if c == comp]
        if rows:
            put(stem, "\n".join(rows) + "\n\n")
    return root


def dumps(rec: dict) -> str:
    return json.dumps(rec)


def test_a_small_folder_loads_with_segments_in_prompt_order(tmp_path: Path) -> None:
    ids = {**EMPTY_IDS, "sys_prompt": [1, 2], "passages_ids": [11, 10], "history": [20], "web_search": [30],
           "user_input": [41]}
    folder = write_folder(tmp_path, [dumps(record("30", ids=ids, session_id="b")), dumps(record("10"))])
    trace = load_ragpulse(folder, block_size=16)
    f = trace.frame
    assert f["request_id"].to_list() == [1, 0]  # sorted by timestamp, file record numbers kept
    assert f["arrival_s"].to_list() == [0.01, 0.03]
    assert f["session_id"].to_list() == ["s1", "b"]
    assert f["segment_ids"].to_list() == [[1, 10, 40], [1, 2, 11, 10, 20, 30, 41]]
    assert f["segment_tokens"].to_list() == [[20, 12, 2], [20, 7, 5, 12, 3, 9, 4]]
    assert f["segment_kind"].to_list()[1] == ["sys_prompt", "sys_prompt", "passages", "passages", "history",
                                              "web_search", "user_input"]
    assert f["template_tokens"].to_list() == [6, 6]
    assert f["input_tokens"].to_list() == [40, 66]
    # 16-token full blocks: both share block 0 (inside segment 1); then they differ (segment 10 vs 2)
    assert f["block_keys"].to_list() == [[0, 1], [0, 2, 3, 4]]
    assert not trace.partial_block_keyed
    assert trace.check_chained().height == 0
    assert trace.provenance["format"] == "ragpulse" and trace.provenance["sessions"] == 2
    assert "1 of 2 records arrive before a record above them" in trace.provenance["notes"][0]
    assert "by 6-6 tokens" in trace.provenance["notes"][1]
    assert load_ragpulse(folder / "0_trace.jsonl").frame.equals(f)
    assert detect_format(folder).name == detect_format(folder / "0_trace.jsonl").name == "ragpulse"


def test_a_segment_repeated_inside_a_request_is_noted(tmp_path: Path) -> None:
    ids = {**EMPTY_IDS, "passages_ids": [10, 11, 10], "user_input": [40]}
    trace = load_ragpulse(write_folder(tmp_path, [dumps(record(ids=ids))]), block_size=4)
    assert "1 requests list a segment twice" in " ".join(trace.provenance["notes"])
    assert trace.check_chained().height == 0


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("bom", [False, True], ids=["no-bom", "bom"])
def test_gzip_and_bom_load(tmp_path: Path, gz: bool, bom: bool) -> None:
    plain = load_ragpulse(write_folder(tmp_path / "a", [dumps(record())]), block_size=8)
    other = load_ragpulse(write_folder(tmp_path / "b", [dumps(record())], gz=gz, bom=bom), block_size=8)
    assert other.frame.equals(plain.frame)
    assert load_trace(tmp_path / "b", block_size=8).frame.equals(plain.frame)


BAD = [
    ("malformed JSON", '{"timestamp": "5", ', "malformed JSON"),
    ("not an object", "[1, 2]", "expected a JSON object, got list"),
    *[(f"missing {name}", dumps(record(**{name: DROP})), f"missing field '{name}'")
      for name in ("timestamp", "input_length", "output_length", "hash_ids", "session_id")],
    ("timestamp not a number", dumps(record(ts="soon")), "field 'timestamp' must be a finite number >= 0"),
    ("negative timestamp", dumps(record(ts="-3")), "field 'timestamp' must be a finite number >= 0"),
    ("negative input", dumps(record(n_in=-1)), "field 'input_length' must be an integer in [0, 2**32), got -1"),
    ("negative output", dumps(record(output_length=-2)),
     "field 'output_length' must be an integer in [0, 2**32), got -2"),
    ("string length", dumps(record(n_in="40")), "field 'input_length' must be an integer in [0, 2**32), got '40'"),
    ("hash_ids a list", dumps(record(hash_ids=[1, 2])), "field 'hash_ids': must be an object of component lists"),
    ("component missing", dumps(record(ids={"sys_prompt": [1]})), "field 'hash_ids.passages_ids': missing"),
    ("unknown component", dumps(record(ids={**EMPTY_IDS, "tools": [1]})),
     "field 'hash_ids.tools': not a RAGPulse component"),
    ("component not a list", dumps(record(ids={**EMPTY_IDS, "history": 20}, n_in=30)),
     "field 'hash_ids.history': must be a list of ids, got int"),
    ("string id", dumps(record(ids={**EMPTY_IDS, "history": ["20"]}, n_in=30)),
     "field 'hash_ids.history[0]' must be an integer in [0, 2**64), got '20'"),
    ("negative id", dumps(record(ids={**EMPTY_IDS, "history": [-20]}, n_in=30)),
     "field 'hash_ids.history[0]' must be an integer in [0, 2**64), got -20"),
    ("session not a string", dumps(record(session_id=7)), "field 'session_id' must be a string, got 7"),
    ("unknown id", dumps(record(ids={**EMPTY_IDS, "passages_ids": [10, 99]}, n_in=50)),
     "field 'hash_ids.passages_ids[1]': id 99 is not in 2_passages.jsonl"),
    ("id of another component", dumps(record(ids={**EMPTY_IDS, "history": [10]}, n_in=50)),
     "field 'hash_ids.history[0]': id 10 is not in 3_history.jsonl"),
    ("input below its segments", dumps(record(n_in=33)),
     "field 'input_length': 33 is less than the 34 tokens of its segments"),
]


@pytest.mark.parametrize(("case", "line", "message"), BAD, ids=[c[0] for c in BAD])
def test_a_bad_record_names_file_line_and_field(tmp_path: Path, case: str, line: str, message: str) -> None:
    folder = write_folder(tmp_path, [dumps(record()), "", line, dumps(record("9"))])
    with pytest.raises(TraceFormatError) as info:
        load_ragpulse(folder)
    assert str(info.value).startswith(f"{folder / '0_trace.jsonl'}:3: ")
    assert message in str(info.value)


def test_empty_files_and_missing_pieces(tmp_path: Path) -> None:
    empty = write_folder(tmp_path / "e", ["", "  "])
    with pytest.raises(TraceFormatError, match="0_trace.jsonl: no records"):
        load_ragpulse(empty)
    with pytest.raises(TraceFormatError, match="no 0_trace.jsonl .* not a RAGPulse trace"):
        load_ragpulse(tmp_path / "e" / "..")  # tmp_path itself: a folder without the trace
    folder = write_folder(tmp_path / "m", [dumps(record())])
    (folder / "2_passages.jsonl").unlink()
    with pytest.raises(TraceFormatError, match=r"0_trace.jsonl:1: field 'hash_ids.passages_ids': no 2_passages"):
        load_ragpulse(folder)
    (folder / "2_passages.jsonl").write_text("\n")
    with pytest.raises(TraceFormatError, match="2_passages.jsonl: no records"):
        load_ragpulse(folder)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        load_ragpulse(folder, block_size=0)


@pytest.mark.parametrize(("case", "line", "message"), [
    ("missing token_length", '{"passage_id": 12}', "missing field 'token_length'"),
    ("negative token_length", '{"passage_id": 12, "token_length": -4}',
     "field 'token_length' must be an integer in [0, 2**32), got -4"),
    ("string id", '{"passage_id": "12", "token_length": 4}', "field 'passage_id' must be an integer in [0, 2**64)"),
    ("listed twice", '{"passage_id": 10, "token_length": 4}', "id 10 is listed again (first in 2_passages.jsonl:1)"),
    ("in two files", '{"passage_id": 40, "token_length": 4}', "id 40 is listed again"),
])
def test_a_bad_component_line_names_file_and_line(tmp_path: Path, case: str, line: str, message: str) -> None:
    folder = write_folder(tmp_path, [dumps(record())])
    path = folder / "2_passages.jsonl"
    path.write_text(path.read_text().rstrip("\n") + "\n" + line + "\n")
    with pytest.raises(TraceFormatError) as info:
        load_ragpulse(folder)
    assert message in str(info.value)
    if case != "in two files":  # the second listing may be in either file
        assert str(info.value).startswith(f"{path}:3: ")


def test_sniff_says_why_not(tmp_path: Path) -> None:
    from kvlab.traces.load import FORMATS
    from kvlab.traces.sniff import Peek

    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}\n')
    assert FORMATS["ragpulse"].sniff(Peek.of(mooncake)) == "line 1: field 'hash_ids': not an object of component " \
                                                           "lists (sys_prompt, passages_ids, history, web_search, " \
                                                           "user_input)"
    assert detect_format(mooncake).name == "mooncake"
    assert FORMATS["ragpulse"].sniff(Peek.of(tmp_path)) == "a folder without 0_trace.jsonl"


# -- properties ---------------------------------------------------------------------------------

def random_folder(root: Path, data: st.DataObject) -> Path:
    lengths = {i: (list(COMPONENTS)[i % 5], data.draw(st.integers(0, 20))) for i in range(12)}
    by_comp = {c: [i for i, (k, _) in lengths.items() if k == c] for c in COMPONENTS}
    lines = []
    for _ in range(data.draw(st.integers(1, 12))):
        ids = {c: data.draw(st.lists(st.sampled_from(by_comp[c]), max_size=3)) for c in COMPONENTS}
        n_in = sum(lengths[i][1] for seg in ids.values() for i in seg) + data.draw(st.integers(0, 5))
        ts = data.draw(st.integers(0, 50))
        lines.append(json.dumps({"timestamp": str(ts), "input_length": n_in, "output_length": 1, "hash_ids": ids,
                                 "session_id": f"s{ts % 3}"}))
    return write_folder(root, lines, lengths=lengths)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), block_size=st.integers(1, 9))
def test_written_and_reread_is_the_same_trace(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                                              block_size: int) -> None:
    root = tmp_path_factory.mktemp("rp")
    trace = load_trace(random_folder(root / "f", data), block_size=block_size)
    trace.write_parquet(root / "t.parquet")
    again = load_trace(root / "t.parquet")
    assert again.same_as(trace)
    assert trace.check_chained().height == 0


def reference_block_keys(trace_frame: object, block_size: int) -> list[list[tuple]]:
    """Plain Python: each block's identity = the segments up to the one holding its last token, and the
    token's offset in it; tail (template) tokens are unique to the request."""
    out = []
    for r, (ids, toks, n_in) in enumerate(zip(trace_frame["segment_ids"].to_list(),
                                              trace_frame["segment_tokens"].to_list(),
                                              trace_frame["input_tokens"].to_list(), strict=True)):
        owner = []  # per token: (segments so far, offset)
        for k, n in enumerate(toks):
            owner += [(tuple(ids[:k + 1]), o) for o in range(n)]
        owner += [(("tail", r), o) for o in range(n_in - len(owner))]
        out.append([owner[(j + 1) * block_size - 1] for j in range(n_in // block_size)])  # full blocks
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), block_size=st.integers(1, 9))
def test_equal_block_keys_iff_same_segments_up_to_the_token(tmp_path_factory: pytest.TempPathFactory,
                                                            data: st.DataObject, block_size: int) -> None:
    trace = load_ragpulse(random_folder(tmp_path_factory.mktemp("rp"), data), block_size=block_size)
    ours = [k for row in trace.frame["block_keys"].to_list() for k in row]
    ref = [k for row in reference_block_keys(trace.frame, block_size) for k in row]
    first: dict[object, int] = {}
    assert ours == [first.setdefault(k, len(first)) for k in ref]  # same partition, numbered in first appearance


def test_segment_block_keys_refuses_short_prompts() -> None:
    with pytest.raises(ValueError, match="request 0: input_tokens=3 is less than its segments' tokens"):
        segment_block_keys(np.array([0, 1]), np.array([5], dtype=np.uint64), np.array([4]), np.array([3]), 2)


# -- the published sample -----------------------------------------------------------------------

def test_the_published_sample() -> None:
    trace = load_trace(SAMPLE)
    assert trace.provenance["format"] == "ragpulse" and trace.block_size == 16
    assert (len(trace), trace.provenance["sessions"], trace.provenance["segments"],
            trace.provenance["distinct_segments"]) == (7106, 3990, 71583, 21857)
    notes = trace.provenance["notes"]
    assert "3304 of 7106 records arrive before a record above them in the file (the timestamp drops 1 time" in notes[0]
    assert "by 6-12 tokens" in notes[1] and notes[2].startswith("64 requests list a segment twice")
    f = trace.frame
    assert int(f["input_tokens"].sum()) == 20_917_099
    assert f["request_id"][:2].to_list() == [3800, 3801]  # the second run of the file starts at 0 ms
    assert (trace.block_refs, trace.distinct_blocks) == (1_303_897, 893_022)  # full blocks only


def test_the_line_reader_gives_the_columnar_reader_s_trace(tmp_path: Path) -> None:
    lines = [dumps(record("7")), dumps(record("3", ids={**EMPTY_IDS, "history": [20], "user_input": [41, 40]}))]
    fast = load_ragpulse(write_folder(tmp_path / "a", lines), block_size=4)
    extra = [dumps({**json.loads(line), "model": "x"}) for line in lines]  # an unknown field: the line reader
    with pytest.warns(UserWarning, match=r"'model' \(first at line 1\)"):
        slow = load_ragpulse(write_folder(tmp_path / "b", extra), block_size=4)
    numeric = [dumps({**json.loads(line), "timestamp": int(json.loads(line)["timestamp"])}) for line in lines]
    assert slow.frame.equals(fast.frame)
    assert load_ragpulse(write_folder(tmp_path / "c", numeric), block_size=4).frame.equals(fast.frame)
