"""kv-cache-tester loader: every malformed input names file, line and field; sub-agent timing,
scopes and the merge follow the format; the real sample's hit ratios match a naive reference."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.paths import bundled_trace_path
from kvlab.sim import replay
from kvlab.traces import TraceFormatError, detect_format, load_trace
from kvlab.traces.kv_cache_tester import load_kv_cache_tester

BS = 4


def req(time: object, ids: list, extra: int = 1, **changes: object) -> dict:
    record = {"t": time, "type": "n", "model": "m", "in": len(ids) * BS + extra, "out": 3, "hash_ids": ids,
              "input_types": ["text"], "stop": ""}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()


def conv(reqs: list, **top: object) -> dict:
    doc = {"id": "c", "models": ["m"], "block_size": BS, "hash_id_scope": "local", "requests": reqs}
    doc.update(top)
    return {k: v for k, v in doc.items() if v is not _DROP}


def write(path: Path, doc: object, *, indent: int | None = None) -> Path:
    path.write_text(json.dumps(doc, indent=indent))
    return path


def good() -> list:
    return [req(0.0, [1, 2]), req(5.0, [1, 2, 3])]


BAD = [
    ("missing in", [req(0.0, [1]), req(1.0, [1], **{"in": _DROP})], "missing field 'requests[1].in'"),
    ("missing t", [req(0.0, [1]), req(1.0, [1], **{"t": _DROP})], "missing field 'requests[1].t'"),
    ("missing hash_ids", [req(0.0, [1]), req(1.0, [1], hash_ids=_DROP)], "missing field 'requests[1].hash_ids'"),
    ("string length", [req(0.0, [1]), req(1.0, [1], **{"in": "5"})],
     "field 'requests[1].in' must be an integer in [0, 2**32), got '5'"),
    ("float length", [req(0.0, [1]), req(1.0, [1], out=2.5)],
     "field 'requests[1].out' must be an integer in [0, 2**32), got 2.5"),
    ("negative length", [req(0.0, [1]), req(1.0, [], **{"in": -5})],
     "field 'requests[1].in' must be an integer in [0, 2**32), got -5"),
    ("negative out", [req(0.0, [1]), req(1.0, [1], out=-1)],
     "field 'requests[1].out' must be an integer in [0, 2**32), got -1"),
    ("negative time", [req(0.0, [1]), req(-1.0, [1])], "field 'requests[1].t' must be a finite number >= 0.0"),
    ("string time", [req(0.0, [1]), req("1", [1])], "field 'requests[1].t' must be a finite number >= 0.0"),
    ("type not a string", [req(0.0, [1], type=1)], "field 'requests[0].type' must be a string, got 1"),
    ("ids not a list", [req(0.0, [1], hash_ids=7)], "field 'requests[0].hash_ids' must be a list, got int"),
    ("float id", [req(0.0, [1, 2.5])], "field 'requests[0].hash_ids[1]' must be an integer in [0, 2**64), got 2.5"),
    ("string id", [req(0.0, ["a", 1])], "field 'requests[0].hash_ids[0]' must be an integer in [0, 2**64), got 'a'"),
    ("bool id among ints", [req(0.0, [1, True])],
     "field 'requests[0].hash_ids[1]' must be an integer in [0, 2**64), got True"),
    ("negative id", [req(0.0, [1]), req(1.0, [1, -3])],
     "field 'requests[1].hash_ids[1]' must be an integer in [0, 2**64), got -3"),
    ("too few ids", [req(0.0, [1]), req(1.0, [1], **{"in": 3 * BS})],
     "requests[1]: 1 hash_ids but in=12 needs floor(12/4)=3 (full blocks only)"),
    ("a partial block keyed", [req(0.0, [1, 2], **{"in": BS + 1})], "2 hash_ids but in=5 needs floor(5/4)=1"),
    ("request not an object", [req(0.0, [1]), [1, 2]], "requests[1]: expected a JSON object, got list"),
    ("model not a string", [req(0.0, [1], model=5)], "field 'requests[0].model' must be a string, got 5"),
    ("sub-agent without requests", [{"t": 1.0, "type": "subagent", "agent_id": "a"}],
     "missing field 'requests[0].requests'"),
    ("bad request in a sub-agent", [req(0.0, [1]), {"t": 1.0, "type": "subagent", "agent_id": "a",
                                                    "requests": [req(0.0, [1]), req(1.0, [], **{"in": -5})]}],
     "field 'requests[1].requests[1].in' must be an integer in [0, 2**32), got -5"),
    ("not chained", [req(0.0, [1, 2]), req(1.0, [3, 2])],
     "requests[1].hash_ids[1]=2 follows id 3 here but id 1 at position 1 in requests[0] on line 1: "
     "the ids are not prefix-chained"),
]


@pytest.mark.parametrize(("case", "requests", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_request_names_file_line_and_field(tmp_path: Path, case: str, requests: list, message: str) -> None:
    path = write(tmp_path / "trace_0001.json", conv(requests))
    with pytest.raises(TraceFormatError) as info:
        load_kv_cache_tester(path)
    assert str(info.value).startswith(f"{path}:1: ")
    assert message in str(info.value)


@pytest.mark.parametrize(("case", "requests", "message"), [c for c in BAD if c[0] != "not chained"],
                         ids=[c[0] for c in BAD if c[0] != "not chained"])
def test_pretty_printed_file_names_the_line_of_the_field(tmp_path: Path, case: str, requests: list,
                                                         message: str) -> None:
    path = write(tmp_path / "t.json", conv(requests), indent=1)
    with pytest.raises(TraceFormatError) as info:
        load_kv_cache_tester(path)
    assert message in str(info.value)
    assert info.value.line is not None and info.value.line > 1  # not the document's first line


def test_pretty_printed_line_is_exact(tmp_path: Path) -> None:
    path = write(tmp_path / "t.json", conv([req(0.0, [1]), req(1.0, [], **{"in": -5})]), indent=2)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"in": -5' in text)
    with pytest.raises(TraceFormatError) as info:
        load_kv_cache_tester(path)
    assert info.value.line == line
    chained = write(tmp_path / "c.json", conv([req(0.0, [1, 2]), req(1.0, [3, 2])]), indent=2)
    starts = [n for n, text in enumerate(chained.read_text().splitlines(), 1) if text == "    {"]
    with pytest.raises(TraceFormatError, match=rf"c.json:{starts[1]}: requests\[1\].hash_ids\[1\]=2 .* in "
                                               rf"requests\[0\] on line {starts[0]}: "):
        load_kv_cache_tester(chained)


TOP_BAD = [
    ("block_size missing", conv(good(), block_size=_DROP), ":1: missing field 'block_size'"),
    ("block_size zero", conv(good(), block_size=0), ":1: field 'block_size' must be an integer >= 1, got 0"),
    ("block_size a string", conv(good(), block_size="64"), "field 'block_size' must be an integer >= 1, got '64'"),
    ("requests missing", conv(good(), requests=_DROP), "missing field 'requests'"),
    ("requests not a list", conv(good(), requests={}), "field 'requests' must be a list of requests, got dict"),
    ("unknown scope", conv(good(), hash_id_scope="shared"),
     "field 'hash_id_scope' is 'shared', an unknown scope (known: local, global)"),
    ("id not a string", conv(good(), id=7), "field 'id' must be a string, got 7"),
    ("not an object", [conv(good())], ":1: expected a JSON object (a kv-cache-tester conversation), got list"),
]


@pytest.mark.parametrize(("case", "doc", "message"), TOP_BAD, ids=[c[0] for c in TOP_BAD])
def test_bad_document(tmp_path: Path, case: str, doc: object, message: str) -> None:
    path = write(tmp_path / "t.json", doc)
    with pytest.raises(TraceFormatError, match="^" + str(path).replace(".", r"\.") + ":") as info:
        load_kv_cache_tester(path)
    assert message in str(info.value)


def test_malformed_json_and_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"block_size": 4,\n "requests": [}')
    with pytest.raises(TraceFormatError, match=r"bad\.json:2: malformed JSON: .* at column 15"):
        load_kv_cache_tester(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("\n  \n")
    with pytest.raises(TraceFormatError, match=r"empty\.json: no records \(empty file\)"):
        load_kv_cache_tester(empty)
    nothing = write(tmp_path / "none.json", conv([]))
    with pytest.raises(TraceFormatError, match="no requests in the file"):
        load_kv_cache_tester(nothing)


def test_bom_and_gzip_load(tmp_path: Path) -> None:
    text = json.dumps(conv(good()))
    plain = load_kv_cache_tester(write(tmp_path / "plain.json", conv(good())))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    gz = tmp_path / "c.json.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    disguised = tmp_path / "gz_named.json"  # gzip found by its magic bytes
    disguised.write_bytes(gzip.compress(text.encode()))
    for path in (bom, gz, disguised):
        trace = load_trace(path)
        assert trace.provenance["format"] == "kv-cache-tester"
        assert trace.frame.drop("request_id").equals(plain.frame.drop("request_id"))


def test_folder_block_sizes_must_agree_and_files_are_found(tmp_path: Path) -> None:
    write(tmp_path / "a.json", conv(good()))
    b = write(tmp_path / "b.json", conv(good(), block_size=8), indent=1)
    line = next(n for n, text in enumerate(b.read_text().splitlines(), 1) if '"block_size": 8' in text)
    (tmp_path / "README.md").write_text("not a trace")
    with pytest.raises(TraceFormatError, match=rf"b\.json:{line}: field 'block_size' is 8 but a\.json has 4"):
        load_kv_cache_tester(tmp_path)
    empty = tmp_path / "sub"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(TraceFormatError, match=r"no kv-cache-tester conversation files"):
        load_kv_cache_tester(empty)
    with pytest.raises(FileNotFoundError):
        load_kv_cache_tester(tmp_path / "missing.json")


def test_subagent_requests_are_placed_at_absolute_times(tmp_path: Path) -> None:
    requests = [req(0.0, [1, 2]),
                {"t": 10.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "done": True,
                 "requests": [req(0.0, [5], type="s"), req(9.0, [5, 6])]},
                req(12.0, [1, 2, 3]), req(19.0, [1, 2, 3, 4])]
    trace = load_kv_cache_tester(write(tmp_path / "t.json", conv(requests)))
    frame = trace.frame
    assert frame["arrival_s"].to_list() == [0.0, 10.0, 12.0, 19.0, 19.0]
    assert frame["agent_id"].to_list() == [None, "agent_001", None, "agent_001", None]  # tie: document order
    assert frame["type"].to_list() == ["n", "s", "n", "n", "n"]
    assert frame["request_id"].to_list() == [0, 1, 3, 2, 4]  # document order, whatever the sorted row
    assert frame["block_keys"].to_list() == [[1, 2], [5], [1, 2, 3], [5, 6], [1, 2, 3, 4]]
    assert trace.provenance["notes"][2].endswith("requests listed after a later one in their file: c (1)")


def test_local_scope_keeps_conversations_apart_and_global_shares(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        write(tmp_path / name, conv(good(), id=name[0]))
    local = load_kv_cache_tester(tmp_path)
    assert local.frame["block_keys"].to_list() == [[1, 2], [5, 6], [1, 2, 3], [5, 6, 7]]
    assert [c["key_offset"] for c in local.provenance["conversations"]] == [0, 4]
    assert local.frame["session_id"].to_list() == ["a", "b", "a", "b"]
    assert replay(local).summary.hit_blocks == 4  # each conversation's second request hits its own prefix
    for name in ("a.json", "b.json"):
        write(tmp_path / name, conv(good(), id=name[0], hash_id_scope="global"))
    shared = load_kv_cache_tester(tmp_path)
    assert shared.frame["block_keys"].to_list() == [[1, 2], [1, 2], [1, 2, 3], [1, 2, 3]]
    assert replay(shared).summary.hit_blocks == 2 + 2 + 3
    write(tmp_path / "b.json", conv(good(), id="b", hash_id_scope=_DROP))  # global a, local (assumed) b
    mixed = load_kv_cache_tester(tmp_path)
    assert mixed.frame["block_keys"].to_list() == [[1, 2], [5, 6], [1, 2, 3], [5, 6, 7]]
    assert "b.json: no hash_id_scope; 'local' assumed" in mixed.provenance["notes"]


def test_detection(tmp_path: Path) -> None:
    one_line = write(tmp_path / "one.json", conv(good()))
    pretty = write(tmp_path / "pretty.json", conv(good()), indent=2)
    for path in (one_line, pretty, tmp_path):
        assert detect_format(path).name == "kv-cache-tester"
    other = write(tmp_path / "x.jsonl", {"requests": []})
    with pytest.raises(TraceFormatError, match=r"kv-cache-tester \(.*\): line 1: field 'block_size': missing"):
        detect_format(other)
    folder = tmp_path / "f"
    folder.mkdir()
    write(folder / "a.json", {"timestamp": 0})
    with pytest.raises(TraceFormatError, match=r"kv-cache-tester .*: a\.json: line 1: field 'block_size': missing"):
        detect_format(folder)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict]:
    """Files of prefix-chained requests: each prompt extends a prefix of an earlier one with new ids;
    sub-agents share the conversation's id counter; times unordered."""
    files, shared = [], ([draw(st.integers(0, 3))], [[]])  # global-scope files draw from one id space
    for _ in range(draw(st.integers(1, 3))):
        scope = draw(st.sampled_from(["local", "global"]))
        next_id, prompts = shared if scope == "global" else ([draw(st.integers(0, 3))], [[]])
        requests = []

        def request(t: float, next_id: list = next_id, prompts: list = prompts) -> dict:
            base = draw(st.sampled_from(prompts))
            ids = base[:draw(st.integers(0, len(base)))]
            fresh = draw(st.integers(0, 3))
            ids = ids + list(range(next_id[0], next_id[0] + fresh))
            next_id[0] += fresh
            prompts.append(ids)
            return req(t, ids, extra=draw(st.integers(0, BS - 1)), type=draw(st.sampled_from("ns")))

        times = st.floats(0, 100, allow_nan=False)
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                requests.append(request(draw(times)))
            else:
                requests.append({"t": draw(times), "type": "subagent", "agent_id": f"a{len(requests)}",
                                 "requests": [request(draw(times)) for _ in range(draw(st.integers(0, 2)))]})
        files.append(conv(requests, id=f"c{len(files)}", hash_id_scope=scope))
    return files


