"""``kvlab events write`` / ``kvlab events replay`` end to end (event files into an index)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.events import (
    END_SEQ,
    AllBlocksCleared,
    EventBatch,
    decode_event_file,
    encode_frames,
    read_event_file,
    write_event_file,
)
from kvlab.index import PodEntry

TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]
# Expected results follow index_blend.md L17-L19 with a canonical block of 4 tokens, worked by hand:
DESCRIPTION = [
    # pod-a seq 0: two GPU blocks -> request keys k1, k2 on pod-a/gpu
    {"pod": "pod-a", "model": "m", "ts": 1, "events": [
        {"type": "BlockStored", "block_hashes": [11, 12], "token_ids": TOKENS, "block_size": 4, "medium": "GPU"}]},
    # pod-b seq 0: the first block, no medium (-> gpu, L17) -> k1 on pod-b/gpu
    {"pod": "pod-b", "model": "m", "events": [
        {"type": "BlockStored", "block_hashes": [21], "token_ids": TOKENS[:4], "block_size": 4}]},
    # pod-a seq 1: offload notice, no tokens -> tier update, k1 and k2 on pod-a/cpu
    {"pod": "pod-a", "model": "m", "ts": 2, "events": [
        {"type": "BlockStored", "block_hashes": [11, 12], "token_ids": [], "block_size": 4, "medium": "CPU"}]},
    # pod-a seq 5 (gap: 2 expected): GPU copy of block 12 evicted -> pod-a/gpu keeps k1
    {"pod": "pod-a", "model": "m", "seq": 5, "ts": 3, "events": [
        {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}]},
    # pod-b seq 1: a tier the index does not know -> an event error, nothing removed
    {"pod": "pod-b", "model": "m", "ts": 4, "events": [{"type": "BlockRemoved", "block_hashes": [21],
                                                        "medium": "tape"}]},
    # pod-b seq 1 again, same ts: a duplicate, not applied (the clear would empty pod-b)
    {"pod": "pod-b", "model": "m", "seq": 1, "ts": 4, "events": [{"type": "AllBlocksCleared"}]},
    # pod-a seq 6: a reset of the GPU tier only (kvlab's AllBlocksCleared.medium) -> pod-a keeps its cpu copies
    {"pod": "pod-a", "model": "m", "ts": 5, "events": [{"type": "AllBlocksCleared", "medium": "GPU"}]},
]
EXPECTED_PODS = {"pod-a": {"cpu": 2}, "pod-b": {"gpu": 1}}
EXPECTED_GAPS = [{"pod": "pod-a", "data_parallel_rank": 0, "expected": 2, "got": 5}]
EXPECTED_BATCHES = {"applied": 5, "duplicate": 1, "gap": 1}
# events: the two stores, the tier update, the GPU eviction and the GPU reset applied; the 'tape' eviction refused
EXPECTED_APPLIED = {"AllBlocksCleared": 1, "BlockRemoved": 1, "BlockStored": 2, "tier_update": 1}
EXPECTED_COUNTERS = {"applied": EXPECTED_APPLIED, "skipped": {"error": 1}, "unresolved_engine_keys": 0,
                     "unmapped_engine_keys": 0, "extra_keys_ignored": 0}
REPORT_KEYS = ["pods", "gaps", "batches", "applied", "skipped", "unresolved_engine_keys", "unmapped_engine_keys",
               "extra_keys_ignored", "errors"]


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def event_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    desc = tmp_path / "desc.json"
    desc.write_text(json.dumps(DESCRIPTION))
    path = tmp_path / "stream.kvev"
    assert run(capsys, "events", "write", "--from-json", str(desc), str(path)) == (
        0, f"wrote 7 messages to {path}\n", "")
    return path


def test_write_then_replay_json(capsys: pytest.CaptureFixture, event_file: Path) -> None:
    code, out, err = run(capsys, "events", "replay", str(event_file), "--block-size", "4", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert list(report) == REPORT_KEYS
    assert {key: report[key] for key in EXPECTED_COUNTERS} == EXPECTED_COUNTERS
    assert report["pods"] == EXPECTED_PODS
    assert report["gaps"] == EXPECTED_GAPS
    assert report["batches"] == EXPECTED_BATCHES
    assert [(e["message"], e["event"]) for e in report["errors"]] == [(4, 0)]
    assert "unknown tier 'tape'" in report["errors"][0]["error"]


def test_replay_text(capsys: pytest.CaptureFixture, event_file: Path) -> None:
    code, out, _ = run(capsys, "events", "replay", str(event_file), "--block-size", "4")
    lines = out.splitlines()
    assert code == 0
    assert lines[:8] == [f"{event_file}: 7 batches: 5 applied, 1 applied after a sequence gap, "
                         "1 duplicate not applied",  # batches (messages) and events are counted apart
                         "pod         cpu       gpu",   # pods padded to the longest name, tiers 10 wide
                         "pod-a         2         0",
                         "pod-b         0         1",
                         "events applied: 5 (1 AllBlocksCleared, 1 BlockRemoved, 2 BlockStored, 1 tier_update)",
                         "events skipped: 1 (1 error)",
                         "1 sequence gap",
                         "  pod-a: expected seq 2, got 5 (DP rank 0)"]
    assert lines[8] == "1 error" and lines[9].startswith("  message 4 event 0: ") and len(lines) == 10


def test_block_size_changes_the_request_keys(capsys: pytest.CaptureFixture, event_file: Path) -> None:
    """With 8-token canonical blocks the two 4-token engine blocks make one request key (L18)."""
    _, out, _ = run(capsys, "events", "replay", str(event_file), "--block-size", "8", "--json")
    report = json.loads(out)
    # pod-b's single 4-token block is shorter than one canonical block: dropped (L17), and counted
    assert report["pods"] == {"pod-a": {"cpu": 1}}
    assert report["skipped"] == {"error": 1, "partial_block": 1}
    _, out, _ = run(capsys, "events", "replay", str(event_file), "--json")  # default 16: every store dropped
    report = json.loads(out)
    # ... so the tier update's engine keys 11 and 12 resolve to nothing
    assert (report["pods"], report["skipped"], report["unresolved_engine_keys"]) == (
        {}, {"error": 1, "partial_block": 2, "unresolved_tier_update": 1}, 2)
    assert report["applied"] == {"AllBlocksCleared": 1, "BlockRemoved": 1}
    code, out, _ = run(capsys, "events", "replay", str(event_file))
    assert code == 0 and out.splitlines()[1:5] == [
        "no blocks indexed",  # not a bare 'pod' header
        "events applied: 2 (1 AllBlocksCleared, 1 BlockRemoved)",
        "events skipped: 4 (1 error, 2 partial_block, 1 unresolved_tier_update)",
        "engine keys not indexed: 2 unresolved (tier updates)"]


def test_initial_seq_makes_a_late_start_a_gap(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = tmp_path / "late.kvev"
    write_event_file(path, [("kv@pod-c@m", 3, EventBatch(0.0, [AllBlocksCleared()], 0))])
    _, out, _ = run(capsys, "events", "replay", str(path), "--json")
    assert json.loads(out) == {"pods": {}, "gaps": [], "batches": {"applied": 1}, "applied": {"AllBlocksCleared": 1},
                               "skipped": {}, "unresolved_engine_keys": 0, "unmapped_engine_keys": 0,
                               "extra_keys_ignored": 0, "errors": []}
    _, out, _ = run(capsys, "events", "replay", str(path), "--json", "--initial-seq", "0")
    assert json.loads(out)["gaps"] == [{"pod": "pod-c", "data_parallel_rank": 0, "expected": 0, "got": 3}]


def test_bad_messages_are_errors_and_the_rest_is_replayed(capsys: pytest.CaptureFixture, event_file: Path,
                                                          tmp_path: Path) -> None:
    good = list(read_event_file(event_file))
    path = tmp_path / "mixed.kvev"
    bad_seq = [b"kv@pod-a@m", b"\x00\x00\x00\x01", b"\x93"]
    other_topic = encode_frames(EventBatch(0.0, [AllBlocksCleared()], 0), topic="vllm")
    write_event_file(path, [good[0], bad_seq, other_topic, [b"", END_SEQ, b""], *good[1:]])
    _, out, _ = run(capsys, "events", "replay", str(path), "--block-size", "4", "--json")
    report = json.loads(out)
    assert report["pods"] == EXPECTED_PODS and report["gaps"] == EXPECTED_GAPS
    assert report["batches"] == EXPECTED_BATCHES  # the end-of-replay marker is skipped, not an error
    errors = [(e["message"], e["event"]) for e in report["errors"]]
    assert errors == [(1, None), (2, None), (7, 0)]  # file message indices (the good ones shifted by 3)
    assert report["errors"][0]["error"] == "frame 1 (seq) must be 8 bytes (big-endian), got 4: b'\\x00\\x00\\x00\\x01'"
    assert "'vllm'" in report["errors"][1]["error"]


def test_write_array_layout(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    desc = tmp_path / "d.json"
    desc.write_text(json.dumps(DESCRIPTION[:2]))
    out = tmp_path / "a.kvev"
    assert run(capsys, "events", "write", "--from-json", str(desc), str(out), "--layout", "array")[0] == 0
    assert [d.layout for d in decode_event_file(out)] == ["array", "array"]


def test_bad_input_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path, event_file: Path) -> None:
    missing = tmp_path / "missing.kvev"
    assert run(capsys, "events", "replay", str(missing)) == (2, "", f"kvlab: error: no event file at {missing}\n")
    assert run(capsys, "events", "write", "--from-json", str(missing), str(tmp_path / "o.kvev")) == (
        2, "", f"kvlab: error: no JSON description at {missing}\n")
    truncated = tmp_path / "cut.kvev"
    truncated.write_bytes(event_file.read_bytes()[:-3])
    code, out, err = run(capsys, "events", "replay", str(truncated), "--json")
    assert (code, out) == (2, "")
    assert err.startswith(f"kvlab: error: {truncated}: message 6 at byte ") and "truncated" in err
    wrong = tmp_path / "desc.kvev"
    wrong.write_text("[]")
    assert run(capsys, "events", "replay", str(wrong)) == (
        2, "", f"kvlab: error: {wrong}: byte 0: expected the magic b'KVLABEV1', got b'[]': not a kvlab event file\n")
    desc = tmp_path / "bad.json"
    desc.write_text(json.dumps([{"pod": "p", "model": "m", "events": [{"type": "BlockStored", "block_hashes": [1],
                                                                       "token_ids": [], "block_size": 0}]}]))
    out_path = tmp_path / "o.kvev"
    assert run(capsys, "events", "write", "--from-json", str(desc), str(out_path)) == (
        2, "", f"kvlab: error: {desc}: messages[0].events[0].block_size must be an integer >= 1, got 0\n")
    assert not out_path.exists()
    assert run(capsys, "events", "write", "--from-json", str(desc), str(tmp_path / "no" / "o.kvev")) == (
        2, "", f"kvlab: error: cannot write {tmp_path / 'no' / 'o.kvev'}: {tmp_path / 'no'} is not an existing "
               f"folder\n")


def write_description(capsys: pytest.CaptureFixture, folder: Path, name: str, description: list) -> Path:
    desc, path = folder / f"{name}.json", folder / f"{name}.kvev"
    desc.write_text(json.dumps(description))
    assert run(capsys, "events", "write", "--from-json", str(desc), str(path))[0] == 0
    return path


def test_strict_exits_1_when_anything_was_not_indexed(capsys: pytest.CaptureFixture, event_file: Path,
                                                      tmp_path: Path) -> None:
    code, out, err = run(capsys, "events", "replay", str(event_file), "--block-size", "4", "--strict", "--json")
    assert (code, err) == (1, "kvlab: --strict: not everything was indexed: 1 sequence gap, 1 error\n")
    assert json.loads(out)["pods"] == EXPECTED_PODS  # the report is printed all the same
    clean = write_description(capsys, tmp_path, "clean", DESCRIPTION[:3])  # before the gap
    assert run(capsys, "events", "replay", str(clean), "--block-size", "4", "--strict")[0] == 0
    # 12 tokens in 4-token engine blocks, canonical 8: one request key, engine key 33 past it (unmapped);
    # the store carries extra_keys (not hashed); a store chained to an unknown parent is skipped
    lossy = write_description(capsys, tmp_path, "lossy", [{"pod": "pod-a", "model": "m", "events": [
        {"type": "BlockStored", "block_hashes": [31, 32, 33], "token_ids": list(range(12)), "block_size": 4,
         "extra_keys": [["salt"], None, None]},
        {"type": "BlockStored", "block_hashes": [41], "parent_block_hash": 999, "token_ids": list(range(8)),
         "block_size": 8}]}])
    code, out, err = run(capsys, "events", "replay", str(lossy), "--block-size", "8", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert {key: report[key] for key in EXPECTED_COUNTERS} == {
        "applied": {"BlockStored": 1}, "skipped": {"unknown_parent": 1}, "unresolved_engine_keys": 0,
        "unmapped_engine_keys": 1, "extra_keys_ignored": 1}
    code, out, err = run(capsys, "events", "replay", str(lossy), "--block-size", "8", "--strict")
    assert code == 1 and err == ("kvlab: --strict: not everything was indexed: 1 event skipped (1 unknown_parent), "
                                 "1 unmapped engine key, 1 store with extra_keys ignored\n")
    assert out.splitlines()[3:7] == ["events applied: 1 (1 BlockStored)", "events skipped: 1 (1 unknown_parent)",
                                     "engine keys not indexed: 1 unmapped (past the last full canonical block)",
                                     "extra_keys ignored (not hashed) in 1 store"]


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture) -> None:
    for argv in (["events", "replay", "--help"], ["events", "write", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert info.value.code == 0 and "exit status: 0 done" in text and "1 with --strict" in text


def test_write_refuses_a_folder_and_its_own_input(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    desc = tmp_path / "d.json"
    desc.write_text(json.dumps(DESCRIPTION))
    (tmp_path / "out").mkdir()
    assert run(capsys, "events", "write", "--from-json", str(desc), str(tmp_path / "out")) == (
        2, "", f"kvlab: error: cannot write {tmp_path / 'out'}: it is a folder (give a file path, e.g. "
               f"{tmp_path / 'out' / 'stream.kvev'})\n")
    for same in (desc, tmp_path / "." / "d.json"):
        assert run(capsys, "events", "write", "--from-json", str(desc), str(same)) == (
            2, "", f"kvlab: error: cannot write {same}: it is the JSON description being read (give another "
                   f"OUT.kvev)\n")
    assert json.loads(desc.read_text()) == DESCRIPTION
    assert run(capsys, "events", "replay", str(tmp_path / "out")) == (
        2, "", f"kvlab: error: {tmp_path / 'out'} is a folder, not an event file\n")


def test_unreadable_and_unwritable_files_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path, event_file: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import kvlab.cli.events as events_cli

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    desc = tmp_path / "d.json"
    desc.write_text(json.dumps(DESCRIPTION))
    monkeypatch.setattr(events_cli, "write_event_file", denied)
    assert run(capsys, "events", "write", "--from-json", str(desc), str(tmp_path / "o.kvev")) == (
        2, "", f"kvlab: error: cannot write {tmp_path / 'o.kvev'}: Permission denied\n")
    monkeypatch.setattr(events_cli, "load_event_description", denied)
    assert run(capsys, "events", "write", "--from-json", str(desc), str(tmp_path / "o.kvev")) == (
        2, "", f"kvlab: error: cannot read {desc}: Permission denied\n")
    monkeypatch.setattr(events_cli, "read_event_file", denied)
    assert run(capsys, "events", "replay", str(event_file)) == (
        2, "", f"kvlab: error: cannot read {event_file}: Permission denied\n")


def test_namespace_and_flush_are_checked_before_anything_is_applied(capsys: pytest.CaptureFixture,
                                                                    event_file: Path) -> None:
    for flags, message in ((["--namespace", "x:"], "--namespace apply to a Redis backend"),
                           (["--namespace", "x:", "--flush"], "--namespace and --flush apply to a Redis backend"),
                           (["--flush", "--backend", "127.0.0.1:1"], "--flush needs a non-empty --namespace"),
                           (["--flush", "--namespace", "", "--backend", "127.0.0.1:1"], "--flush needs a non-empty")):
        code, out, err = run(capsys, "events", "replay", str(event_file), *flags)
        assert (code, out) == (2, "") and err.startswith(f"kvlab: error: {message}")


@pytest.mark.parametrize("backend", ["127.0.0.1:{port}", "valkey://127.0.0.1:{port}", "redis://127.0.0.1:{port}/0"])
def test_backend_takes_host_port_and_llm_d_urls(capsys: pytest.CaptureFixture, event_file: Path, backend: str) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out, err = run(capsys, "events", "replay", str(event_file), "--backend", backend.format(port=port))
    assert (code, out) == (2, "")
    assert err.startswith(f"kvlab: error: cannot reach a Redis server at redis://127.0.0.1:{port}")


@pytest.mark.parametrize(("argv", "message"), [
    (["replay", "f.kvev", "--backend", "mongo://h:1"],
     "expected 'memory', HOST:PORT or a URL (redis://, rediss://, unix://, valkey://, valkeys://), got 'mongo://h:1'"),
    (["replay", "f.kvev", "--backend", "memroy"], "expected 'memory', HOST:PORT or a URL"),
    (["replay", "f.kvev", "--backend", "cache.local"], "expected 'memory', HOST:PORT or a URL"),
    (["replay", "f.kvev", "--backend", "redis://"], "names no host"),
    (["replay", "f.kvev", "--block-size", "0"], "expected an integer >= 1, got 0"),
    (["replay", "f.kvev", "--initial-seq", "-1"], "expected an integer in [0, 2**64), got -1"),
    (["write", "out.kvev"], "the following arguments are required: --from-json"),
    (["write", "--from-json", "d.json", "out.kvev", "--layout", "tree"], "invalid choice: 'tree'"),
    ([], "the following arguments are required: events_command"),
])
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["events", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_unreachable_redis_exit_2(capsys: pytest.CaptureFixture, event_file: Path) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out, err = run(capsys, "events", "replay", str(event_file), "--backend", f"redis://127.0.0.1:{port}")
    assert (code, out) == (2, "")
    assert err.startswith(f"kvlab: error: cannot reach a Redis server at redis://127.0.0.1:{port}")


@pytest.mark.parametrize(("reply", "cause"), [
    (b"HTTP/1.0 400 Bad request\r\n\r\n", "what answers there does not speak the Redis protocol (InvalidResponse"),
    (None, "nothing answered PING within 2 s"),  # accepts connections, never replies
])
def test_a_port_that_does_not_talk_redis_exit_2(capsys: pytest.CaptureFixture, event_file: Path, reply: bytes | None,
                                               cause: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

        if reply is not None:
            threading.Thread(target=answer, daemon=True).start()
        code, out, err = run(capsys, "events", "replay", str(event_file), "--backend", f"redis://127.0.0.1:{port}")
    assert (code, out) == (2, "")
    assert err.startswith(f"kvlab: error: cannot reach a Redis server at redis://127.0.0.1:{port}: {cause}")


def test_replay_into_redis(capsys: pytest.CaptureFixture, event_file: Path, request: pytest.FixtureRequest) -> None:
    try:
        server = request.getfixturevalue("redis_server")
    except pytest.FixtureLookupError:
        pytest.skip("the redis_server fixture (tests/redis_server.py) is not available")
    from kvlab.index.redis_index import RedisIndex

    with RedisIndex(server.url) as index:
        index.client.flushdb()  # the CLI writes namespace '' and counts what the server holds
        try:
            code, out, _ = run(capsys, "events", "replay", str(event_file), "--block-size", "4", "--json",
                               "--backend", server.url)
            report = json.loads(out)
            assert code == 0
            assert (report["pods"], report["gaps"], report["batches"]) == (EXPECTED_PODS, EXPECTED_GAPS,
                                                                           EXPECTED_BATCHES)
            assert [(e["message"], e["event"]) for e in report["errors"]] == [(4, 0)]
        finally:
            index.client.flushdb()


def test_replay_into_a_redis_namespace_with_flush(capsys: pytest.CaptureFixture, event_file: Path, tmp_path: Path,
                                                  request: pytest.FixtureRequest) -> None:
    try:
        server = request.getfixturevalue("redis_server")
    except pytest.FixtureLookupError:
        pytest.skip("the redis_server fixture (tests/redis_server.py) is not available")
    from kvlab.index.redis_index import RedisIndex

    other = write_description(capsys, tmp_path, "other", [{"pod": "pod-c", "model": "m", "events": [
        {"type": "BlockStored", "block_hashes": [51], "token_ids": [9, 9, 9, 9], "block_size": 4}]}])
    with RedisIndex(server.url) as root:
        root.add(None, [7], [PodEntry("pod-root")])  # namespace '': neither read nor flushed
        try:
            def replay(path: Path, *flags: str) -> dict:
                code, out, _ = run(capsys, "events", "replay", str(path), "--block-size", "4", "--json", "--backend",
                                   server.url.removeprefix("redis://"), "--namespace", "cli:", *flags)
                assert code == 0
                return json.loads(out)["pods"]

            assert replay(event_file, "--flush") == EXPECTED_PODS
            assert replay(other) == {**EXPECTED_PODS, "pod-c": {"gpu": 1}}  # merged with the first replay
            assert replay(other, "--flush") == {"pod-c": {"gpu": 1}}
            assert dict(root.items()) == {7: (PodEntry("pod-root"),)}
        finally:
            root.client.flushdb()


def test_a_sequence_gap_fails_strict_and_batches_are_not_events(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """Issue 14 item 13: seq 1 then 5 exited 0 under --strict, and the text said "1 applied" (a batch)
    above "events applied: none". The batches in a gap were lost: --strict fails; the text names both."""
    gap = write_description(capsys, tmp_path, "gap", [
        {"pod": "pod-a", "model": "m", "seq": 1, "events": []},
        {"pod": "pod-a", "model": "m", "seq": 5, "events": []}])
    code, out, err = run(capsys, "events", "replay", str(gap), "--strict")
    assert code == 1 and err == "kvlab: --strict: not everything was indexed: 1 sequence gap\n"
    assert out.splitlines() == [f"{gap}: 2 batches: 1 applied, 1 applied after a sequence gap", "no blocks indexed",
                                "events applied: none", "events skipped: none", "1 sequence gap",
                                "  pod-a: expected seq 2, got 5 (DP rank 0)"]
    # seq 3 arrives after the gap [2, 5) was reported: a late batch, never applied
    late = write_description(capsys, tmp_path, "late", [
        {"pod": "pod-a", "model": "m", "seq": 1, "events": []},
        {"pod": "pod-a", "model": "m", "seq": 5, "events": []},
        {"pod": "pod-a", "model": "m", "seq": 3, "events": [{"type": "AllBlocksCleared"}]}])
    code, out, err = run(capsys, "events", "replay", str(late), "--strict")
    assert code == 1 and err.endswith("1 sequence gap, 1 late batch not applied\n")
    assert out.splitlines()[0] == f"{late}: 3 batches: 1 applied, 1 applied after a sequence gap, 1 late not applied"
