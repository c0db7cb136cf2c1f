"""Event files (length-prefixed ZMQ frames) and the JSON description of a stream (kvlab.events.files)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, DecodedBatch, EventBatch, EventDecodeError
from kvlab.events.files import (
    MAGIC,
    MAX_FRAMES_PER_MESSAGE,
    decode_event_file,
    load_event_description,
    parse_event_description,
    read_event_file,
    write_event_file,
)
from kvlab.events.wire import encode_frames


def u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def file_bytes(*messages: list[bytes]) -> bytes:
    """The format written out by hand: magic, then per message u32 count, per frame u32 length + bytes."""
    body = b"".join(u32(len(m)) + b"".join(u32(len(f)) + f for f in m) for m in messages)
    return b"KVLABEV1" + body


STORED = BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None)
BATCH = EventBatch(5.0, [STORED, BlockRemoved([12], "GPU"), AllBlocksCleared("CPU")], 0)


# ---- the binary format ----------------------------------------------------------------------

def test_file_layout_is_magic_then_counted_length_prefixed_frames(tmp_path: Path) -> None:
    frames = encode_frames(BATCH, topic="kv@pod-a@m", seq=3)
    odd = [b"", b"\x00" * 5]  # any frame list is kept as is, not only vLLM's three frames
    path = tmp_path / "s.kvev"
    assert write_event_file(path, [("kv@pod-a@m", 3, BATCH), odd, [bytearray(b"x"), memoryview(b"yz"), b""]]) == 3
    assert path.read_bytes() == file_bytes(frames, odd, [b"x", b"yz", b""])
    assert path.read_bytes()[:20].hex() == b"KVLABEV1".hex() + "00000003" + "0000000a" + b"kv@p".hex()
    assert list(read_event_file(path)) == [frames, odd, [b"x", b"yz", b""]]
    assert MAGIC == b"KVLABEV1"


def test_empty_stream_is_the_magic_alone(tmp_path: Path) -> None:
    path = tmp_path / "empty.kvev"
    assert write_event_file(path, iter([])) == 0
    assert path.read_bytes() == b"KVLABEV1"
    assert list(read_event_file(path)) == [] and decode_event_file(path) == []


def test_array_layout_and_zmq_like_frames(tmp_path: Path) -> None:
    class Frame:
        def __init__(self, raw: bytes) -> None:
            self.bytes = raw

    path = tmp_path / "a.kvev"
    write_event_file(path, [("t", 1, BATCH), [Frame(f) for f in encode_frames(BATCH, seq=2)]], layout="array")
    decoded = decode_event_file(path)
    assert decoded == [DecodedBatch("t", 1, BATCH, "array"), DecodedBatch("", 2, BATCH, "map")]


HASHES = st.lists(st.integers(0, 2**64 - 1), max_size=3) | st.lists(st.binary(min_size=32, max_size=32), max_size=3)
MEDIUM = st.none() | st.sampled_from(["GPU", "CPU", "DISK"])


@st.composite
def stored(draw: st.DrawFn) -> BlockStored:
    hashes = draw(HASHES)
    block_size = draw(st.integers(1, 4))
    tokens = draw(st.just([]) | st.lists(st.integers(0, 2**32), min_size=len(hashes) * block_size,
                                         max_size=len(hashes) * block_size))
    return BlockStored(hashes, None, tokens, block_size, None, draw(MEDIUM), None,
                       group_idx=draw(st.none() | st.just(0)))


EVENTS = stored() | st.builds(BlockRemoved, HASHES, MEDIUM) | st.builds(AllBlocksCleared, MEDIUM)
MESSAGES = st.lists(st.tuples(st.text(max_size=12), st.integers(0, 2**64 - 1),
                              st.builds(EventBatch, st.floats(0, 4e9), st.lists(EVENTS, max_size=4),
                                        st.none() | st.integers(0, 7))), max_size=6)


@settings(max_examples=60)
@given(messages=MESSAGES, layout=st.sampled_from(["map", "array"]))
def test_batches_round_trip_in_order(tmp_path_factory: pytest.TempPathFactory, messages: list, layout: str) -> None:
    path = tmp_path_factory.mktemp("rt") / "s.kvev"
    assert write_event_file(path, messages, layout=layout) == len(messages)
    assert list(read_event_file(path)) == [encode_frames(b, topic=t, seq=s, layout=layout) for t, s, b in messages]
    expected = [DecodedBatch(t, s, b, layout if b.events else "map") for t, s, b in messages]
    assert decode_event_file(path) == expected


FRAME_LISTS = st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=5), max_size=6)


@settings(max_examples=60)
@given(messages=FRAME_LISTS)
def test_frame_lists_round_trip_and_every_cut_inside_a_message_is_named(tmp_path_factory: pytest.TempPathFactory,
                                                                         messages: list[list[bytes]]) -> None:
    path = tmp_path_factory.mktemp("cut") / "s.kvev"
    write_event_file(path, messages)
    raw = path.read_bytes()
    assert raw == file_bytes(*messages) and list(read_event_file(path)) == messages
    boundaries = [len(file_bytes(*messages[:i])) for i in range(len(messages) + 1)]
    cut_path = path.with_name("cut.kvev")
    for cut in range(len(MAGIC), len(raw)):
        cut_path.write_bytes(raw[:cut])
        if cut in boundaries:  # a file cut between messages is a shorter stream
            assert list(read_event_file(cut_path)) == messages[:boundaries.index(cut)]
            continue
        whole = max(i for i, b in enumerate(boundaries) if b < cut)
        reader = read_event_file(cut_path)
        assert [next(reader) for _ in range(whole)] == messages[:whole]  # the whole messages come first
        with pytest.raises(ValueError, match=rf"^{cut_path}: message {whole} at byte \d+: .*the file is truncated"):
            next(reader)


def test_truncated_file_names_file_message_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "t.kvev"
    path.write_bytes(file_bytes([b"ab"], [b"topic", b"12345678"])[:-3])  # second message, frame 1 cut
    reader = read_event_file(path)
    assert next(reader) == [b"ab"]
    with pytest.raises(ValueError) as info:
        next(reader)
    # message 1 starts at 8 + 10 = 18; its frame 1 data at 18 + 4 + 4 + 5 + 4 = 35, with 5 of its 8 bytes left
    assert str(info.value) == (f"{path}: message 1 at byte 35: frame 1 (8 bytes) needs 8 bytes but only 5 remain: "
                               f"the file is truncated or corrupt")
    path.write_bytes(file_bytes([b"ab"]) + b"\x00\x00")
    with pytest.raises(ValueError, match=rf"^{path}: message 1 at byte 18: the frame count needs 4 bytes but only 2"):
        list(read_event_file(path))


@pytest.mark.parametrize(("content", "message"), [
    (b"", "byte 0: expected the magic b'KVLABEV1', got b'': not a kvlab event file"),
    (b"KVLAB", "byte 0: expected the magic b'KVLABEV1', got b'KVLAB': not a kvlab event file"),
    (b"PK\x03\x04zipfile", "byte 0: expected the magic b'KVLABEV1', got b'PK\\x03\\x04zipf': not a kvlab event file"),
    (b"KVLABEV2" + u32(1) + u32(0), "byte 0: expected the magic b'KVLABEV1', got b'KVLABEV2': a kvlab event file of "
                                    "another version ('2')"),
    (b"KVLABEV1" + u32(0), "message 0 at byte 8: frame count 0 is not in [1, 64]: the file is corrupt"),
    (file_bytes([b"a"]) + u32(MAX_FRAMES_PER_MESSAGE + 1) + bytes(600),
     "message 1 at byte 17: frame count 65 is not in [1, 64]: the file is corrupt"),
    (b"KVLABEV1" + u32(1) + u32(2**32 - 1) + b"abc",
     "message 0 at byte 16: frame 0 (4294967295 bytes) needs 4294967295 bytes but only 3 remain: the file is "
     "truncated or corrupt"),
], ids=["empty", "short", "zip", "version 2", "no frames", "absurd count", "absurd length"])
def test_corrupt_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.kvev"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        list(read_event_file(path))
    assert str(info.value) == f"{path}: {message}"
    with pytest.raises(ValueError, match="the file is|magic"):
        decode_event_file(path)


def test_missing_file_raises_at_the_call(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_event_file(tmp_path / "nope.kvev")


def test_a_malformed_message_does_not_stop_the_others(tmp_path: Path) -> None:
    good = encode_frames(BATCH, topic="kv@p@m", seq=0)
    path = tmp_path / "m.kvev"
    write_event_file(path, [good, [b"kv@p@m", u32(1), b"\x93"], [b"only one frame"], good])
    decoded = decode_event_file(path)
    assert [type(d) for d in decoded] == [DecodedBatch, EventDecodeError, EventDecodeError, DecodedBatch]
    assert str(decoded[1]) == "message 1: frame 1 (seq) must be 8 bytes (big-endian), got 4: b'\\x00\\x00\\x00\\x01'"
    assert str(decoded[2]) == "message 2: expected 3 frames [topic, seq, payload], got 1"
    assert decoded[0] == decoded[3] == DecodedBatch("kv@p@m", 0, BATCH, "map")


@pytest.mark.parametrize(("messages", "message"), [
    ([[b"a"], b"abc"], "messages[1] must be a list of frames or a (topic, seq, EventBatch) tuple, got bytes"),
    ([[]], "messages[0] has 0 frames; a message has 1 to 64"),
    ([[b""] * 65], "messages[0] has 65 frames; a message has 1 to 64"),
    ([[b"a", "text"]], "messages[0] frame 1 must be bytes, bytearray, memoryview or a zmq.Frame, got str"),
    ([("t", -1, BATCH)], "messages[0]: seq must be an integer in [0, 2**64), got -1"),
    ([[b"a"], 7], "messages[1] must be a list of frames or a (topic, seq, EventBatch) tuple, got int"),
])
def test_bad_messages_leave_no_file(tmp_path: Path, messages: list, message: str) -> None:
    path = tmp_path / "w.kvev"
    path.write_bytes(b"previous")
    with pytest.raises(ValueError) as info:
        write_event_file(path, messages)
    assert str(info.value) == message
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["w.kvev"]
    with pytest.raises(ValueError, match="messages must be an iterable of messages, got bytes"):
        write_event_file(path, b"frames")


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_written_file_gets_the_mode_of_a_new_file(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        write_event_file(tmp_path / "new.kvev", [[b"a"]])
        (tmp_path / "plain").write_bytes(b"")  # what open() makes under the same umask
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "new.kvev").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_writing_onto_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError) as info:
        write_event_file(tmp_path / "out", [[b"a"]])
    assert str(info.value) == f"cannot write {tmp_path / 'out'}: it is a folder (give a file path, e.g. " \
                              f"{tmp_path / 'out' / 'stream.kvev'})"
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not any((tmp_path / "out").iterdir())


# ---- the JSON description -------------------------------------------------------------------

DESCRIPTION = [
    {"pod": "pod-a", "model": "m", "ts": 1, "events": [
        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": list(range(8)),
         "block_size": 4, "medium": "GPU"}]},
    {"pod": "pod-b", "model": "m", "events": [{"type": "BlockRemoved", "block_hashes": [{"bytes_hex": "0a" * 16}],
                                               "medium": "CPU", "group_idx": 1}]},
    {"pod": "pod-a", "model": "m", "ts": 2.5, "data_parallel_rank": None, "events": [{"type": "AllBlocksCleared"}]},
    {"pod": "pod-a", "model": "m", "seq": 7, "events": []},
    {"pod": "pod-b", "model": "other", "events": [{"type": "AllBlocksCleared", "medium": "CPU"}]},
    {"pod": "pod-a", "model": "m", "events": []},
    {"pod": "pod-c", "model": "org/model@rev", "events": []},  # llm-d splits the topic at the first two '@'
]


def test_description_gives_topics_per_pod_seqs_and_events() -> None:
    assert parse_event_description(DESCRIPTION) == [
        ("kv@pod-a@m", 0, EventBatch(1.0, [BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None)], 0)),
        ("kv@pod-b@m", 0, EventBatch(0.0, [BlockRemoved([b"\x0a" * 16], "CPU", group_idx=1)], 0)),
        ("kv@pod-a@m", 1, EventBatch(2.5, [AllBlocksCleared()], None)),
        ("kv@pod-a@m", 7, EventBatch(0.0, [], 0)),  # an explicit seq (a gap) restarts the pod's count
        ("kv@pod-b@other", 1, EventBatch(0.0, [AllBlocksCleared("CPU")], 0)),
        ("kv@pod-a@m", 8, EventBatch(0.0, [], 0)),
        ("kv@pod-c@org/model@rev", 0, EventBatch(0.0, [], 0)),
    ]
    assert parse_event_description({"messages": DESCRIPTION}) == parse_event_description(DESCRIPTION)


def test_description_file_to_event_file(tmp_path: Path) -> None:
    desc = tmp_path / "d.json"
    desc.write_text(json.dumps(DESCRIPTION))
    path = tmp_path / "d.kvev"
    write_event_file(path, load_event_description(desc))
    decoded = decode_event_file(path)
    assert [(d.topic, d.seq) for d in decoded] == [("kv@pod-a@m", 0), ("kv@pod-b@m", 0), ("kv@pod-a@m", 1),
                                                   ("kv@pod-a@m", 7), ("kv@pod-b@other", 1), ("kv@pod-a@m", 8),
                                                   ("kv@pod-c@org/model@rev", 0)]
    assert decoded[1].batch.events[0].block_keys_u64() == (0x0A0A0A0A0A0A0A0A,)


def msg(**changes: object) -> list[dict]:
    return [{"pod": "p", "model": "m", "events": []}, {"pod": "p", "model": "m", "events": [], **changes}]


def stored_with(**changes: object) -> list[dict]:
    return msg(events=[{"type": "AllBlocksCleared"}, {"type": "BlockStored", "block_hashes": [1], "token_ids": [],
                                                      "block_size": 4, **changes}])


@pytest.mark.parametrize(("description", "message"), [
    ("x", "messages must be a list, got str"),
    ({"messages": [], "extra": 1}, "a description object has exactly one key, 'messages', got ['extra', 'messages']"),
    ([5], "messages[0] must be an object, got int 5"),
    (msg(sq=3), "messages[1]: unknown key 'sq' (keys: pod, model, seq, ts, data_parallel_rank, events)"),
    ([{"pod": "p", "events": []}], "messages[0]: missing 'model'"),
    (msg(pod="a@b"), "messages[1].pod must be a non-empty string without '@' (the pod-id segment of the topic "
                     "kv@<pod>@<model>), got 'a@b'"),
    (msg(model=""), "messages[1].model must be a non-empty string (the model segment of the topic kv@<pod>@<model>), "
                    "got ''"),
    (msg(seq=-1), "messages[1].seq must be an integer in [0, 2**64), got -1"),
    (msg(seq=True), "messages[1].seq must be an integer in [0, 2**64), got True"),
    (msg(ts=-2), "messages[1].ts must be a finite number in [0.0, 2**64), got -2"),
    (msg(data_parallel_rank=-1), "messages[1].data_parallel_rank must be an integer in [0, 2**64) or None, "
                                 "got -1"),
    (msg(events={}), "messages[1].events must be a list, got dict {}"),
    (msg(events=[["BlockRemoved"]]),
     "messages[1].events[0] must be an object with a 'type', got list ['BlockRemoved']"),
    (msg(events=[{"type": "BlockMoved"}]), "messages[1].events[0].type must be one of BlockStored, BlockRemoved, "
                                          "AllBlocksCleared, got 'BlockMoved'"),
    (msg(events=[{"type": "AllBlocksCleared", "tier": "CPU"}]),
     "messages[1].events[0]: AllBlocksCleared has no field 'tier' (fields: medium)"),
    (msg(events=[{"type": "BlockStored", "block_hashes": [1]}]),
     "messages[1].events[0]: BlockStored needs 'token_ids', 'block_size' (use \"token_ids\": [] for a tier update)"),
    (msg(events=[{"type": "BlockStored", "block_hashes": [1], "block_size": 4, "medium": "CPU"}]),
     "messages[1].events[0]: BlockStored needs 'token_ids' (use \"token_ids\": [] for a tier update)"),
    (msg(events=[{"type": "BlockRemoved"}]), "messages[1].events[0]: BlockRemoved needs 'block_hashes'"),
    (stored_with(medium=""), "messages[1].events[1].medium must be null or a non-empty string (a tier such as "
                             "\"GPU\"), got ''"),
    (msg(events=[{"type": "BlockRemoved", "block_hashes": [1], "medium": ""}]),
     "messages[1].events[0].medium must be null or a non-empty string (a tier such as \"GPU\"), got ''"),
    (msg(events=[{"type": "AllBlocksCleared", "medium": ""}]),
     "messages[1].events[0].medium must be null or a non-empty string (a tier such as \"GPU\"), got ''"),
    (stored_with(block_size=0), "messages[1].events[1].block_size must be an integer >= 1, got 0"),
    (stored_with(block_size=4.0), "messages[1].events[1].block_size must be an integer >= 1, got 4.0"),
    (stored_with(token_ids=[1, 2]), "messages[1].events[1].token_ids has 2 tokens but 1 block_hashes x block_size 4 "
                                    "= 4; token_ids must be empty or hold every token of the stored blocks"),
    (stored_with(block_hashes=[1, {"bytes_hex": "zz"}]),
     "messages[1].events[1].block_hashes[1].bytes_hex must be a string of hex digit pairs, got 'zz'"),
    (stored_with(block_hashes=[1, {"bytes_hex": "0102"}]),
     "messages[1].events[1].block_hashes mixes integer and bytes hashes: block_hashes[1] is bytes b'\\x01\\x02' but "
     "block_hashes[0] is an integer 1; an event's hashes are all ints or all digest bytes"),
    (stored_with(medium=3), "messages[1].events[1].medium must be a str or None, got 3"),
])
def test_description_errors_name_the_json_path_and_value(description: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_event_description(description)
    assert str(info.value) == message


@pytest.mark.parametrize(("content", "message"), [
    (b'[{"pod": "p",]', "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 14"),
    (b"\xff[]", "not UTF-8 text (invalid start byte at byte 0)"),
    (b'{"messages": 3}', "messages must be a list, got int"),
])
def test_description_file_errors_name_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_event_description(path)
    assert str(info.value) == f"{path}: {message}"
    with pytest.raises(FileNotFoundError):
        load_event_description(tmp_path / "missing.json")