def _naive_rows(files: list[dict]) -> list[tuple]:
    """The rows the loader must produce, by the format's rules in plain Python."""
    rows = []
    global_top = max((i for f in files if f["hash_id_scope"] == "global" for i in _ids(f["requests"])), default=-1)
    base = global_top + 1
    for f in files:
        offset = 0
        if f["hash_id_scope"] == "local":
            offset = base
            base += max(_ids(f["requests"]), default=-1) + 1
        for t, agent, r in _leaves(f["requests"], 0.0, None):
            rows.append((t, f["id"], agent, r["type"], r["in"], [i + offset for i in r["hash_ids"]]))
    return sorted(rows, key=lambda row: row[0])  # sorted() is stable


def _leaves(requests: list, start: float, agent: str | None) -> list:
    out = []
    for r in requests:
        if r["type"] == "subagent":
            out += _leaves(r["requests"], start + r["t"], r["agent_id"])
        else:
            out.append((start + r["t"], agent, r))
    return out


def _ids(requests: list) -> list[int]:
    return [i for _, _, r in _leaves(requests, 0.0, None) for i in r["hash_ids"]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=conversations())
def test_loaded_trace_matches_the_rules_and_survives_parquet(tmp_path_factory: pytest.TempPathFactory,
                                                             files: list[dict]) -> None:
    folder = tmp_path_factory.mktemp("conv")
    for i, doc in enumerate(files):
        write(folder / f"trace_{i:04d}.json", doc, indent=None if i % 2 else 1)
    rows = _naive_rows(files)
    if not rows:
        with pytest.raises(TraceFormatError, match="no requests"):
            load_kv_cache_tester(folder)
        return
    trace = load_trace(folder)
    got = trace.frame.select("arrival_s", "session_id", "agent_id", "type", "input_tokens", "block_keys").rows()
    assert got == [tuple(row) for row in rows]
    assert trace.frame["request_id"].n_unique() == len(trace)
    path = folder / "t.parquet"
    trace.write_parquet(path)
    assert load_trace(path).same_as(trace)


