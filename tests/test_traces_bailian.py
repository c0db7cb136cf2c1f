"""Bailian / Qwen loader: re-chained ids, root-chat sessions, file:line errors for every bad input.

The real files are Git-LFS objects not obtainable here: ``tests/data/bailian_sample.jsonl`` is a
synthetic sample written from the published schema (tests/data/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import reference_rechain, write_lines
from kvlab.traces import FORMATS, TraceFormatError, detect_format, load_trace
from kvlab.traces.bailian import load_bailian

SAMPLE = Path(__file__).parent / "data" / "bailian_sample.jsonl"
GOOD = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 20, "output_length": 3,
        "type": "text", "turn": 1, "hash_ids": [7, 8]}
_DROP = object()


def record(**changes: object) -> str:
    rec = {**GOOD, **changes}
    return json.dumps({k: v for k, v in rec.items() if v is not _DROP})



# -- plain-Python references -------------------------------------------------------------

def reference_roots(chats: list[int], parents: list[int]) -> list[int]:
    by_chat = dict(zip(chats, parents, strict=True))
    roots = []
    for chat in chats:
        while by_chat.get(chat, -1) in by_chat:
            chat = by_chat[chat]
        roots.append(chat)
    return roots


def prefix_hits(rows: list[list[int]]) -> int:
    """Blocks served by an infinite prefix cache keyed by the ids as given: block i hits when each of
    ids 0..i was seen in an earlier request (the naive reading of unchained ids)."""
    seen: set[int] = set()
    hits = 0
    for ids in rows:
        for i in ids:
            if i not in seen:
                break
            hits += 1
        seen.update(ids)
    return hits


def id_seen_hits(rows: list[list[int]]) -> int:
    seen: set[int] = set()
    hits = 0
    for ids in rows:
        hits += sum(i in seen for i in ids)
        seen.update(ids)
    return hits


# -- the sample -----------------------------------------------------------------------------
def test_sample_loads_with_rechained_keys_and_sessions() -> None:
    trace = load_trace(SAMPLE)
    assert trace.provenance["format"] == "bailian" and trace.block_size == 16
    frame = trace.frame
    raw = [json.loads(line)["hash_ids"] for line in SAMPLE.read_text().splitlines()]
    assert frame["block_keys"].to_list() == reference_rechain(raw)
    assert frame["block_keys"].to_list()[11] == [17, 18, 19]  # ids 3, 2 under new prefixes: new keys
    assert frame["session_id"].to_list() == [0, 1, 2, 0, 4, 1, 0, 4, 1, 9, 2, 9]
    assert frame["chat_id"].to_list() == list(range(12))
    assert frame["type"].to_list()[:5] == ["text", "search", "text", "text", "image"]
    assert frame["turn"].to_list()[10] == 4 and frame["parent_chat_id"].to_list()[2] == 90
    facts = {k: trace.provenance[k] for k in ("distinct_ids", "distinct_keys", "rows_reordered", "parents_not_in_file")}
    assert facts == {"distinct_ids": 17, "distinct_keys": 20, "rows_reordered": 0, "parents_not_in_file": 1}
    assert trace.frame["input_tokens"].to_list()[:3] == [40, 48, 20]
    assert trace.check_chained().height == 0


def test_rechaining_removes_hits_the_raw_ids_would_count() -> None:
    """docs/specs/traces.md §2.2: a block id repeated under another prefix is not a prefix hit."""
    raw = [json.loads(line)["hash_ids"] for line in SAMPLE.read_text().splitlines()]
    keys = load_bailian(SAMPLE).frame["block_keys"].to_list()
    assert (id_seen_hits(raw), prefix_hits(raw), prefix_hits(keys)) == (25, 24, 22)
    from kvlab.sim.replay import replay  # the cache-level replay agrees with the reference on the keys

    assert replay(load_bailian(SAMPLE), capacity_blocks=1000).requests["hit_blocks"].sum() == 22


# -- properties -------------------------------------------------------------------------------
@st.composite
def bailian_rows(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 25))
    chats = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n, unique=True))
    rows, t = [], 0.0
    for r, chat in enumerate(chats):
        parent = draw(st.sampled_from([-1, 99, *chats[:r]]))  # 99: a parent not in the file
        ids = draw(st.lists(st.integers(0, 6), max_size=5))
        n_in = draw(st.integers(16 * len(ids) - 15, 16 * len(ids))) if ids else 0
        t += draw(st.sampled_from([0.0, 0.25, 1.0]))
        rows.append({"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": n_in,
                     "output_length": draw(st.integers(0, 9)), "type": draw(st.sampled_from(["text", "search"])),
                     "turn": draw(st.integers(1, 4)), "hash_ids": ids})
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bailian_rows(), st.booleans())
def test_random_files_match_the_references_and_survive_parquet(tmp_path: Path, rows: list[dict], blank: bool) -> None:
    path = tmp_path / "r.jsonl"
    sep = "\n\n" if blank else "\n"  # a blank line sends the file to the line-by-line reader
    path.write_text(sep.join(json.dumps(r) for r in rows) + "\n")
    trace = load_trace(path)
    assert trace.frame["block_keys"].to_list() == reference_rechain([r["hash_ids"] for r in rows])
    chats = [r["chat_id"] for r in rows]
    assert trace.frame["session_id"].to_list() == reference_roots(chats, [r["parent_chat_id"] for r in rows])
    out = tmp_path / "r.parquet"
    trace.write_parquet(out)
    assert load_trace(out).same_as(trace)


# -- malformed input --------------------------------------------------------------------------
BAD_LINES = [
    ("malformed JSON", '{"chat_id": 1,', "malformed JSON"),
    ("not an object", "[1, 2]", "expected a JSON object, got list"),
    *[(f"missing {f}", record(**{f: _DROP}), f"missing field {f!r}") for f in GOOD],
    ("negative input", record(input_length=-1, hash_ids=[]), "field 'input_length' must be an integer in [0, 2**32)"),
    ("negative output", record(output_length=-2), "field 'output_length' must be an integer in [0, 2**32), got -2"),
    ("string length", record(output_length="3"), "field 'output_length' must be an integer in [0, 2**32), got '3'"),
    ("float chat", record(chat_id=1.5), "field 'chat_id' must be an integer"),
    ("parent below -1", record(parent_chat_id=-2), "field 'parent_chat_id' must be an integer in [-1, "),
    ("string timestamp", record(timestamp="0.5"), "field 'timestamp' must be a finite number >= 0"),
    ("negative timestamp", record(timestamp=-1.0), "field 'timestamp' must be a finite number >= 0"),
    ("numeric type", record(type=3), "field 'type' must be a string, got 3"),
    ("list type", record(type=["text"]), "field 'type' must be a string"),
    ("bool turn", record(turn=True), "field 'turn' must be an integer"),
    ("ids not a list", record(hash_ids=7), "field 'hash_ids' must be a list, got int"),
    ("negative id", record(hash_ids=[7, -1]), "hash_ids[1] must be an integer in [0, 2**64), got -1"),
    ("float id", record(hash_ids=[7.0, 8]), "hash_ids[0] must be an integer in [0, 2**64), got 7.0"),
    ("too few ids", record(hash_ids=[7]), "1 hash_ids but input_length=20 needs ceil(20/16)=2"),
    ("too many ids", record(input_length=16), "2 hash_ids but input_length=16 needs ceil(16/16)=1"),
]


@pytest.mark.parametrize(("case", "line", "message"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
@pytest.mark.parametrize("blank", [False, True], ids=["columnar", "by-line"])
def test_bad_line_names_file_line_and_field(tmp_path: Path, case: str, line: str, message: str, blank: bool) -> None:
    lines = [record(chat_id=0), *([""] if blank else []), line, record(chat_id=5, timestamp=9)]
    path = write_lines(tmp_path, lines)
    with pytest.raises(TraceFormatError) as info:
        load_bailian(path)
    assert info.value.line == (3 if blank else 2), str(info.value)
    assert message in info.value.reason, str(info.value)
    assert str(info.value).startswith(f"{path}:{info.value.line}: ")


def test_empty_and_blank_files_are_rejected(tmp_path: Path) -> None:
    for text in ("", "\n \n"):
        path = tmp_path / "e.jsonl"
        path.write_text(text)
        with pytest.raises(TraceFormatError, match="no records"):
            load_bailian(path)


def test_bom_and_gzip_load_like_the_plain_file(tmp_path: Path) -> None:
    text = SAMPLE.read_bytes()
    plain = load_bailian(SAMPLE)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    packed = tmp_path / "packed.jsonl.gz"
    packed.write_bytes(gzip.compress(text))
    hidden = tmp_path / "hidden.jsonl"  # gzip under a plain name: found by its magic bytes
    hidden.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text))
    for path in (bom, packed, hidden):
        assert load_trace(path).frame.equals(plain.frame)
        assert detect_format(path).name == "bailian"


def test_repeated_chat_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(chat_id=4), record(chat_id=5), record(chat_id=4)])
    with pytest.raises(TraceFormatError, match=r":3: field 'chat_id': value 4 repeats line 1"):
        load_bailian(path)


@pytest.mark.parametrize("links", [[(1, 1)], [(1, 2), (2, 1)], [(0, -1), (1, 3), (2, 1), (3, 2)],
                                   [(1, 2), (2, 3), (3, 4), (4, 1)]])
def test_a_cycle_of_parent_links_is_rejected(tmp_path: Path, links: list[tuple[int, int]]) -> None:
    path = write_lines(tmp_path, [record(chat_id=c, parent_chat_id=p) for c, p in links])
    with pytest.raises(TraceFormatError, match="its own ancestor"):
        load_bailian(path)


def test_out_of_order_timestamps_are_sorted_and_noted(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [record(chat_id=0, timestamp=2.0, hash_ids=[1, 2]),
                                  record(chat_id=1, timestamp=1.0, hash_ids=[1, 3]),
                                  record(chat_id=2, parent_chat_id=0, timestamp=2.0, hash_ids=[1, 2])])
    trace = load_bailian(path)
    assert trace.frame["chat_id"].to_list() == [1, 0, 2]
    assert trace.frame["arrival_s"].to_list() == [1.0, 2.0, 2.0]
    assert trace.frame["block_keys"].to_list() == [[0, 1], [0, 2], [0, 2]]
    assert trace.frame["session_id"].to_list() == [1, 0, 0]
    assert trace.provenance["rows_reordered"] == 2 and "2 rows were out of file order" in trace.provenance["notes"][2]


def test_dispatch_prefers_bailian_over_mooncake_and_block_size(tmp_path: Path) -> None:
    names = list(FORMATS)
    assert names.index("bailian") < names.index("mooncake")
    path = write_lines(tmp_path, [record(input_length=64, hash_ids=[7, 8])])
    trace = load_trace(path, block_size=32)
    assert trace.block_size == 32 and trace.provenance["options"] == {"block_size": 32}
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        load_bailian(path, block_size=0)
    partial = write_lines(tmp_path, [json.dumps({"chat_id": 1, "parent_chat_id": -1, "hash_ids": 3})], "p.jsonl")
    with pytest.raises(TraceFormatError, match="bailian .*line 1: field 'hash_ids': a JSON int"):
        load_trace(partial)
    aiperf_style = write_lines(tmp_path, [record(hash_ids=_DROP)], "a.jsonl")  # AIPerf's example has no hash_ids
    assert detect_format(aiperf_style).name == "bailian"
    with pytest.raises(TraceFormatError, match=r"a.jsonl:1: missing field 'hash_ids'"):
        load_trace(aiperf_style)