# -- the real sample: hit ratios against a naive reference ------------------------------------
# data/traces/kv-cache-tester: the 19-file sample (shared/data/traces/kv-cache-tester-weka-claude-
# code-sample), each file gzip-compressed (data/README.md)


def _naive_hits(requests: list[tuple[float, list[int], int]], warmup: float) -> tuple[int, int]:
    """(hit tokens, input tokens) of an unbounded prefix cache over ``requests`` (time, ids, in) in
    time order, the first floor(warmup × n) not measured: a request hits its longest run of leading
    ids seen before, 64 tokens each."""
    seen: set[int] = set()
    hit = total = 0
    skip = int(warmup * len(requests))
    for n, (_, ids, tokens) in enumerate(sorted(requests, key=lambda r: r[0])):
        run = 0
        while run < len(ids) and ids[run] in seen:
            run += 1
        seen.update(ids)
        if n >= skip:
            hit += min(run * 64, tokens)
            total += tokens
    return hit, total


def test_sample_hit_ratios_match_a_naive_reference() -> None:
    folder = bundled_trace_path("claude-code")
    per_file = {}
    for path in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        per_file[path.name] = [(t, [(path.name, i) for i in r["hash_ids"]], r["in"])
                               for t, _, r in _leaves(doc["requests"], 0.0, None)]
    assert len(per_file) == 19
    pooled = [r for requests in per_file.values() for r in requests]
    naive = {w: _naive_hits(pooled, w) for w in (0.0, 0.5)}
    trace = load_trace("claude-code")
    assert (len(trace), trace.block_size, trace.block_refs, trace.distinct_blocks) == (1367, 64, 2198055, 71625)
    for warmup, (hit, total) in naive.items():
        summary = replay(trace, warmup_fraction=warmup).summary
        assert (summary.hit_tokens, summary.input_tokens) == (hit, total)
    # golden values (docs/trace_formats/kv_cache_tester.md), held by the naive numbers themselves
    assert naive[0.0] == (136_091_520, 140_718_777)
    assert naive[0.5] == (76_073_664, 77_674_641)
    ratios = {}
    for name, requests in per_file.items():
        alone = load_trace(folder / name)
        for warmup in (0.0, 0.5):
            hit, total = _naive_hits(requests, warmup)
            assert replay(alone, warmup_fraction=warmup).summary.hit_tokens == hit, name
            ratios.setdefault(warmup, []).append(hit / total)
    assert [round(f(ratios[0.0]), 4) for f in (statistics.median, statistics.mean, min, max)] == [
        0.9705, 0.9613, 0.9218, 0.986]
    assert [round(f(ratios[0.5]), 4) for f in (statistics.median, statistics.mean, min, max)] == [
        0.9832, 0.9742, 0.9101, 0.995]
    assert np.isclose(naive[0.5][0] / naive[0.5][1], 0.97939, atol=5e-6)


def test_global_ids_must_be_chained_across_files(tmp_path: Path) -> None:
    write(tmp_path / "a.json", conv([req(0.0, [1, 2])], hash_id_scope="global"))
    write(tmp_path / "b.json", conv([req(1.0, [3, 2])], hash_id_scope="global"))
    with pytest.raises(TraceFormatError, match=r": b\.json requests\[0\]\.hash_ids\[1\]=2 follows id 3 here but "
                                               r"id 1 at position 1 in a\.json requests\[0\]: the ids are not "
                                               r"prefix-chained"):
        load_kv_cache_tester(tmp_path)
    write(tmp_path / "b.json", conv([req(1.0, [3, 2])]))  # local: its own ids
    assert load_kv_cache_tester(tmp_path).frame["block_keys"].to_list() == [[1, 2], [6, 5]]


def test_repeated_conversation_ids_are_noted(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        write(tmp_path / name, conv(good()))
    trace = load_kv_cache_tester(tmp_path)
    assert trace.provenance["notes"][-1] == "conversation ids used by more than one file (their session_id repeats): c"
    assert trace.frame["block_keys"].to_list() == [[1, 2], [5, 6], [1, 2, 3], [5, 6, 7]]
